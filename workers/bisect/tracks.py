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
from dataclasses import dataclass, field, replace

from workers.bisect.state import (
    CULPRIT,
    ENDPOINT,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    RECHECK,
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
    Shift,
    compare,
    paired_shift,
    paired_shift_interval,
    paired_sides,
    shift_interval,
    sign_test,
    slot_levels,
)
from workers.bisect.verdicts import classify as _classify


def classify(
    samples: Sequence[float], good: Sequence[float], bad: Sequence[float], config: SearchConfig
) -> Classification:
    """:func:`workers.bisect.verdicts.classify` with the thresholds of ``config``."""
    return _classify(
        samples,
        good,
        bad,
        alpha=config.alpha,
        power=config.power,
        resamples=config.resamples,
        side_alpha=config.look_alpha,
    )


@dataclass(frozen=True)
class Track:
    """One benchmark's standing, as :func:`track_of` reads it from the state."""

    benchmark: str
    # "endpoints" | "not_reproduced" | "searching" | "verifying" | "rechecking" | "culprit" |
    # "inconclusive"
    status: str
    lo: int = 0
    hi: int = 0
    sides: Mapping[int, str] = field(default_factory=dict)
    refine: tuple[int, ...] = ()  # indices that need more samples
    endpoint_more: int = 0  # samples to add at both endpoints
    verify_more: tuple[tuple[int, int], ...] = ()  # (index, fresh samples to take)
    recheck: tuple[tuple[int, int], ...] = ()  # (index, fresh samples) after a failed verification
    candidates: tuple[int, ...] = ()
    reason: str = ""
    change: float | None = None


def more_samples(have: int, config: SearchConfig) -> int:
    """Samples to add when doubling ``have`` (0 at the cap, and once measured when
    ``config.measure_once``: a count taken again says the same)."""
    if have >= config.max_samples or (config.measure_once and have > 0):
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
    thermal limits) moves all three alike. Counted once (``SearchConfig.measure_once``), no
    round holds all three, and the endpoints' first samples, their stored counts, are used.

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
    """Where ``benchmark`` stands in ``state``: read afresh from its samples every time.

    A benchmark still measuring whose budget (:class:`SearchConfig`: samples, wall time) is
    spent ends ``inconclusive`` with the range it had narrowed to.
    """
    track = _standing(state, benchmark)
    if track.status not in OPEN:
        return track
    spent = budget_spent(state, benchmark)
    if not spent:
        return track
    recoveries = len(
        {
            b.round
            for sha in state.commits
            for b in state.samples.get((sha, benchmark), ())
            if b.purpose == RECHECK
        }
    )
    if recoveries:
        spent += f" after {recoveries} failed verification(s) and their rechecks"
    reason = f"{spent}; {track.reason}" if track.reason else spent
    lo, hi = track.lo, track.hi
    if track.status == "verifying":
        # A pair not verified is not a range the measurements support: widen it to the
        # commits judged good before it and bad after it.
        lo = max((i for i, s in track.sides.items() if s == GOOD and i < lo), default=0)
        hi = min(
            (i for i, s in track.sides.items() if s == BAD and i > hi),
            default=len(state.commits) - 1,
        )
    return replace(track, status=INCONCLUSIVE, lo=lo, hi=hi, reason=reason, recheck=(), refine=())


OPEN = ("endpoints", "searching", "verifying", "rechecking")
"""The statuses of a benchmark still being measured."""


def budget_spent(state: BisectionState, benchmark: str) -> str:
    """Why the benchmark's sample or time budget is spent, or "" while it is not."""
    cfg = state.config
    taken = sum(
        len(batch.values)
        for sha in state.commits
        for batch in state.samples.get((sha, benchmark), ())
    )
    if taken >= cfg.samples_allowed():
        return f"the sample budget is spent ({taken} samples of {cfg.samples_allowed()})"
    if cfg.budget_seconds is not None and state.seconds >= cfg.budget_seconds:
        return f"the time budget is spent ({state.seconds:.0f} s of {cfg.budget_seconds:.0f} s)"
    return ""


def _standing(state: BisectionState, benchmark: str) -> Track:
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
    common = sorted(levels[0].keys() & levels[1].keys())
    if len(common) >= PAIRED_MIN_SLOTS:
        ratios = [levels[1][k] / levels[0][k] for k in common]
        shift = paired_shift_interval(ratios, alpha=cfg.look_alpha)
        slower, faster, _ = paired_shift(levels[0], levels[1])
        p = min(sign_test(slower, faster), sign_test(faster, slower))
        # Slot by slot, a round's pairs cancel the host's moment: one round may conclude.
        return _endpoint_check(state, benchmark, shift, p, len(good), len(bad), early=True)
    shift = shift_interval(good, bad, alpha=cfg.look_alpha)
    p = compare(bad, good, alpha=cfg.alpha).p_value
    # Without slots a round is one moment of the host: only a step is concluded early.
    return _endpoint_check(state, benchmark, shift, p, len(good), len(bad), early=False)


def _endpoint_check(
    state: BisectionState,
    benchmark: str,
    shift: Shift,
    p: float,
    good_count: int,
    bad_count: int,
    *,
    early: bool,
) -> Track:
    """The endpoint check: the change's interval against ``min_change``.

    The step is searched as soon as the interval lies beyond ``min_change`` in the direction
    bisected. Otherwise the endpoints get more samples (doubling, to the cap); a change whose
    interval excludes zero but lies within ``min_change``, or runs the wrong way, is concluded
    at once when ``early`` (slot by slot) and at the cap otherwise. At the cap, endpoints that
    differ at the test's level with an estimate of at least ``min_change`` are searched, and
    an interval that still straddles both zero and ``min_change`` is "too noisy".
    """
    cfg = state.config
    n = len(state.commits) - 1
    sign = -1 if cfg.slower is False or (cfg.slower is None and shift.estimate < 0) else 1
    est, low, high = shift.toward(sign)
    least = math.log1p(cfg.min_change)
    more = more_samples(min(good_count, bad_count), cfg)
    interval = f"{_pct(shift.low)} to {_pct(shift.high)} at {1 - 2 * shift.alpha:.1%}"
    counts = f"with {good_count} and {bad_count} samples"
    slower_is_bad = sign > 0 if early else None
    if low >= least:
        return _search_track(state, benchmark, shift.estimate, slower_is_bad=slower_is_bad)
    wrong_way = cfg.slower is not None and high < 0
    below = low > 0 and high < least
    outcome, reason = NOT_REPRODUCED, ""
    if wrong_way:
        reason = _wrong_way(shift.estimate, good_count, bad_count, bool(cfg.slower))
    elif below:
        reason = (
            f"the endpoints differ by {shift.estimate:+.1%} {counts}, below the "
            f"{cfg.min_change:.0%} that counts ({interval})"
        )
    if reason and early:
        return Track(benchmark, outcome, 0, n, change=shift.estimate, reason=reason)
    if more:
        return Track(benchmark, "endpoints", 0, n, endpoint_more=more, change=shift.estimate)
    if reason:
        return Track(benchmark, outcome, 0, n, change=shift.estimate, reason=reason)
    if low > 0 and est >= least:
        return _search_track(state, benchmark, shift.estimate, slower_is_bad=slower_is_bad)
    if low > 0:
        reason = (
            f"the endpoints differ by {shift.estimate:+.1%} {counts}, below the "
            f"{cfg.min_change:.0%} that counts ({interval})"
        )
    elif high < least and low > -least:
        reason = f"good and bad endpoints measure alike (p={p:.3g} {counts}; {interval})"
    else:
        outcome = INCONCLUSIVE
        reason = (
            f"the endpoints' change lies {interval} even {counts}: too noisy to tell it "
            f"from the {cfg.min_change:.0%} that counts"
        )
    return Track(benchmark, outcome, 0, n, change=shift.estimate, reason=reason)


def _pct(value: float) -> str:
    return f"{value:+.1%}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")


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
            if sign_test(near_good, near_bad) <= state.config.look_alpha:
                return GOOD, count
            if sign_test(near_bad, near_good) <= state.config.look_alpha:
                return BAD, count
            return UNDECIDED, count
    taken_rounds = {b.round for b in own}
    good_ref = values_of(batches_of(state, 0, benchmark), rounds=taken_rounds)
    bad_ref = values_of(batches_of(state, n, benchmark), rounds=taken_rounds)
    if not good_ref or not bad_ref:
        good_ref = values_of(batches_of(state, 0, benchmark), purposes={ENDPOINT})
        bad_ref = values_of(batches_of(state, n, benchmark), purposes={ENDPOINT})
    return classify(values_of(own), good_ref, bad_ref, state.config).side, count


def searched_purposes(state: BisectionState, index: int, benchmark: str) -> tuple[str, ...]:
    """The batches that place a commit during the search: its recheck's once it was rechecked
    after a failed verification (fresh and larger, they supersede), else its search's."""
    if any(b.purpose == RECHECK for b in batches_of(state, index, benchmark)):
        return (RECHECK,)
    return (SEARCH, REFINE)


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
            state,
            index,
            benchmark,
            searched_purposes(state, index, benchmark),
            slower_is_bad=slower_is_bad,
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
    if not inside_refine and (not candidates or state.builds >= cfg.builds_allowed(n)):
        return _stuck(state, benchmark, lo, hi, sides, change, bool(candidates))
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


def _stuck(
    state: BisectionState,
    benchmark: str,
    lo: int,
    hi: int,
    sides: Mapping[int, str],
    change: float,
    candidates: bool,
) -> Track:
    """A search that cannot go on inside ``(lo, hi]``: commits left to build but the build
    budget spent, or none left that could be measured."""
    cfg, commits = state.config, state.commits
    parts = []
    if candidates:
        allowed = cfg.builds_allowed(len(commits) - 1)
        parts.append(f"the build budget is spent ({state.builds} builds of {allowed})")
    skipped = [i for i in range(lo + 1, hi) if commits[i] in state.skipped]
    if skipped:
        parts.append(f"{len(skipped)} commit(s) failed to build")
    undecided = [i for i in range(lo + 1, hi) if sides.get(i) == UNDECIDED]
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
    measured again in rounds of their own (two at least when measured apart), with both
    endpoints beside them; only those rounds' samples decide: the rounds after the benchmark's latest recheck, so a pair verified again
    after a recovery (:func:`_recover`) is judged on samples the failure did not see.
    """
    cfg, commits = state.config, state.commits
    if not cfg.verify:
        return Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    if cfg.measure_once:
        return _verify_stored(state, benchmark, lo, hi, sides, change)
    n = len(commits) - 1
    targets = [i for i in (lo, hi) if 0 < i < n] or [0, n]
    last_recheck = max(
        (
            b.round
            for sha in commits
            for b in state.samples.get((sha, benchmark), ())
            if b.purpose == RECHECK
        ),
        default=-1,
    )
    rounds = {
        b.round
        for i in targets
        for b in batches_of(state, i, benchmark)
        if b.purpose == VERIFY and b.round > last_recheck
    }
    fresh = {
        i: values_of(batches_of(state, i, benchmark), rounds=rounds) for i in sorted({0, lo, hi, n})
    }
    have = min(len(v) for v in fresh.values()) if rounds else 0
    # Measured apart, each commit carries its own moment of the host, which no interval of one
    # round's samples sees: a verification then passes on two rounds at least (in 20 simulated
    # +8% bisections under 3% per-probe drift, one round once passed a good commit as culprit).
    need_rounds = 1 if slower_is_bad is not None else 2
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
    holds = ends_hold and parent_side == GOOD and child_side == BAD and step_holds
    if holds and len(rounds) >= need_rounds:
        return Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    contradicted = ends_hold and (parent_side == BAD or child_side == GOOD)
    more = 0 if contradicted else more_samples(have, cfg)
    if holds:
        more = cfg.initial_samples  # a second round, as one moment of the host may mislead
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
    reason = (
        f"verification failed: fresh samples put the parent {commits[lo][:10]} on the "
        f"{parent_side} side and the candidate {commits[hi][:10]} on the {child_side} "
        f"side (endpoints p={ends.p_value:.3g}, candidate against parent "
        f"p={direct.p_value:.3g})"
    )
    return _recover(state, benchmark, lo, hi, (start, end), sides, change, reason)


def _verify_stored(
    state: BisectionState,
    benchmark: str,
    lo: int,
    hi: int,
    sides: Mapping[int, str],
    change: float,
) -> Track:
    """Verification of an exact count (``SearchConfig.measure_once``): on the stored counts.

    A count taken again says what the first said, so nothing is measured: the culprit is named
    when the stored counts of the endpoints differ in the regression's direction and so do the
    candidate's against its parent's (the checks :func:`_fresh_checks` makes of a latency
    verification's fresh samples, here on every sample taken). Otherwise no recheck could
    change that: the benchmark ends ``inconclusive`` over the commits after the last judged
    good before the parent, up to the first judged bad after the candidate, with the
    comparison that failed.
    """
    commits = state.commits
    n = len(commits) - 1
    compared = sorted({0, lo, hi, n})
    stored = {i: values_of(batches_of(state, i, benchmark)) for i in compared}
    rounds = {b.round for i in compared for b in batches_of(state, i, benchmark)}
    checks = _fresh_checks(state, benchmark, lo, hi, stored, rounds, change, None)
    endpoints, direct, ends_hold, step_holds = checks
    if ends_hold and step_holds:
        return Track(benchmark, CULPRIT, lo, hi, sides=sides, change=change)
    reason = (
        f"verification failed: the stored counts of the parent {commits[lo][:10]} and the "
        f"candidate {commits[hi][:10]} do not hold the step (endpoints "
        f"p={endpoints.p_value:.3g}, candidate against parent p={direct.p_value:.3g})"
    )
    start = max((i for i, s in sides.items() if s == GOOD and i < lo), default=0)
    end = min((i for i, s in sides.items() if s == BAD and i > hi), default=n)
    return Track(benchmark, INCONCLUSIVE, start, end, sides=sides, change=change, reason=reason)


def _recover(
    state: BisectionState,
    benchmark: str,
    lo: int,
    hi: int,
    believed: tuple[int, int],
    sides: Mapping[int, str],
    change: float,
    reason: str,
) -> Track:
    """After a failed verification of ``(lo, hi]``: recheck the commits nearest the boundary.

    The parent, the candidate, the last commit judged good before the parent and the first judged
    bad after the candidate are measured again, ``max_samples`` each in fresh processes, in one
    round beside both endpoints; their recheck then decides their side
    (:func:`searched_purposes`) and the search resumes inside the range the measurements still
    support, verifying whichever pair it closes on (Pinpoint's answer to an uncertain
    boundary: measure more there, within a budget, rather than stop). A range with no commit
    between its endpoints has nothing to recheck and ends ``inconclusive``; so does a benchmark
    whose budget is spent (:func:`track_of`).
    """
    n = len(state.commits) - 1
    before = max((i for i, s in sides.items() if s == GOOD and i < lo), default=0)
    after = min((i for i, s in sides.items() if s == BAD and i > hi), default=n)
    targets = sorted({i for i in (before, lo, hi, after) if 0 < i < n})
    start, end = believed
    if not targets:
        return Track(benchmark, INCONCLUSIVE, start, end, sides=sides, change=change, reason=reason)
    return Track(
        benchmark,
        "rechecking",
        start,
        end,
        sides=sides,
        change=change,
        recheck=tuple((i, state.config.max_samples) for i in targets),
        reason=reason,
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
        i: slot_levels(b for b in batches_of(state, i, benchmark) if b.round in rounds)
        for i in fresh
    }
    common = set.intersection(*(set(v) for v in levels.values()))
    if slower_is_bad is not None and len(common) >= PAIRED_MIN_SLOTS:
        # Paired by slot: the endpoints, then the candidate against its parent.
        slower, faster, _ = paired_shift(levels[0], levels[n])
        ends_hold = (
            sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) <= cfg.look_alpha
        )
        slower, faster, _ = paired_shift(levels[lo], levels[hi])
        step_holds = (
            sign_test(*((slower, faster) if slower_is_bad else (faster, slower))) <= cfg.look_alpha
        )
    else:
        # The change's interval must exclude zero in the regression's direction.
        # and, measured apart, Pinpoint's verdict too: each commit carries its own moment.
        sign = 1 if change > 0 else -1
        ends_hold = (
            ends.verdict == DIFFERENT
            and shift_interval(good, bad, alpha=cfg.look_alpha).toward(sign)[1] > 0
        )
        step_holds = (
            direct.verdict == DIFFERENT
            and shift_interval(parent, child, alpha=cfg.look_alpha).toward(sign)[1] > 0
        )
    return ends, direct, ends_hold, step_holds
