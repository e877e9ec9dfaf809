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
    OTHER,
    RAN,
    RUNS,
    SKIPPED,
    FailureOutcome,
    FailureProbe,
    FailureSearch,
    failure_outcome,
    failure_signature,
    next_failure_probes,
    record_failures,
    start_failure_search,
)

SHAS = tuple(f"{i:02d}" + "c" * 38 for i in range(17))  # 16 commits after the good endpoint
NIGHT = "TypeError: boom (at models/tokbag.py:40 in forward)"  # the night's error
ANOTHER = "b:eval:cpu: ImportError: cannot import name 'sdpa' (at models/tokbag.py:3 in <module>)"


def _run(state: FailureSearch, status: Callable[[int, int], str]) -> FailureOutcome:
    """Run the search to its end; ``status(index, runs before at that index)`` stands in for a
    build (``skipped``) and one suite process (``ran`` or ``failed``)."""
    runs: dict[int, int] = {}
    while wanted := next_failure_probes(state):
        results = []
        for p in wanted:
            got = []
            for _ in range(RUNS):
                got.append(status(p.index, runs.get(p.index, 0)))
                runs[p.index] = runs.get(p.index, 0) + 1
            failed = got.count(FAILED) + got.count(OTHER)
            detail = ANOTHER if OTHER in got else "TypeError: boom" if failed else None
            results.append(
                replace(p, ran=got.count(RAN), failed=failed, skipped=SKIPPED in got, detail=detail)
            )
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
    assert final.reason == (
        f"it runs at its parent {SHAS[culprit - 1][:10]} (4 of 4 runs) and "
        f"fails from {SHAS[culprit][:10]} on (4 of 4 runs)"
    )
    # Both endpoints, the search (about log_{W+1} 16 rounds), then parent and child again.
    assert final.rounds <= 2 + math.ceil(math.log(16, workers + 1)) + 1
    assert final.builds <= 2 + workers * math.ceil(math.log(16, workers + 1))


def test_a_commit_that_does_not_build_is_stepped_around() -> None:
    # 9 does not build; the search probes its neighbours and still finds 12.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, _: SKIPPED if i == 8 else (FAILED if i >= 12 else RAN),
    )
    assert final.kind == "culprit" and final.culprit == SHAS[12]


def test_unbuildable_commits_beside_the_culprit_leave_a_range() -> None:
    # 7 and 8 do not build, the failure starts at 8: 7..8 may hold it, no commit is named.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, _: SKIPPED if i in (7, 8) else (FAILED if i >= 8 else RAN),
    )
    assert final.kind == "inconclusive" and final.culprit is None
    assert final.range == SHAS[7:10]
    assert "did not build" in final.reason


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (lambda i, _: RAN, "the first failing build 16cccccccc runs"),
        (lambda i, _: FAILED, "the last good build 00cccccccc fails too"),
        (lambda i, _: SKIPPED if i == 16 else (FAILED if i >= 5 else RAN), "did not build"),
    ],
)
def test_a_failure_the_endpoints_do_not_show_is_not_reproduced(
    status: Callable[[int, int], str], words: str
) -> None:
    final = _run(start_failure_search(SHAS, "b"), status)
    assert final.kind == "not_reproduced" and final.culprit is None, final
    assert words in final.reason and final.rounds == 1
    assert final.range == SHAS[1:]


def test_a_run_that_disagrees_is_outvoted_or_probed_again() -> None:
    # Commit 8 (before the culprit, 12) fails on its first run only: a tie, probed again, then
    # outvoted (3 of 4 runs ran). The answer stands.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, n: FAILED if i >= 12 or (i == 8 and n == 0) else RAN,
    )
    assert final.kind == "culprit" and final.culprit == SHAS[12], final
    # Commit 14 (after the culprit, 10) runs once in four: still failing by the majority.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, n: RAN if i < 10 or (i == 14 and n == 1) else FAILED,
    )
    assert final.kind == "culprit" and final.culprit == SHAS[10], final


def test_a_failure_that_comes_and_goes_is_never_named() -> None:
    # One round of three probes: it fails at 4 but runs at 8. No commit is named.
    final = _run(
        start_failure_search(SHAS, "b", workers=3),
        lambda i, _: FAILED if i == 4 or i >= 12 else RAN,
    )
    assert final.kind == "inconclusive" and final.culprit is None
    assert "it ran at 08cccccccc, after failing at 04cccccccc" in final.reason, final.reason
    # The parent fails on a run of its last probe (a flaky benchmark): the range widens to the
    # commit below it that ran (here the good endpoint: 8 failed, 4 ran, 6 and 5 failed), and
    # holds the culprit.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, n: FAILED if i >= 5 or (i == 4 and n == 2) else RAN,
    )
    assert final.kind == "inconclusive", final
    assert "04cccccccc ran 1 and failed 1 of 2 runs" in final.reason, final.reason
    assert final.range == SHAS[1:6]
    # A commit that fails and runs by turns, twice over, is stepped around like an unbuildable one.
    final = _run(
        start_failure_search(SHAS, "b"),
        lambda i, n: FAILED if i >= 9 or (i == 8 and n % 2) else RAN,
    )
    assert final.kind == "inconclusive" and final.range == SHAS[8:10], final


@pytest.mark.parametrize(
    ("error", "signature"),
    [
        (
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x3 and 4x8) (at m/x.py:1 in f)",
            "RuntimeError",
        ),
        (
            "tokbag:eval:cpu: RuntimeError: mat1 and mat2 (128x3 and 4x8) (2 of 2 runs failed)",
            "RuntimeError",
        ),
        ("tokbag:eval:cpu: Unsupported: data-dependent branch (at m/x.py:9 in f)", "Unsupported"),
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "OutOfMemoryError"),
        ("exited with code 1: Traceback (most recent call last): | KeyError: 'w'", "KeyError"),
        ("timed out after 900 s", "timeout"),
        ("tokbag:eval:cpu did not finish in 600 s", "timeout"),
        ("killed by SIGKILL (out of memory?): ", "exit -9"),
        ("tokbag:eval:cpu wrote no record (exit -9): ", "exit -9"),
        ("the benchmark gave no samples", None),
        (None, None),
    ],
)
def test_a_failure_s_signature_is_its_kind_not_its_message(
    error: str | None, signature: str | None
) -> None:
    assert failure_signature(error) == signature


def test_another_failure_inside_the_range_is_stepped_around() -> None:
    # Commits 6..9 fail with another error (a bug fixed at 10); the night's failure starts at 12.
    def status(i: int, _: int) -> str:
        return OTHER if 6 <= i <= 9 else FAILED if i >= 12 else RAN

    final = _run(start_failure_search(SHAS, "b", error=NIGHT), status)
    assert final.kind == "culprit" and final.culprit == SHAS[12], final
    assert final.error == "TypeError: boom"
    # Counted as the night's failure (no error given), the search names the other bug's commit.
    blind = _run(start_failure_search(SHAS, "b"), status)
    assert blind.kind == "culprit" and blind.culprit == SHAS[6], blind


def test_another_failure_beside_the_culprit_leaves_a_range_never_its_commit() -> None:
    # 10 and 11 fail with another error, the night's failure starts at 12: whether 10 or 11
    # already had it cannot be told, so 10..12 is the answer, never 10.
    final = _run(
        start_failure_search(SHAS, "b", error=NIGHT),
        lambda i, _: OTHER if i in (10, 11) else FAILED if i >= 12 else RAN,
    )
    assert final.kind == "inconclusive" and final.culprit is None, final
    assert final.range == SHAS[10:13]
    assert "failed differently" in final.reason
    # The night's build itself fails with another error: not this failure, not reproduced.
    final = _run(
        start_failure_search(SHAS, "b", error=NIGHT),
        lambda i, _: OTHER if i == 16 else FAILED if i >= 12 else RAN,
    )
    assert final.kind == "not_reproduced", final
    assert (
        "the first failing build 16cccccccc failed differently (ImportError) from the night "
        "(TypeError)"
    ) in final.reason


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
        record_failures(
            state,
            [
                FailureProbe(0, SHAS[0], "endpoint"),
                FailureProbe(16, SHAS[16], "endpoint", failed=2),
            ],
        )
