"""The local driver: a whole bisection on one machine, as ``nightbench bisect`` runs it.

A probe is one commit built by a build provider (:mod:`workers.builds.registry`) and measured
(:mod:`workers.bisect.measure`) for the benchmarks the search asks for (:mod:`workers.bisect.search`).
:func:`bisect_repository` is what ``nightbench bisect`` calls: the commit range from a local
clone, a ``checkout`` build per probe (or another provider; W builds at once), each round's
commits measured interleaved with both endpoints (:func:`run_round`; a count bisection counts
each commit once instead, ``SearchConfig.measure_once``), and a :class:`BisectionReport` with
the outcome and every probe.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from service.errors import InvalidInput
from service.metrics import BISECT_METRICS, INSTRUCTIONS, bisect_once
from workers.bisect.counts import COUNT_SAMPLES, CommandCountMeasurer, SuiteCountMeasurer
from workers.bisect.measure import (
    DEFAULT_MEASURE_TIMEOUT_S,
    CommandMeasurer,
    MeasureError,
    Measurer,
    SuiteMeasurer,
    parse_benchmark,
)
from workers.bisect.report import outcome_json
from workers.bisect.search import (
    BisectionState,
    Outcome,
    ProbeRequest,
    ProbeResult,
    SearchConfig,
    next_probes,
    outcome,
    record_round,
    start,
)
from workers.builds.base import BuildEnvironment, BuildError, BuildProvider
from workers.builds.checkout import CheckoutProvider
from workers.commits import CommitInfo, local_commit_range

__all__ = [
    "BisectionReport",
    "BuildCache",
    "bisect_repository",
    "command_benchmarks",
    "run_bisection",
    "run_probe",
    "run_round",
]


class BuildCache:
    """Builds each commit once per bisection and hands the environment to every probe of it."""

    def __init__(self, provider: BuildProvider) -> None:
        self.provider = provider
        self._envs: dict[str, BuildEnvironment] = {}
        self._failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, sha: str) -> BuildEnvironment:
        """The environment of ``sha``, built on first use.

        Raises:
            BuildError: the commit failed to build (now or on an earlier call).
        """
        with self._lock:
            if sha in self._failed:
                raise BuildError(sha, self._failed[sha])
            if sha in self._envs:
                return self._envs[sha]
        try:
            env = self.provider.prepare(sha)
        except BuildError as exc:
            with self._lock:
                self._failed[sha] = exc.reason
            raise
        with self._lock:
            self._envs[sha] = env
        return env

    def release_all(self) -> None:
        """Remove every environment built."""
        with self._lock:
            envs, self._envs = list(self._envs.values()), {}
        for env in envs:
            self.provider.release(env)


def run_probe(
    request: ProbeRequest, *, build: Callable[[str], BuildEnvironment], measurer: Measurer
) -> ProbeResult:
    """Build (or reuse) a probe's commit and measure the requested benchmarks on that one build.

    Args:
        request: what the search asked for.
        build: ``sha -> BuildEnvironment`` (a provider's ``prepare`` or a
            :class:`BuildCache`'s ``get``); raises :class:`BuildError`.
        measurer: takes the samples.

    Returns:
        The :class:`ProbeResult`: samples per benchmark, or the build failure as ``skipped``, or
        per-benchmark measuring errors.
    """
    try:
        env = build(request.sha)
    except BuildError as exc:
        return ProbeResult(request.sha, request.purpose, skipped=exc.detail())
    samples: dict[str, tuple[float, ...]] = {}
    errors: dict[str, str] = {}
    for benchmark in request.benchmarks:
        try:
            samples[benchmark] = measurer.measure(env, benchmark, request.samples)
        except MeasureError as exc:
            errors[benchmark] = exc.message
    return ProbeResult(
        request.sha, request.purpose, samples, build_seconds=env.build_seconds, errors=errors
    )


@dataclass(frozen=True)
class BisectionReport:
    """A finished bisection: its final state, the outcome, and the commits' details.

    Attributes:
        state: the final :class:`BisectionState`.
        outcome: the :class:`Outcome`.
        commits: :class:`CommitInfo` per sha of the range (good endpoint first).
    """

    state: BisectionState
    outcome: Outcome
    commits: tuple[CommitInfo, ...]

    def as_json(self) -> dict[str, object]:
        """The report ``nightbench bisect --json`` prints.

        Shape::

            {"outcome": "culprit"|"culprits"|"inconclusive"|"not_reproduced",
             "good": sha, "bad": sha, "commits": N, "builds": int, "rounds": int,
             "culprits": [{"sha", "title", "author", "author_email", "pr_number", "date",
                           "benchmarks": [...], "change": {benchmark: fraction}}],
             "benchmarks": [{"benchmark", "status", "culprit", "range": [sha...], "change",
                             "reason"}],
             "skipped": [{"sha", "reason"}],
             "probes": [{"round", "sha", "index", "purpose", "status", "build_seconds", "reason",
                         "results": [{"benchmark", "samples", "vs_good", "vs_bad", "side",
                                      "error", "reference_rounds": [round...]}]}]}

            ``reference_rounds``: the rounds of the endpoint samples the verdicts were judged
            against: the probe's own (latency), or the first round's, whose stored counts a
            count bisection reuses.
        """
        return outcome_json(self.state, self.outcome, {c.sha: c for c in self.commits})


def command_benchmarks(commands: Sequence[str]) -> dict[str, str]:
    """Benchmark names for ``--command`` strings: the command itself (unique per command).

    Raises:
        InvalidInput: an empty or repeated command.
    """
    names: dict[str, str] = {}
    for command in commands:
        text = command.strip()
        if not text:
            raise InvalidInput("command: a benchmark command is empty")
        if text in names:
            raise InvalidInput(f"command: {text!r} is given twice")
        shlex.split(text)  # fails early on unbalanced quotes
        names[text] = text
    return names


RoundHook = Callable[[BisectionState, tuple[ProbeRequest, ...]], None]
ProbeHook = Callable[[ProbeRequest, ProbeResult], None]


def run_round(
    requests: Sequence[ProbeRequest],
    *,
    build: Callable[[str], BuildEnvironment],
    measurer: Measurer,
    workers: int = 1,
    interleave: bool = True,
) -> list[ProbeResult]:
    """Build a round's commits (``workers`` at a time), then measure them interleaved.

    The measuring processes take turns across the round's commits (slot 1: one process of every
    commit, back to back; then slot 2, ...), so that the endpoints measured beside the probes
    see the machine in the same state as the probes, and each sample carries its slot for the
    paired comparison (:func:`workers.bisect.verdicts.paired_sides`). They run one at a time, as
    parallel measurements would slow each other down.

    Args:
        requests: the round (from :func:`workers.bisect.search.next_probes`).
        build: ``sha -> BuildEnvironment``, raising :class:`BuildError`.
        measurer: takes the samples.
        workers: builds at once.
        interleave: take turns as above. False (a count bisection, which measures each commit
            once, ``SearchConfig.measure_once``): each commit's samples are taken whole, in
            turn, by ``measurer.measure`` (as a Celery probe takes them), so a probe that is
            never measured again has all it asked for; no slots are recorded.

    Returns:
        One :class:`ProbeResult` per request, in order.
    """
    envs = _build_round(requests, build=build, workers=workers)
    measure = _measure_interleaved if interleave else _measure_whole
    taken, slot_of, errors = measure(requests, envs, measurer)
    results = []
    for request, env, got, where, failed in zip(
        requests, envs, taken, slot_of, errors, strict=True
    ):
        if isinstance(env, BuildError):
            results.append(ProbeResult(request.sha, request.purpose, skipped=env.detail()))
            continue
        samples = {b: tuple(v) for b, v in got.items() if b not in failed and v}
        results.append(
            ProbeResult(
                request.sha,
                request.purpose,
                samples,
                build_seconds=env.build_seconds,
                errors=failed,
                slots={b: tuple(where[b]) for b in samples if where[b]},
            )
        )
    return results


def _build_round(
    requests: Sequence[ProbeRequest], *, build: Callable[[str], BuildEnvironment], workers: int
) -> list[BuildEnvironment | BuildError]:
    """Build a round's commits, ``workers`` at a time: each request's environment or failure."""

    def attempt(request: ProbeRequest) -> BuildEnvironment | BuildError:
        try:
            return build(request.sha)
        except BuildError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        return list(pool.map(attempt, requests))


def _measure_interleaved(
    requests: Sequence[ProbeRequest],
    envs: Sequence[BuildEnvironment | BuildError],
    measurer: Measurer,
) -> tuple[list[dict[str, list[float]]], list[dict[str, list[int]]], list[dict[str, str]]]:
    """Measure a round's built commits slot by slot (see :func:`run_round`).

    Returns:
        Per request: the samples per benchmark, each sample's slot, and the measuring errors.
    """
    taken: list[dict[str, list[float]]] = [{b: [] for b in r.benchmarks} for r in requests]
    slot_of: list[dict[str, list[int]]] = [{b: [] for b in r.benchmarks} for r in requests]
    errors: list[dict[str, str]] = [{} for _ in requests]
    slots = max(1, min(measurer.processes, max(r.samples for r in requests)))
    # A command may print fewer samples than asked: a few more turns make up the count.
    for slot in range(slots + 3):
        for request, env, got, where, failed in zip(
            requests, envs, taken, slot_of, errors, strict=True
        ):
            if isinstance(env, BuildError):
                continue
            for benchmark in request.benchmarks:
                need = request.samples - len(got[benchmark])
                if benchmark in failed or need <= 0:
                    continue
                want = -(-need // max(slots - slot, 1))
                try:
                    values = measurer.measure_once(env, benchmark, want)
                except MeasureError as exc:
                    failed[benchmark] = exc.message
                    continue
                got[benchmark].extend(values)
                where[benchmark].extend([slot] * len(values))
    return taken, slot_of, errors


def _measure_whole(
    requests: Sequence[ProbeRequest],
    envs: Sequence[BuildEnvironment | BuildError],
    measurer: Measurer,
) -> tuple[list[dict[str, list[float]]], list[dict[str, list[int]]], list[dict[str, str]]]:
    """Measure a round's built commits one after another, each benchmark's samples whole
    (see :func:`run_round`); the same shape as :func:`_measure_interleaved`, with no slots."""
    taken: list[dict[str, list[float]]] = [{b: [] for b in r.benchmarks} for r in requests]
    errors: list[dict[str, str]] = [{} for _ in requests]
    for request, env, got, failed in zip(requests, envs, taken, errors, strict=True):
        if isinstance(env, BuildError):
            continue
        for benchmark in request.benchmarks:
            try:
                got[benchmark].extend(measurer.measure(env, benchmark, request.samples))
            except MeasureError as exc:
                failed[benchmark] = exc.message
    return taken, [{b: [] for b in r.benchmarks} for r in requests], errors


def run_bisection(
    state: BisectionState,
    *,
    build: Callable[[str], BuildEnvironment],
    measurer: Measurer,
    on_round: RoundHook | None = None,
    on_probe: ProbeHook | None = None,
) -> BisectionState:
    """Drive a bisection to its end on this machine, one round at a time (:func:`run_round`).

    Args:
        state: a state from :func:`workers.bisect.search.start` (or a resumed one).
        build: ``sha -> BuildEnvironment``, raising :class:`BuildError`.
        measurer: takes the samples.
        on_round: called with the state and the round's requests before they run.
        on_probe: called after each probe of a round finished.

    Returns:
        The final state (``outcome(state)`` is not None).
    """
    while True:
        requests = next_probes(state)
        if not requests:
            return state
        if on_round:
            on_round(state, requests)
        began = time.monotonic()
        results = run_round(
            requests,
            build=build,
            measurer=measurer,
            workers=state.config.workers,
            interleave=not state.config.measure_once,
        )
        if on_probe:
            for request, result in zip(requests, results, strict=True):
                on_probe(request, result)
        state = record_round(state, results, seconds=time.monotonic() - began)


def bisect_repository(
    repo: str | Path,
    good: str,
    bad: str,
    *,
    benchmarks: Sequence[str] = (),
    commands: Sequence[str] = (),
    install: str = "",
    config: SearchConfig | None = None,
    provider: BuildProvider | None = None,
    work_dir: str | Path | None = None,
    keep_builds: bool = False,
    measure_timeout_s: float = DEFAULT_MEASURE_TIMEOUT_S,
    on_round: RoundHook | None = None,
    on_probe: ProbeHook | None = None,
    metric: str = "latency",
) -> BisectionReport:
    """Bisect ``good..bad`` of a local git repository to the commit(s) that moved latency.

    Args:
        repo: a local clone of a Python package a suite model uses (or any package, with
            ``commands``).
        good: the last good commit.
        bad: the first bad commit.
        benchmarks: suite benchmarks ``MODEL:MODE:DEVICE`` to measure at each probe.
        commands: benchmark commands instead (each its own benchmark, named by its text); run in
            the probe's checkout, last stdout line ``{"samples": [ms, ...]}``.
        install: the install command run in each probe's checkout (``pip install -e .``).
        config: search settings (workers, samples, thresholds); its ``measure_once`` is set
            from ``metric``'s row of the metric table (each build counted once for a count).
        provider: a build provider (default: :class:`CheckoutProvider` with ``install``).
        work_dir: where builds go (default: a temporary directory).
        keep_builds: leave the builds on disk (default: removed at the end).
        measure_timeout_s: seconds one measuring process may take.
        on_round: called with the state and the requests before each round (progress).
        on_probe: called with each request and its result as it ends (progress).
        metric: what a probe measures: ``latency`` (timed samples), or ``cpu_instructions``
            (instructions counted under callgrind: :mod:`workers.bisect.counts`).

    Returns:
        The :class:`BisectionReport`.

    Raises:
        InvalidInput: both or neither of ``benchmarks`` and ``commands``, a malformed benchmark,
            or a bad commit range (see :func:`workers.commits.local_commit_range`).
    """
    if bool(benchmarks) == bool(commands):
        raise InvalidInput("give either --benchmark MODEL:MODE:DEVICE or --command CMD (not both)")
    names, measurer = _names_and_measurer(benchmarks, commands, measure_timeout_s, metric)
    if config is None and metric == INSTRUCTIONS:
        config = SearchConfig(initial_samples=COUNT_SAMPLES[0], max_samples=COUNT_SAMPLES[1])
    config = replace(config or SearchConfig(), measure_once=bisect_once(metric))
    commits = local_commit_range(repo, good, bad)
    provider = provider or CheckoutProvider(repo, install, work_dir=work_dir)
    state = start([c.sha for c in commits], names, config)
    cache = BuildCache(provider)
    try:
        state = run_bisection(
            state, build=cache.get, measurer=measurer, on_round=on_round, on_probe=on_probe
        )
    finally:
        if not keep_builds:
            cache.release_all()
    final = outcome(state)
    assert final is not None  # run_bisection returns only when no probe is left
    return BisectionReport(state=state, outcome=final, commits=tuple(commits))


def _names_and_measurer(
    benchmarks: Sequence[str], commands: Sequence[str], measure_timeout_s: float, metric: str
) -> tuple[tuple[str, ...], Measurer]:
    """The benchmarks' names and their measurer: the suite's, or the commands', timed for
    ``latency`` and counted for ``cpu_instructions``.

    Raises:
        InvalidInput: a malformed or repeated benchmark, an empty or repeated command, or a
            metric a bisection cannot measure.
    """
    if metric not in BISECT_METRICS:
        raise InvalidInput(f"metric: must be one of {', '.join(BISECT_METRICS)}, got {metric!r}")
    counted = metric == INSTRUCTIONS
    measurer: Measurer
    if benchmarks:
        names = tuple(parse_benchmark(b).name for b in benchmarks)
        if len(set(names)) != len(names):
            raise InvalidInput("a benchmark is given twice")
        measurer = (
            SuiteCountMeasurer(timeout_s=measure_timeout_s)
            if counted
            else SuiteMeasurer(timeout_s=measure_timeout_s)
        )
    else:
        named = command_benchmarks(commands)
        names = tuple(named)
        measurer = (
            CommandCountMeasurer(named, timeout_s=measure_timeout_s)
            if counted
            else CommandMeasurer(named, timeout_s=measure_timeout_s)
        )
    return names, measurer
