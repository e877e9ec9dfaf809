"""Bisect a commit range to the culprit: statistical verdicts, fewest builds, W probes per round.

The search is pure: a :class:`BisectionState` (frozen, in :mod:`workers.bisect.state`) holds the
commit range, the regressed benchmarks and every sample measured so far; :func:`next_probes`
says which commits to measure next (and how many samples of which benchmarks);
:func:`record_round` folds the measurements in and returns the next state; :func:`outcome`
reads the answer once no probe is left. The statistics live in :mod:`workers.bisect.verdicts`,
where each benchmark stands (its interval, its probes' sides, its verification) in
:mod:`workers.bisect.tracks`. Nothing here builds or runs anything: the local driver
(:mod:`workers.bisect.local_driver`) and the Celery tasks do that, and the tests drive the same
functions with literal and simulated samples.

Method
------
*Verdicts* follow Chromium's Pinpoint (catapult ``dashboard/pinpoint/models/compare/compare.py``
and ``thresholds.py``): the p-value of two sets of raw samples is the smaller of the two-sided
Mann–Whitney U and Kolmogorov–Smirnov tests; p ≤ 0.01 (the *low threshold*) is ``different``; p
above a *high threshold* (simulated from the endpoints) is ``same``; in between ``unknown``. They
are recorded beside every probe; what decides is below.

*Endpoints*: the change between them is an interval, not a midpoint the samples must not
straddle. Measured apart (Celery workers), the Hodges–Lehmann shift of the log samples with its
Mann–Whitney confidence interval (:func:`~workers.bisect.verdicts.shift_interval`); measured slot
by slot (the local driver), the median per-slot ratio with its sign-test interval
(:func:`~workers.bisect.verdicts.paired_shift_interval`). Both rest on ranks or signs, so a few
samples descheduled to 5–13 times their level weigh as any other sample. The step is searched as
soon as the interval lies beyond ``min_change`` in the direction bisected
(``SearchConfig.slower``); otherwise the endpoints' samples double up to the cap (without slots
a round is one moment of the host, and a real +7.5% step judged on one round was called not
reproduced in about one bisection in four, ``benchmarks/bisection_endpoints.py``). At the cap,
endpoints that differ at the test's level with an estimate of at least ``min_change`` are
searched, a change within ``min_change`` (or the other way) is ``not_reproduced``, and only an
interval that still straddles both zero and ``min_change`` is "too noisy".

*References*: every round measures both endpoints again beside its probes (they are built
already), and a probe is judged only against the endpoint samples of its own rounds
(:func:`~workers.bisect.tracks.paired`), so a machine whose speed wanders between rounds moves a
probe and its yardstick alike. The local driver measures a round's commits slot by slot, one
process of each back to back, and records each sample's slot; each slot is then a paired
comparison (:func:`paired_sides`), which cancels a machine that switches between two speeds
from one second to the next (another tenant on the core, a clock that steps down).

*Counted once*: an exact count (``SearchConfig.measure_once``, set from the metric table's
``KindRule.bisect_once``) does not drift with the host, so the references above buy nothing:
each commit is counted once per benchmark, the endpoints in the first round only, every probe
is judged against the endpoints' stored counts (its record's ``reference_rounds`` name the
round they came from), an undecided commit is not counted again, and the verification below
judges the parent and the candidate on their stored counts. A bisection of N commits then
takes about ⌈log2(N+1)⌉ + 2 counted measurements instead of about three a round.

*Sides*: slot by slot, a probe is *good* when a sign test puts it on the good side of the
midpoint between the endpoints measured beside it in significantly many slots, *bad* in the
mirror case. Without slots, it is *good* when the upper bounds of its shift intervals against
both endpoints lie below the midpoint between them (half their Hodges–Lehmann shift, in log
units), *bad* in the mirror case (:func:`~workers.bisect.verdicts.side_by_shift`); a drift of
the host of less than half the step is tolerated. Otherwise the probe is undecided.

*Samples where they are needed*: a commit starts with ``initial_samples``; an undecided one has
them doubled up to ``max_samples`` (a group-sequential test with at most
``SearchConfig.looks`` looks), and each look tests at ``alpha`` / looks
(``SearchConfig.look_alpha``, Bonferroni), so a side decided at any look is wrong with
probability at most ``alpha`` (0.01) whatever the number of looks taken.

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

*Recovery*: a failed verification is information, not an end. The parent, the candidate, the
last commit judged good before the parent and the first judged bad after the candidate are
measured again (``recheck``: ``max_samples`` each, fresh processes, one round beside both
endpoints); their recheck then decides their side, and the search resumes inside the range its
measurements still support, verifying whichever pair it closes on on samples taken after the
recheck (Pinpoint's answer to an uncertain boundary: measure more there, within a budget).

*Budget*: builds, samples and wall time (``SearchConfig.budget_*``). A benchmark whose budget
is spent ends ``inconclusive``, naming the narrowest range its measurements support (an
unverified pair widened to the commits judged good before it and bad after it). How the rules
were measured: ``docs/bisection.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

from service.errors import InvalidInput
from workers.bisect.state import (
    CULPRIT,
    CULPRITS,
    ENDPOINT,
    INCONCLUSIVE,
    MEASURED,
    NOT_REPRODUCED,
    OUTCOMES,
    RECHECK,
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
from workers.bisect.tracks import (
    Track,
    batches_of,
    more_samples,
    paired,
    paired_direction,
    side_of,
    track_of,
    values_of,
)
from workers.bisect.verdicts import (
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
)

__all__ = [
    "BAD",
    "CULPRIT",
    "CULPRITS",
    "DIFFERENT",
    "ENDPOINT",
    "GOOD",
    "INCONCLUSIVE",
    "MEASURED",
    "NOT_REPRODUCED",
    "OUTCOMES",
    "PAIRED_MIN_SLOTS",
    "RECHECK",
    "REFERENCE",
    "REFINE",
    "SAME",
    "SEARCH",
    "SKIPPED",
    "UNDECIDED",
    "UNKNOWN",
    "VERDICTS",
    "VERIFY",
    "Batch",
    "BenchmarkOutcome",
    "BenchmarkVerdict",
    "BisectionState",
    "Classification",
    "Comparison",
    "Outcome",
    "ProbeRecord",
    "ProbeRequest",
    "ProbeResult",
    "SearchConfig",
    "compare",
    "floor_builds",
    "next_probes",
    "outcome",
    "record_round",
    "start",
]


# ---------------------------------------------------------------------------------------------
# Planning


def _spread(lo: int, hi: int, candidates: Sequence[int], k: int) -> list[int]:
    """K candidates closest to the points splitting (lo, hi) into k+1 equal parts."""
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
    those are built already, so W bounds the builds of a round. With
    ``SearchConfig.measure_once`` (an exact count) a round holds only what was not measured
    yet: no references, refinements or verification rounds, normally just the new probes.

    Args:
        state: the current state.

    Returns:
        Requests, one per commit, in range order.
    """
    commits = state.commits
    tracks = [track_of(state, b) for b in state.benchmarks]
    n = len(commits) - 1
    endpoint_tracks = [t for t in tracks if t.status == "endpoints"]
    chosen: dict[int, dict]
    if endpoint_tracks:
        more = max(t.endpoint_more for t in endpoint_tracks)
        names = [t.benchmark for t in endpoint_tracks]
        chosen = {
            i: {"benchmarks": list(names), "samples": more, "purpose": ENDPOINT} for i in (0, n)
        }
    else:
        requests = _remeasurements(state, tracks)
        taken = {i for i, _ in requests}
        free = state.config.workers - sum(1 for _, e in requests if e["purpose"] == REFINE)
        free = min(free, state.config.builds_allowed(n) - state.builds)
        searching = [t for t in tracks if t.status == "searching" and t.candidates]
        chosen = dict(requests + _new_probes(state, searching, free, taken))
        if chosen:
            _add_references(state, chosen, n)
    if state.config.measure_once:
        _drop_measured(state, chosen)
    return tuple(
        ProbeRequest(commits[i], i, tuple(e["benchmarks"]), e["samples"], e["purpose"])
        for i, e in sorted(chosen.items())
    )


def _want(wanted: dict[int, dict], index: int, benchmark: str, samples: int, purpose: str) -> None:
    """Ask for ``samples`` of ``benchmark`` at commit ``index`` (merged with earlier asks)."""
    entry = wanted.setdefault(index, {"benchmarks": [], "samples": 0, "purpose": purpose})
    if benchmark not in entry["benchmarks"]:
        entry["benchmarks"].append(benchmark)
    entry["samples"] = max(entry["samples"], samples)


def _remeasurements(state: BisectionState, tracks: list[Track]) -> list[tuple[int, dict]]:
    """A verification's commits (all of them) and a recovery's rechecks, then at most W
    re-measurements of undecided probes: they need no new build. A verification's commits are
    measured in one round whatever W is: their comparison needs them side by side in time."""
    wanted: dict[int, dict] = {}
    for t in tracks:
        if t.status == "verifying":
            for index, more in t.verify_more:
                _want(wanted, index, t.benchmark, more, VERIFY)
        for index, more in t.recheck:
            if index not in wanted or wanted[index]["purpose"] == RECHECK:
                _want(wanted, index, t.benchmark, more, RECHECK)
    verifying = sorted(wanted.items())
    for t in tracks:
        for index in t.refine:
            have = len(paired(state, index, t.benchmark, (SEARCH, REFINE))[0])
            if index not in wanted or wanted[index]["purpose"] == REFINE:
                _want(wanted, index, t.benchmark, more_samples(have, state.config), REFINE)
    refining = sorted((i, e) for i, e in wanted.items() if e["purpose"] == REFINE)
    return verifying + refining[: state.config.workers]


def _new_probes(
    state: BisectionState, searching: list[Track], free: int, taken: set[int]
) -> list[tuple[int, dict]]:
    """New commits to build, ``free`` of them, spread over the open intervals (the widest per
    slot first); ``taken`` gains the chosen indices."""
    groups: dict[tuple[int, int], list[Track]] = {}
    for t in searching:
        groups.setdefault((t.lo, t.hi), []).append(t)
    slots = {key: 0 for key in groups}
    for _ in range(max(free, 0)):
        open_groups = [
            key
            for key in groups
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
                t.benchmark for t in searching if t.lo < index < t.hi and index in t.candidates
            ]
            new.append(
                (
                    index,
                    {
                        "benchmarks": open_here,
                        "samples": state.config.initial_samples,
                        "purpose": SEARCH,
                    },
                )
            )
    return new


def _drop_measured(state: BisectionState, chosen: dict[int, dict]) -> None:
    """Leave out of ``chosen`` every benchmark already measured (or failed) at its commit, and
    the commits left with none: with ``SearchConfig.measure_once`` a round measures only what
    was not measured yet, and the endpoints' stored samples stand in for their references."""
    for index in list(chosen):
        sha = state.commits[index]
        entry = chosen[index]
        entry["benchmarks"] = [
            name
            for name in entry["benchmarks"]
            if (sha, name) not in state.samples and (sha, name) not in state.errors
        ]
        if not entry["benchmarks"]:
            del chosen[index]


def _add_references(state: BisectionState, chosen: dict[int, dict], n: int) -> None:
    """Both endpoints again, beside this round's probes: each probe is judged against endpoint
    samples of its own rounds (see :func:`paired`)."""
    measured = sorted(
        {name for e in chosen.values() for name in e["benchmarks"]}, key=state.benchmarks.index
    )
    most = max(e["samples"] for e in chosen.values())
    for end in (0, n):
        entry = chosen.setdefault(end, {"benchmarks": [], "samples": 0, "purpose": REFERENCE})
        entry["benchmarks"] = sorted(
            set(entry["benchmarks"]) | set(measured), key=state.benchmarks.index
        )
        entry["samples"] = max(entry["samples"], most)


# ---------------------------------------------------------------------------------------------
# Recording


def record_round(
    state: BisectionState, results: Iterable[ProbeResult], *, seconds: float = 0.0
) -> BisectionState:
    """Fold one round's measurements into a new state.

    Args:
        state: the state the round was planned from.
        results: one :class:`ProbeResult` per measured or skipped commit.
        seconds: the round's wall time (s), counted against ``SearchConfig.budget_seconds``.

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
        state,
        samples=frozen_mapping(samples),
        skipped=frozen_mapping(skipped),
        errors=frozen_mapping(errors),
    )
    records = []
    for r in results:
        index = index_of[r.sha]
        if r.skipped is not None:
            records.append(
                ProbeRecord(
                    state.round, r.sha, index, r.purpose, SKIPPED, r.build_seconds, (), r.skipped
                )
            )
            continue
        verdicts = [_verdict(new_state, r, name, index) for name in r.samples]
        verdicts += [
            BenchmarkVerdict(name, (), None, None, None, error) for name, error in r.errors.items()
        ]
        records.append(
            ProbeRecord(
                state.round, r.sha, index, r.purpose, MEASURED, r.build_seconds, tuple(verdicts)
            )
        )
    return replace(
        new_state,
        round=state.round + 1,
        probes=state.probes + tuple(records),
        seconds=state.seconds + max(seconds, 0.0),
    )


def _references(state: BisectionState, end: int, name: str) -> tuple[Batch, ...]:
    """The batches of endpoint ``end`` a probe of the round being recorded is judged against:
    those of the same round, or with ``SearchConfig.measure_once`` every stored one (the
    endpoints are then measured in the first round only)."""
    batches = batches_of(state, end, name)
    if state.config.measure_once:
        return batches
    return tuple(b for b in batches if b.round == state.round)


def _rounds_of(*groups: Sequence[Batch]) -> tuple[int, ...]:
    """The distinct rounds of ``groups``' batches, in order."""
    return tuple(sorted({b.round for group in groups for b in group}))


def _verdict(state: BisectionState, r: ProbeResult, name: str, index: int) -> BenchmarkVerdict:
    """One probe's record: Pinpoint's verdicts of its samples against the endpoints' samples of
    the same round (or, measured once, their stored samples: ``reference_rounds`` says which),
    and the side the search puts the commit on with all its samples so far."""
    cfg = state.config
    taken = tuple(float(v) for v in r.samples[name])
    n = len(state.commits) - 1
    if index in (0, n):
        other = _references(state, n if index == 0 else 0, name)
        if not other:
            return BenchmarkVerdict(name, taken, None, None, GOOD if index == 0 else BAD)
        verdict = compare(taken, values_of(other), alpha=cfg.alpha).verdict
        refs = _rounds_of(other)
        if index == 0:
            return BenchmarkVerdict(name, taken, None, verdict, GOOD, reference_rounds=refs)
        return BenchmarkVerdict(name, taken, verdict, None, BAD, reference_rounds=refs)
    good_batches, bad_batches = _references(state, 0, name), _references(state, n, name)
    good, bad = values_of(good_batches), values_of(bad_batches)
    if not good or not bad:
        return BenchmarkVerdict(name, taken, None, None, None)
    vs_good = compare(
        taken, good, alternative=bad, alpha=cfg.alpha, power=cfg.power, resamples=cfg.resamples
    )
    vs_bad = compare(
        taken, bad, alternative=good, alpha=cfg.alpha, power=cfg.power, resamples=cfg.resamples
    )
    purposes = (r.purpose,) if r.purpose in (VERIFY, RECHECK) else (SEARCH, REFINE)
    side, _ = side_of(state, index, name, purposes, slower_is_bad=paired_direction(state, name))
    return BenchmarkVerdict(
        name,
        taken,
        vs_good.verdict,
        vs_bad.verdict,
        side,
        reference_rounds=_rounds_of(good_batches, bad_batches),
    )


# ---------------------------------------------------------------------------------------------
# Outcome


def outcome(state: BisectionState) -> Outcome | None:
    """The answer, or None while :func:`next_probes` still has probes to run."""
    if next_probes(state):
        return None
    commits = state.commits
    per: list[BenchmarkOutcome] = []
    for t in (track_of(state, b) for b in state.benchmarks):
        if t.status == CULPRIT:
            per.append(
                BenchmarkOutcome(t.benchmark, CULPRIT, commits[t.hi], (commits[t.hi],), t.change)
            )
        elif t.status == NOT_REPRODUCED:
            per.append(BenchmarkOutcome(t.benchmark, NOT_REPRODUCED, None, (), t.change, t.reason))
        else:
            per.append(
                BenchmarkOutcome(
                    t.benchmark,
                    INCONCLUSIVE,
                    None,
                    tuple(commits[t.lo + 1 : t.hi + 1]),
                    t.change,
                    t.reason or "the search stopped without a verdict",
                )
            )
    culprits: dict[str, list[str]] = {}
    for o in per:
        if o.culprit:
            culprits.setdefault(o.culprit, []).append(o.benchmark)
    order = {sha: i for i, sha in enumerate(commits)}
    ordered = tuple(
        (sha, tuple(names)) for sha, names in sorted(culprits.items(), key=lambda kv: order[kv[0]])
    )
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
