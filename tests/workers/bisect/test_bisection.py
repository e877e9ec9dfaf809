"""The bisection: verdicts and search on literal and simulated samples, then on a real repository.

The pure core (:mod:`workers.bisect.search`) is driven with samples drawn from seeded
distributions, so each test is exact and quick. The ``slow`` tests bisect a generated git
repository of the ``minitok`` package with ``nightbench bisect``'s driver: real builds
(``pip install -e .`` per probe) and a real benchmark command timing a real slowdown.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.errors import InvalidInput
from workers.bisect import search as b
from workers.bisect.local_driver import bisect_repository
from workers.bisect.search import (
    BAD,
    DIFFERENT,
    GOOD,
    SAME,
    UNDECIDED,
    UNKNOWN,
    ProbeResult,
    SearchConfig,
    compare,
    next_probes,
    outcome,
    record_round,
    start,
)
from workers.bisect.tracks import classify
from workers.demo.minitok import DECODE, ENCODE, INSTALL_COMMAND, make_package_repository

# ----- verdicts on literal samples ----------------------------------------------------------------

GOOD_MS = (10.1, 9.9, 10.0, 10.2, 9.8, 10.05, 9.95, 10.1, 10.0, 9.9)
BAD_MS = (12.1, 11.9, 12.0, 12.2, 11.8, 12.05, 11.95, 12.1, 12.0, 11.9)


def test_separated_samples_are_different() -> None:
    result = compare(BAD_MS, GOOD_MS)
    assert result.verdict == DIFFERENT
    assert result.p_value <= 0.01


def test_same_needs_an_alternative_to_be_ruled_out() -> None:
    probe = (10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.1, 9.9, 10.02, 9.98)
    # Without an alternative, "same" is never said: only different or unknown.
    assert compare(probe, GOOD_MS).verdict == UNKNOWN
    with_alt = compare(probe, GOOD_MS, alternative=BAD_MS)
    assert with_alt.verdict == SAME
    assert with_alt.p_value > with_alt.high_threshold


def test_overlapping_samples_are_unknown_until_there_are_enough() -> None:
    good = (8.5, 9.0, 9.5, 10.0, 10.5, 11.0, 11.5, 9.2, 10.2, 10.8)
    bad = tuple(v + 1.0 for v in good)  # 1 ms slower, well inside the noise
    few = (9.8, 10.3, 10.9, 10.1)
    result = compare(few, good, alternative=bad)
    assert result.verdict == UNKNOWN
    assert result.low_threshold < result.p_value <= result.high_threshold
    # More samples lower the high threshold (Pinpoint's "thresholds.py" behaviour) until the
    # probe can be told apart from the other side.
    many = compare((*few, 9.7, 10.4, 10.0, 10.2) * 4, good, alternative=bad)
    assert many.high_threshold < result.high_threshold
    assert many.verdict == SAME


def test_classify_sides() -> None:
    cfg = SearchConfig()
    assert (
        classify(
            (10.0, 10.1, 9.9, 10.0, 9.95, 10.05, 10.0, 9.9, 10.1, 10.0), GOOD_MS, BAD_MS, cfg
        ).side
        == GOOD
    )
    assert (
        classify(
            (12.0, 12.1, 11.9, 12.0, 11.95, 12.05, 12.0, 11.9, 12.1, 12.0), GOOD_MS, BAD_MS, cfg
        ).side
        == BAD
    )
    # Halfway between: different from both and near neither.
    assert (
        classify(
            (11.0, 11.1, 10.9, 11.0, 10.95, 11.05, 11.0, 10.9, 11.1, 11.0), GOOD_MS, BAD_MS, cfg
        ).side
        == UNDECIDED
    )


def test_classify_tolerates_a_small_drift_but_not_a_large_one() -> None:
    cfg = SearchConfig()
    drifted_good = tuple(v * 1.03 for v in GOOD_MS)  # the machine got 3% slower since
    c = classify(drifted_good, GOOD_MS, BAD_MS, cfg)
    assert c.vs_good.verdict == DIFFERENT and c.vs_bad.verdict == DIFFERENT
    assert c.side == GOOD
    # 12% slower is past the midpoint of a 20% regression: never called good.
    assert classify(tuple(v * 1.12 for v in GOOD_MS), GOOD_MS, BAD_MS, cfg).side != GOOD


def test_a_mixture_of_two_speeds_is_undecided() -> None:
    # Half the processes ran at the good speed, half at twice it (a busy machine): the probe
    # can look "same" as bad to a rank test, yet it sits on neither side.
    mixed = (3.3, 3.26, 3.33, 3.36, 3.4, 5.92, 6.77, 6.8, 6.86, 6.94)
    good = (3.25, 3.26, 3.28, 3.29, 3.29, 3.29, 3.3, 3.3, 3.31, 3.31)
    bad = (4.36, 4.36, 4.37, 4.37, 4.39, 4.4, 4.41, 4.43, 4.47, 4.63)
    assert classify(mixed, good, bad, SearchConfig()).side == UNDECIDED


def test_compare_rejects_empty_samples() -> None:
    with pytest.raises(InvalidInput, match="at least one sample"):
        compare((), GOOD_MS)


# ----- the search on simulated measurements ------------------------------------------------------

Model = Callable[[int, str], float]


def step(culprits: Mapping[str, int], effect: float = 0.2) -> Model:
    """Median latency (ms) of benchmark ``name`` at commit ``index``: a step at its culprit."""
    return lambda index, name: 10.0 * (1 + effect if index >= culprits[name] else 1)


def simulate(
    n: int,
    model: Model,
    benchmarks: tuple[str, ...] = ("bench",),
    *,
    config: SearchConfig | None = None,
    seed: int = 0,
    noise: float = 0.02,
    broken: frozenset[int] = frozenset(),
    drift_per_round: float = 0.0,
    fresh_override: Callable[[int, str], float] | None = None,
    fresh_purposes: tuple[str, ...] = (b.VERIFY, b.RECHECK),
    paired: bool = True,
    slow_slots: float = 0.0,
) -> b.BisectionState:
    """Run the pure search over ``n`` commits, drawing samples from ``model`` with noise.

    ``paired``: the round's commits are measured slot by slot, one sample each (the local
    driver); otherwise without slots (Celery workers). ``slow_slots``: the chance that the
    machine runs at half speed during a slot, slowing every commit measured in it.
    ``fresh_override``: the level of the samples taken for ``fresh_purposes`` instead.
    """
    rng = np.random.default_rng(seed)
    state = start([f"{i:040x}" for i in range(n + 1)], benchmarks, config)
    for _ in range(300):
        requests = next_probes(state)
        if not requests:
            return state
        width = max(r.samples for r in requests)
        speed = np.where(rng.random(width) < slow_slots, 2.0, 1.0)
        results = []
        for r in requests:
            if r.index in broken:
                results.append(ProbeResult(r.sha, r.purpose, skipped="setup.py: syntax error"))
                continue
            drift = 1 + drift_per_round * state.round
            samples, slots = {}, {}
            for name in r.benchmarks:
                level = model(r.index, name)
                if fresh_override is not None and r.purpose in fresh_purposes:
                    level = fresh_override(r.index, name)
                factor = (
                    speed[: r.samples]
                    if paired
                    else np.where(rng.random(r.samples) < slow_slots, 2.0, 1.0)
                )
                samples[name] = tuple(
                    level * drift * factor * (1 + noise * rng.standard_normal(r.samples))
                )
                slots[name] = tuple(range(r.samples))
            results.append(
                ProbeResult(
                    r.sha, r.purpose, samples, build_seconds=1.5, slots=slots if paired else {}
                )
            )
        state = record_round(state, results)
    raise AssertionError("the search did not end in 300 rounds")


def culprit_indices(state: b.BisectionState) -> dict[str, int]:
    result = outcome(state)
    assert result is not None
    return {o.benchmark: state.commits.index(o.culprit) for o in result.benchmarks if o.culprit}


@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("culprit", [1, 7, 16, 17, 31, 32])
def test_one_culprit_in_32_commits_is_named_within_eight_builds(culprit: int, paired: bool) -> None:
    state = simulate(32, step({"bench": culprit}), seed=culprit, paired=paired)
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRIT
    assert culprit_indices(state) == {"bench": culprit}
    assert result.builds <= math.ceil(math.log2(33)) + 2
    # Verified: the culprit, its parent and both endpoints were measured again, side by side,
    # in one round slot by slot, in two when measured apart.
    verify_rounds = {p.round for p in state.probes if p.purpose == b.VERIFY}
    assert len(verify_rounds) == (1 if paired else 2)
    for verify_round in verify_rounds:
        measured = {p.index for p in state.probes if p.round == verify_round}
        assert measured == {0, culprit - 1, culprit, 32}
    # Every round after the first measures both endpoints again as references.
    for r in range(1, state.round):
        assert {0, 32} <= {p.index for p in state.probes if p.round == r}


def test_every_probe_is_recorded_with_verdicts() -> None:
    state = simulate(8, step({"bench": 5}))
    assert [p.round for p in state.probes] == sorted(p.round for p in state.probes)
    endpoints = [p for p in state.probes if p.purpose == b.ENDPOINT]
    assert {p.index for p in endpoints} == {0, 8}
    for probe in state.probes:
        (result,) = probe.results
        assert len(result.samples) == SearchConfig().initial_samples
        assert probe.build_seconds == 1.5
        if probe.purpose == b.SEARCH:
            assert result.side in (GOOD, BAD)
            assert result.vs_good in (DIFFERENT, SAME, UNKNOWN)


def test_more_workers_take_fewer_rounds() -> None:
    rounds = {}
    for workers in (1, 2, 4):
        state = simulate(70, step({"bench": 45}), config=SearchConfig(workers=workers), seed=4)
        assert culprit_indices(state) == {"bench": 45}
        rounds[workers] = state.round
        # Never more than W commits searched or refined in a round (the endpoints measured
        # again beside them, and a verification's pair, are built already).
        per_round: dict[int, int] = {}
        for p in state.probes:
            if p.purpose in (b.SEARCH, b.REFINE):
                per_round[p.round] = per_round.get(p.round, 0) + 1
        assert per_round and max(per_round.values()) <= workers
    assert rounds[1] > rounds[2] > rounds[4]


def test_two_benchmarks_with_two_culprits_are_both_found() -> None:
    state = simulate(32, step({"encode": 9, "decode": 24}), ("encode", "decode"), seed=2)
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRITS
    assert culprit_indices(state) == {"encode": 9, "decode": 24}
    assert [names for _, names in result.culprits] == [("encode",), ("decode",)]


def test_each_probe_measures_only_the_benchmarks_still_open_there() -> None:
    state = simulate(32, step({"encode": 3, "decode": 30}), ("encode", "decode"), seed=5)
    for probe in state.probes:
        if probe.purpose != b.SEARCH:
            continue
        measured = {r.benchmark for r in probe.results}
        # The first probe (16) splits the range: encode's culprit lies before it, decode's
        # after, so every later probe lies in one benchmark's open interval only.
        assert len(measured) == (2 if probe.round == 1 else 1)


def test_a_commit_that_fails_to_build_is_skipped_and_reported() -> None:
    state = simulate(32, step({"bench": 20}), broken=frozenset({16}))
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRIT
    assert culprit_indices(state) == {"bench": 20}
    assert result.skipped == ((state.commits[16], "setup.py: syntax error"),)
    assert any(p.status == b.SKIPPED and p.index == 16 for p in state.probes)


def test_a_skipped_parent_leaves_an_inconclusive_range_not_a_guess() -> None:
    state = simulate(32, step({"bench": 17}), broken=frozenset({16}))
    result = outcome(state)
    assert result is not None and result.kind == b.INCONCLUSIVE
    (found,) = result.benchmarks
    assert found.culprit is None
    assert found.range == (state.commits[16], state.commits[17])
    assert "failed to build" in found.reason


def test_no_change_between_the_endpoints_is_not_reproduced() -> None:
    state = simulate(32, lambda i, n: 10.0)
    result = outcome(state)
    assert result is not None and result.kind == b.NOT_REPRODUCED
    assert result.builds == 2
    # Doubling up to the cap before giving up.
    batches = state.samples[(state.good, "bench")]
    assert sum(len(batch.values) for batch in batches) == SearchConfig().max_samples


def test_a_change_below_min_change_is_not_reproduced() -> None:
    # Measured slot by slot (the local driver), a round's pairs cancel the host's moment and
    # one round decides; without slots (Celery workers) only once the endpoints were measured
    # to the cap, in rounds of their own: one round is one moment of the host.
    for paired, samples in ((True, 12), (False, SearchConfig().max_samples)):
        state = simulate(8, step({"bench": 4}, effect=0.03), noise=0.002, paired=paired)
        result = outcome(state)
        assert result is not None and result.kind == b.NOT_REPRODUCED
        assert f"with {samples} and {samples} samples, below the 5%" in result.benchmarks[0].reason
        batches = state.samples[(state.good, "bench")]
        assert sum(len(batch.values) for batch in batches) == samples


def test_a_speed_up_is_not_the_slowdown_bisected() -> None:
    # A nightly bisects a latency regression: endpoints whose bad end measures 20% faster are
    # not that regression, paired by slot or not; a range given by hand (direction unknown)
    # is searched either way, and names the commit that changed.
    for paired, samples in ((True, 12), (False, SearchConfig().max_samples)):
        state = simulate(
            8,
            step({"bench": 4}, effect=-0.2),
            noise=0.005,
            paired=paired,
            config=SearchConfig(slower=True),
        )
        result = outcome(state)
        assert result is not None and result.kind == b.NOT_REPRODUCED, paired
        (track,) = result.benchmarks
        assert track.reason.startswith("the bad endpoint measures faster than the good one (-20")
        assert f"with {samples} and {samples} samples): not the slowdown bisected" in track.reason
        assert result.builds == 2  # nothing between the endpoints was built
        either = outcome(simulate(8, step({"bench": 4}, effect=-0.2), noise=0.005, paired=paired))
        assert either is not None and either.kind == b.CULPRIT, paired
        assert either.benchmarks[0].culprit == state.commits[4]
    # The regression's own direction is bisected as before.
    slower = outcome(
        simulate(8, step({"bench": 4}), noise=0.005, paired=False, config=SearchConfig(slower=True))
    )
    assert slower is not None and slower.kind == b.CULPRIT


def test_a_real_step_whose_first_round_reads_small_is_still_bisected() -> None:
    # +10% at commit 2 of 4; during the first round the host ran the bad endpoint 6% faster,
    # so that round alone reads about +3.4%: under min_change, but the step is real.
    state = start([f"{i:040x}" for i in range(5)], ("bench",), SearchConfig())
    rng = np.random.default_rng(4)
    while requests := next_probes(state):
        results = []
        for r in requests:
            level = 10.0 * (1.1 if r.index >= 2 else 1.0)
            if state.round == 0 and r.index == 4:
                level *= 0.94
            results.append(
                ProbeResult(
                    r.sha, r.purpose, {"bench": tuple(level * rng.lognormal(0.0, 0.003, r.samples))}
                )
            )
        state = record_round(state, results)
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRIT, result
    assert result.culprits[0][0] == state.commits[2]


def test_a_gradual_change_is_inconclusive_never_a_wrong_commit() -> None:
    # Two half steps: the commits in between are halfway, neither good nor bad.
    def model(index: int, name: str) -> float:
        return 10.0 * (1 + 0.1 * (index >= 10) + 0.1 * (index >= 22))

    state = simulate(32, model, seed=3)
    result = outcome(state)
    assert result is not None
    for found in result.benchmarks:
        assert found.culprit in (None, state.commits[10], state.commits[22])
    if result.kind == b.INCONCLUSIVE:
        (found,) = result.benchmarks
        assert found.range and found.reason


def test_a_verification_that_keeps_failing_ends_inconclusive_once_the_budget_is_spent() -> None:
    # Fresh samples of the candidate measure as good in every verification, while the search's
    # and the rechecks' samples put it on the bad side: the recoveries go round until the
    # sample budget is spent, and the answer names no culprit, only the range still supported.
    state = simulate(
        16,
        step({"bench": 9}),
        seed=1,
        config=SearchConfig(budget_samples=1200),
        fresh_override=lambda index, name: 10.0 if index == 9 else step({"bench": 9})(index, name),
        fresh_purposes=(b.VERIFY,),
    )
    result = outcome(state)
    assert result is not None and result.kind == b.INCONCLUSIVE
    (found,) = result.benchmarks
    assert found.reason.startswith("the sample budget is spent ("), found.reason
    assert culprit_indices(state) == {}
    assert state.commits[9] in found.range, found.range


@pytest.mark.parametrize("paired", [True, False])
def test_a_search_misled_before_the_verification_recovers_and_names_the_culprit(
    paired: bool,
) -> None:
    # The search's rounds read commit 4 as bad (a straying moment of the host); fresh samples,
    # the verification's and the recheck's, put it on the good side, where it is: the
    # verification of 4 fails, the commits nearest the boundary are rechecked, the search
    # resumes after 4 and names 5.
    state = simulate(
        8, step({"bench": 4}), seed=2, paired=paired, fresh_override=step({"bench": 5})
    )
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRIT, result
    assert culprit_indices(state) == {"bench": 5}
    rechecked = {p.index for p in state.probes if p.purpose == b.RECHECK}
    assert 4 in rechecked, rechecked


def _literal(values: Sequence[float], count: int) -> tuple[float, ...]:
    """``count`` samples: ``values`` repeated, each repeat 0.1% slower than the last."""
    return tuple(values[k % len(values)] * (1 + 0.001 * (k // len(values))) for k in range(count))


def test_literal_probes_a_wrong_convergence_is_recovered_after_the_failed_verification() -> None:
    # Eight commits, the culprit is 5 (12 ms after it, 10 ms before). The search's samples of
    # commit 4 read 12 ms (the host strayed while it ran), so the search closes on (3, 4]. The
    # verification's fresh samples put 4 at 10 ms: it fails. The recheck (48 samples of 2, 3
    # and 4 beside both endpoints) puts 4 back on the good side, and the search resumes in
    # (4, 8]: 6 and 5 are bad, and the verification of (4, 5] names 5.
    state = start([f"{i:040x}" for i in range(9)], ("bench",), SearchConfig())
    rounds = []
    while requests := next_probes(state):
        rounds.append({r.index: r.purpose for r in requests})
        results = []
        for r in requests:
            misled = r.index == 4 and r.purpose == b.SEARCH
            values = BAD_MS if r.index >= 5 or misled else GOOD_MS
            results.append(ProbeResult(r.sha, r.purpose, {"bench": _literal(values, r.samples)}))
        state = record_round(state, results)
    assert rounds[:4] == [
        {0: b.ENDPOINT, 8: b.ENDPOINT},
        {0: b.REFERENCE, 4: b.SEARCH, 8: b.REFERENCE},
        {0: b.REFERENCE, 2: b.SEARCH, 8: b.REFERENCE},
        {0: b.REFERENCE, 3: b.SEARCH, 8: b.REFERENCE},
    ], rounds
    assert rounds[4] == {0: b.REFERENCE, 3: b.VERIFY, 4: b.VERIFY, 8: b.REFERENCE}, rounds
    assert rounds[5] == {
        0: b.REFERENCE,
        2: b.RECHECK,
        3: b.RECHECK,
        4: b.RECHECK,
        8: b.REFERENCE,
    }, rounds
    (recheck,) = [p for p in state.probes if p.purpose == b.RECHECK and p.index == 4]
    assert len(recheck.results[0].samples) == SearchConfig().max_samples
    assert recheck.results[0].side == GOOD
    result = outcome(state)
    assert result is not None and result.kind == b.CULPRIT, result
    assert result.culprits == ((state.commits[5], ("bench",)),)
    assert result.builds <= SearchConfig().builds_allowed(8)


@pytest.mark.parametrize("paired", [True, False])
def test_a_slow_drift_does_not_mislead_the_search(paired: bool) -> None:
    state = simulate(32, step({"bench": 13}), seed=7, drift_per_round=0.004, paired=paired)
    assert culprit_indices(state) in ({"bench": 13}, {})


@pytest.mark.parametrize("seed", range(10))
def test_a_machine_at_two_speeds_is_read_slot_by_slot(seed: int) -> None:
    # A third of the slots run at half speed: far more than the 15% step, but every commit in a
    # slot is slowed alike, so slot by slot the step still shows.
    culprit = 3 + 3 * seed
    state = simulate(32, step({"bench": culprit}, effect=0.15), seed=200 + seed, slow_slots=0.3)
    assert culprit_indices(state) == {"bench": culprit}


@pytest.mark.parametrize("seed", range(5))
def test_without_slots_two_speeds_never_give_a_wrong_commit(seed: int) -> None:
    # Probes measured apart (Celery workers) cannot cancel the machine's speed changes: the
    # search may give up, but never names a wrong commit.
    culprit = 5 + 5 * seed
    state = simulate(
        32, step({"bench": culprit}, effect=0.15), seed=300 + seed, slow_slots=0.2, paired=False
    )
    assert culprit_indices(state) in ({"bench": culprit}, {})


@pytest.mark.parametrize("seed", range(20))
def test_noisy_trials_never_name_a_wrong_commit(seed: int) -> None:
    culprit = 1 + seed % 32
    state = simulate(32, step({"bench": culprit}, effect=0.15), seed=100 + seed, noise=0.04)
    assert culprit_indices(state) in ({"bench": culprit}, {})


def test_state_is_immutable_and_planning_is_pure() -> None:
    state = start([f"{i:040x}" for i in range(9)], ["bench"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.round = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        state.samples[("x", "bench")] = (1.0,)  # type: ignore[index]
    assert next_probes(state) == next_probes(state)
    first = next_probes(state)
    assert [r.index for r in first] == [0, 8] and all(r.purpose == b.ENDPOINT for r in first)
    after = record_round(state, [ProbeResult(r.sha, r.purpose, {"bench": GOOD_MS}) for r in first])
    assert state.round == 0 and not state.probes and after.round == 1


def test_bad_input_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput, match="good and a bad"):
        start(["a" * 40], ["bench"])
    with pytest.raises(InvalidInput, match="repeats a commit"):
        start(["a" * 40, "a" * 40], ["bench"])
    with pytest.raises(InvalidInput, match="at least one benchmark"):
        start(["a" * 40, "b" * 40], [])
    with pytest.raises(InvalidInput, match="workers"):
        SearchConfig(workers=0)
    state = start(["a" * 40, "b" * 40], ["bench"])
    with pytest.raises(InvalidInput, match="positive finite"):
        record_round(state, [ProbeResult("a" * 40, b.ENDPOINT, {"bench": (1.0, -2.0)})])
    with pytest.raises(InvalidInput, match="not in the commit range"):
        record_round(state, [ProbeResult("c" * 40, b.ENDPOINT, {"bench": (1.0,)})])
    with pytest.raises(InvalidInput, match="not bisected"):
        record_round(state, [ProbeResult("a" * 40, b.ENDPOINT, {"other": (1.0,)})])


def test_floor_builds() -> None:
    assert [b.floor_builds(n) for n in (1, 8, 32, 70)] == [1, 4, 6, 7]


# ----- a real repository, real builds, a real slowdown --------------------------------------


def _tracks(data: Mapping[str, Any], shas: Sequence[str]) -> list[tuple[str, str, str, list[int]]]:
    """Each benchmark's status, reason and range (as commit positions), for a failure message."""
    return [
        (b["benchmark"], b["status"], b["reason"], [shas.index(s) for s in b["range"]])
        for b in data["benchmarks"]
    ]


@pytest.fixture(autouse=False)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.measured
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_bisect_names_the_culprit_of_a_real_slowdown(tmp_path: Path) -> None:
    # The culprit re-validates at every lookup (encode about 7x slower), as in the two-culprit
    # test below. With the +30% step (docs/benchmarks.md "Bisection": 20 of 20 named here), a
    # CI host whose per-process speed wandered left the step undecided at the 48-sample cap in
    # two bisections in a row (an honest "inconclusive", never a wrong commit): whether +30%
    # stands out of a host's noise is the benchmark's to record, not a test's. What this
    # follows is the whole path on a real repository: builds, measuring processes, the search,
    # the verification and the culprit's commit metadata.
    repo = make_package_repository(
        tmp_path / "minitok", commits=32, encode_culprit=21, per_lookup=True
    )
    data = bisect_repository(
        repo.path,
        repo.good,
        repo.bad,
        commands=[ENCODE],
        install=INSTALL_COMMAND,
        work_dir=tmp_path / "builds",
    ).as_json()
    assert data["outcome"] == "culprit", _tracks(data, repo.shas)
    (culprit,) = data["culprits"]
    assert culprit["sha"] == repo.culprits[ENCODE]
    assert culprit["title"] == "Validate words and pieces while encoding (#1022)"
    assert culprit["pr_number"] == 1022
    assert culprit["author"] and culprit["benchmarks"] == [ENCODE]
    # Nominally about +600%; a busy machine moves the measured figure, not by that much.
    assert culprit["change"][ENCODE] > 1.0
    assert data["builds"] <= math.ceil(math.log2(33)) + 2
    assert data["builds"] == len({p["sha"] for p in data["probes"]})
    assert all(p["build_seconds"] > 0 for p in data["probes"])
    assert all(len(r["samples"]) >= 10 for p in data["probes"] for r in p["results"])
    # The builds are removed afterwards.
    assert not any((tmp_path / "builds").glob("*/src"))


@pytest.mark.measured
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_bisect_finds_two_culprits_and_skips_a_broken_build(tmp_path: Path) -> None:
    # Both culprits re-validate at every lookup (encode about 7x, decode about 5x). What this
    # test follows is two tracks searched side by side around a broken build; a host whose
    # speed switches between two levels from one round to the next (1.8x apart, seen on this
    # machine and in CI) left a +25% decode step's verification undecided in 3 of 5 runs.
    repo = make_package_repository(
        tmp_path / "minitok",
        commits=16,
        encode_culprit=11,
        decode_culprit=4,
        broken=[8],
        per_lookup=True,
    )
    report = bisect_repository(
        repo.path,
        repo.good,
        repo.bad,
        commands=[ENCODE, DECODE],
        install=INSTALL_COMMAND,
        work_dir=tmp_path / "builds",
    )
    data = report.as_json()
    assert data["outcome"] == "culprits", _tracks(data, repo.shas)
    found = {c["sha"]: c["benchmarks"] for c in data["culprits"]}
    assert found == {repo.culprits[DECODE]: [DECODE], repo.culprits[ENCODE]: [ENCODE]}
    (skipped,) = data["skipped"]
    assert skipped["sha"] == repo.broken[0]
    assert "install command" in skipped["reason"] and "TOMLDecodeError" in skipped["reason"]
    assert any(p["status"] == "skipped" for p in data["probes"])


@pytest.mark.measured
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.skipif(
    not os.environ.get("NIGHTBENCH_NEAR_THRESHOLD_BISECTION"),
    reason="a +8% step at a few percent of noise: named 6 of 6 on a quiet host, but inconclusive "
    "twice in one CI run on a host loaded by other work; opt in with "
    "NIGHTBENCH_NEAR_THRESHOLD_BISECTION=1 (docs/bisection.md has the repeated runs)",
)
def test_bisect_names_a_python_level_slowdown_near_the_threshold(tmp_path: Path) -> None:
    # About +8% (one alphabetic scan per word in encode) among 16 commits: the endpoints differ
    # by a few times the noise, so the endpoint check's interval, not a separation of the
    # samples, decides (docs/bisection.md: the repeated runs). A wrong commit is never the
    # answer; an inconclusive one says which budget or check stopped it.
    repo = make_package_repository(tmp_path / "minitok", commits=16, encode_culprit=11, light=True)
    data = bisect_repository(
        repo.path,
        repo.good,
        repo.bad,
        commands=[ENCODE],
        install=INSTALL_COMMAND,
        work_dir=tmp_path / "builds",
        config=SearchConfig(slower=True),
    ).as_json()
    named = [c["sha"] for c in data["culprits"]]
    assert named in ([], [repo.culprits[ENCODE]]), _tracks(data, repo.shas)
    assert data["outcome"] == "culprit", _tracks(data, repo.shas)
    (culprit,) = data["culprits"]
    assert culprit["title"] == "Check that words are alphabetic while encoding (#1012)"
    assert 0.02 < culprit["change"][ENCODE] < 0.3


def test_commands_and_benchmarks_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="either"):
        bisect_repository(tmp_path, "a" * 40, "b" * 40, commands=[], benchmarks=[])
    with pytest.raises(InvalidInput, match="MODEL:MODE:DEVICE"):
        bisect_repository(tmp_path, "a" * 40, "b" * 40, benchmarks=["resnet18"])
