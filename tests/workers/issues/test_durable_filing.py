"""Filing as a durable state: GitHub refusing or away, the issue kept in the outbox, retried
until filed exactly once; on Postgres, with GitHub as a local stand-in with injected faults."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

import pytest
from pydantic import SecretStr
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Alert, FilingState
from service.status.service import system_status
from tests.github_server import FakeGitHub, Fault
from tests.workers.issues.conftest import TOKEN
from tests.workers.issues.test_issues import World
from workers.issues.pending import backoff, file_durably, retry_due
from workers.issues.trackers.github import GitHubTracker
from workers.issues.trackers.outbox import OutboxTracker

T0 = datetime(2026, 11, 12, 6, 0, tzinfo=UTC)
REPO = "/repos/octo-org/perf"
ISSUES = REPO + "/issues"


@pytest.fixture
def tracker(fake: FakeGitHub) -> GitHubTracker:
    # Six retries per request with tiny backoffs: a burst longer than that still fails.
    return GitHubTracker(
        "octo-org/perf",
        SecretStr(TOKEN),
        api_url=fake.base_url,
        retries=6,
        backoff_factor=0.001,
        write_attempts=3,
        seconds_between_requests=None,
        seconds_between_writes=None,
        timeout=2,
        sleep=lambda _s: None,
    )


@pytest.fixture
def world(db: Session) -> World:
    w = World(db)
    w.history([("resnet18", "eval"), ("bert", "eval")], 10, date(2026, 11, 1))
    return w


def _wrong_token(fake: FakeGitHub) -> Callable[[], None]:
    right = fake.token
    fake.token = "ghp_rotated_token_not_ours"

    def heal() -> None:
        fake.token = right

    return heal


def _forbidden(fake: FakeGitHub) -> Callable[[], None]:
    fake.fail(
        "GET",
        REPO,
        status=403,
        times=1000,
        message="Resource not accessible by personal access token",
    )
    return fake.heal


def _burst(fake: FakeGitHub) -> Callable[[], None]:
    fake.fail("*", ".*", status=502, times=1000)
    return fake.heal


def _outage(fake: FakeGitHub) -> Callable[[], None]:
    fake.stop()
    return fake.restart


def _applied_then_502(fake: FakeGitHub) -> Callable[[], None]:
    # GitHub creates the issue, answers 502, and keeps answering 502 (the lookup that would
    # find the landed issue fails too).
    fake.fail("POST", ISSUES, status=502, after=True, then=(Fault("*", ".*", 502, times=1000),))
    return fake.heal


FAULTS = {
    "401": (_wrong_token, r"rejected the token \(401\).*NIGHTBENCH_GITHUB_TOKEN", True),
    "403 on the repository": (_forbidden, r"refused \(403\).*NIGHTBENCH_GITHUB_TOKEN", True),
    "502 burst": (_burst, "GitHub kept answering 5xx", False),
    "outage": (_outage, "could not reach GitHub", False),
    "applied then 502": (_applied_then_502, "GitHub (kept answering 5xx|answered 502)", False),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failed_filing_waits_in_the_outbox_and_is_filed_exactly_once_when_github_answers(
    fault: str,
    db: Session,
    world: World,
    fake: FakeGitHub,
    tracker: GitHubTracker,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    breaks, error, refused = FAULTS[fault]
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    alert_id = night.alert.id
    heal = breaks(fake)
    caplog.set_level(logging.INFO, logger="workers.issues")

    attempt = file_durably(db, alert_id=alert_id, settings=settings, tracker=tracker, now=T0)

    assert attempt.state == FilingState.FAILED_RETRYING
    alert = db.get(Alert, alert_id)
    assert alert is not None
    assert (alert.filing_state, alert.filing_attempts) == (FilingState.FAILED_RETRYING, 1)
    assert alert.filing_pending_since == T0 and alert.filing_next_at == T0 + backoff(1)
    assert alert.filing_error is not None
    assert re.search(error, alert.filing_error), alert.filing_error
    assert alert.status == "open"
    # Only the apply-then-502 case created it on GitHub, unrecorded: the retry must adopt it.
    assert len(fake.issues) == (1 if fault == "applied then 502" else 0)
    # The issue waits in the outbox, rendered as it would go to GitHub.
    outbox = OutboxTracker(settings.effective_outbox_dir)
    [kept] = outbox.updated_since(None)
    assert kept.state == "open" and kept.title.startswith("[perf] resnet18 eval cpu latency")
    assert attempt.urls == (kept.url,)
    # One line, no traceback; a refusal names the setting to fix, at error level.
    [line] = [r for r in caplog.records if r.name == "workers.issues.pending"]
    assert line.exc_info is None and "\n" not in line.getMessage()
    assert line.levelno == (logging.ERROR if refused else logging.WARNING)
    assert ("NIGHTBENCH_GITHUB_TOKEN" in line.getMessage()) == refused
    # Status shows it pending with its error and age; the CLI exits 1 on that problem.
    status = system_status(db, now=T0 + timedelta(hours=2))
    [pending] = status.pending_filings
    assert (pending.alert_id, pending.state, pending.attempts) == (
        alert_id,
        FilingState.FAILED_RETRYING,
        1,
    )
    assert pending.last_error == alert.filing_error and pending.age_s == 7200
    assert any(p.startswith(f"alert {alert_id} ") for p in status.problems)

    # Before its backoff ends nothing is tried; once due, still failing: no second outbox copy.
    assert retry_due(db, settings=settings, tracker=tracker, now=T0 + timedelta(minutes=1)) == []
    [again] = retry_due(db, settings=settings, tracker=tracker, now=T0 + timedelta(hours=1))
    assert again.state == FilingState.FAILED_RETRYING
    db.refresh(alert)
    assert alert.filing_attempts == 2 and alert.filing_next_at == T0 + timedelta(hours=1) + backoff(
        2
    )
    assert len(outbox.updated_since(None)) == 1

    heal()
    [filed] = retry_due(db, settings=settings, tracker=tracker, now=T0 + timedelta(days=1))

    assert filed.state == FilingState.FILED
    assert len(fake.issues) == 1, "filed exactly once"
    url = fake.issues[1]["html_url"]
    assert filed.urls == (url,)
    db.refresh(alert)
    assert (alert.filing_state, alert.status, alert.filing_error) == (
        FilingState.FILED,
        "filed",
        None,
    )
    assert alert.filing_attempts == 3 and alert.filed_at == T0 + timedelta(days=1)
    # The outbox copy says where it went, so nobody files it by hand as well.
    [done] = outbox.updated_since(None)
    assert (done.state, done.state_reason) == ("closed", "filed")
    assert f"Filed as {url}" in outbox.path(done.number).read_text()
    assert system_status(db, now=T0 + timedelta(days=1)).pending_filings == []
    # Another retry, or the next night's, finds nothing to do and files nothing.
    assert (
        retry_due(db, settings=settings, tracker=tracker, now=T0 + timedelta(days=2), force=True)
        == []
    )
    assert len(fake.issues) == 1
    assert file_durably(db, alert_id=alert_id, settings=settings, tracker=tracker).state == "filed"
    assert len(fake.issues) == 1


def test_a_filing_that_works_at_once_is_filed_and_never_pending(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    attempt = file_durably(db, alert_id=night.alert.id, settings=settings, tracker=tracker, now=T0)
    assert attempt.state == FilingState.FILED and len(fake.issues) == 1
    assert (night.alert.filing_attempts, night.alert.filed_at) == (1, T0)
    assert not settings.effective_outbox_dir.exists() or not list(
        settings.effective_outbox_dir.iterdir()
    )
    assert system_status(db, now=T0).pending_filings == []


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [backoff(n) for n in (1, 2, 3)] == [
        timedelta(minutes=5),
        timedelta(minutes=10),
        timedelta(minutes=20),
    ]
    assert backoff(30) == timedelta(hours=6)
