"""Where each benchmark of a bisection stands: its interval, the sides of its probes, what it
still needs measured, and the verification of its culprit.

Pure, like the rest of the search (:mod:`workers.bisect.search`, whose docstring describes the
method): a benchmark's track is read from a :class:`~workers.bisect.state.BisectionState`
alone, every time it is needed. :func:`side_of` puts one commit on a side; the planning and the
outcome in :mod:`workers.bisect.search` read the tracks.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.bisect.state import (
    CULPRIT,
    ENDPOINT,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REFINE,
    SEARCH,
    VERIFY,
    BisectionState,
    SearchConfig,
)
from workers.bisect.verdicts import (
    BAD,
    DIFFERENT,
    GOOD,
    PAIRED_MIN_SLOTS,
    UNDECIDED,
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
from workers.bisect.verdicts import classify as _classify


def classify(
    samples: Sequence[float], good: Sequence[float], bad: Sequence[float], config: SearchConfig
) -> Classification:
    """:func:`workers.bisect.verdicts.classify` with the thresholds of ``config``."""
    return _classify(
        samples, good, bad, alpha=config.alpha, power=config.power, resamples=config.resamples
    )


@dataclass(frozen=True)
class Track:
    """One benchmark's standing, as :func:`track_of` reads it from the state."""

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


def more_samples(have: int, config: SearchConfig) -> int:
    """Samples to add when doubling ``have`` (0 at the cap)."""
    if have >= config.max_samples:
        return 0
    return min(max(have, config.initial_samples), config.max_samples - have)


def batches_of(state: BisectionState, index: int, benchmark: str) -> tuple[Batch, ...]:
    """Every batch of ``benchmark`` measured at commit ``index``, in round order."""
    return state.samples.get((state.commits[index], benchmark), ())


def values_of(
    batches: Iterable[Batch],
    *,
    rounds: Collection[int] | None = None,
    purposes: Collection[str] | None = None,
) -> tuple[float, ...]:
    """The samples (ms) of ``batches`` taken in ``rounds`` for ``purposes`` (all when None)."""
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
    own = [b for b in batches_of(state, index, benchmark) if b.purpose in purposes]
    rounds = {b.round for b in own}
    rounds &= {b.round for b in batches_of(state, 0, benchmark)}
    rounds &= {b.round for b in batches_of(state, n, benchmark)}
    if rounds:
        return (
            values_of(own, rounds=rounds),
            values_of(batches_of(state, 0, benchmark), rounds=rounds),
            values_of(batches_of(state, n, benchmark), rounds=rounds),
        )
    return (
        values_of(own),
        values_of(batches_of(state, 0, benchmark), purposes={ENDPOINT}),
        values_of(batches_of(state, n, benchmark), purposes={ENDPOINT}),
    )


def track_of(state: BisectionState, benchmark: str) -> Track:
    """Where ``benchmark`` stands in ``state``: read afresh from its samples every time."""
    cfg, commits = state.config, state.commits
    n = len(commits) - 1
    for end in (0, n):
        if commits[end] in state.skipped:
            which = "good" if end == 0 else "bad"
            return Track(
                benchmark,
                INCONCLUSIVE,
                0,
                n,
                reason=f"the {which} endpoint failed to build: {state.skipped[commits[end]]}",
            )
        if (commits[end], benchmark) in state.errors:
            which = "good" if end == 0 else "bad"
            return Track(
                benchmark,
                INCONCLUSIVE,
                0,
                n,
                reason=f"the {which} endpoint failed to measure: "
                f"{state.errors[(commits[end], benchmark)]}",
            )
    good = values_of(batches_of(state, 0, benchmark), purposes={ENDPOINT})
    bad = values_of(batches_of(state, n, benchmark), purposes={ENDPOINT})
    if len(good) == 0 or len(bad) == 0:
        return Track(benchmark, "endpoints", 0, n, endpoint_more=cfg.initial_samples)
    levels = (
        slot_levels(b for b in batches_of(state, 0, benchmark) if b.purpose == ENDPOINT),
        slot_levels(b for b in batches_of(state, n, benchmark) if b.purpose == ENDPOINT),
    )
    if len(levels[0].keys() & levels[1].keys()) >= PAIRED_MIN_SLOTS:
        return _paired_track(state, benchmark, len(good), len(bad), *levels)
    endpoints = compare(bad, good, alpha=cfg.alpha)
    change = (median_of(bad) - median_of(good)) / median_of(good) if median_of(good) else math.inf
    if endpoints.verdict != DIFFERENT:
        outcome, reason = (
            NOT_REPRODUCED,
            (
                f"good and bad endpoints measure alike (p={endpoints.p_value:.3g} "
                f"with {len(good)} and {len(bad)} samples)"
            ),
        )
    elif abs(change) < cfg.min_change:
        outcome, reason = (
            NOT_REPRODUCED,
            (
                f"the endpoints differ by {change:+.1%} with {len(good)} and "
                f"{len(bad)} samples, below the {cfg.min_change:.0%} that counts"
            ),
        )
    elif cfg.slower is not None and (change > 0) != cfg.slower:
        outcome, reason = NOT_REPRODUCED, _wrong_way(change, len(good), len(bad), cfg.slower)
    elif not endpoints_apart(good, bad):
        outcome, reason = (
            INCONCLUSIVE,
            (
                f"the endpoints' samples straddle the midpoint between them even "
                f"with {cfg.max_samples} samples: too noisy to bisect"
            ),
        )
    else:
        return _search_track(state, benchmark, change, slower_is_bad=None)
    # Not a step yet: measure the endpoints more (doubling, to the cap) before concluding.
    more = more_samples(min(len(good), len(bad)), cfg)
    if more:
        return Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=change)
    return Track(benchmark, outcome, 0, n, change=change, reason=reason)


def paired_direction(state: BisectionState, benchmark: str) -> bool | None:
    """True when the bad endpoint is slower slot by slot, False when faster, None when the
    endpoints were not measured interleaved in enough slots (or show no significant shift)."""
    n = len(state.commits) - 1
    good = slot_levels(b for b in batches_of(state, 0, benchmark) if b.purpose == ENDPOINT)
    bad = slot_levels(b for b in batches_of(state, n, benchmark) if b.purpose == ENDPOINT)
    if len(good.keys() & bad.keys()) < PAIRED_MIN_SLOTS:
        return None
    slower, faster, _ = paired_shift(good, bad)
    if sign_test(slower, faster) <= state.config.alpha:
        return True
    if sign_test(faster, slower) <= state.config.alpha:
        return False
    return None


def _paired_track(
    state: BisectionState,
    benchmark: str,
    good_count: int,
    bad_count: int,
    good: Mapping[tuple[int, int], float],
    bad: Mapping[tuple[int, int], float],
) -> Track:
    """The endpoint check when the endpoints were measured interleaved: paired by slot."""
    cfg = state.config
    n = len(state.commits) - 1
    slower, faster, change = paired_shift(good, bad)
    p_slower, p_faster = sign_test(slower, faster), sign_test(faster, slower)
    if min(p_slower, p_faster) > cfg.alpha:
        more = more_samples(min(good_count, bad_count), cfg)
        if more:
            return Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=change)
        return Track(
            benchmark,
            NOT_REPRODUCED,
            0,
            n,
            change=change,
            reason=f"good and bad endpoints measure alike: the bad one was slower in "
            f"{slower} and faster in {faster} of the slots measured side by "
            f"side (p={min(p_slower, p_faster):.3g})",
        )
    if abs(change) < cfg.min_change:
        return Track(
            benchmark,
            NOT_REPRODUCED,
            0,
            n,
            change=change,
            reason=f"the endpoints differ by {change:+.1%} with {good_count} and "
            f"{bad_count} samples, below the {cfg.min_change:.0%} that counts",
        )
    if cfg.slower is not None and (p_slower <= cfg.alpha) != cfg.slower:
        return Track(
            benchmark,
            NOT_REPRODUCED,
            0,
            n,
            change=change,
            reason=_wrong_way(change, good_count, bad_count, cfg.slower),
        )
    return _search_track(state, benchmark, change, slower_is_bad=p_slower <= cfg.alpha)


def _wrong_way(change: float, good_count: int, bad_count: int, slower: bool) -> str:
    """The reason of an endpoint check whose change runs against the regression bisected."""
    way = "faster" if slower else "slower"
    return (
        f"the bad endpoint measures {way} than the good one ({change:+.1%} with {good_count} "
        f"and {bad_count} samples): not the {'slowdown' if slower else 'speed-up'} bisected"
    )


def side_of(
    state: BisectionState,
    index: int,
    benchmark: str,
    purposes: Collection[str],
    *,
    rounds: Collection[int] | None = None,
    slower_is_bad: bool | None = None,
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
    own = [
        b
        for b in batches_of(state, index, benchmark)
        if b.purpose in purposes and (rounds is None or b.round in rounds)
    ]
    count = sum(len(b.values) for b in own)
    if not own:
        return UNDECIDED, 0
    if slower_is_bad is not None:
        taken = {b.round for b in own}
        levels = slot_levels(own)
        good = slot_levels(b for b in batches_of(state, 0, benchmark) if b.round in taken)
        bad = slot_levels(b for b in batches_of(state, n, benchmark) if b.round in taken)
        if len(levels.keys() & good.keys() & bad.keys()) >= PAIRED_MIN_SLOTS:
            near_good, near_bad = paired_sides(levels, good, bad, slower_is_bad=slower_is_bad)
            if sign_test(near_good, near_bad) <= state.config.alpha:
                return GOOD, count
            if sign_test(near_bad, near_good) <= state.config.alpha:
                return BAD, count
            return UNDECIDED, count
    taken_rounds = {b.round for b in own}
    good_ref = values_of(batches_of(state, 0, benchmark), rounds=taken_rounds)
    bad_ref = values_of(batches_of(state, n, benchmark), rounds=taken_rounds)
    if not good_ref or not bad_ref:
        good_ref = values_of(batches_of(state, 0, benchmark), purposes={ENDPOINT})
        bad_ref = values_of(batches_of(state, n, benchmark), purposes={ENDPOINT})
    return classify(values_of(own), good_ref, bad_ref, state.config).side, count


def _search_track(
    state: BisectionState, benchmark: str, change: float, *, slower_is_bad: bool | None
) -> Track:
    cfg, commits = state.config, state.commits
    n = len(commits) - 1
    sides: dict[int, str] = {0: GOOD, n: BAD}
    refine: list[int] = []
    have: dict[int, int] = {}
    for index in range(1, n):
        key = (commits[index], benchmark)
        if commits[index] in state.skipped or key in state.errors:
            continue
        side, count = side_of(
            state, index, benchmark, (SEARCH, REFINE), slower_is_bad=slower_is_bad
        )
        if not count:
            continue
        have[index] = count
        sides[index] = side
        if side == UNDECIDED and more_samples(count, cfg):
            refine.append(index)
    goods = [i for i, s in sides.items() if s == GOOD]
    bads = [i for i, s in sides.items() if s == BAD]
    first_bad, last_good = min(bads), max(goods)
    lo = max(i for i in goods if i < first_bad)
    hi = min(i for i in bads if i > last_good)
    if last_good > first_bad:
        # Not a single step: re-measure the probes that disagree before believing either.
        clash = [i for i in goods if i > first_bad] + [i for i in bads if i < last_good]
        clash = [i for i in clash if 0 < i < n and more_samples(have[i], cfg)]
        if clash:
            return Track(
                benchmark,
                "searching",
                lo,
                hi,
                sides=sides,
                refine=tuple(sorted(set(clash) | set(refine))),
                change=change,
            )
        return Track(
            benchmark,
            INCONCLUSIVE,
            lo,
            hi,
            sides=sides,
            change=change,
            reason="probes disagree: a good commit after a bad one "
            "(more than one change, or noise beyond the sample cap)",
        )
    inside_refine = tuple(i for i in refine if lo < i < hi)
    candidates = tuple(
        i
        for i in range(lo + 1, hi)
        if i not in sides
        and commits[i] not in state.skipped
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
            parts.append(
                f"{len(undecided)} commit(s) measured neither good nor bad "
                f"with {cfg.max_samples} samples"
            )
        failed = [i for i in range(lo + 1, hi) if (commits[i], benchmark) in state.errors]
        if failed:
            parts.append(f"{len(failed)} commit(s) failed to measure")
        return Track(
            benchmark,
            INCONCLUSIVE,
            lo,
            hi,
            sides=sides,
            change=change,
            reason="; ".join(parts) or "no commit left to probe",
        )
    return Track(
        benchmark,
        "searching",
        lo,
        hi,
        sides=sides,
        refine=inside_refine,
        candidates=candidates,
        change=change,
    )


def _verify_track(
    state: BisectionState,
    benchmark: str,
    lo: int,
    hi: int,
    sides: Mapping[int, str],
    change: float,
    slower_is_bad: bool | None = None,
) -> Track:
    """Verification: fresh samples of the parent and the candidate, beside both endpoints.

    The parent and the candidate (or, for a one-commit range, the endpoints themselves) are
    measured again in rounds of their own, with both endpoints beside them; only those rounds'
    samples decide.
    """
    cfg, commits = state.config, state.commits
    if not cfg.verify:
        return Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    n = len(commits) - 1
    targets = [i for i in (lo, hi) if 0 < i < n] or [0, n]
    rounds = {
        b.round for i in targets for b in batches_of(state, i, benchmark) if b.purpose == VERIFY
    }
    fresh = {
        i: values_of(batches_of(state, i, benchmark), rounds=rounds) for i in sorted({0, lo, hi, n})
    }
    have = min(len(v) for v in fresh.values()) if rounds else 0
    if have < cfg.initial_samples:
        more = cfg.initial_samples - have
        return Track(
            benchmark,
            "verifying",
            lo,
            hi,
            sides=sides,
            change=change,
            verify_more=tuple((i, more) for i in targets),
        )
    ends, direct, ends_hold, step_holds = _fresh_checks(
        state, benchmark, lo, hi, fresh, rounds, change, slower_is_bad
    )
    verify_rounds = rounds
    parent_side = (
        GOOD
        if lo == 0
        else side_of(
            state, lo, benchmark, (VERIFY,), rounds=verify_rounds, slower_is_bad=slower_is_bad
        )[0]
    )
    child_side = (
        BAD
        if hi == n
        else side_of(
            state, hi, benchmark, (VERIFY,), rounds=verify_rounds, slower_is_bad=slower_is_bad
        )[0]
    )
    if ends_hold and parent_side == GOOD and child_side == BAD and step_holds:
        return Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    contradicted = ends_hold and (parent_side == BAD or child_side == GOOD)
    more = 0 if contradicted else more_samples(have, cfg)
    if more:
        return Track(
            benchmark,
            "verifying",
            lo,
            hi,
            sides=sides,
            change=change,
            verify_more=tuple((i, more) for i in targets),
        )
    start, end = _unverified_range(sides, lo, hi, n, parent_side, child_side)
    return Track(
        benchmark,
        INCONCLUSIVE,
        start,
        end,
        sides=sides,
        change=change,
        reason=(
            f"verification failed: fresh samples put the parent {commits[lo][:10]} on the "
            f"{parent_side} side and the candidate {commits[hi][:10]} on the {child_side} "
            f"side (endpoints p={ends.p_value:.3g}, candidate against parent "
            f"p={direct.p_value:.3g})"
        ),
    )


def _unverified_range(
    sides: Mapping[int, str], lo: int, hi: int, n: int, parent_side: str, child_side: str
) -> tuple[int, int]:
    """The interval ``(start, end]`` that may hold the culprit when the verification of
    ``(lo, hi]`` did not confirm it.

    It starts at the parent when its fresh samples put it on the good side, else at the last
    commit the search judged good before it (or the good endpoint), and ends at the candidate when
    its fresh samples put it on the bad side, else at the first commit the search judged bad after
    it (or the bad endpoint): a candidate that measures good again means the search's bad
    verdict on it was wrong and the culprit lies after it, never that the range ends there.
    """
    start = (
        lo
        if parent_side == GOOD
        else max((i for i, s in sides.items() if s == GOOD and i < lo), default=0)
    )
    end = (
        hi
        if child_side == BAD
        else min((i for i, s in sides.items() if s == BAD and i > hi), default=n)
    )
    return start, end


def _fresh_checks(
    state: BisectionState,
    benchmark: str,
    lo: int,
    hi: int,
    fresh: Mapping[int, tuple[float, ...]],
    rounds: Collection[int],
    change: float,
    slower_is_bad: bool | None,
) -> tuple[Comparison, Comparison, bool, bool]:
    """A verification's comparisons of its fresh samples: the endpoints, and the candidate
    against its parent.

    Returns:
        ``(ends, direct, ends_hold, step_holds)``: the verdicts of the bad endpoint against the
        good one and of the candidate against its parent, and whether each holds in the
        regression's direction (paired by slot when the rounds line up in enough slots).
    """
    cfg = state.config
    n = len(state.commits) - 1
    good, bad, parent, child = fresh[0], fresh[n], fresh[lo], fresh[hi]
    ends = compare(bad, good, alpha=cfg.alpha)
    direct = compare(child, parent, alpha=cfg.alpha)
    levels = {
        i: slot_levels(b for b in batches_of(state, i, benchmark) if b.round in rounds) for i in fresh
    }
    common = set.intersection(*(set(v) for v in levels.values()))
    if slower_is_bad is not None and len(common) >= PAIRED_MIN_SLOTS:
        # Paired by slot: the endpoints, then the candidate against its parent.
        slower, faster, _ = paired_shift(levels[0], levels[n])
        ends_hold = (
            sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) <= cfg.alpha
        )
        slower, faster, _ = paired_shift(levels[lo], levels[hi])
        step_holds = (
            sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) <= cfg.alpha
        )
    else:
        ends_hold = (
            ends.verdict == DIFFERENT
            and (median_of(bad) - median_of(good)) * change > 0
            and endpoints_apart(good, bad)
        )
        step_holds = (
            direct.verdict == DIFFERENT and (median_of(child) - median_of(parent)) * change > 0
        )
    return ends, direct, ends_hold, step_holds
