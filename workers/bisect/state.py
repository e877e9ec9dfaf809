"""The bisection's data: its settings, what it asks for, what it is given, what it remembers.

Frozen dataclasses only; the search that reads and extends them is :mod:`workers.bisect.search`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from service.errors import InvalidInput
from service.models import BisectionOutcome
from workers.bisect.verdicts import Batch

CULPRIT, CULPRITS, INCONCLUSIVE, NOT_REPRODUCED = (
    BisectionOutcome.CULPRIT,
    BisectionOutcome.CULPRITS,
    BisectionOutcome.INCONCLUSIVE,
    BisectionOutcome.NOT_REPRODUCED,
)
OUTCOMES = tuple(BisectionOutcome)

ENDPOINT, SEARCH, REFINE, VERIFY, REFERENCE, RECHECK = (
    "endpoint",
    "search",
    "refine",
    "verify",
    "reference",
    "recheck",
)
MEASURED, SKIPPED = "measured", "skipped"


@dataclass(frozen=True)
class SearchConfig:
    """How the search measures and decides.

    Attributes:
        workers: W, the commits probed per round ((W+1)-ary search).
        initial_samples: samples per benchmark at a new probe.
        max_samples: cap per commit and benchmark; doubling stops there.
        alpha: low threshold of the verdicts (Pinpoint: 0.01).
        power: quantile of the simulated high threshold.
        resamples: redraws for the high threshold.
        min_change: the endpoints' medians must differ by at least this fraction, or the
            regression counts as not reproduced; without slots, a smaller change is measured
            again (the endpoints' samples doubled up to ``max_samples``, in rounds of their
            own) before that is concluded, as one round's samples share one moment of the host.
        verify: re-measure parent and culprit with fresh samples before naming the culprit.
        slower: the direction of the regression bisected, when known: True, the bad endpoint
            must measure slower (higher) than the good one, as for a nightly's latency
            regression; an endpoint change the other way is then not the regression, and ends
            ``not_reproduced`` (after the same doubling of samples as a change too small).
            None: either direction counts (a range given by hand).
        side_error: the chance that a commit's side, or the endpoints' step, is decided wrong
            over all the looks its doubling takes (spent evenly: with 12 to 48 samples, three
            looks at 0.01 each); a wrong side is what the verification and its recovery catch.
        budget_builds: distinct commits a benchmark's search may build, endpoints included;
            None: ⌈log2(N+1)⌉ + 2 + 6 (the floor, the endpoints, and room for two recoveries).
        budget_samples: samples of one benchmark over the whole bisection, every commit and
            round together; None: 60 × ``max_samples``.
        budget_seconds: wall time of the bisection's rounds (s, builds and measuring); None: no
            limit. Once a budget is spent the benchmark ends ``inconclusive`` with the narrowest
            range its measurements support.
        measure_once: each commit is measured once per benchmark and its samples are reused by
            every later comparison: for an exact count (``KindRule.bisect_once`` in
            ``service/metrics.py``), which neither the host nor a fresh process moves. A round
            then measures only what was not measured yet (the endpoints in the first round,
            then normally the new probes alone), every probe is compared with the endpoints'
            stored samples, an undecided commit is not measured again (``max_samples`` is
            not used), and a culprit is verified on the stored samples of its parent and itself
            rather than on fresh ones. False (latency): the endpoints are measured again beside
            every round's probes, which are compared with those of their own round.
    """

    workers: int = 1
    initial_samples: int = 12
    max_samples: int = 48
    alpha: float = 0.01
    power: float = 0.99
    resamples: int = 200
    min_change: float = 0.05
    verify: bool = True
    slower: bool | None = None
    side_error: float = 0.03
    budget_builds: int | None = None
    budget_samples: int | None = None
    budget_seconds: float | None = None
    measure_once: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidInput(f"workers must be at least 1, got {self.workers}")
        if self.initial_samples < 3:
            raise InvalidInput(f"initial_samples must be at least 3, got {self.initial_samples}")
        if self.max_samples < self.initial_samples:
            raise InvalidInput(
                f"max_samples ({self.max_samples}) must be at least initial_samples "
                f"({self.initial_samples})"
            )
        if not 0 < self.alpha < 1 or not 0 < self.power < 1 or not 0 < self.side_error < 1:
            raise InvalidInput(
                f"alpha, power and side_error must lie in (0, 1), got {self.alpha}, "
                f"{self.power}, {self.side_error}"
            )
        if self.min_change < 0:
            raise InvalidInput(f"min_change must not be negative, got {self.min_change}")
        for name in ("budget_builds", "budget_samples", "budget_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidInput(f"{name} must be positive, got {value}")

    @property
    def looks(self) -> int:
        """How often one commit's side can be tested as its samples double to the cap."""
        return 1 + max(0, math.ceil(math.log2(self.max_samples / self.initial_samples)))

    @property
    def look_alpha(self) -> float:
        """Each test's one-sided error rate: ``side_error`` spent evenly over :attr:`looks` (the
        Bonferroni bound of a group-sequential test), so a side decided at any look is wrong
        with probability at most ``side_error``."""
        return self.side_error / self.looks

    def builds_allowed(self, commits: int) -> int:
        """The build budget for a range of ``commits`` commits after the good one."""
        if self.budget_builds is not None:
            return self.budget_builds
        return floor_builds(commits) + 2 + 6

    def samples_allowed(self) -> int:
        """The sample budget of one benchmark."""
        return self.budget_samples if self.budget_samples is not None else 60 * self.max_samples


@dataclass(frozen=True)
class ProbeRequest:
    """One commit to measure in the coming round.

    Attributes:
        sha: the commit.
        index: its position in the range (0 = good endpoint).
        benchmarks: the benchmarks to measure there.
        samples: how many new samples of each benchmark to take.
        purpose: ``endpoint`` | ``search`` | ``refine`` (more samples for an undecided probe) |
            ``verify`` (fresh samples of a parent or culprit) | ``reference`` (an endpoint
            measured again beside the round's other probes) | ``recheck`` (after a failed
            verification, fresh samples of the commits nearest the boundary, which then decide
            their side).
    """

    sha: str
    index: int
    benchmarks: tuple[str, ...]
    samples: int
    purpose: str


@dataclass(frozen=True)
class ProbeResult:
    """What measuring a :class:`ProbeRequest` gave.

    Attributes:
        sha: the commit.
        purpose: the request's purpose.
        samples: new samples per benchmark (ms); a benchmark missing here failed to measure.
        build_seconds: build wall time (s), None when no build was attempted.
        skipped: why the commit could not be built (None when it was built).
        errors: per benchmark, why it could not be measured.
        slots: per benchmark, the measuring slot of each sample (same length as its samples)
            when the round's commits were measured interleaved, slot by slot (the local driver):
            samples of one slot were taken back to back across the round's commits. Empty when
            each probe was measured on its own (Celery workers).
    """

    sha: str
    purpose: str
    samples: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    build_seconds: float | None = None
    skipped: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)
    slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkVerdict:
    """One benchmark at one probe, as recorded.

    Attributes:
        benchmark: the benchmark's name.
        samples: the samples taken in this probe (ms).
        vs_good: verdict against the good endpoint (None at the good endpoint itself).
        vs_bad: verdict against the bad endpoint (None at the bad endpoint itself).
        side: ``good`` | ``bad`` | ``undecided`` on all samples of this commit so far.
        error: why the benchmark could not be measured here.
        reference_rounds: the rounds whose endpoint samples ``vs_good`` and ``vs_bad`` were
            judged against: this probe's own round when the endpoints were measured beside it;
            an earlier round when their stored counts were reused
            (:attr:`SearchConfig.measure_once`); empty when nothing was compared. Where the
            samples came from, not what they say: left out of equality, so a verdict read back
            from a store that keeps no provenance equals the one recorded.
    """

    benchmark: str
    samples: tuple[float, ...]
    vs_good: str | None
    vs_bad: str | None
    side: str | None
    error: str | None = None
    reference_rounds: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class ProbeRecord:
    """One probe: a commit measured (or skipped) in one round.

    Attributes:
        round: the round (0 = endpoints).
        sha: the commit.
        index: its position in the range.
        purpose: see :class:`ProbeRequest`.
        status: ``measured`` | ``skipped``.
        build_seconds: build wall time (s), None when not built.
        results: one :class:`BenchmarkVerdict` per measured benchmark.
        reason: why it was skipped.
    """

    round: int
    sha: str
    index: int
    purpose: str
    status: str
    build_seconds: float | None
    results: tuple[BenchmarkVerdict, ...]
    reason: str | None = None


def frozen_mapping(mapping: Mapping) -> Mapping:
    """A read-only copy of ``mapping`` (the state's mappings are never changed in place)."""
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class BisectionState:
    """Everything the search knows; never mutated (each step returns a new state).

    Attributes:
        commits: the range in first-parent order, good endpoint first, bad endpoint last.
        benchmarks: the regressed benchmarks to bisect.
        config: the :class:`SearchConfig`.
        round: the number of rounds recorded.
        samples: ``(sha, benchmark) -> batches``: every :class:`Batch` of samples taken, in
            round order. A probe is judged against the endpoints' batches of the same rounds.
        skipped: ``sha -> reason`` for commits that failed to build.
        errors: ``(sha, benchmark) -> reason`` for benchmarks that failed to measure.
        probes: every probe recorded, in order.
        seconds: wall time of the rounds recorded (s), as the drivers report it.
    """

    commits: tuple[str, ...]
    benchmarks: tuple[str, ...]
    config: SearchConfig
    round: int = 0
    samples: Mapping[tuple[str, str], tuple[Batch, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    skipped: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    errors: Mapping[tuple[str, str], str] = field(default_factory=lambda: MappingProxyType({}))
    probes: tuple[ProbeRecord, ...] = ()
    seconds: float = 0.0

    @property
    def good(self) -> str:
        """The good endpoint's sha (the first commit of the range)."""
        return self.commits[0]

    @property
    def bad(self) -> str:
        """The bad endpoint's sha (the last commit of the range)."""
        return self.commits[-1]

    @property
    def builds(self) -> int:
        """Distinct commits built (or attempted), endpoints included."""
        return len({p.sha for p in self.probes})


def start(
    commits: Sequence[str], benchmarks: Sequence[str], config: SearchConfig | None = None
) -> BisectionState:
    """The initial state of a bisection.

    Args:
        commits: ``[good, c1, ..., bad]`` in first-parent order (see
            :func:`workers.commits.local_commit_range`); at least two distinct commits.
        benchmarks: the regressed benchmarks, at least one, distinct.
        config: search settings (defaults when None).

    Raises:
        InvalidInput: fewer than two commits, a repeated commit or benchmark, or no benchmark.
    """
    commits = tuple(commits)
    benchmarks = tuple(benchmarks)
    if len(commits) < 2:
        raise InvalidInput("a commit range needs a good and a bad commit")
    if len(set(commits)) != len(commits):
        raise InvalidInput("the commit range repeats a commit")
    if not benchmarks:
        raise InvalidInput("name at least one benchmark to bisect")
    if len(set(benchmarks)) != len(benchmarks):
        raise InvalidInput("the benchmarks to bisect repeat a name")
    return BisectionState(commits=commits, benchmarks=benchmarks, config=config or SearchConfig())


@dataclass(frozen=True)
class BenchmarkOutcome:
    """The answer for one benchmark.

    Attributes:
        benchmark: its name.
        status: ``culprit`` | ``inconclusive`` | ``not_reproduced``.
        culprit: the culprit's sha (``culprit`` only).
        range: for ``inconclusive``, the commits that may hold the culprit (after the last good
            commit, up to the first bad one); for ``culprit``, just the culprit.
        change: relative change of the median, bad endpoint against good (0.2 = 20% slower).
        reason: why it is inconclusive or not reproduced.
    """

    benchmark: str
    status: str
    culprit: str | None
    range: tuple[str, ...]
    change: float | None
    reason: str = ""


@dataclass(frozen=True)
class Outcome:
    """The answer of a bisection.

    Attributes:
        kind: ``culprit`` (one commit for every found benchmark) | ``culprits`` (several) |
            ``inconclusive`` (no culprit named; see ``benchmarks`` for the narrowed ranges) |
            ``not_reproduced``.
        benchmarks: one :class:`BenchmarkOutcome` per benchmark.
        culprits: ``sha -> benchmarks`` it is the culprit of, in range order.
        skipped: ``(sha, reason)`` for commits that failed to build.
        builds: distinct commits built, endpoints included.
        rounds: rounds of probes.
    """

    kind: str
    benchmarks: tuple[BenchmarkOutcome, ...]
    culprits: tuple[tuple[str, tuple[str, ...]], ...]
    skipped: tuple[tuple[str, str], ...]
    builds: int
    rounds: int


def floor_builds(n: int) -> int:
    """⌈log2(N+1)⌉: the fewest probes that can tell N+1 possibilities apart (N commits)."""
    return math.ceil(math.log2(n + 1)) if n > 0 else 0
