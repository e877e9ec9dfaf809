"""Bisect a commit range to the culprit: statistical verdicts, fewest builds, W probes per round.

The search is pure: a :class:`BisectionState` (frozen, in :mod:`workers.bisect_state`) holds the
commit range, the regressed benchmarks and every sample measured so far; :func:`next_probes`
says which commits to measure next (and how many samples of which benchmarks);
:func:`record_round` folds the measurements in and returns the next state; :func:`outcome`
reads the answer once no probe is left. The statistics live in :mod:`workers.verdicts`. Nothing
here builds or runs anything: the local driver (:mod:`workers.probes`) and the Celery tasks do
that, and the tests drive the same functions with literal and simulated samples.

Method
------
*Verdicts* follow Chromium's Pinpoint (catapult ``dashboard/pinpoint/models/compare/compare.py``
and ``thresholds.py``): the p-value of two sets of raw samples is the smaller of the two-sided
Mann–Whitney U and Kolmogorov–Smirnov tests; p ≤ 0.01 (the *low threshold*) is ``different``; p
above a *high threshold* is ``same``; in between is ``unknown``, answered by measuring more
samples. Pinpoint reads the high threshold from tables simulated for a given effect size in
multiples of the IQR; here it is simulated from the endpoints themselves: the 99th percentile of
the p-values that samples drawn (with replacement) from the *other* endpoint would give. Every
probe is recorded with its verdicts against both endpoints; the endpoints must be ``different``
for the regression to count as reproduced.

*References*: every round measures both endpoints again beside its probes (they are built
already), and a probe is judged only against the endpoint samples of its own rounds
(:func:`paired`), so a machine whose speed wanders between rounds moves a probe and its
yardstick alike. The local driver goes further: it measures a round's commits slot by slot, one
process of each back to back, and records each sample's slot; then each slot is a paired
comparison (:func:`paired_sides`), which cancels a machine that switches between two speeds
from one second to the next (another tenant on the core, a clock that steps down).

*Sides*: a probe is *good* when, slot by slot, a sign test at p ≤ 0.01 puts it on the good side
of the midpoint between the endpoints measured beside it, *bad* in the mirror case. Without
slots (probes measured on their own by Celery workers), it is *good* when it is ``different``
from the bad endpoint and a sign test puts its samples on the good side of the midpoint between
the endpoints' medians (:func:`nearer_side`), with the endpoints standing on their own sides of
that midpoint (:func:`endpoints_apart`). ``same`` is not required: a probe measured after a drift
is ``different`` from both endpoints, and one whose samples mix two speeds can pass as ``same``
as either. Otherwise the probe is undecided: its samples are doubled up to a cap, and then it is
left out of the search (the answer becomes an inconclusive, narrowed range, never a guess).

*Search*: binary search over the range in first-parent order, generalised to a (W+1)-ary search
with W workers: each round probes W commits spread evenly over the remaining interval, so the
rounds fall from ⌈log2(N+1)⌉ to about ⌈log_{W+1}(N+1)⌉. Each probe measures only the regressed
benchmarks whose interval still contains the commit, all on the same build. Benchmarks that
converge on different culprits are reported separately. A commit that fails to build is skipped
(as ``git bisect skip`` does) and the nearest buildable commit is probed instead.

*Verification*: when a benchmark's interval closes on a parent and child, both are measured again
in rounds of their own beside both endpoints; the culprit is named only when those fresh samples
say the endpoints still differ, the parent is good, the child is bad, and the child differs from
the parent in the regression's direction.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.errors import InvalidInput
from workers.bisect_state import (
    CULPRIT,
    CULPRITS,
    ENDPOINT,
    INCONCLUSIVE,
    MEASURED,
    NOT_REPRODUCED,
    OUTCOMES,
    REFERENCE,
    REFINE,
    SEARCH,
    SKIPPED,
    VERIFY,
    BenchmarkOutcome,
    BenchmarkVerdict,
    BisectionState,
    Outcome,
    ProbeRecord,
    ProbeRequest,
    ProbeResult,
    SearchConfig,
    floor_builds,
    frozen_mapping,
    start,
)
from workers.verdicts import (
    APART_ALPHA,
    BAD,
    DIFFERENT,
    GOOD,
    PAIRED_MIN_SLOTS,
    SAME,
    UNDECIDED,
    UNKNOWN,
    VERDICTS,
    Batch,
    Classification,
    Comparison,
    compare,
    endpoints_apart,
    median_of,
    paired_shift,
    paired_sides,
    sign_test,
    slot_levels,
)
from workers.verdicts import classify as _classify

__all__ = [
    "APART_ALPHA", "BAD", "CULPRIT", "CULPRITS", "DIFFERENT", "ENDPOINT", "GOOD", "INCONCLUSIVE",
    "MEASURED", "NOT_REPRODUCED", "OUTCOMES", "PAIRED_MIN_SLOTS", "REFERENCE", "REFINE", "SAME",
    "SEARCH", "SKIPPED", "UNDECIDED", "UNKNOWN", "VERDICTS", "VERIFY", "Batch",
    "BenchmarkOutcome", "BenchmarkVerdict", "BisectionState", "Classification", "Comparison",
    "Outcome", "ProbeRecord", "ProbeRequest", "ProbeResult", "SearchConfig", "classify",
    "compare", "floor_builds", "next_probes", "outcome", "paired", "record_round", "side_of",
    "start",
]


def classify(
    samples: Sequence[float], good: Sequence[float], bad: Sequence[float], config: SearchConfig
) -> Classification:
    """:func:`workers.verdicts.classify` with the thresholds of ``config``."""
    return _classify(samples, good, bad, alpha=config.alpha, power=config.power,
                     resamples=config.resamples)


# ---------------------------------------------------------------------------------------------
# Analysis: where each benchmark stands


@dataclass(frozen=True)
class _Track:
    """One benchmark's standing (internal)."""

    benchmark: str
    # "endpoints" | "not_reproduced" | "searching" | "verifying" | "culprit" | "inconclusive"
    status: str
    lo: int = 0
    hi: int = 0
    sides: Mapping[int, str] = field(default_factory=dict)
    refine: tuple[int, ...] = ()  # indices that need more samples
    endpoint_more: int = 0  # samples to add at both endpoints
    verify_more: tuple[tuple[int, int], ...] = ()  # (index, fresh samples to take)
    candidates: tuple[int, ...] = ()
    reason: str = ""
    change: float | None = None


def _more(have: int, config: SearchConfig) -> int:
    """Samples to add when doubling ``have`` (0 at the cap)."""
    if have >= config.max_samples:
        return 0
    return min(max(have, config.initial_samples), config.max_samples - have)


def _batches(state: BisectionState, index: int, benchmark: str) -> tuple[Batch, ...]:
    return state.samples.get((state.commits[index], benchmark), ())


def _values(batches: Iterable[Batch], *, rounds: Collection[int] | None = None,
            purposes: Collection[str] | None = None) -> tuple[float, ...]:
    out: list[float] = []
    for batch in batches:
        if rounds is not None and batch.round not in rounds:
            continue
        if purposes is not None and batch.purpose not in purposes:
            continue
        out.extend(batch.values)
    return tuple(out)


def paired(
    state: BisectionState, index: int, benchmark: str, purposes: Collection[str]
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """A commit's samples and the endpoints' samples taken in the same rounds.

    Every round measures both endpoints again beside its probes, so a probe is compared with
    endpoints measured minutes, not hours, from it: a machine whose speed wanders (other work,
    thermal limits) moves all three alike.

    Args:
        state: the state.
        index: the commit's position in the range.
        benchmark: the benchmark.
        purposes: which of the commit's batches to take (e.g. search and refine).

    Returns:
        ``(commit, good, bad)`` samples (ms); the endpoints' first samples when no round holds
        all three (an endpoint failed to measure beside the probe).
    """
    n = len(state.commits) - 1
    own = [b for b in _batches(state, index, benchmark) if b.purpose in purposes]
    rounds = {b.round for b in own}
    rounds &= {b.round for b in _batches(state, 0, benchmark)}
    rounds &= {b.round for b in _batches(state, n, benchmark)}
    if rounds:
        return (_values(own, rounds=rounds), _values(_batches(state, 0, benchmark), rounds=rounds),
                _values(_batches(state, n, benchmark), rounds=rounds))
    return (_values(own), _values(_batches(state, 0, benchmark), purposes={ENDPOINT}),
            _values(_batches(state, n, benchmark), purposes={ENDPOINT}))


def _track(state: BisectionState, benchmark: str) -> _Track:
    cfg, commits = state.config, state.commits
    n = len(commits) - 1
    for end in (0, n):
        if commits[end] in state.skipped:
            which = "good" if end == 0 else "bad"
            return _Track(benchmark, INCONCLUSIVE, 0, n,
                          reason=f"the {which} endpoint failed to build: "
                                 f"{state.skipped[commits[end]]}")
        if (commits[end], benchmark) in state.errors:
            which = "good" if end == 0 else "bad"
            return _Track(benchmark, INCONCLUSIVE, 0, n,
                          reason=f"the {which} endpoint failed to measure: "
                                 f"{state.errors[(commits[end], benchmark)]}")
    good = _values(_batches(state, 0, benchmark), purposes={ENDPOINT})
    bad = _values(_batches(state, n, benchmark), purposes={ENDPOINT})
    if len(good) == 0 or len(bad) == 0:
        return _Track(benchmark, "endpoints", 0, n, endpoint_more=cfg.initial_samples)
    levels = (
        slot_levels(b for b in _batches(state, 0, benchmark) if b.purpose == ENDPOINT),
        slot_levels(b for b in _batches(state, n, benchmark) if b.purpose == ENDPOINT),
    )
    if len(levels[0].keys() & levels[1].keys()) >= PAIRED_MIN_SLOTS:
        return _paired_track(state, benchmark, len(good), len(bad), *levels)
    endpoints = compare(bad, good, alpha=cfg.alpha)
    change = (median_of(bad) - median_of(good)) / median_of(good) if median_of(good) else math.inf
    if endpoints.verdict != DIFFERENT:
        more = _more(min(len(good), len(bad)), cfg)
        if more:
            return _Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=change)
        return _Track(benchmark, NOT_REPRODUCED, 0, n, change=change,
                      reason=f"good and bad endpoints measure alike (p={endpoints.p_value:.3g} "
                             f"with {len(good)} and {len(bad)} samples)")
    if abs(change) < cfg.min_change:
        return _Track(benchmark, NOT_REPRODUCED, 0, n, change=change,
                      reason=f"the endpoints differ by {change:+.1%}, below the "
                             f"{cfg.min_change:.0%} that counts")
    if not endpoints_apart(good, bad):
        more = _more(min(len(good), len(bad)), cfg)
        if more:
            return _Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=change)
        return _Track(benchmark, INCONCLUSIVE, 0, n, change=change,
                      reason=f"the endpoints' samples straddle the midpoint between them even "
                             f"with {cfg.max_samples} samples: too noisy to bisect")

    return _search_track(state, benchmark, change, slower_is_bad=None)


def paired_direction(state: BisectionState, benchmark: str) -> bool | None:
    """True when the bad endpoint is slower slot by slot, False when faster, None when the
    endpoints were not measured interleaved in enough slots (or show no significant shift)."""
    n = len(state.commits) - 1
    good = slot_levels(b for b in _batches(state, 0, benchmark) if b.purpose == ENDPOINT)
    bad = slot_levels(b for b in _batches(state, n, benchmark) if b.purpose == ENDPOINT)
    if len(good.keys() & bad.keys()) < PAIRED_MIN_SLOTS:
        return None
    slower, faster, _ = paired_shift(good, bad)
    if sign_test(slower, faster) <= state.config.alpha:
        return True
    if sign_test(faster, slower) <= state.config.alpha:
        return False
    return None


def _paired_track(
    state: BisectionState, benchmark: str, good_count: int, bad_count: int,
    good: Mapping[tuple[int, int], float], bad: Mapping[tuple[int, int], float],
) -> _Track:
    """The endpoint check when the endpoints were measured interleaved: paired by slot."""
    cfg = state.config
    n = len(state.commits) - 1
    slower, faster, change = paired_shift(good, bad)
    p_slower, p_faster = sign_test(slower, faster), sign_test(faster, slower)
    if min(p_slower, p_faster) > cfg.alpha:
        more = _more(min(good_count, bad_count), cfg)
        if more:
            return _Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=change)
        return _Track(benchmark, NOT_REPRODUCED, 0, n, change=change,
                      reason=f"good and bad endpoints measure alike: the bad one was slower in "
                             f"{slower} and faster in {faster} of the slots measured side by "
                             f"side (p={min(p_slower, p_faster):.3g})")
    if abs(change) < cfg.min_change:
        return _Track(benchmark, NOT_REPRODUCED, 0, n, change=change,
                      reason=f"the endpoints differ by {change:+.1%}, below the "
                             f"{cfg.min_change:.0%} that counts")
    return _search_track(state, benchmark, change, slower_is_bad=p_slower <= cfg.alpha)


def side_of(
    state: BisectionState, index: int, benchmark: str, purposes: Collection[str], *,
    rounds: Collection[int] | None = None, slower_is_bad: bool | None = None,
) -> tuple[str, int]:
    """Which side of the regression a commit's samples put it on, and how many samples decided.

    Paired by slot against the endpoints measured beside it (:func:`paired_sides` and a sign
    test) when the rounds were measured interleaved and enough slots line up, else
    :func:`classify` against the endpoints' samples of the same rounds (:func:`paired`).

    Args:
        state: the state.
        index: the commit's position.
        benchmark: the benchmark.
        purposes: which of the commit's batches count.
        rounds: only these rounds (verification), or all.
        slower_is_bad: the regression's direction when known from paired endpoints.

    Returns:
        ``(side, samples)``: ``good`` | ``bad`` | ``undecided``, and the commit's sample count.
    """
    n = len(state.commits) - 1
    own = [b for b in _batches(state, index, benchmark)
           if b.purpose in purposes and (rounds is None or b.round in rounds)]
    count = sum(len(b.values) for b in own)
    if not own:
        return UNDECIDED, 0
    if slower_is_bad is not None:
        taken = {b.round for b in own}
        levels = slot_levels(own)
        good = slot_levels(b for b in _batches(state, 0, benchmark) if b.round in taken)
        bad = slot_levels(b for b in _batches(state, n, benchmark) if b.round in taken)
        if len(levels.keys() & good.keys() & bad.keys()) >= PAIRED_MIN_SLOTS:
            near_good, near_bad = paired_sides(levels, good, bad, slower_is_bad=slower_is_bad)
            if sign_test(near_good, near_bad) <= state.config.alpha:
                return GOOD, count
            if sign_test(near_bad, near_good) <= state.config.alpha:
                return BAD, count
            return UNDECIDED, count
    taken_rounds = {b.round for b in own}
    good_ref = _values(_batches(state, 0, benchmark), rounds=taken_rounds)
    bad_ref = _values(_batches(state, n, benchmark), rounds=taken_rounds)
    if not good_ref or not bad_ref:
        good_ref = _values(_batches(state, 0, benchmark), purposes={ENDPOINT})
        bad_ref = _values(_batches(state, n, benchmark), purposes={ENDPOINT})
    return classify(_values(own), good_ref, bad_ref, state.config).side, count


def _search_track(
    state: BisectionState, benchmark: str, change: float, *, slower_is_bad: bool | None
) -> _Track:
    cfg, commits = state.config, state.commits
    n = len(commits) - 1
    sides: dict[int, str] = {0: GOOD, n: BAD}
    refine: list[int] = []
    have: dict[int, int] = {}
    for index in range(1, n):
        key = (commits[index], benchmark)
        if commits[index] in state.skipped or key in state.errors:
            continue
        side, count = side_of(state, index, benchmark, (SEARCH, REFINE),
                              slower_is_bad=slower_is_bad)
        if not count:
            continue
        have[index] = count
        sides[index] = side
        if side == UNDECIDED and _more(count, cfg):
            refine.append(index)
    goods = [i for i, s in sides.items() if s == GOOD]
    bads = [i for i, s in sides.items() if s == BAD]
    first_bad, last_good = min(bads), max(goods)
    lo = max(i for i in goods if i < first_bad)
    hi = min(i for i in bads if i > last_good)
    if last_good > first_bad:
        # Not a single step: re-measure the probes that disagree before believing either.
        clash = [i for i in goods if i > first_bad] + [i for i in bads if i < last_good]
        clash = [i for i in clash if 0 < i < n and _more(have[i], cfg)]
        if clash:
            return _Track(benchmark, "searching", lo, hi, sides=sides,
                          refine=tuple(sorted(set(clash) | set(refine))), change=change)
        return _Track(benchmark, INCONCLUSIVE, lo, hi, sides=sides, change=change,
                      reason="probes disagree: a good commit after a bad one "
                             "(more than one change, or noise beyond the sample cap)")
    inside_refine = tuple(i for i in refine if lo < i < hi)
    candidates = tuple(
        i for i in range(lo + 1, hi)
        if i not in sides and commits[i] not in state.skipped
        and (commits[i], benchmark) not in state.errors
    )
    if hi == lo + 1:
        return _verify_track(state, benchmark, lo, hi, sides, change, slower_is_bad)
    if not candidates and not inside_refine:
        undecided = [i for i in range(lo + 1, hi) if sides.get(i) == UNDECIDED]
        skipped = [i for i in range(lo + 1, hi) if commits[i] in state.skipped]
        parts = []
        if skipped:
            parts.append(f"{len(skipped)} commit(s) failed to build")
        if undecided:
            parts.append(f"{len(undecided)} commit(s) measured neither good nor bad "
                         f"with {cfg.max_samples} samples")
        failed = [i for i in range(lo + 1, hi) if (commits[i], benchmark) in state.errors]
        if failed:
            parts.append(f"{len(failed)} commit(s) failed to measure")
        return _Track(benchmark, INCONCLUSIVE, lo, hi, sides=sides, change=change,
                      reason="; ".join(parts) or "no commit left to probe")
    return _Track(benchmark, "searching", lo, hi, sides=sides, refine=inside_refine,
                  candidates=candidates, change=change)


def _verify_track(
    state: BisectionState, benchmark: str, lo: int, hi: int, sides: Mapping[int, str],
    change: float, slower_is_bad: bool | None = None,
) -> _Track:
    """Verification: fresh samples of the parent and the candidate, beside both endpoints.

    The parent and the candidate (or, for a one-commit range, the endpoints themselves) are
    measured again in rounds of their own, with both endpoints beside them; only those rounds'
    samples decide.
    """
    cfg, commits = state.config, state.commits
    if not cfg.verify:
        return _Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    n = len(commits) - 1
    targets = [i for i in (lo, hi) if 0 < i < n] or [0, n]
    rounds = {b.round for i in targets for b in _batches(state, i, benchmark)
              if b.purpose == VERIFY}
    fresh = {i: _values(_batches(state, i, benchmark), rounds=rounds)
             for i in sorted({0, lo, hi, n})}
    have = min(len(v) for v in fresh.values()) if rounds else 0
    if have < cfg.initial_samples:
        more = cfg.initial_samples - have
        return _Track(benchmark, "verifying", lo, hi, sides=sides, change=change,
                      verify_more=tuple((i, more) for i in targets))
    good, bad, parent, child = fresh[0], fresh[n], fresh[lo], fresh[hi]
    ends = compare(bad, good, alpha=cfg.alpha)
    direct = compare(child, parent, alpha=cfg.alpha)
    levels = {i: slot_levels(b for b in _batches(state, i, benchmark) if b.round in rounds)
              for i in fresh}
    common = set.intersection(*(set(v) for v in levels.values()))
    if slower_is_bad is not None and len(common) >= PAIRED_MIN_SLOTS:
        # Paired by slot: the endpoints, then the candidate against its parent.
        slower, faster, _ = paired_shift(levels[0], levels[n])
        ends_hold = sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) \
            <= cfg.alpha
        slower, faster, _ = paired_shift(levels[lo], levels[hi])
        step_holds = sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) \
            <= cfg.alpha
    else:
        ends_hold = (ends.verdict == DIFFERENT
                     and (median_of(bad) - median_of(good)) * change > 0
                     and endpoints_apart(good, bad))
        step_holds = (direct.verdict == DIFFERENT
                      and (median_of(child) - median_of(parent)) * change > 0)
    verify_rounds = rounds
    parent_side = GOOD if lo == 0 else side_of(state, lo, benchmark, (VERIFY,),
                                               rounds=verify_rounds,
                                               slower_is_bad=slower_is_bad)[0]
    child_side = BAD if hi == n else side_of(state, hi, benchmark, (VERIFY,),
                                             rounds=verify_rounds,
                                             slower_is_bad=slower_is_bad)[0]
    if ends_hold and parent_side == GOOD and child_side == BAD and step_holds:
        return _Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    contradicted = ends_hold and (parent_side == BAD or child_side == GOOD)
    more = 0 if contradicted else _more(have, cfg)
    if more:
        return _Track(benchmark, "verifying", lo, hi, sides=sides, change=change,
                      verify_more=tuple((i, more) for i in targets))
    return _Track(
        benchmark, INCONCLUSIVE, lo - 1 if lo > 0 else lo, hi, sides=sides, change=change,
        reason=(f"verification failed: fresh samples put the parent {commits[lo][:10]} on the "
                f"{parent_side} side and the candidate {commits[hi][:10]} on the {child_side} "
                f"side (endpoints p={ends.p_value:.3g}, candidate against parent "
                f"p={direct.p_value:.3g})"),
    )


# ---------------------------------------------------------------------------------------------
# Planning


def _spread(lo: int, hi: int, candidates: Sequence[int], k: int) -> list[int]:
    """k candidates closest to the points splitting (lo, hi) into k+1 equal parts."""
    chosen: list[int] = []
    pool = list(candidates)
    for j in range(1, k + 1):
        if not pool:
            break
        ideal = lo + (hi - lo) * j / (k + 1)
        best = min(pool, key=lambda i: (abs(i - ideal), i))
        chosen.append(best)
        pool.remove(best)
    return sorted(chosen)


def next_probes(state: BisectionState) -> tuple[ProbeRequest, ...]:
    """The probes of the next round (empty when the bisection is over).

    Endpoints come first (both, whatever W is: every verdict depends on them). After that, each
    round holds at most ``workers`` commits to search or refine (re-measurements of undecided
    probes first, then new probes spread over the open intervals, the widest first), plus a
    verification's parent and candidate, plus both endpoints measured again as references:
    those are built already, so W bounds the builds of a round.

    Args:
        state: the current state.

    Returns:
        Requests, one per commit, in range order.
    """
    cfg, commits = state.config, state.commits
    tracks = [_track(state, b) for b in state.benchmarks]
    n = len(commits) - 1

    endpoint_tracks = [t for t in tracks if t.status == "endpoints"]
    if endpoint_tracks:
        more = max(t.endpoint_more for t in endpoint_tracks)
        names = tuple(t.benchmark for t in endpoint_tracks)
        purpose = ENDPOINT
        return (ProbeRequest(commits[0], 0, names, more, purpose),
                ProbeRequest(commits[n], n, names, more, purpose))

    wanted: dict[int, dict] = {}

    def want(index: int, benchmark: str, samples: int, purpose: str) -> None:
        entry = wanted.setdefault(index, {"benchmarks": [], "samples": 0, "purpose": purpose})
        if benchmark not in entry["benchmarks"]:
            entry["benchmarks"].append(benchmark)
        entry["samples"] = max(entry["samples"], samples)

    for t in tracks:
        if t.status == "verifying":
            for index, more in t.verify_more:
                want(index, t.benchmark, more, VERIFY)
    verifying = sorted(wanted.items())
    for t in tracks:
        for index in t.refine:
            have = len(paired(state, index, t.benchmark, (SEARCH, REFINE))[0])
            if index not in wanted or wanted[index]["purpose"] == REFINE:
                want(index, t.benchmark, _more(have, cfg), REFINE)
    # Re-measurements come first; they need no new build. A verification's commits are
    # measured in one round whatever W is: their comparison needs them side by side in time.
    refining = sorted((i, e) for i, e in wanted.items() if e["purpose"] == REFINE)
    requests = verifying + refining[: cfg.workers]
    free = cfg.workers - len(refining[: cfg.workers])
    taken = {i for i, _ in requests}

    searching = [t for t in tracks if t.status == "searching" and t.candidates]
    groups: dict[tuple[int, int], list[_Track]] = {}
    for t in searching:
        groups.setdefault((t.lo, t.hi), []).append(t)
    slots = {key: 0 for key in groups}
    for _ in range(max(free, 0)):
        open_groups = [
            key for key in groups
            if slots[key] < len([i for i in groups[key][0].candidates if i not in taken])
        ]
        if not open_groups:
            break
        key = max(open_groups, key=lambda g: ((g[1] - g[0]) / (slots[g] + 1), -g[0]))
        slots[key] += 1
    new: list[tuple[int, dict]] = []
    for (lo, hi), k in sorted(slots.items()):
        if not k:
            continue
        candidates = [i for i in groups[(lo, hi)][0].candidates if i not in taken]
        for index in _spread(lo, hi, candidates, k):
            taken.add(index)
            open_here = [
                t.benchmark for t in searching
                if t.lo < index < t.hi and index in t.candidates
            ]
            new.append((index, {"benchmarks": open_here, "samples": cfg.initial_samples,
                                "purpose": SEARCH}))
    chosen = dict(requests + new)
    if chosen:
        # Both endpoints again, beside this round's probes: each probe is judged against
        # endpoint samples of its own rounds (see :func:`paired`).
        measured = sorted({name for e in chosen.values() for name in e["benchmarks"]},
                          key=state.benchmarks.index)
        most = max(e["samples"] for e in chosen.values())
        for end in (0, n):
            entry = chosen.setdefault(end, {"benchmarks": [], "samples": 0,
                                            "purpose": REFERENCE})
            entry["benchmarks"] = sorted(set(entry["benchmarks"]) | set(measured),
                                         key=state.benchmarks.index)
            entry["samples"] = max(entry["samples"], most)
    out = [
        ProbeRequest(commits[i], i, tuple(e["benchmarks"]), e["samples"], e["purpose"])
        for i, e in sorted(chosen.items())
    ]
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Recording


def record_round(state: BisectionState, results: Iterable[ProbeResult]) -> BisectionState:
    """Fold one round's measurements into a new state.

    Args:
        state: the state the round was planned from.
        results: one :class:`ProbeResult` per measured or skipped commit.

    Returns:
        The next state (``round`` + 1), with each probe recorded with its verdicts.

    Raises:
        InvalidInput: a result names a commit outside the range, a benchmark not bisected, or a
            non-positive / non-finite sample.
    """
    index_of = {sha: i for i, sha in enumerate(state.commits)}
    samples = dict(state.samples)
    skipped = dict(state.skipped)
    errors = dict(state.errors)
    results = list(results)
    for r in results:
        if r.sha not in index_of:
            raise InvalidInput(f"probe result for {r.sha[:10]}, which is not in the commit range")
        if r.skipped is not None:
            skipped[r.sha] = r.skipped
            continue
        for name, values in r.samples.items():
            if name not in state.benchmarks:
                raise InvalidInput(f"probe result for benchmark {name!r}, which is not bisected")
            values = tuple(float(v) for v in values)
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise InvalidInput(
                    f"samples of {name} at {r.sha[:10]} must be positive finite numbers (ms)"
                )
            slots = tuple(int(v) for v in r.slots[name]) if name in r.slots else None
            if slots is not None and len(slots) != len(values):
                raise InvalidInput(f"slots of {name} at {r.sha[:10]} do not match its samples")
            samples[(r.sha, name)] = samples.get((r.sha, name), ()) + (
                Batch(state.round, r.purpose, values, slots),
            )
        for name, reason in r.errors.items():
            errors[(r.sha, name)] = reason
    new_state = replace(
        state, samples=frozen_mapping(samples), skipped=frozen_mapping(skipped),
        errors=frozen_mapping(errors),
    )
    records = []
    for r in results:
        index = index_of[r.sha]
        if r.skipped is not None:
            records.append(ProbeRecord(state.round, r.sha, index, r.purpose, SKIPPED,
                                       r.build_seconds, (), r.skipped))
            continue
        verdicts = [_verdict(new_state, r, name, index) for name in r.samples]
        verdicts += [BenchmarkVerdict(name, (), None, None, None, error)
                     for name, error in r.errors.items()]
        records.append(ProbeRecord(state.round, r.sha, index, r.purpose, MEASURED,
                                   r.build_seconds, tuple(verdicts)))
    return replace(new_state, round=state.round + 1, probes=state.probes + tuple(records))


def _verdict(state: BisectionState, r: ProbeResult, name: str, index: int) -> BenchmarkVerdict:
    """One probe's record: Pinpoint's verdicts of its samples against the endpoints' samples of
    the same round, and the side the search puts the commit on with all its samples so far."""
    cfg = state.config
    taken = tuple(float(v) for v in r.samples[name])
    n = len(state.commits) - 1
    this_round = {state.round}  # the round being recorded
    if index in (0, n):
        other = _values(_batches(state, n if index == 0 else 0, name), rounds=this_round)
        if not other:
            return BenchmarkVerdict(name, taken, None, None, GOOD if index == 0 else BAD)
        verdict = compare(taken, other, alpha=cfg.alpha).verdict
        if index == 0:
            return BenchmarkVerdict(name, taken, None, verdict, GOOD)
        return BenchmarkVerdict(name, taken, verdict, None, BAD)
    good = _values(_batches(state, 0, name), rounds=this_round)
    bad = _values(_batches(state, n, name), rounds=this_round)
    if not good or not bad:
        return BenchmarkVerdict(name, taken, None, None, None)
    vs_good = compare(taken, good, alternative=bad, alpha=cfg.alpha, power=cfg.power,
                      resamples=cfg.resamples)
    vs_bad = compare(taken, bad, alternative=good, alpha=cfg.alpha, power=cfg.power,
                     resamples=cfg.resamples)
    purposes = (VERIFY,) if r.purpose == VERIFY else (SEARCH, REFINE)
    side, _ = side_of(state, index, name, purposes, slower_is_bad=paired_direction(state, name))
    return BenchmarkVerdict(name, taken, vs_good.verdict, vs_bad.verdict, side)


# ---------------------------------------------------------------------------------------------
# Outcome


def outcome(state: BisectionState) -> Outcome | None:
    """The answer, or None while :func:`next_probes` still has probes to run."""
    if next_probes(state):
        return None
    commits = state.commits
    per: list[BenchmarkOutcome] = []
    for t in (_track(state, b) for b in state.benchmarks):
        if t.status == CULPRIT:
            per.append(BenchmarkOutcome(t.benchmark, CULPRIT, commits[t.hi], (commits[t.hi],),
                                        t.change))
        elif t.status == NOT_REPRODUCED:
            per.append(BenchmarkOutcome(t.benchmark, NOT_REPRODUCED, None, (), t.change, t.reason))
        else:
            per.append(BenchmarkOutcome(t.benchmark, INCONCLUSIVE, None,
                                        tuple(commits[t.lo + 1: t.hi + 1]), t.change,
                                        t.reason or "the search stopped without a verdict"))
    culprits: dict[str, list[str]] = {}
    for o in per:
        if o.culprit:
            culprits.setdefault(o.culprit, []).append(o.benchmark)
    order = {sha: i for i, sha in enumerate(commits)}
    ordered = tuple((sha, tuple(names)) for sha, names in sorted(culprits.items(),
                                                                   key=lambda kv: order[kv[0]]))
    if len(ordered) > 1:
        kind = CULPRITS
    elif ordered:
        kind = CULPRIT
    elif any(o.status == INCONCLUSIVE for o in per):
        kind = INCONCLUSIVE
    else:
        kind = NOT_REPRODUCED
    skipped = tuple((sha, state.skipped[sha]) for sha in commits if sha in state.skipped)
    return Outcome(kind, tuple(per), ordered, skipped, state.builds, state.round)
