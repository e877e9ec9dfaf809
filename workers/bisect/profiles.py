"""Profiling a benchmark in a build's environment, and diffing two builds' profiles.

A build's environment runs ``python -m suite profile`` in a subprocess through
:func:`workers.runner.run_suite` (:func:`profile_with`), and the two documents are diffed by
:func:`service.profiles.diff_profiles`. The environment is a torch spec's
(``workers/builds/torch_envs.py``: ``current``, ``torch==X``: :func:`profile_build`, what
``nightbench profile`` runs by hand) or a commit's build from a bisection's provider
(:func:`profile_commit`, the night's profile probe: :mod:`workers.bisect.profile_probe`). What the suite is asked for is the metric
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
from service.profiles import (
    Profile,
    ProfileDiff,
    diff_json,
    diff_profiles,
    profile_from_json,
    python_profile_of,
)
from workers.bisect.measure import REPO_ROOT, parse_benchmark, quiet_env
from workers.builds.base import BuildEnvironment, log_tail
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
        python: a count profile's Python-level rows (bytecodes per step), None without.
    """

    spec: str
    torch: str
    profile: Profile
    document: Mapping[str, Any]
    python: Profile | None = None


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


def profile_with(
    python: Path,
    environ: dict[str, str],
    benchmark: str,
    metric_name: str = "latency",
    *,
    label: str,
    steps: int = 3,
    windows: int = 7,
    batch_size: int | None = None,
    trace: Path | None = None,
    python_functions: bool = False,
    timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S,
) -> BuildProfile:
    """Profile ``benchmark`` with interpreter ``python`` in process environment ``environ``.

    Args:
        python: the build's interpreter.
        environ: its process environment (the suite's folder is added to ``PYTHONPATH``; one
            torch thread unless it says otherwise).
        benchmark: ``MODEL:MODE:DEVICE``.
        metric_name: ``latency`` (operator table) or ``cpu_instructions`` (functions).
        label: what the build is called in errors and in the result (a spec, a sha).
        steps: steps per profiled window.
        windows: profiled windows.
        batch_size: overrides the model's default batch size.
        trace: where to keep the Chrome trace (operator tables only; ignored otherwise).
        python_functions: a row per Python function too: its self time in an operator table
            (cProfile), its bytecodes beside a function profile (``sys.settrace``).
        timeout_s: seconds the suite process may take.

    Returns:
        The build's profile (:attr:`BuildProfile.spec` is ``label``).

    Raises:
        InvalidInput: as :func:`profile_args`.
        MeasureError: the suite process failed, timed out, or its document holds an error.
    """
    args = profile_args(
        benchmark, metric_name, steps=steps, windows=windows, batch_size=batch_size, trace=trace
    )
    if python_functions:
        args.append("--python-functions")
    environ = dict(environ)
    if metric(metric_name).kind == MetricKind.COUNT:
        # Set iteration order moves a Python-level count: the same seed on every build.
        environ.setdefault("PYTHONHASHSEED", "0")
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (environ.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
    )
    environ.setdefault("OMP_NUM_THREADS", "1")
    environ.setdefault("MKL_NUM_THREADS", "1")
    outcome = run_suite(python, args, timeout_s=timeout_s, env=environ)
    doc = outcome.record
    if outcome.timed_out:
        raise MeasureError(f"{benchmark} on {label}: not profiled in {timeout_s:.0f} s")
    if doc is None:
        raise MeasureError(f"{benchmark} on {label}: no profile ({outcome.error})")
    if doc.get("error"):
        raise MeasureError(f"{benchmark} on {label}: {doc['error']}")
    if outcome.returncode != 0:
        raise MeasureError(f"{benchmark} on {label}: {log_tail(outcome.stderr)}")
    return BuildProfile(
        spec=label,
        torch=str(doc.get("torch", "")),
        profile=profile_from_json(doc),
        document=doc,
        python=python_profile_of(doc),
    )


def profile_build(
    spec: str,
    benchmark: str,
    metric_name: str = "latency",
    *,
    steps: int = 3,
    windows: int = 7,
    batch_size: int | None = None,
    trace: Path | None = None,
    python_functions: bool = False,
    timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
) -> BuildProfile:
    """Profile ``benchmark`` in the environment of torch spec ``spec`` (:func:`profile_with`).

    Args:
        spec: the build, as the nightly takes it (``current``, ``torch==2.13.0``).
        benchmark: ``MODEL:MODE:DEVICE``.
        metric_name: ``latency`` (operator table) or ``cpu_instructions`` (functions).
        steps: steps per profiled window.
        windows: profiled windows.
        batch_size: overrides the model's default batch size.
        trace: where to keep the Chrome trace (operator tables only; ignored otherwise).
        python_functions: a row per Python function too: its self time in an operator table
            (cProfile), its bytecodes beside a function profile (``sys.settrace``).
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
    with use_environment(spec) as env:
        environ = env.subprocess_env()
        environ.update(extra_env or {})
        return profile_with(
            env.python,
            environ,
            benchmark,
            metric_name,
            label=spec,
            steps=steps,
            windows=windows,
            batch_size=batch_size,
            trace=trace,
            python_functions=python_functions,
            timeout_s=timeout_s,
        )


def profile_commit(
    env: BuildEnvironment,
    benchmark: str,
    metric_name: str = "latency",
    **options: Any,
) -> BuildProfile:
    """Profile ``benchmark`` on a commit's build from a bisection's provider, in the environment
    a probe measures in (:func:`workers.bisect.measure.quiet_env`).

    Args:
        env: the build (:meth:`workers.builds.base.BuildProvider.prepare`).
        benchmark: ``MODEL:MODE:DEVICE``.
        metric_name: ``latency`` or ``cpu_instructions``.
        **options: :func:`profile_with`'s keyword options but ``label`` (the commit's sha).

    Raises:
        InvalidInput, MeasureError: as :func:`profile_with`.
    """
    return profile_with(
        env.python, quiet_env(env), benchmark, metric_name, label=env.sha[:12], **options
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


def diff_python(
    before: BuildProfile, after: BuildProfile, *, top: int | None = None
) -> ProfileDiff | None:
    """The diff of two count profiles' Python-level rows (bytecodes per step), None when either
    build has none (a latency profile, or the section failed)."""
    if before.python is None or after.python is None:
        return None
    return diff_profiles(before.python, after.python, top=top)


def diff_document(
    before: BuildProfile,
    after: BuildProfile,
    *,
    repeat: BuildProfile | None = None,
    top: int | None = None,
) -> dict[str, Any]:
    """Both diffs of two builds as the JSON the API serves and the issue renders
    (:func:`service.profiles.diff_json`, with the Python-level diff as its ``python``)."""
    return diff_json(
        diff_builds(before, after, repeat=repeat, top=top),
        python=diff_python(before, after, top=top),
    )
