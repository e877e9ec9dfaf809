"""Bisect a benchmark that fails to the commit that broke it: ``git bisect run`` for failures.

A benchmark that ran at its last good night's build and fails at the first failing night's has,
in the commit range between them, a first commit at which it fails. The latency search
(:mod:`workers.bisect.search`) cannot look for it: a failing benchmark gives no samples. This
search works on pass/fail runs instead: a probe builds one commit and runs the benchmark in
``runs`` (2) suite processes; each run *ran* (the benchmark gave samples) or *failed* (the
suite reported an error, which is kept); a commit that does not build is *skipped*.

Method (``git bisect run``'s, generalised to W probes per round as the latency search is, with
each commit judged by the majority of its runs, since benchmarks do fail now and then):

1. Round 0 probes both endpoints. The good one must run and the bad one fail; otherwise the
   failure is not the build's (a benchmark failing now and then, a machine that ran out of
   memory that night) and the outcome is ``not_reproduced``, with what each endpoint gave.
2. A commit *runs* when most of its runs ran, *fails* when most failed; a tie is probed again
   in the next round, and a commit still tied after that *wavers* and is stepped around like
   one that does not build.
3. Each later round probes W commits spread evenly over the interval between the latest commit
   that runs and the earliest commit that fails (and the tied ones again). A commit that does
   not build is skipped and the nearest buildable commit of the interval is probed instead
   (``git bisect skip``).
4. When the interval closes on a parent that runs and its child that fails, both are probed
   once more; the child is named the culprit only when every run of that probe agrees.

A probe that fails *differently* from the night (another exception, a timeout, a crash where
the night raised) cannot say whether the night's failure is there: another bug fixed later can
sit inside the range, and ``git bisect`` would converge on it. The search is given the night's
error; a run whose error has another signature (:func:`failure_signature`: the exception's
type, a timeout, a crash's exit status) counts as neither ran nor failed, and a commit left
with no run either way is stepped around like one that does not build (``git bisect skip``).
An error with no recognisable signature counts as the failure, as before.

A failure that comes and goes is never named: a commit that runs after one that fails, or a
last probe that disagrees, ends ``inconclusive`` with a range widened to the next commit
judged on the side that disagreed; so does an interval whose only commits left did not build
or waver. Everything here is pure: :mod:`workers.bisect.failure_driver` builds and runs the
probes (``benchmarks/failure_bisection.py`` measures how often the answer is right, wrong or a
range).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace

from service.errors import InvalidInput
from workers.bisect.state import CULPRIT, ENDPOINT, INCONCLUSIVE, NOT_REPRODUCED, SEARCH, VERIFY

RAN, FAILED, MIXED, SKIPPED, OTHER = "ran", "failed", "mixed", "skipped", "other"
RUNS = 2
"""Suite processes a probe runs the benchmark in."""

__all__ = [
    "FAILED",
    "MIXED",
    "OTHER",
    "RAN",
    "RUNS",
    "SKIPPED",
    "FailureOutcome",
    "FailureProbe",
    "FailureSearch",
    "failure_outcome",
    "failure_signature",
    "next_failure_probes",
    "record_failures",
    "start_failure_search",
]

_EXCEPTION = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))\b")
_NAMED = re.compile(r"^(?:[\w.\-]+(?::[\w.\-]+)+: )?([A-Z][\w.]*)(?=: | \(at |$)")
_TIMEOUT = re.compile(r"\btimed out\b|\bdid not finish in\b")
_EXIT = re.compile(r"\bexit(?:ed with (?:status|code))? (-?\d+)")
_KILLED = re.compile(r"\bkilled by (SIG[A-Z]+)")


def failure_signature(error: str | None) -> str | None:
    """What kind of failure an error text is, to tell the night's failure from another one.

    Args:
        error: a benchmark's error as a night's job or a probe stores it
            (``"RuntimeError: mat1 and mat2 shapes cannot be multiplied (at models/x.py:12 in
            forward)"``, ``"tokbag:eval:cpu: ValueError: ..."``, ``"timed out after 900 s"``,
            ``"... wrote no record (exit -9): ..."``).

    Returns:
        The type that opens the text (``"RuntimeError"``, ``"Unsupported"``; after a
        probe's ``model:mode:device:`` prefix; the suite names every out-of-memory
        ``OutOfMemoryError``), else the first exception type named in it (a traceback's tail
        after ``exited with code 1:``), else
        ``"timeout"`` for a run that did not finish, else ``"exit N"`` for a process that
        ended without a record (a signal as its negative number: ``killed by SIGKILL`` is
        ``exit -9``), else None (unknown: matched by anything). The message is left out: it
        names shapes, addresses and lines that change from commit to commit.
    """
    text = (error or "").strip()
    if found := _NAMED.search(text) or _EXCEPTION.search(text):
        return found.group(1).rsplit(".", 1)[-1]
    if _TIMEOUT.search(text):
        return "timeout"
    if found := _EXIT.search(text):
        return f"exit {found.group(1)}"
    if (found := _KILLED.search(text)) and found.group(1) in signal.Signals.__members__:
        return f"exit {-signal.Signals[found.group(1)].value}"
    return None


@dataclass(frozen=True)
class FailureProbe:
    """One commit built and run for a failure bisection.

    Attributes:
        index: position in the commit range (0 = good endpoint).
        sha: the commit.
        purpose: ``endpoint`` | ``search`` | ``verify``.
        ran: runs in which the benchmark ran.
        failed: runs in which it failed as the night did.
        detail: the benchmark's error when a run failed; why the commit did not build when
            skipped.
        other: runs in which it failed differently from the night (set by
            :func:`record_failures` from ``detail``'s signature; counted neither way).
        skipped: the commit did not build (no run).
        round: the round it was probed in (set by :func:`record_failures`).
        build_seconds: how long its build took, when built.
    """

    index: int
    sha: str
    purpose: str
    ran: int = 0
    failed: int = 0
    detail: str | None = None
    skipped: bool = False
    round: int = 0
    build_seconds: float | None = None
    other: int = 0

    @property
    def status(self) -> str:
        """``skipped``; ``other`` (no run either way: every run failed differently); else
        ``ran`` (no run failed as the night), ``failed`` (none ran) or ``mixed``."""
        if self.skipped:
            return SKIPPED
        if not self.ran and not self.failed:
            return OTHER
        return FAILED if not self.ran else RAN if not self.failed else MIXED


@dataclass(frozen=True)
class FailureSearch:
    """A failure bisection's state: its range, its benchmark and every probe so far.

    Attributes:
        commits: the range in first-parent order, ``commits[0]`` the good endpoint (the last
            good night's build), ``commits[-1]`` the bad one (the first failing night's).
        benchmark: the failing benchmark (``model:mode:device[:compiler]``).
        workers: W, the commits probed per round.
        round: the next round's number (rounds recorded so far).
        probes: every probe, in the order recorded.
        signature: the night's failure (:func:`failure_signature` of its error), or None to
            count every failure as it.
    """

    commits: tuple[str, ...]
    benchmark: str
    workers: int = 1
    round: int = 0
    probes: tuple[FailureProbe, ...] = ()
    signature: str | None = None


@dataclass(frozen=True)
class FailureOutcome:
    """What a failure bisection found.

    Attributes:
        kind: ``culprit`` | ``inconclusive`` | ``not_reproduced``.
        culprit: the first failing commit (``culprit`` only).
        range: the commits that may hold the culprit, oldest first (the culprit alone once
            found; the whole range when not reproduced).
        reason: one sentence for the issue and the report.
        error: the benchmark's error at the culprit (or at the earliest commit that failed).
        builds: distinct commits built.
        rounds: rounds run.
    """

    kind: str
    culprit: str | None
    range: tuple[str, ...]
    reason: str
    error: str | None
    builds: int
    rounds: int


def start_failure_search(
    commits: Sequence[str], benchmark: str, workers: int = 1, error: str | None = None
) -> FailureSearch:
    """A new failure bisection of ``commits`` (good endpoint first) for ``benchmark``, whose
    night failed with ``error`` (None: every failure counts as the night's).

    Raises:
        InvalidInput: fewer than two commits, a commit twice, no benchmark, or ``workers`` < 1.
    """
    if len(commits) < 2:
        raise InvalidInput("a failure bisection needs a good and a bad commit")
    if len(set(commits)) != len(commits):
        raise InvalidInput("commits: a commit appears twice in the range")
    if not benchmark:
        raise InvalidInput("benchmark: a failure bisection needs the failing benchmark")
    if workers < 1:
        raise InvalidInput(f"workers must be at least 1, got {workers}")
    return FailureSearch(tuple(commits), benchmark, workers, signature=failure_signature(error))


def next_failure_probes(state: FailureSearch) -> list[FailureProbe]:
    """The probes of the next round (no runs yet: ``ran`` and ``failed`` 0), or ``[]`` when the
    search has ended (:func:`failure_outcome`)."""
    decided = _decide(state)
    if isinstance(decided, FailureOutcome):
        return []
    return [FailureProbe(i, state.commits[i], purpose, round=state.round) for i, purpose in decided]


def record_failures(state: FailureSearch, results: Sequence[FailureProbe]) -> FailureSearch:
    """Fold one round's results in; the next state.

    Raises:
        InvalidInput: the results are not the round :func:`next_failure_probes` asked for
            (another commit or purpose), or a built probe without a run.
    """
    wanted = [(p.index, p.purpose) for p in next_failure_probes(state)]
    given = [(r.index, r.purpose) for r in results]
    if sorted(given) != sorted(wanted):
        raise InvalidInput(
            f"round {state.round}: expected probes {sorted(wanted)}, got {sorted(given)}"
        )
    for r in results:
        if (
            r.sha != state.commits[r.index]
            or r.ran < 0
            or r.failed < 0
            or not (r.skipped or r.ran + r.failed + r.other)
        ):
            raise InvalidInput(
                f"round {state.round}: probe {r.index} ({r.sha[:10]}) has no run "
                "or the wrong commit"
            )
    rows = tuple(
        _judged(replace(r, round=state.round), state.signature)
        for r in sorted(results, key=lambda r: r.index)
    )
    return replace(state, round=state.round + 1, probes=state.probes + rows)


def _judged(probe: FailureProbe, signature: str | None) -> FailureProbe:
    """``probe`` with its failed runs moved to ``other`` when its error's signature is known
    and not the night's."""
    seen = failure_signature(probe.detail)
    if not probe.failed or signature is None or seen is None or seen == signature:
        return probe
    return replace(probe, failed=0, other=probe.other + probe.failed)


def failure_outcome(state: FailureSearch) -> FailureOutcome | None:
    """The answer once no probe is left, else None."""
    decided = _decide(state)
    return decided if isinstance(decided, FailureOutcome) else None


def _verdicts(s: FailureSearch) -> dict[int, str]:
    """Each probed commit's verdict from its search and endpoint probes (not the verification):
    ``ran``/``failed`` by the majority of its runs, ``other`` when every run failed
    differently from the night, ``mixed`` for a tie probed once (probe it again), ``skipped``
    when it did not build or is still tied after two probes (wavers)."""
    runs: dict[int, list[FailureProbe]] = {}
    for p in s.probes:
        if p.purpose != VERIFY:
            runs.setdefault(p.index, []).append(p)
    out = {}
    for i, probes in runs.items():
        ran, failed = sum(p.ran for p in probes), sum(p.failed for p in probes)
        if any(p.skipped for p in probes):
            out[i] = SKIPPED
        elif not ran and not failed:
            out[i] = OTHER
        elif ran != failed:
            out[i] = RAN if ran > failed else FAILED
        else:
            out[i] = MIXED if len(probes) < 2 else SKIPPED
    return out


def _decide(s: FailureSearch) -> FailureOutcome | list[tuple[int, str]]:
    """The next round's ``(index, purpose)`` pairs, or the outcome."""
    last = len(s.commits) - 1
    if s.round == 0:
        return [(0, ENDPOINT), (last, ENDPOINT)]
    seen = _verdicts(s)
    if seen[0] == MIXED or seen[last] == MIXED:
        return [(i, ENDPOINT) for i in (0, last) if seen[i] == MIXED]
    if seen[0] != RAN or seen[last] != FAILED:
        return _end(s, NOT_REPRODUCED, None, range(1, last + 1), _unreproduced(s, seen))
    hi = min(i for i, v in seen.items() if v == FAILED)
    lo = max(i for i, v in seen.items() if v == RAN and i < hi)
    later = [i for i, v in seen.items() if v == RAN and i > hi]
    if later:
        return _end(
            s,
            INCONCLUSIVE,
            None,
            range(lo + 1, max(later) + 1),
            (
                f"it ran at {s.commits[max(later)][:10]}, after failing at {s.commits[hi][:10]}: "
                "the failure comes and goes, so no commit is named"
            ),
        )
    tied = [i for i in range(lo + 1, hi) if seen.get(i) == MIXED]
    open_ = [i for i in range(lo + 1, hi) if i not in seen]
    if tied or open_:
        fresh = _spread(open_, lo, hi, max(s.workers - len(tied), 0)) if open_ else []
        return sorted([(i, SEARCH) for i in tied + fresh])
    if hi > lo + 1:
        return _end(
            s,
            INCONCLUSIVE,
            None,
            range(lo + 1, hi + 1),
            (
                f"the {hi - lo - 1} commit(s) between {s.commits[lo][:10]} (runs) and "
                f"{s.commits[hi][:10]} (fails) did not build, failed differently, or ran and "
                "failed by turns"
            ),
        )
    return _verify(s, seen, lo, hi)


def _verify(
    s: FailureSearch, seen: dict[int, str], lo: int, hi: int
) -> FailureOutcome | list[tuple[int, str]]:
    """Parent ``lo`` and child ``hi`` probed once more: the culprit when every run agrees,
    else a range widened to the next commit judged on the side that disagreed."""
    again = {p.index: p for p in s.probes if p.purpose == VERIFY}
    if not again:
        return [(lo, VERIFY), (hi, VERIFY)]
    parent, child = again[lo], again[hi]
    if parent.status == RAN and child.status == FAILED:
        ran = [p for p in s.probes if p.index == lo]
        failed = [p for p in s.probes if p.index == hi]
        return _end(
            s,
            CULPRIT,
            hi,
            range(hi, hi + 1),
            (
                f"it runs at its parent {s.commits[lo][:10]} ({_count(ran, 'ran')}) and fails from "
                f"{s.commits[hi][:10]} on ({_count(failed, 'failed')})"
            ),
        )
    first = (
        max([i for i, v in seen.items() if v == RAN and i < lo], default=0)
        if parent.status != RAN
        else lo
    )
    end = (
        min([i for i, v in seen.items() if v == FAILED and i > hi], default=len(s.commits) - 1)
        if child.status != FAILED
        else hi
    )
    return _end(
        s,
        INCONCLUSIVE,
        None,
        range(first + 1, end + 1),
        (
            f"probed again, {s.commits[lo][:10]} {_word(parent)} and {s.commits[hi][:10]} "
            f"{_word(child)}: the failure comes and goes, so no commit is named"
        ),
    )


def _spread(open_: list[int], lo: int, hi: int, workers: int) -> list[int]:
    """Up to ``workers`` (at least one) of the unprobed indices ``open_`` (all inside
    ``(lo, hi)``), each the nearest to one of the points that cut ``[lo, hi]`` into equal
    parts."""
    workers = max(workers, 1)
    chosen: list[int] = []
    for k in range(1, workers + 1):
        target = lo + (hi - lo) * k / (workers + 1)
        left = [i for i in open_ if i not in chosen]
        if not left:
            break
        chosen.append(min(left, key=lambda i: (abs(i - target), i)))
    return sorted(chosen)


def _count(probes: Sequence[FailureProbe], what: str) -> str:
    """``"4 of 4 runs"``: how many of the probes' runs ``ran`` or ``failed``."""
    n = sum(p.ran + p.failed for p in probes)
    return f"{sum(getattr(p, what) for p in probes)} of {n} runs"


def _word(p: FailureProbe) -> str:
    if p.status == MIXED:
        return f"ran {p.ran} and failed {p.failed} of {p.ran + p.failed} runs"
    if p.status == OTHER:
        return _differently(p)
    return {RAN: "ran", FAILED: "failed", SKIPPED: "did not build"}[p.status]


def _differently(p: FailureProbe) -> str:
    return f"failed differently ({failure_signature(p.detail)})"


def _unreproduced(s: FailureSearch, seen: dict[int, str]) -> str:
    last = len(s.commits) - 1
    words = {RAN: "runs", FAILED: "fails", SKIPPED: "did not build, or ran and failed by turns"}

    def word(i: int) -> str:
        if seen[i] != OTHER:
            return words[seen[i]]
        (probe, *_) = [p for p in s.probes if p.index == i and p.other]
        return f"{_differently(probe)} from the night ({s.signature})"

    parts = []
    if seen[0] != RAN:
        parts.append(
            f"the last good build {s.commits[0][:10]} {word(0)}"
            + ("" if seen[0] == OTHER else " too")
        )
    if seen[last] != FAILED:
        parts.append(f"the first failing build {s.commits[last][:10]} {word(last)}")
    return "; ".join(parts) + (
        ": the failure is not this range's (it comes and goes, or the night's machine caused it)"
    )


def _end(
    s: FailureSearch, kind: str, culprit: int | None, span: range, reason: str
) -> FailureOutcome:
    failed = [p for p in s.probes if p.failed and p.detail]
    at = [p for p in failed if p.index == culprit] or sorted(failed, key=lambda p: p.index)
    return FailureOutcome(
        kind=kind,
        culprit=s.commits[culprit] if culprit is not None else None,
        range=tuple(s.commits[i] for i in span),
        reason=reason,
        error=at[0].detail if at else None,
        builds=len({p.sha for p in s.probes if not p.skipped}),
        rounds=s.round,
    )
