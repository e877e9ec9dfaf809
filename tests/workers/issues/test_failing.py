"""A benchmark failing night after night is filed as an issue, once, durably."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, date, datetime

import pytest
from sqlalchemy import select

from service.config import get_settings
from service.db import session_scope
from service.models import Alert, FilingState
from service.status.service import system_status
from tests.github_server import FakeGitHub
from tests.nights import posted_night
from tests.workers.issues.conftest import TOKEN
from workers.issues import pending

BOOM = ("Traceback (most recent call last):\n  File \"suite/harness.py\", line 256, in run\n"
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x512 and 256x10)")


@pytest.fixture
def github(configure: Callable[..., None], fake: FakeGitHub) -> FakeGitHub:
    configure(github_repository="octo-org/perf", github_token=TOKEN,
              github_api_url=fake.base_url, source_github_repository="pytorch/pytorch")
    return fake


def _night(day: int, rng: random.Random, *, error: str | None = None) -> int:
    return posted_night(date(2026, 10, day), 10.0, rng, error=error)


def test_a_benchmark_failing_two_nights_in_a_row_is_filed_once(github: FakeGitHub) -> None:
    rng = random.Random(3)
    for day in (1, 2, 3):
        _night(day, rng)
    _night(4, rng, error=BOOM)
    assert github.issues == {}  # one failed night is not yet a streak
    second = _night(5, rng, error=BOOM)
    (issue,) = github.issues.values()
    assert issue["title"].startswith("[perf] dqn:eval:cpu fails on ")
    assert issue["title"].endswith("since 2026-10-04: RuntimeError: mat1 and mat2 shapes cannot "
                                   "be multiplied (4x512 and 256x10)"), issue["title"]
    body = issue["body"]
    assert "has failed on its last 2 nights" in body and "It last ran on 2026-10-03" in body
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in body
    assert body.count("| RuntimeError: mat1 and mat2") == 2  # the two failed nights' row
    assert "python -m suite run --model dqn --mode eval --device cpu --compiler eager" in body
    assert f"nightbench:run={second}" in body
    with session_scope() as session:
        alert = session.scalar(select(Alert).where(Alert.run_id == second,
                                                   Alert.kind == "failing"))
        assert alert is not None and alert.filing_state == FilingState.FILED
        now = datetime(2026, 10, 6, tzinfo=UTC)
        assert any(p.startswith("benchmark dqn:eval:cpu on ") and "2 nights in a row" in p
                   for p in system_status(session, now=now).problems)
    _night(6, rng, error=BOOM)  # the same streak: no second issue, no new alert
    assert len(github.issues) == 1 and github.comments[1] == []
    again = _night(7, rng)  # runs again: the issue is told, once
    (told,) = github.comments[1]
    assert told["body"].startswith(f"**Runs again on 2026-10-07** (run {again}, build ")
    assert "after failing on 3 nights since 2026-10-04" in told["body"], told["body"]
    with session_scope() as session:
        assert system_status(session, now=datetime(2026, 10, 8, tzinfo=UTC)).failing == []
    _night(8, rng, error=BOOM)
    _night(9, rng, error=BOOM)  # a new streak: a new issue
    assert len(github.issues) == 2
    assert "since 2026-10-08" in list(github.issues.values())[-1]["title"]


def test_a_failing_benchmark_waits_in_the_outbox_while_github_refuses(
    github: FakeGitHub,
) -> None:
    rng = random.Random(4)
    for day in (1, 2):
        _night(day, rng)
    _night(3, rng, error=BOOM)
    github.token = "ghp_rotated_token_not_ours"
    run_id = _night(4, rng, error=BOOM)
    assert github.issues == {}
    with session_scope() as session:
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id,
                                                   Alert.kind == "failing"))
        assert alert is not None and alert.filing_state == FilingState.FAILED_RETRYING
        status = system_status(session, now=datetime(2026, 10, 5, tzinfo=UTC))
        assert [f.kind for f in status.pending_filings] == ["failing"]
        assert any("failing-benchmark issue failed" in p for p in status.problems)
    kept = list(get_settings().effective_outbox_dir.glob("*.md"))
    assert len(kept) == 1 and "dqn:eval:cpu` has failed on its last 2 nights" in kept[0].read_text()
    github.token = TOKEN
    pending.retry_pending(force=True)
    pending.retry_pending(force=True)
    assert len(github.issues) == 1
    assert "filed_url" in kept[0].read_text()  # the outbox copy says where it went


def test_the_commit_range_links_the_builds_either_side_of_the_first_failure() -> None:
    from service.config import Settings
    from workers.issues.failing import _range

    linked = _range(Settings(source_github_repository="pytorch/pytorch"), "a" * 40, "b" * 40)
    assert f"`{'a' * 10}..{'b' * 10}`" in linked
    assert f"https://github.com/pytorch/pytorch/compare/{'a' * 40}...{'b' * 40}" in linked
    assert "compare" not in _range(Settings(source_github_repository=None), "a" * 40, "b" * 40)
    assert "same torch commit" in _range(Settings(), "a" * 40, "a" * 40)
    assert _range(Settings(), None, "b" * 40) == ""


def test_a_benchmark_that_never_ran_is_not_filed(github: FakeGitHub) -> None:
    # A configuration it does not support fails from its first night: each night's report
    # says so; it is not a benchmark that broke.
    rng = random.Random(5)
    for day in (1, 2, 3):
        _night(day, rng, error="NotImplementedError: eval on cpu is not supported")
    assert github.issues == {}
    with session_scope() as session:
        status = system_status(session, now=datetime(2026, 10, 4, tzinfo=UTC))
        assert status.failing == [] and status.problems == []
