"""A filed regression whose series is back at its level from before: its issue is told once.

Nights are posted results (the ingest path: the deadline sweep detects, triages and files them,
as for a runner's posts), filed on the local GitHub stand-in.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import date

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from service.db import session_scope
from service.models import Alert, FilingState, Regression
from tests.github_server import FakeGitHub
from tests.nights import posted_night
from tests.workers.issues.conftest import TOKEN
from workers.cli import app
from workers.issues import pending


@pytest.fixture
def github(configure: Callable[..., None], fake: FakeGitHub) -> FakeGitHub:
    configure(github_repository="octo-org/perf", github_token=TOKEN, github_api_url=fake.base_url)
    return fake


def _posted_night(day: int, level_ms: float, rng: random.Random, same_build: bool = False) -> int:
    # Each night builds its own torch commit (the day's number, repeated), or all the same one.
    return posted_night(
        date(2026, 10, day), level_ms, rng, commit=None if same_build else f"{day:02d}" * 20
    )


def _nights(rng: random.Random, levels: dict[int, float], same_build: bool = False) -> None:
    for day, level in sorted(levels.items()):
        _posted_night(day, level, rng, same_build)


def _filed() -> Regression:
    with session_scope() as session:
        (regression,) = session.scalars(
            select(Regression).where(
                Regression.direction == "regression", Regression.confirmation == "reproduced"
            )
        )
        session.expunge(regression)
        return regression


def test_an_issue_is_told_once_when_its_step_did_not_persist(github: FakeGitHub) -> None:
    # +30% on nights 9 and 10 (raised and filed on night 10), then 10 ms again: on night 13,
    # the third night back, the issue is told; not before, and not again on night 14.
    rng = random.Random(11)
    _nights(rng, {day: 13.0 if day in (9, 10) else 10.0 for day in range(1, 13)})
    assert len(github.issues) == 1 and github.comments[1] == []
    assert _filed().back_night is None
    _posted_night(13, 10.0, rng)
    filed = _filed()
    assert filed.back_night == date(2026, 10, 13) and filed.back_told_at is not None
    assert "did not persist" in (filed.back_reason or ""), filed.back_reason
    (comment,) = github.comments[1]
    assert comment["body"].startswith(
        "**Back at its level from before this regression on 2026-10-13**: `dqn:eval:cpu` latency"
    )
    assert "first night 2026-10-09" in comment["body"], comment["body"]
    assert "strays for a night or two" in comment["body"], comment["body"]
    _posted_night(14, 10.0, rng)
    assert len(github.comments[1]) == 1 and len(github.issues) == 1
    # The triage list says it too.
    listed = CliRunner().invoke(app, ["regressions", "list", "--json", "--state", "untriaged"])
    assert listed.exit_code == 0, listed.output
    assert [
        r["back_night"]
        for r in json.loads(listed.output)
        if r["direction"] == "regression" and r["confirmation"] == "reproduced"
    ] == ["2026-10-13"]
    table = CliRunner().invoke(app, ["regressions", "list", "--state", "untriaged"])
    assert "2026-10-13" in table.output


def test_an_issue_is_told_when_a_later_improvement_undoes_its_regression(
    github: FakeGitHub,
) -> None:
    # The +30% step persists (nights 9 to 16) and is filed; a fix from night 17 brings the
    # series back to 10 ms: the improvement, raised once it persisted, tells the issue.
    rng = random.Random(12)
    _nights(rng, {day: 13.0 if 9 <= day <= 16 else 10.0 for day in range(1, 22)})
    filed = _filed()
    assert filed.back_night is not None and date(2026, 10, 17) <= filed.back_night, filed
    assert (
        "a fix or a revert landed between torch commits 1616161616 (2026-10-16) and "
        "1717171717 (2026-10-17)."
    ) in (filed.back_reason or ""), filed.back_reason
    (comment,) = github.comments[1]
    assert f"on {filed.back_night}**" in comment["body"] and "Improvement" in comment["body"]
    assert len(github.issues) == 1


@pytest.mark.parametrize("same_build", [False, True], ids=["two ranges", "one build"])
def test_a_fix_of_two_stacked_regressions_tells_both(github: FakeGitHub, same_build: bool) -> None:
    # +30% from night 9, +20% more from night 17, each filed; a fix from night 25 takes the
    # series back to 10 ms, below both regressions' baselines: both are told.
    rng = random.Random(14)
    level = {
        **{d: 10.0 for d in range(1, 9)},
        **{d: 13.0 for d in range(9, 17)},
        **{d: 15.6 for d in range(17, 25)},
        **{d: 10.0 for d in range(25, 31)},
    }
    _nights(rng, level, same_build)
    with session_scope() as session:
        filed = session.scalars(
            select(Regression)
            .where(Regression.direction == "regression", Regression.confirmation == "reproduced")
            .order_by(Regression.id)
        ).all()
        assert [r.first_night for r in filed] == [date(2026, 10, 9), date(2026, 10, 17)]
        assert all(
            r.back_night is not None and r.back_night >= date(2026, 10, 25) for r in filed
        ), [(r.back_night, r.back_reason) for r in filed]
    told = [
        c["body"]
        for n in github.issues
        for c in github.comments[n]
        if c["body"].startswith("**Back at its level")
    ]
    assert len(told) == 2
    if same_build:  # no commit range: the second step is a recurrence comment on the first
        # issue, which reports both regressions; each is told there once
        assert len(github.issues) == 1 and len(github.comments[1]) == 3
    else:  # two steps, two commit ranges: two issues, each told once
        assert len(github.issues) == 2
        assert all(len(github.comments[n]) == 1 for n in github.issues)
    assert sorted("first night 2026-10-09" in t for t in told) == [False, True], told
    assert sorted("first night 2026-10-17" in t for t in told) == [False, True], told


def test_a_partial_fix_tells_nothing(github: FakeGitHub) -> None:
    # Back to 12 ms from a +30% step is an improvement of -8%, not a return to 10 ms.
    rng = random.Random(13)
    _nights(rng, {day: 10.0 if day < 9 else 13.0 if day <= 16 else 12.0 for day in range(1, 22)})
    with session_scope() as session:
        raised = [
            r.reason
            for r in session.scalars(
                select(Regression).where(Regression.direction == "improvement")
            )
            if r.reason.startswith("Improvement")
        ]
    assert raised, "the partial fix was not raised"
    assert _filed().back_night is None and github.comments[1] == []


def test_telling_waits_while_github_refuses_and_is_done_once(github: FakeGitHub) -> None:
    rng = random.Random(11)
    _nights(rng, {day: 13.0 if day in (9, 10) else 10.0 for day in range(1, 13)})
    github.token = "ghp_rotated_token_not_ours"
    _posted_night(13, 10.0, rng)  # the night completes; the tell waits
    filed = _filed()
    assert filed.back_night == date(2026, 10, 13) and filed.back_told_at is None
    with session_scope() as session:
        alert = session.get(Alert, filed.alert_id)
        assert alert is not None and alert.filing_state == FilingState.FAILED_RETRYING
    assert github.comments[1] == []
    github.token = TOKEN
    pending.retry_pending(force=True)
    pending.retry_pending(force=True)
    assert len(github.comments[1]) == 1 and len(github.issues) == 1
    assert _filed().back_told_at is not None


def test_an_issue_closed_meanwhile_is_not_told_nor_filed_again(github: FakeGitHub) -> None:
    rng = random.Random(11)
    _nights(rng, {day: 13.0 if day in (9, 10) else 10.0 for day in range(1, 13)})
    github.close_issue(1, reason="not_planned")
    _posted_night(13, 10.0, rng)
    assert _filed().back_night == date(2026, 10, 13)
    assert github.comments[1] == [] and len(github.issues) == 1
