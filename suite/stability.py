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

This module is the method, over records: the rounds (:func:`measure_stability`) and the verdict
(:func:`judge`). It starts no process: its caller passes the function that measures a benchmark
once, ``workers.night.stability.run_once`` (``python -m suite run`` through ``workers.runner``,
the one way the suite's subprocess is run; ``suite`` imports no ``workers``). It imports nothing
heavy.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from suite.cpu_setup import setup_label
from suite.gpu_setup import gpu_setup_label

UNSTABLE_SPREAD = 0.07  # TorchBench's STABLE_THRESHOLD in userbenchmark/model-stableness/run.py
REFERENCE_PROCESSES = 5  # the process count UNSTABLE_SPREAD is the rule for (TorchBench's K)


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


def _median_latency(record: Mapping[str, Any]) -> float | None:
    for metric in record.get("metrics") or []:
        if metric.get("metric") == "latency":
            return metric.get("median")
    return None


def measure_stability(
    benchmarks: Sequence[StabilityBenchmark],
    repeats: int = 5,
    *,
    run: Callable[[StabilityBenchmark], Mapping[str, Any]],
    threshold: float = UNSTABLE_SPREAD,
    on_record: Callable[[StabilityBenchmark, int, dict[str, Any]], None] | None = None,
) -> list[StabilityResult]:
    """Run every benchmark ``repeats`` times, each in its own process, and judge its stability.

    Round r runs every benchmark once, in the order given (module docstring: a drift of the
    machine spreads over all benchmarks).

    Args:
        benchmarks: what to measure.
        repeats: processes per benchmark (K >= 2).
        run: measures a benchmark once in a fresh process and returns its record (a suite
            record, ``suite/records.py``; ``error`` set when the process failed), e.g.
            ``workers.night.stability.run_once``. Never raises for a benchmark's failure.
        threshold: spread (fraction) from which a benchmark is unstable over 5 processes
            (TorchBench: 0.07); over the n processes that succeeded, :func:`allowed_spread`.
        on_record: called after each process with the spec, the round (0-based) and the record;
            a progress bar hangs here.

    Returns:
        One :class:`StabilityResult` per benchmark, in the order given (:func:`judge`).

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
            record = dict(run(spec))
            records[spec].append(record)
            if on_record is not None:
                on_record(spec, round_no, record)
    return [judge(spec, records[spec], threshold=threshold) for spec in benchmarks]


def judge(
    spec: StabilityBenchmark,
    records: Sequence[Mapping[str, Any]],
    *,
    threshold: float = UNSTABLE_SPREAD,
) -> StabilityResult:
    """The verdict on ``spec`` from the records of its processes, one per process.

    Args:
        spec: the benchmark.
        records: its processes' suite records, in run order; one with ``error`` set counts as a
            failed process, one without a latency metric is left out of the medians.
        threshold: the spread (fraction) from which it is unstable over 5 processes; over the
            n processes that succeeded, :func:`allowed_spread` of it.

    Returns:
        The :class:`StabilityResult` (``repeats`` is ``len(records)``; ``unstable`` is None when
        fewer than two processes gave a median).

    Raises:
        ValueError: a median latency is not a positive finite number (:func:`summarize`).
    """
    medians = [m for r in records if not r.get("error") and (m := _median_latency(r)) is not None]
    errors = [str(r["error"]) for r in records if r.get("error")]
    allowed = allowed_spread(len(medians), threshold) if len(medians) >= 2 else None
    cv, spread, unstable = summarize(medians, threshold if allowed is None else allowed)
    ok = [r for r in records if not r.get("error")]
    return StabilityResult(
        model=spec.model,
        mode=spec.mode,
        device=spec.device,
        compiler=spec.compiler,
        repeats=len(records),
        medians_ms=medians,
        cv=cv,
        spread=spread,
        unstable=unstable,
        threshold=threshold,
        allowed_spread=allowed,
        errors=errors,
        benchmark_version=ok[0].get("benchmark_version") if ok else None,
        environment=dict(ok[0].get("environment") or {}) if ok else {},
        setups=list(dict.fromkeys(full_setup_label(r.get("environment") or {}) for r in ok)),
    )


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
