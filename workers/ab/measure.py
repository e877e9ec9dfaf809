"""Measuring an A/B: the base build and the head build side by side, a process a turn.

Each benchmark is measured in ``processes`` turns; a turn runs one process of each side, base
first on even turns and head first on odd ones (A B, B A, A B, …), so that a host slowing down
or speeding up over the run moves both sides alike instead of the later one. A suite process
gives every metric it records (latency, peak memory); a counted metric (``cpu_instructions``)
is one valgrind process a side after the timed turns (:class:`~workers.bisect.counts.
SuiteCountMeasurer`). A command benchmark gives latency only. A side that fails ends the
benchmark's turns once the other side has had its turn: its error is the row's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidInput, MeasureError
from service.metrics import INSTRUCTIONS, METRICS
from workers.ab.verdicts import Side
from workers.bisect.counts import COUNT_SAMPLES, SuiteCountMeasurer
from workers.bisect.measure import CommandMeasurer, SuiteMeasurer, parse_benchmark
from workers.builds.base import BuildEnvironment

TIMED_METRICS = ("latency", "cpu_peak_mem", "gpu_peak_mem")
"""What an A/B judges from each timed suite process (those the benchmark's device records)."""
DEFAULT_PROCESSES = 6
"""Processes a side per benchmark: the exact rank test's smallest p is then 0.002."""
DEFAULT_SAMPLES = 10
"""Timed iterations per process."""

Turn = Callable[[str, str, int], None]
"""Progress: ``(benchmark, side, turn)`` before each process (side: ``base`` | ``head``)."""


@dataclass
class _Taken:
    values: dict[str, list[float]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    count_error: str | None = None

    def side(self, metric: str) -> Side:
        return Side(
            tuple(self.values.get(metric, ())), self.samples.get(metric, 0), error=self.error
        )


def _record_values(record: dict[str, Any], metrics: Sequence[str]) -> dict[str, list[float]]:
    """Per metric in ``metrics``, the samples a suite record holds."""
    out: dict[str, list[float]] = {}
    for entry in record.get("metrics") or []:
        name = entry.get("metric")
        samples = [float(v) for v in entry.get("samples") or []]
        if name in metrics and samples:
            out[name] = samples
    return out


def measure_pair(
    base: BuildEnvironment,
    head: BuildEnvironment,
    *,
    benchmarks: Sequence[str] = (),
    commands: Sequence[str] = (),
    command_names: Sequence[str] = (),
    metrics: Sequence[str] = ("latency", "cpu_peak_mem"),
    processes: int = DEFAULT_PROCESSES,
    samples: int = DEFAULT_SAMPLES,
    timeout_s: float = 1800.0,
    on_turn: Turn | None = None,
) -> dict[str, dict[str, tuple[Side, Side]]]:
    """Measure every benchmark on both builds, interleaved (see the module docstring).

    Args:
        base: the base build's environment.
        head: the head build's environment.
        benchmarks: suite benchmarks ``MODEL:MODE:DEVICE``.
        commands: benchmark commands instead (last stdout line ``{"samples": [ms, ...]}``, run
            in the build's checkout).
        command_names: the commands' names (same length as ``commands``).
        metrics: what to judge: ``latency``, ``cpu_peak_mem``, ``gpu_peak_mem`` (suite
            benchmarks; those a benchmark's device does not record are left out), and
            ``cpu_instructions`` (counted, CPU suite benchmarks only).
        processes: processes a side per benchmark (at least 2).
        samples: timed iterations per process.
        timeout_s: seconds one process may take.
        on_turn: progress callback before each process.

    Returns:
        benchmark -> metric -> (base side, head side); a benchmark a side failed on has one
        entry, under its first metric, carrying the error.

    Raises:
        InvalidInput: fewer than 2 processes, an unknown metric, a malformed benchmark, or
            commands without as many names.
    """
    if processes < 2:
        raise InvalidInput(f"processes: an A/B needs at least 2 a side, got {processes}")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise InvalidInput(f"metric: unknown {', '.join(unknown)}; one of {', '.join(METRICS)}")
    if len(commands) != len(command_names):
        raise InvalidInput("every benchmark command needs a name")
    timed = [m for m in metrics if m != INSTRUCTIONS]
    counted = INSTRUCTIONS in metrics
    suite = SuiteMeasurer(timeout_s=timeout_s)
    envs = {"base": base, "head": head}
    out: dict[str, dict[str, tuple[Side, Side]]] = {}
    for spec in benchmarks:
        b = parse_benchmark(spec)
        wanted = [m for m in timed if b.device in METRICS[m].devices]

        def suite_values(
            env: BuildEnvironment, name: str = b.name, want: list[str] = wanted
        ) -> dict[str, list[float]]:
            return _record_values(suite.record_once(env, name, samples), want)

        taken = _interleave(b.name, envs, processes if wanted else 0, suite_values, on_turn)
        if counted and b.device == "cpu":
            _count(b.name, envs, taken, timeout_s, on_turn)
        out[b.name] = _sides(taken, [*wanted, *([INSTRUCTIONS] if counted else [])])
    if commands:
        measurer = CommandMeasurer(dict(zip(command_names, commands, strict=True)))
        measurer.timeout_s = timeout_s
        for name_of in command_names:

            def command_values(
                env: BuildEnvironment, name: str = name_of
            ) -> dict[str, list[float]]:
                return {"latency": measurer.measure_once(env, name, samples)}

            taken = _interleave(name_of, envs, processes, command_values, on_turn)
            out[name_of] = _sides(taken, ["latency"])
    return out


def _interleave(
    benchmark: str,
    envs: dict[str, BuildEnvironment],
    processes: int,
    take: Callable[[BuildEnvironment], dict[str, list[float]]],
    on_turn: Turn | None,
) -> dict[str, _Taken]:
    """``processes`` turns of one process a side, base first on even turns; each process's
    values per metric reduced to their median. A side's first failure ends the turns once the
    other side has had its turn too (the row is then a failure, ``fails on head`` or ``base``)."""
    taken = {"base": _Taken(), "head": _Taken()}
    for turn in range(processes):
        for name in ("base", "head") if turn % 2 == 0 else ("head", "base"):
            side = taken[name]
            if side.error is not None:
                continue
            if on_turn:
                on_turn(benchmark, name, turn)
            try:
                values = take(envs[name])
            except MeasureError as exc:
                side.error = exc.message
                continue
            for metric, got in values.items():
                side.values.setdefault(metric, []).append(float(np.median(got)))
                side.samples[metric] = side.samples.get(metric, 0) + len(got)
        if any(t.error is not None for t in taken.values()):
            break  # both sides had their turn: the row is a failure whatever more turns say
    return taken


def _count(
    benchmark: str,
    envs: dict[str, BuildEnvironment],
    taken: dict[str, _Taken],
    timeout_s: float,
    on_turn: Turn | None,
) -> None:
    """One counted process a side: each counted step is a replicate."""
    counter = SuiteCountMeasurer(timeout_s=timeout_s)
    for name in ("base", "head"):
        side = taken[name]
        if side.error is not None:
            continue
        if on_turn:
            on_turn(benchmark, name, -1)
        try:
            counts = counter.measure_once(envs[name], benchmark, COUNT_SAMPLES[0])
        except MeasureError as exc:
            side.values.pop(INSTRUCTIONS, None)
            side.samples[INSTRUCTIONS] = 0
            side.count_error = exc.message
            continue
        side.values[INSTRUCTIONS] = counts
        side.samples[INSTRUCTIONS] = len(counts)


def _sides(taken: dict[str, _Taken], metrics: Sequence[str]) -> dict[str, tuple[Side, Side]]:
    """Per metric, the two sides; one entry only when a side failed (the error is the row)."""
    base, head = taken["base"], taken["head"]
    if base.error is not None or head.error is not None:
        first = metrics[0] if metrics else "latency"
        return {first: (base.side(first), head.side(first))}
    out: dict[str, tuple[Side, Side]] = {}
    for metric in metrics:
        pair = []
        for side in (base, head):
            error = side.count_error if metric == INSTRUCTIONS else None
            values = tuple(side.values.get(metric, ()))
            pair.append(Side(values, side.samples.get(metric, 0), error=error))
        if any(p.values or p.error for p in pair):
            out[metric] = (pair[0], pair[1])
    return out
