"""Process-to-process stability of benchmarks: which ones are too noisy to alert on.

Method (TorchBench's ``userbenchmark/model-stableness``): run each benchmark K times, each time
in a fresh process (``python -m suite run``), take each process's median latency, and compute the
spread ``(max - min) / min`` of those medians. A benchmark whose spread reaches 7% is marked
unstable: a 7% regression threshold cannot tell its noise from a change. The coefficient of
variation (sample standard deviation / mean) of the per-process medians is reported beside it; its
median over a suite's CPU benchmarks is the suite's noise floor.

The range of n draws grows with n, so the 7% is the rule *for 5 processes* (TorchBench's and
``nightbench suite stability``'s default K): judged over n processes, the spread allowed is 7%
scaled by d2(n) / d2(5), the expected range of n standard normal draws relative to 5's
(:func:`allowed_spread`). Over 5 processes it is exactly TorchBench's rule; over the nightly
re-check's 10 it is 9.26%, so both call the same benchmarks stable whatever the window.

The K processes of one benchmark are interleaved with the other benchmarks' (round r runs every
benchmark once), so that a slow drift of the machine (another job starting, thermal state)
spreads over all benchmarks instead of landing on one benchmark's repeats.

This module orchestrates subprocesses and imports nothing heavy: it runs in nightbench's own
environment, and may point ``python`` at the environment under test.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from suite.cpu_setup import setup_label
from suite.gpu_setup import gpu_setup_label

UNSTABLE_SPREAD = 0.07  # TorchBench's STABLE_THRESHOLD in userbenchmark/model-stableness/run.py
REFERENCE_PROCESSES = 5  # the process count UNSTABLE_SPREAD is the rule for (TorchBench's K)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StabilityBenchmark:
    """One benchmark: a model in a mode on a device with a compiler."""

    model: str
    mode: str
    device: str = "cpu"
    compiler: str = "eager"

    @property
    def key(self) -> str:
        """The benchmark's name, ``model:mode:device:compiler``."""
        return f"{self.model}:{self.mode}:{self.device}:{self.compiler}"


@dataclass(frozen=True)
class StabilityResult:
    """The verdict on one benchmark after K processes.

    Attributes:
        medians_ms: each successful process's median latency (ms), in run order.
        cv: sample standard deviation / mean of ``medians_ms`` (None with fewer than 2).
        spread: ``(max - min) / min`` of ``medians_ms`` (None with fewer than 2).
        unstable: ``spread >= allowed_spread``; None when fewer than 2 processes succeeded.
        threshold: the rule's spread for :data:`REFERENCE_PROCESSES` processes (TorchBench: 0.07).
        allowed_spread: the spread the verdict allowed for ``len(medians_ms)`` processes
            (:func:`allowed_spread` of ``threshold``; None with fewer than 2).
        errors: the error of each failed process.
        benchmark_version: the version the processes reported (None if none succeeded).
        environment: the environment of the first process that succeeded.
        setups: the measurement setups in force in the processes that succeeded, each named
            once (:func:`full_setup_label`: ``jemalloc``, ``glibc+tunables``, and on CUDA
            ``cudnn.benchmark off``, ...).
        source: where the verdict comes from: ``measured`` (K processes here); the nightly
            re-check stores ``nightly`` beside it (``service/stability/recheck.py``).
    """

    model: str
    mode: str
    device: str
    compiler: str
    repeats: int
    medians_ms: list[float]
    cv: float | None
    spread: float | None
    unstable: bool | None
    threshold: float = UNSTABLE_SPREAD
    allowed_spread: float | None = None
    errors: list[str] = field(default_factory=list)
    benchmark_version: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    setups: list[str] = field(default_factory=list)
    source: str = "measured"

    def to_json(self) -> dict[str, Any]:
        """This record as a JSON-ready dict (``dataclasses.asdict``)."""
        return asdict(self)


@functools.lru_cache(maxsize=64)
def d2(n: int) -> float:
    """The expected range of ``n`` independent standard normal draws, E[max - min].

    The d2 constant of statistical process control (Tippett 1925, "On the extreme individuals
    and the range of samples taken from a normal population", Biometrika 17; tabled in ASTM
    E2587): d2(2) = 1.128 (= 2 / sqrt(pi)), d2(5) = 2.326, d2(10) = 3.078. Computed as
    ``integral over x of 1 - Phi(x)^n - (1 - Phi(x))^n`` (the range's expectation from its
    distribution function) with ``scipy.integrate.quad``.

    Args:
        n: the number of draws (>= 2).

    Returns:
        d2(n), in standard deviations.

    Raises:
        ValueError: ``n`` < 2 (one draw has no range).
    """
    if n < 2:
        raise ValueError(f"a range needs at least 2 draws, got {n}")
    from scipy import integrate, stats  # here: the suite's runs never pay for scipy

    value, _ = integrate.quad(
        lambda x: 1.0 - stats.norm.cdf(x) ** n - stats.norm.sf(x) ** n, -math.inf, math.inf
    )
    return float(value)


def allowed_spread(processes: int, threshold: float = UNSTABLE_SPREAD) -> float:
    """The spread (fraction) from which ``processes`` per-process medians are unstable.

    ``threshold`` is the rule for :data:`REFERENCE_PROCESSES` (5) processes, TorchBench's 7%;
    for n processes it is scaled by d2(n) / d2(5) (:func:`d2`), the expected range of n normal
    draws relative to 5's, so that a benchmark with a given process-to-process noise gets the
    same verdict over any number of processes (for small spreads, (max - min) / min is close to
    range / mean). Exactly ``threshold`` for 5 processes; 9.26% of 7% for 10, 3.39% for 2.

    Args:
        processes: the number of per-process medians judged (>= 2).
        threshold: the rule's spread for 5 processes (fraction).

    Returns:
        The allowed spread (fraction).

    Raises:
        ValueError: ``processes`` < 2.
    """
    if processes == REFERENCE_PROCESSES:
        return threshold
    return threshold * d2(processes) / d2(REFERENCE_PROCESSES)


def summarize(
    medians: Sequence[float], threshold: float = UNSTABLE_SPREAD
) -> tuple[float | None, float | None, bool | None]:
    """CV, spread and the unstable flag of per-process medians.

    Args:
        medians: per-process median latencies (any unit; all the same); must be positive.
        threshold: the spread (fraction) from which a benchmark is unstable, as is: pass
            :func:`allowed_spread` of the medians' count to judge by the process-scaled rule.

    Returns:
        ``(cv, spread, unstable)``; all None with fewer than two medians.

    Raises:
        ValueError: a median is not a positive finite number.
    """
    if any(not (math.isfinite(m) and m > 0) for m in medians):
        raise ValueError(f"medians must be positive finite numbers, got {list(medians)}")
    if len(medians) < 2:
        return None, None, None
    cv = statistics.stdev(medians) / statistics.fmean(medians)
    spread = (max(medians) - min(medians)) / min(medians)
    return cv, spread, spread >= threshold


def full_setup_label(environment: Mapping[str, Any]) -> str:
    """The setup in force of a record's environment: the CPU part (:func:`setup_label`:
    ``jemalloc``, ``glibc+tunables``) and, on CUDA, the GPU part (:func:`gpu_setup_label`:
    ``cudnn.benchmark off``, ``+deterministic``, ``+alloc:<conf>``), comma-separated."""
    return ", ".join(filter(None, [setup_label(environment), gpu_setup_label(environment)]))


def noise_floor(results: Sequence[StabilityResult]) -> float | None:
    """The median CV over the results that have one (None if none has)."""
    cvs = [r.cv for r in results if r.cv is not None]
    return statistics.median(cvs) if cvs else None


def _suite_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run_once(
    spec: StabilityBenchmark,
    *,
    python: str = sys.executable,
    run_args: Sequence[str] = (),
    timeout_s: float = 600,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Measure ``spec`` once in a fresh ``python -m suite run`` process; return its record.

    Never raises for a benchmark failure: a timeout, a crash or an unreadable record becomes a
    record with ``error`` set.
    """
    with tempfile.TemporaryDirectory(prefix="nightbench-stability-") as tmp:
        out = Path(tmp) / "record.json"
        argv = [
            python,
            "-m",
            "suite",
            "run",
            "--model",
            spec.model,
            "--mode",
            spec.mode,
            "--device",
            spec.device,
            "--compiler",
            spec.compiler,
            "--out",
            str(out),
            *run_args,
        ]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=ROOT,
                env=_suite_env(env),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:g} s", "metrics": []}
        if not out.is_file():
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            return {"error": f"exited with code {proc.returncode}: {tail}", "metrics": []}
        try:
            return dict(json.loads(out.read_text()))
        except json.JSONDecodeError as exc:
            return {"error": f"unreadable record: {exc}", "metrics": []}


def _median_latency(record: Mapping[str, Any]) -> float | None:
    for metric in record.get("metrics") or []:
        if metric.get("metric") == "latency":
            return metric.get("median")
    return None


def measure_stability(
    benchmarks: Sequence[StabilityBenchmark],
    repeats: int = 5,
    *,
    python: str = sys.executable,
    run_args: Sequence[str] = (),
    timeout_s: float = 600,
    env: Mapping[str, str] | None = None,
    threshold: float = UNSTABLE_SPREAD,
    on_record: Callable[[StabilityBenchmark, int, dict[str, Any]], None] | None = None,
) -> list[StabilityResult]:
    """Run every benchmark ``repeats`` times, each in its own process, and judge its stability.

    Args:
        benchmarks: what to measure.
        repeats: processes per benchmark (K >= 2).
        python: the interpreter of the environment under test.
        run_args: extra ``python -m suite run`` arguments (e.g. ``["--iterations", "30"]``).
        timeout_s: limit per process (s).
        env: extra environment variables for the processes.
        threshold: spread (fraction) from which a benchmark is unstable over 5 processes
            (TorchBench: 0.07); over the n processes that succeeded, :func:`allowed_spread`.
        on_record: called after each process with the spec, the round (0-based) and the record;
            a progress bar hangs here.

    Returns:
        One :class:`StabilityResult` per benchmark, in the order given.

    Raises:
        ValueError: ``repeats`` < 2 or ``benchmarks`` is empty.
    """
    if repeats < 2:
        raise ValueError(f"repeats must be at least 2, got {repeats}")
    if not benchmarks:
        raise ValueError("no benchmarks to measure")
    records: dict[StabilityBenchmark, list[dict[str, Any]]] = {b: [] for b in benchmarks}
    for round_no in range(repeats):
        for spec in benchmarks:
            record = run_once(spec, python=python, run_args=run_args, timeout_s=timeout_s, env=env)
            records[spec].append(record)
            if on_record is not None:
                on_record(spec, round_no, record)
    results = []
    for spec in benchmarks:
        medians = [
            m for r in records[spec] if not r.get("error") and (m := _median_latency(r)) is not None
        ]
        errors = [str(r["error"]) for r in records[spec] if r.get("error")]
        allowed = allowed_spread(len(medians), threshold) if len(medians) >= 2 else None
        cv, spread, unstable = summarize(medians, threshold if allowed is None else allowed)
        ok = [r for r in records[spec] if not r.get("error")]
        results.append(
            StabilityResult(
                model=spec.model,
                mode=spec.mode,
                device=spec.device,
                compiler=spec.compiler,
                repeats=repeats,
                medians_ms=medians,
                cv=cv,
                spread=spread,
                unstable=unstable,
                threshold=threshold,
                allowed_spread=allowed,
                errors=errors,
                benchmark_version=ok[0].get("benchmark_version") if ok else None,
                environment=dict(ok[0].get("environment") or {}) if ok else {},
                setups=list(
                    dict.fromkeys(full_setup_label(r.get("environment") or {}) for r in ok)
                ),
            )
        )
    return results


def benchmarks_for(
    models: Sequence[Mapping[str, Any]],
    *,
    device: str = "cpu",
    modes: Sequence[str] = ("train", "eval"),
    compiler: str = "eager",
) -> list[StabilityBenchmark]:
    """The benchmarks of ``python -m suite list --json`` entries on ``device``.

    Models that do not list ``device`` or a mode are left out.
    """
    specs = []
    for m in models:
        if device not in m.get("devices", []):
            continue
        for mode in modes:
            if mode in m.get("modes", []):
                specs.append(StabilityBenchmark(m["name"], mode, device, compiler))
    return specs


def list_models_json(
    python: str = sys.executable, env: Mapping[str, str] | None = None, timeout_s: float = 300
) -> list[dict[str, Any]]:
    """``python -m suite list --json`` in the environment of ``python``.

    Raises:
        RuntimeError: the listing failed; its stderr is in the message.
    """
    proc = subprocess.run(
        [python, "-m", "suite", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=_suite_env(env),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -m suite list failed: {proc.stderr.strip()[-2000:]}")
    return list(json.loads(proc.stdout))
