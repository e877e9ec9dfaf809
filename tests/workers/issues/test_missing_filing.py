"""Missing-data alerts go through the durable filing state: stored pending at the deadline,
filed exactly once after GitHub failures, pending in status, the "data came" comment told once,
nothing lost across a process restart; on Postgres with GitHub as a local stand-in."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import select

from service.config import get_settings
from service.db import session_scope
from service.models import Alert, FilingState, Job, JobStatus
from service.runs.service import BenchmarkSpec
from service.status.service import system_status
from tests.github_server import FakeGitHub, Fault
from tests.workers.issues.conftest import TOKEN
from workers.issues import missing, pending
from workers.issues.trackers.github import GitHubTracker
from workers.issues.trackers.outbox import OutboxTracker
from workers.night import deadline
from workers.night.plan import create_night

ROOT = Path(__file__).resolve().parents[3]
NIGHT = date(2026, 11, 14)
SPECS = [BenchmarkSpec(model="resnet18", mode="eval"), BenchmarkSpec(model="dcgan", mode="train")]
COMMENTS = r"/repos/octo-org/perf/issues/\d+/comments"


@pytest.fixture
def github(configure: Callable[..., None], fake: FakeGitHub) -> FakeGitHub:
    """The deployment files on the stand-in (what a fresh process reads from its settings)."""
    configure(github_repository="octo-org/perf", github_token=TOKEN, github_api_url=fake.base_url)
    return fake


@pytest.fixture
def tracker(github: FakeGitHub) -> GitHubTracker:
    # One urllib3 retry, two sends per write and a 1 s timeout: a fault burst outlasts an attempt.
    return GitHubTracker(
        "octo-org/perf",
        SecretStr(TOKEN),
        api_url=github.base_url,
        retries=1,
        backoff_factor=0.001,
        write_attempts=2,
        seconds_between_requests=None,
        seconds_between_writes=None,
        timeout=1,
        sleep=lambda _s: None,
    )


def _past_deadline() -> tuple[int, int, datetime]:
    """A night whose two benchmarks never reported, taken past its deadline (no attempt yet)."""
    run_id = create_night(night=NIGHT, benchmarks=SPECS)
    t0 = datetime.now(UTC) + timedelta(days=1)
    steps = deadline.check_deadline(run_id, now=t0)
    assert [s.task for s in steps] == ["night.file_missing", "night.finish"]
    with session_scope() as session:
        alert = session.scalar(
            select(Alert).where(Alert.run_id == run_id, Alert.kind == "missing_data")
        )
        assert alert is not None
        return run_id, alert.id, t0


def _alert(alert_id: int) -> Alert:
    with session_scope() as session:
        alert = session.get(Alert, alert_id)
        assert alert is not None
        session.expunge(alert)
        return alert


def _retry(tracker: GitHubTracker, now: datetime) -> list[pending.FilingAttempt]:
    with session_scope() as session:
        return pending.retry_due(session, settings=get_settings(), tracker=tracker, now=now)


def _missing_issues(fake: FakeGitHub) -> list[dict[str, object]]:
    return [i for i in fake.issues.values() if str(i["title"]).startswith("Missing data:")]


def test_missing_data_is_stored_pending_and_filed_once_after_5xx_and_timeouts(
    github: FakeGitHub, tracker: GitHubTracker
) -> None:
    run_id, alert_id, t0 = _past_deadline()
    # Stored before any attempt: pending and due, listed by status.
    alert = _alert(alert_id)
    assert (alert.filing_state, alert.filing_attempts, alert.filing_next_at) == (
        FilingState.PENDING,
        0,
        t0,
    )
    with session_scope() as session:
        [listed] = system_status(session, now=t0).pending_filings
    assert (listed.alert_id, listed.kind, listed.state) == (alert_id, "missing_data", "pending")

    github.fail("POST", r"/repos/octo-org/perf/issues", status=500, times=1000)
    first = pending.file_missing_data(run_id, tracker=tracker, now=t0)  # night.file_missing
    assert first is not None and first.state == FilingState.FAILED_RETRYING
    assert "GitHub answered 500" in (first.error or ""), first.error
    assert _missing_issues(github) == []
    # The rendered issue waits in the outbox meanwhile.
    outbox = OutboxTracker(get_settings().effective_outbox_dir)
    [kept] = outbox.updated_since(None)
    assert kept.title.startswith("Missing data: 2 benchmark(s) of night 2026-11-14 on cpu")
    assert first.urls == (kept.url,)

    github.heal()
    github.fail("*", ".*", status=504, times=1000, delay=1.5)  # every answer after the timeout
    assert _retry(tracker, t0 + timedelta(minutes=1)) == []  # inside the backoff: not tried
    [second] = _retry(tracker, t0 + pending.backoff(1))
    assert second.state == FilingState.FAILED_RETRYING and second.error
    alert = _alert(alert_id)
    assert alert.filing_attempts == 2
    assert alert.filing_next_at == t0 + pending.backoff(1) + pending.backoff(2)
    assert len(outbox.updated_since(None)) == 1  # no second outbox copy

    github.heal()
    [third] = _retry(tracker, t0 + timedelta(days=1))
    assert third.state == FilingState.FILED
    [issue] = _missing_issues(github)
    assert third.urls == (issue["html_url"],)
    assert "| `dcgan:train:cpu` |" in str(issue["body"])
    # It carries the label the marker lookup lists by, so it is found again (dedup, arrivals).
    assert [lab["name"] for lab in issue["labels"]] == ["performance", "nightbench", "missing-data"]  # type: ignore[attr-defined]
    assert missing.missing_data_fingerprint("cpu", str(NIGHT)) in str(issue["body"])
    alert = _alert(alert_id)
    assert (alert.filing_state, alert.status, alert.filing_attempts) == ("filed", "filed", 3)
    [done] = outbox.updated_since(None)
    assert (done.state, done.state_reason) == ("closed", "filed")
    with session_scope() as session:
        assert system_status(session, now=t0 + timedelta(days=1)).pending_filings == []
    # The task delivered again, a forced retry: nothing filed twice.
    again = pending.file_missing_data(run_id, tracker=tracker)
    assert again is not None and again.state == FilingState.FILED
    with session_scope() as session:
        assert (
            pending.retry_due(session, settings=get_settings(), tracker=tracker, force=True) == []
        )
    assert len(_missing_issues(github)) == 1


def test_an_issue_created_whose_answer_was_lost_is_adopted_not_filed_again(
    github: FakeGitHub, tracker: GitHubTracker
) -> None:
    run_id, alert_id, t0 = _past_deadline()
    # GitHub creates the issue, answers 502, and keeps answering 502 for the lookups after it.
    github.fail(
        "POST",
        r"/repos/octo-org/perf/issues",
        status=502,
        after=True,
        then=(Fault("*", ".*", 502, times=1000),),
    )
    first = pending.file_missing_data(run_id, tracker=tracker, now=t0)
    assert first is not None and first.state == FilingState.FAILED_RETRYING
    assert len(_missing_issues(github)) == 1
    github.heal()
    [filed] = _retry(tracker, t0 + timedelta(days=1))
    [issue] = _missing_issues(github)
    assert filed.state == FilingState.FILED and filed.urls == (issue["html_url"],)
    assert _alert(alert_id).filing_attempts == 2


def test_a_refused_token_is_pending_in_status_and_a_fresh_process_files_it(
    github: FakeGitHub, tracker: GitHubTracker, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from service.main import create_app
    from workers.cli import app

    run_id, alert_id, t0 = _past_deadline()
    github.token = "ghp_rotated_token_not_ours"
    caplog.set_level(logging.INFO, logger="workers.issues")
    attempt = pending.file_missing_data(run_id, tracker=tracker, now=t0)
    assert attempt is not None and attempt.state == FilingState.FAILED_RETRYING
    # One line, no traceback, at error level, naming the setting to fix.
    [line] = [r for r in caplog.records if r.name == "workers.issues.pending"]
    assert line.levelno == logging.ERROR and line.exc_info is None
    assert "\n" not in line.getMessage() and "NIGHTBENCH_GITHUB_TOKEN" in line.getMessage()
    with TestClient(create_app()) as client:
        body = client.get("/api/status").json()
    [listed] = body["pending_filings"]
    assert (listed["alert_id"], listed["kind"], listed["state"], listed["attempts"]) == (
        alert_id,
        "missing_data",
        "failed_retrying",
        1,
    )
    assert "401" in listed["last_error"] and "NIGHTBENCH_GITHUB_TOKEN" in listed["last_error"]
    assert any(
        p.startswith(f"alert {alert_id} ") and "missing-data issue" in p for p in body["problems"]
    )
    shown = CliRunner().invoke(app, ["status", "--json"])
    assert shown.exit_code == 1
    assert [f["alert_id"] for f in json.loads(shown.output)["pending_filings"]] == [alert_id]

    # The worker that tried is gone; the token is fixed; a fresh process files from Postgres.
    github.token = TOKEN
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    retried = subprocess.run(
        [sys.executable, "-m", "workers.cli", "issues", "retry"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert retried.returncode == 0, retried.stdout + retried.stderr
    [issue] = _missing_issues(github)
    assert f"alert {alert_id}: filed {issue['html_url']}" in retried.stdout
    alert = _alert(alert_id)
    assert (alert.filing_state, alert.filing_attempts, alert.filing_error) == ("filed", 2, None)
    again = subprocess.run(
        [sys.executable, "-m", "workers.cli", "issues", "retry"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "no filing pending" in again.stdout
    assert len(_missing_issues(github)) == 1


def _breaks_comments(fake: FakeGitHub, how: str) -> None:
    if how == "5xx burst":
        fake.fail("POST", COMMENTS, status=500, times=1000)
    else:  # GitHub posts the comment, answers 502, and keeps failing the lookups after it
        fake.fail(
            "POST", COMMENTS, status=502, after=True, then=(Fault("*", ".*", 502, times=1000),)
        )


@pytest.mark.parametrize("how", ["5xx burst", "applied then 502"])
def test_data_that_came_later_is_told_once_after_a_failed_comment(
    how: str, github: FakeGitHub, tracker: GitHubTracker
) -> None:
    run_id, alert_id, t0 = _past_deadline()
    [filed] = _retry(tracker, t0)
    assert filed.state == FilingState.FILED
    [issue] = _missing_issues(github)
    number = int(str(issue["number"]))
    # Nothing came yet: nothing to tell, the alert stays filed.
    assert missing.note_arrivals(today=NIGHT) == []
    # The night is measured again for one of its two benchmarks (a re-dispatch).
    redo = create_night(night=NIGHT, benchmarks=SPECS[1:])
    with session_scope() as session:
        for job in session.scalars(select(Job).where(Job.run_id == redo)):
            job.status, job.finished_at = JobStatus.DONE, datetime.now(UTC)

    assert missing.note_arrivals(today=NIGHT) == [alert_id]
    assert missing.note_arrivals(today=NIGHT) == []  # already pending: not counted twice
    with session_scope() as session:
        [listed] = system_status(session).pending_filings
    assert (listed.alert_id, listed.kind, listed.state) == (alert_id, "missing_data", "pending")

    _breaks_comments(github, how)
    now = datetime.now(UTC) + timedelta(seconds=1)
    [failed] = _retry(tracker, now)
    assert failed.state == FilingState.FAILED_RETRYING
    alert = _alert(alert_id)
    assert alert.arrived is None and alert.filing_attempts == 1  # nothing recorded as told
    assert len(github.comments.get(number, [])) == (1 if how == "applied then 502" else 0)
    # No second outbox copy of an issue already on GitHub: what is left is the comment.
    assert not get_settings().effective_outbox_dir.exists() or not list(
        get_settings().effective_outbox_dir.glob("issue-*.md")
    )

    github.heal()
    [told] = _retry(tracker, now + pending.backoff(1))
    assert told.state == FilingState.FILED and told.urls == (issue["html_url"],)
    [comment] = github.comments[number]
    assert "**Data arrived**" in comment["body"] and "`dcgan:train:cpu`" in comment["body"]
    assert "Still missing: `resnet18:eval:cpu`" in comment["body"]
    assert _alert(alert_id).arrived == ["dcgan:train:cpu"]
    # Later sweeps find nothing new: no second comment, no second issue.
    assert missing.note_arrivals(today=NIGHT) == []
    assert _retry(tracker, now + timedelta(days=1)) == []
    assert len(github.comments[number]) == 1 and len(_missing_issues(github)) == 1
    assert run_id != redo


def test_the_deadline_sweep_finishes_the_night_while_github_refuses(github: FakeGitHub) -> None:
    from service.models import Run

    run_id = create_night(night=NIGHT, benchmarks=SPECS)
    github.token = "ghp_rotated_token_not_ours"
    t0 = datetime.now(UTC) + timedelta(days=1)
    assert deadline.sweep_deadlines(now=t0) == [run_id]  # the failed filing raises nothing
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "incomplete"  # night.finish ran after it
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id))
        assert alert is not None and alert.filing_state == FilingState.FAILED_RETRYING
        assert "NIGHTBENCH_GITHUB_TOKEN" in (alert.filing_error or "")
    assert _missing_issues(github) == []
