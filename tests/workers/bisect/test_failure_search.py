"""The failure bisection's search, on literal pass/fail probes: the first failing commit, or an
honest inconclusive range, never a guess."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from service.errors import InvalidInput
from workers.bisect.failures import (
    FAILED,
    RAN,
    RUNS,
    SKIPPED,
    FailureOutcome,
    FailureProbe,
    FailureSearch,
    failure_outcome,
    next_failure_probes,
    record_failures,
    start_failure_search,
)

SHAS = tuple(f"{i:02d}" + "c" * 38 for i in range(17))  # 16 commits after the good endpoint


def _run(state: FailureSearch, status: Callable[[int, int], str]) -> FailureOutcome:
    """Run the search to its end; ``status(index, runs before at that index)`` stands in for a
    build (``skipped``) and one suite process (``ran`` or ``failed``)."""
    runs: dict[int, int] = {}
    while (wanted := next_failure_probes(state)):
        results = []
        for p in wanted:
            got = []
            for _ in range(RUNS):
                got.append(status(p.index, runs.get(p.index, 0)))
                runs[p.index] = runs.get(p.index, 0) + 1
            failed = got.count(FAILED)
            results.append(replace(p, ran=got.count(RAN), failed=failed,
                                   skipped=SKIPPED in got,
                                   detail="TypeError: boom" if failed else None))
        state = record_failures(state, results)
        assert state.round < 40
    final = failure_outcome(state)
    assert final is not None
    return final


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("culprit", [1, 2, 7, 8, 9, 15, 16])
def test_the_first_failing_commit_is_named_wherever_it_lies(culprit: int, workers: int) -> None:
    state = start_failure_search(SHAS, "tokbag:eval:cpu", workers)
    final = _run(state, lambda i, _: FAILED if i >= culprit else RAN)
    assert final.kind == "culprit" and final.culprit == SHAS[culprit], final
    assert final.range == (SHAS[culprit],)
    assert final.error == "TypeError: boom"
    assert final.reason == (f"it runs at its parent {SHAS[culprit - 1][:10]} (4 of 4 runs) and "
                            f"fails from {SHAS[culprit][:10]} on (4 of 4 runs)")
    # Both endpoints, the search (about log_{W+1} 16 rounds), then parent and child again.
    assert final.rounds <= 2 + math.ceil(math.log(16, workers + 1)) + 1
    assert final.builds <= 2 + workers * math.ceil(math.log(16, workers + 1))


def test_a_commit_that_does_not_build_is_stepped_around() -> None:
    # 9 does not build; the search probes its neighbours and still finds 12.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, _: SKIPPED if i == 8 else (FAILED if i >= 12 else RAN))
    assert final.kind == "culprit" and final.culprit == SHAS[12]


def test_unbuildable_commits_beside_the_culprit_leave_a_range() -> None:
    # 7 and 8 do not build, the failure starts at 8: 7..8 may hold it, no commit is named.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, _: SKIPPED if i in (7, 8) else (FAILED if i >= 8 else RAN))
    assert final.kind == "inconclusive" and final.culprit is None
    assert final.range == SHAS[7:10]
    assert "did not build" in final.reason


@pytest.mark.parametrize(("status", "words"), [
    (lambda i, _: RAN, "the first failing build 16cccccccc runs"),
    (lambda i, _: FAILED, "the last good build 00cccccccc fails too"),
    (lambda i, _: SKIPPED if i == 16 else (FAILED if i >= 5 else RAN), "did not build"),
])
def test_a_failure_the_endpoints_do_not_show_is_not_reproduced(
        status: Callable[[int, int], str], words: str) -> None:
    final = _run(start_failure_search(SHAS, "b"), status)
    assert final.kind == "not_reproduced" and final.culprit is None, final
    assert words in final.reason and final.rounds == 1
    assert final.range == SHAS[1:]


def test_a_run_that_disagrees_is_outvoted_or_probed_again() -> None:
    # Commit 8 (before the culprit, 12) fails on its first run only: a tie, probed again, then
    # outvoted (3 of 4 runs ran). The answer stands.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, n: FAILED if i >= 12 or (i == 8 and n == 0) else RAN)
    assert final.kind == "culprit" and final.culprit == SHAS[12], final
    # Commit 14 (after the culprit, 10) runs once in four: still failing by the majority.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, n: RAN if i < 10 or (i == 14 and n == 1) else FAILED)
    assert final.kind == "culprit" and final.culprit == SHAS[10], final


def test_a_failure_that_comes_and_goes_is_never_named() -> None:
    # One round of three probes: it fails at 4 but runs at 8. No commit is named.
    final = _run(start_failure_search(SHAS, "b", workers=3),
                 lambda i, _: FAILED if i == 4 or i >= 12 else RAN)
    assert final.kind == "inconclusive" and final.culprit is None
    assert "it ran at 08cccccccc, after failing at 04cccccccc" in final.reason, final.reason
    # The parent fails on a run of its last probe (a flaky benchmark): the range widens to the
    # commit below it that ran (here the good endpoint: 8 failed, 4 ran, 6 and 5 failed), and
    # holds the culprit.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, n: FAILED if i >= 5 or (i == 4 and n == 2) else RAN)
    assert final.kind == "inconclusive", final
    assert "04cccccccc ran 1 and failed 1 of 2 runs" in final.reason, final.reason
    assert final.range == SHAS[1:6]
    # A commit that fails and runs by turns, twice over, is stepped around like an unbuildable one.
    final = _run(start_failure_search(SHAS, "b"),
                 lambda i, n: FAILED if i >= 9 or (i == 8 and n % 2) else RAN)
    assert final.kind == "inconclusive" and final.range == SHAS[8:10], final


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidInput, match="good and a bad"):
        start_failure_search(SHAS[:1], "b")
    with pytest.raises(InvalidInput, match="appears twice"):
        start_failure_search((SHAS[0], SHAS[0]), "b")
    with pytest.raises(InvalidInput, match="workers"):
        start_failure_search(SHAS, "b", 0)
    state = start_failure_search(SHAS, "b")
    with pytest.raises(InvalidInput, match="expected probes"):
        record_failures(state, [FailureProbe(3, SHAS[3], "search", RAN)])
    with pytest.raises(InvalidInput, match="no run"):
        record_failures(state, [FailureProbe(0, SHAS[0], "endpoint"),
                                FailureProbe(16, SHAS[16], "endpoint", failed=2)])
