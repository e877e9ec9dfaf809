"""Filing survives its own storage (issue 40, finding 1): an outbox that cannot be written (a
path blocked by a file, a full disk in a real process) is an error recorded on the alert and
retried, never a lost alert or a run left open; a partial file never blocks later filings; a
missing-data alert records its failed attempts like a regression alert. Real Postgres, real
files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Alert, FilingState, Run
from service.runs.service import BenchmarkSpec
from tests.workers.issues.test_issues import World
from workers.issues import pending
from workers.issues.trackers.outbox import OutboxTracker
from workers.night import deadline
from workers.night.plan import create_night
from workers.night.triage import file_night

ROOT = Path(__file__).resolve().parents[3]


def _regressed_night(day: date) -> tuple[int, int]:
    """A committed night with a reproduced regression alert not yet filed: (run id, alert id)."""
    with session_scope() as session:
        world = World(session)
        world.history([("resnet18", "eval")], 10, day - timedelta(days=10))
        night = world.regressed_night(day, {("resnet18", "eval"): 12.5})
        night.run.status = "detecting"
        return night.run.id, night.alert.id


def _alert(alert_id: int) -> Alert:
    with session_scope() as session:
        alert = session.get(Alert, alert_id)
        assert alert is not None
        session.expunge(alert)
        return alert


def _issues(outbox: Path) -> list[Path]:
    return sorted(outbox.glob("issue-*.md")) if outbox.is_dir() else []


@pytest.fixture
def blocked(tmp_path: Path) -> tuple[Settings, Path]:
    """Settings whose outbox cannot be made (a file stands where its parent folder should)."""
    (tmp_path / "disk").write_text("not a folder")
    return Settings(outbox_dir=tmp_path / "disk" / "outbox"), tmp_path / "disk"


def test_an_unwritable_outbox_is_a_recorded_failure_filed_once_when_it_heals(
    database_url: str, blocked: tuple[Settings, Path]
) -> None:
    settings, blocker = blocked
    run_id, alert_id = _regressed_night(date(2026, 11, 11))

    file_night(run_id, settings=settings)

    alert = _alert(alert_id)
    assert (alert.filing_state, alert.filing_attempts) == (FilingState.FAILED_RETRYING, 1)
    assert alert.filing_error and "cannot be written" in alert.filing_error, alert.filing_error
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "complete"  # the night closed all the same
    blocker.unlink()  # the disk is writable again
    [attempt] = pending.retry_pending(settings=settings, force=True)
    assert attempt.state == FilingState.FILED
    [issue] = _issues(settings.effective_outbox_dir)
    assert "resnet18 eval" in issue.read_text()
    assert pending.retry_pending(settings=settings, force=True) == []
    assert len(_issues(settings.effective_outbox_dir)) == 1


def test_a_partial_file_in_the_outbox_never_blocks_later_filings(
    db: Session, settings: Settings
) -> None:
    outbox = settings.effective_outbox_dir
    outbox.mkdir(parents=True)
    (outbox / "issue-0001.md").write_text("")  # what a full disk left
    (outbox / "issue-0002.md").write_text("---\nnumber: 2\ntitle: [perf] res")
    world = World(db)
    world.history([("resnet18", "eval"), ("bert", "eval")], 10, date(2026, 11, 1))
    nights = [
        world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5}),
        world.regressed_night(date(2026, 11, 12), {("bert", "eval"): 12.5}),
    ]
    for night in nights:
        attempt = pending.file_durably(db, alert_id=night.alert.id, settings=settings)
        assert attempt.state == FilingState.FILED, attempt
    names = [p.name for p in _issues(outbox)]
    assert names == ["issue-0001.md", "issue-0002.md", "issue-0003.md", "issue-0004.md"]
    assert len(OutboxTracker(outbox).updated_since(None)) == 2  # the broken two are skipped


def test_a_full_disk_leaves_no_partial_issue_and_the_alert_is_filed_once_after(
    database_url: str, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    run_id, alert_id = _regressed_night(date(2026, 11, 11))
    # A real process whose files may not pass 200 bytes: the issue's write fails part way, as
    # on a full disk (EFBIG here, ENOSPC there: both an OSError from write).
    script = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
        from service.config import Settings
        from workers.night.triage import file_night
        file_night({run_id}, settings=Settings(outbox_dir={str(outbox)!r}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _issues(outbox) == [], [p.read_text() for p in _issues(outbox)]
    alert = _alert(alert_id)
    assert alert.filing_state == FilingState.FAILED_RETRYING and alert.filing_attempts >= 1
    assert alert.filing_error and "File too large" in alert.filing_error
    [attempt] = pending.retry_pending(settings=Settings(outbox_dir=outbox), force=True)
    assert attempt.state == FilingState.FILED
    assert len(_issues(outbox)) == 1


def test_a_missing_data_alert_records_its_failed_attempts(
    database_url: str, blocked: tuple[Settings, Path]
) -> None:
    settings, blocker = blocked
    run_id = create_night(
        night=date(2026, 11, 14), benchmarks=[BenchmarkSpec(model="resnet18", mode="eval")]
    )
    deadline.check_deadline(run_id, now=datetime.now(UTC) + timedelta(days=1))
    attempt = pending.file_missing_data(run_id, settings=settings)
    assert attempt is not None and attempt.state == FilingState.FAILED_RETRYING
    with session_scope() as session:
        alert = session.scalar(
            select(Alert).where(Alert.run_id == run_id, Alert.kind == "missing_data")
        )
        assert alert is not None
        assert alert.filing_attempts == 1 and "cannot be written" in (alert.filing_error or "")
    blocker.unlink()
    [filed] = pending.retry_pending(settings=settings, force=True)
    assert filed.state == FilingState.FILED
    assert len(_issues(settings.effective_outbox_dir)) == 1
