"""Profiling a benchmark in a build's environment, and diffing two builds' profiles.

The profile probe by hand (``nightbench profile``; docs/profile.md): each build's environment
(``workers/builds/torch_envs.py``: ``current``, ``torch==X``, ...) runs ``python -m suite
profile`` in a subprocess through :func:`workers.runner.run_suite`, and the two documents are
diffed by :func:`service.profiles.diff_profiles`. What the suite is asked for is the metric
kind's row of :data:`PROFILE_KINDS`: an operator table for a timed metric, function-level
instruction counts (callgrind) for a count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.errors import InvalidInput, MeasureError
from service.metrics import MetricKind, metric
from service.profiles import Profile, ProfileDiff, diff_profiles, profile_from_json
from workers.bisect.measure import REPO_ROOT, parse_benchmark
from workers.builds.base import log_tail
from workers.builds.torch_envs import use_environment
from workers.runner import run_suite


@dataclass(frozen=True)
class ProfileKind:
    """What ``python -m suite profile`` is asked for to profile a metric of one kind.

    Attributes:
        args: the suite's options for it (``--callgrind`` for counts).
        traced: it can keep a Chrome trace (``--trace``).
    """

    args: tuple[str, ...]
    traced: bool


PROFILE_KINDS: dict[MetricKind, ProfileKind] = {
    MetricKind.TIMED: ProfileKind(args=(), traced=True),
    MetricKind.COUNT: ProfileKind(args=("--callgrind",), traced=False),
}
"""The profile of each metric kind (a kind not listed has none)."""
DEFAULT_PROFILE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BuildProfile:
    """One build's profile of one benchmark.

    Attributes:
        spec: the torch spec it was made with (``current``, ``torch==2.13.0``).
        torch: the torch version the suite reported.
        profile: the rows.
        document: the suite's whole document (rows per window, trace path).
    """

    spec: str
    torch: str
    profile: Profile
    document: Mapping[str, Any]


def profile_args(
    benchmark: str,
    metric_name: str,
    *,
    steps: int,
    windows: int,
    batch_size: int | None = None,
    trace: Path | None = None,
) -> list[str]:
    """The arguments of ``python -m suite profile`` for ``benchmark`` and ``metric_name``
    (``trace`` is dropped for a profile that keeps none).

    Raises:
        InvalidInput: a malformed benchmark, a metric with no profile, or a count on a device
            other than the CPU.
    """
    b = parse_benchmark(benchmark)
    row = metric(metric_name)
    if row.kind not in PROFILE_KINDS:
        raise InvalidInput(
            f"metric {metric_name!r} has no profile: one of latency, cpu_instructions"
        )
    if b.device not in row.devices:
        raise InvalidInput(
            f"{b.name}: {metric_name} is measured on {', '.join(sorted(row.devices))}"
        )
    if b.compiler != "eager":
        raise InvalidInput(f"{b.name}: profiles are of eager benchmarks only")
    args = ["profile", "--model", b.model, "--mode", b.mode, "--device", b.device]
    kind = PROFILE_KINDS[row.kind]
    args += ["--steps", str(steps), "--windows", str(windows), *kind.args]
    if batch_size is not None:
        args += ["--batch-size", str(batch_size)]
    return args + (["--trace", str(trace)] if trace is not None and kind.traced else [])


def profile_build(
    spec: str,
    benchmark: str,
    metric_name: str = "latency",
    *,
    steps: int = 3,
    windows: int = 7,
    batch_size: int | None = None,
    trace: Path | None = None,
    timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
) -> BuildProfile:
    """Profile ``benchmark`` in the environment of torch spec ``spec``.

    Args:
        spec: the build, as the nightly takes it (``current``, ``torch==2.13.0``).
        benchmark: ``MODEL:MODE:DEVICE``.
        metric_name: ``latency`` (operator table) or ``cpu_instructions`` (functions).
        steps: steps per profiled window.
        windows: profiled windows.
        batch_size: overrides the model's default batch size.
        trace: where to keep the Chrome trace (operator tables only; ignored otherwise).
        timeout_s: seconds the suite process may take.
        extra_env: variables added to the process's environment (a planted regression's
            ``NIGHTBENCH_SUITE_INJECT_WORK``).

    Returns:
        The build's profile.

    Raises:
        InvalidInput: as :func:`profile_args`; a spec that pins no build.
        MeasureError: the suite process failed, timed out, or its document holds an error.
        EnvironmentBuildError: the build's venv could not be made.
    """
    args = profile_args(
        benchmark, metric_name, steps=steps, windows=windows, batch_size=batch_size, trace=trace
    )
    with use_environment(spec) as env:
        environ = env.subprocess_env()
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (environ.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
        )
        environ.setdefault("OMP_NUM_THREADS", "1")
        environ.setdefault("MKL_NUM_THREADS", "1")
        environ.update(extra_env or {})
        outcome = run_suite(env.python, args, timeout_s=timeout_s, env=environ)
    doc = outcome.record
    if doc is None:
        raise MeasureError(f"{benchmark} on {spec}: no profile ({outcome.error})")
    if doc.get("error"):
        raise MeasureError(f"{benchmark} on {spec}: {doc['error']}")
    if outcome.returncode != 0:
        raise MeasureError(f"{benchmark} on {spec}: {log_tail(outcome.stderr)}")
    return BuildProfile(
        spec=spec, torch=str(doc.get("torch", "")), profile=profile_from_json(doc), document=doc
    )


def diff_builds(
    before: BuildProfile,
    after: BuildProfile,
    *,
    repeat: BuildProfile | None = None,
    top: int | None = None,
) -> ProfileDiff:
    """The diff of two builds' profiles (:func:`service.profiles.diff_profiles`), the noise
    measured against ``repeat`` (a second profile of ``before``'s build) when given.

    Raises:
        InvalidInput: profiles of different metrics.
    """
    return diff_profiles(
        before.profile,
        after.profile,
        repeat=repeat.profile if repeat is not None else None,
        top=top,
    )
