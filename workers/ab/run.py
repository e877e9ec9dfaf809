"""One A/B from request to judged rows: build both commits, measure them interleaved, judge,
and profile what regressed.

Pure of the database and of GitHub: :mod:`workers.ab.store` keeps what this returns and
:mod:`workers.ab.reporting` reports it; ``nightbench ab`` prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.errors import BuildError, InvalidInput, MeasureError
from service.metrics import INSTRUCTIONS
from service.profiles import diff_json
from workers.ab.measure import DEFAULT_PROCESSES, DEFAULT_SAMPLES, Turn, measure_pair
from workers.ab.verdicts import AB_ALPHA, REGRESSION, ABRow, Side, judge_all
from workers.bisect.local_driver import command_benchmarks
from workers.bisect.measure import parse_benchmark
from workers.bisect.profiles import diff_builds, profile_commit
from workers.builds.base import BuildEnvironment, BuildProvider

PROFILED_ROWS = 2
"""Flagged rows profiled (the largest changes first), as a night's profile probe does."""
PROFILE_STEPS = 3
PROFILE_WINDOWS = 5

Progress = Callable[[str], None]
"""A line saying what the A/B does now (``building base abc1234``)."""


@dataclass(frozen=True)
class ABRequest:
    """What to measure.

    Attributes:
        base_sha, head_sha: the commits (the PR's merge base and head).
        benchmarks: suite benchmarks ``MODEL:MODE:DEVICE``.
        commands: benchmark commands instead (``{"samples": [ms, ...]}`` on the last line).
        metrics: what to judge (``latency``, ``cpu_peak_mem``, ``gpu_peak_mem``,
            ``cpu_instructions``).
        processes: processes a side per benchmark.
        samples: timed iterations per process.
        profile: profile the flagged rows (:data:`PROFILED_ROWS` of them).
        timeout_s: seconds one measuring process may take.
    """

    base_sha: str
    head_sha: str
    benchmarks: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("latency", "cpu_peak_mem")
    processes: int = DEFAULT_PROCESSES
    samples: int = DEFAULT_SAMPLES
    profile: bool = True
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if bool(self.benchmarks) == bool(self.commands):
            raise InvalidInput(
                "give either benchmarks (MODEL:MODE:DEVICE) or benchmark commands (not both)"
            )
        for spec in self.benchmarks:
            parse_benchmark(spec)
        if self.processes < 2:
            raise InvalidInput(f"processes: an A/B needs at least 2 a side, got {self.processes}")

    def as_options(self) -> dict[str, Any]:
        """The request as the JSON ``ab_tests.options`` keeps (shas aside)."""
        return {
            "benchmarks": list(self.benchmarks),
            "commands": list(self.commands),
            "metrics": list(self.metrics),
            "processes": self.processes,
            "samples": self.samples,
            "profile": self.profile,
        }

    @classmethod
    def from_options(cls, base_sha: str, head_sha: str, options: Mapping[str, Any]) -> ABRequest:
        """The request :meth:`as_options` wrote.

        Raises:
            InvalidInput: the options are not a valid request.
        """
        return cls(
            base_sha,
            head_sha,
            benchmarks=tuple(options.get("benchmarks") or ()),
            commands=tuple(options.get("commands") or ()),
            metrics=tuple(options.get("metrics") or ("latency", "cpu_peak_mem")),
            processes=int(options.get("processes", DEFAULT_PROCESSES)),
            samples=int(options.get("samples", DEFAULT_SAMPLES)),
            profile=bool(options.get("profile", True)),
        )


@dataclass
class ABOutcome:
    """What an A/B found.

    Attributes:
        rows: the judged rows, flagged first (empty when a build failed).
        measured: benchmark -> metric -> (base side, head side), as measured.
        error: why it could not be measured (a build failed), else None.
        failed_side: ``base`` or ``head`` when ``error`` is a build failure.
        build_seconds: seconds each side took to build (``base``, ``head``).
        profiles: per profiled benchmark ``{"metric", "diff"}`` or ``{"metric", "reason"}``.
        remeasured: benchmarks measured with as many processes more, their first ones leaving
            a change past the threshold not significant.
    """

    rows: list[ABRow] = field(default_factory=list)
    measured: dict[str, dict[str, tuple[Side, Side]]] = field(default_factory=dict)
    error: str | None = None
    failed_side: str | None = None
    build_seconds: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    remeasured: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[ABRow]:
        """The rows that fail the check."""
        return [r for r in self.rows if r.flagged]


def run_ab(
    request: ABRequest,
    provider: BuildProvider,
    *,
    threshold_for: Callable[[str, str], float],
    alpha: float = AB_ALPHA,
    progress: Progress | None = None,
    on_turn: Turn | None = None,
    keep_builds: bool = False,
) -> ABOutcome:
    """Build ``base_sha`` and ``head_sha`` with ``provider``, measure and judge them.

    Args:
        request: what to measure.
        provider: builds a commit into an environment (checkout, python-overlay, wheel).
        threshold_for: ``(metric, benchmark) -> threshold`` (the settings' ``threshold_for``).
        alpha: the rank test's significance level.
        progress: told what happens next, a line at a time.
        on_turn: told before each measuring process.
        keep_builds: leave the builds on disk.

    Returns:
        The :class:`ABOutcome`; a build that fails is its ``error`` (never raised).

    Raises:
        InvalidInput: a malformed benchmark or metric.
    """
    say = progress or (lambda _line: None)
    outcome = ABOutcome()
    envs: dict[str, BuildEnvironment] = {}
    try:
        for side, sha in (("base", request.base_sha), ("head", request.head_sha)):
            say(f"building {side} {sha[:12]}")
            try:
                envs[side] = provider.prepare(sha)
            except BuildError as exc:
                outcome.error = f"the {side} ({sha[:12]}) does not build: {exc.detail()}"
                outcome.failed_side = side
                return outcome
            outcome.build_seconds[side] = envs[side].build_seconds
        named = command_benchmarks(request.commands) if request.commands else {}

        def measure(benchmarks: Sequence[str], commands: Mapping[str, str]) -> Measured:
            return measure_pair(
                envs["base"],
                envs["head"],
                benchmarks=benchmarks,
                commands=list(commands.values()),
                command_names=list(commands),
                metrics=request.metrics,
                processes=request.processes,
                samples=request.samples,
                timeout_s=request.timeout_s,
                on_turn=on_turn,
            )

        say("measuring, base and head interleaved")
        outcome.measured = measure(request.benchmarks, named)
        outcome.rows = judge_all(outcome.measured, threshold_for=threshold_for, alpha=alpha)
        unsure = {r.benchmark for r in outcome.rows if _unsure(r)}
        if unsure:
            say(f"measuring {len(unsure)} unsure benchmark(s) again: as many processes more")
            more = measure(
                [b for b in request.benchmarks if b in unsure],
                {n: c for n, c in named.items() if n in unsure},
            )
            outcome.measured = _merged(outcome.measured, more)
            outcome.remeasured = sorted(unsure)
            outcome.rows = judge_all(outcome.measured, threshold_for=threshold_for, alpha=alpha)
        if request.profile:
            outcome.profiles = _profile_flagged(outcome.rows, envs, request, say)
        return outcome
    finally:
        if not keep_builds:
            for env in envs.values():
                provider.release(env)


Measured = dict[str, dict[str, tuple[Side, Side]]]


def _unsure(row: ABRow) -> bool:
    """A row whose estimate is past its threshold but whose test did not reach ``alpha``: a
    process or two disturbed (a busy host) can hide a real change from six a side, so the
    benchmark is measured again (Kalibera & Jones 2013: add repetitions where the variation
    is)."""
    return (
        row.verdict in ("not significant", "not enough processes")
        and row.ratio is not None
        and abs(row.ratio - 1) > row.threshold
    )


def _merged(first: Measured, more: Measured) -> Measured:
    """``first`` with ``more``'s replicates appended side by side (a side that failed in either
    keeps the failure)."""
    out: Measured = {b: dict(metrics) for b, metrics in first.items()}
    for benchmark, metrics in more.items():
        for metric, (base, head) in metrics.items():
            old = out.setdefault(benchmark, {}).get(metric)
            if old is None:
                out[benchmark][metric] = (base, head)
                continue
            out[benchmark][metric] = (_joined(old[0], base), _joined(old[1], head))
    return out


def _joined(a: Side, b: Side) -> Side:
    return Side(a.values + b.values, a.samples + b.samples, error=a.error or b.error)


def _profile_flagged(
    rows: Sequence[ABRow],
    envs: Mapping[str, BuildEnvironment],
    request: ABRequest,
    say: Progress,
) -> dict[str, dict[str, Any]]:
    """The profile diff of base and head for the largest regressions of suite benchmarks:
    operators and Python functions for latency, callgrind's functions for a count (base
    profiled twice for latency, so that the diff knows the noise)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if len(out) >= PROFILED_ROWS:
            break
        if row.verdict != REGRESSION or row.benchmark not in request.benchmarks:
            continue
        metric = INSTRUCTIONS if row.metric == INSTRUCTIONS else "latency"
        if row.benchmark in out:
            continue
        say(f"profiling {row.benchmark} ({metric}) on base and head")
        options: dict[str, Any] = {"timeout_s": request.timeout_s}
        if metric == "latency":
            options.update(steps=PROFILE_STEPS, windows=PROFILE_WINDOWS, python_functions=True)
        try:
            before = profile_commit(envs["base"], row.benchmark, metric, **options)
            after = profile_commit(envs["head"], row.benchmark, metric, **options)
            repeat = (
                profile_commit(envs["base"], row.benchmark, metric, **options)
                if metric == "latency"
                else None
            )
            diff = diff_builds(before, after, repeat=repeat)
        except (MeasureError, InvalidInput) as exc:
            out[row.benchmark] = {"metric": metric, "reason": _one_line(exc.message)}
            continue
        out[row.benchmark] = {"metric": metric, "diff": diff_json(diff)}
    return out


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
