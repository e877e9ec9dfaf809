"""The filing pipeline's table: every kind of alert is a row, and a new kind is only a row.

A toy kind (a report dataclass, a pure render, one row added to the table) is filed through the
durable filing into the outbox, deduplicated by its fingerprint, and told a comment once; no
filing code learns its name. On the migrated Postgres, rolled back per test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date

import pytest
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import InvalidInput
from service.models import Alert, AlertKind, FilingState, Run
from workers.issues import filing, pending
from workers.issues.kind import AlertKindRow, FilingContext
from workers.issues.kinds import KINDS
from workers.issues.model import Comment, FiledIssue, RenderedIssue
from workers.issues.trackers import IssueTracker
from workers.issues.trackers.markers import marker
from workers.issues.trackers.outbox import OutboxTracker


@dataclass(frozen=True)
class Quiet:
    """The toy kind's report: a night that measured nothing at all."""

    night: date
    spec: str


def _report(session: Session, context: FilingContext) -> Sequence[Quiet]:
    return [Quiet(context.run.night, context.run.torch_spec)]


def _fingerprint(report: Quiet) -> str:
    return hashlib.sha256(f"quiet\0{report.night}".encode()).hexdigest()[:16]


def _render(report: Quiet, fingerprint: str, labels: tuple[str, ...]) -> RenderedIssue:
    body = f"Night {report.night} (`{report.spec}`) measured nothing.\n\n{marker(fingerprint)}\n"
    return RenderedIssue(f"Quiet night {report.night}", body, labels, fingerprint)


def _comments(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    filed: Mapping[str, FiledIssue],
) -> Sequence[Comment]:
    fp = _fingerprint(Quiet(context.run.night, context.run.torch_spec))
    return [Comment(key=f"quiet-{context.run.id}", body="Still quiet.", fingerprint=fp)]


TOY = AlertKindRow(
    labels=("nightbench", "quiet"),
    report=_report,
    fingerprint=_fingerprint,
    render=_render,
    comments=_comments,
)


def test_every_stored_kind_has_a_row() -> None:
    assert set(KINDS) == set(AlertKind)


def test_a_toy_kind_added_to_the_table_alone_is_filed_to_the_outbox(
    db: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(KINDS, "quiet", TOY)
    run = Run(night=date(2026, 11, 20), torch_spec="nightly:2026-11-20", status="done")
    db.add(run)
    db.flush()
    alert = Alert(run_id=run.id, kind="quiet", status="open")
    db.add(alert)
    db.flush()

    attempt = pending.file_durably(db, alert_id=alert.id, settings=settings)

    assert attempt.state == FilingState.FILED and attempt.error is None
    outbox = OutboxTracker(settings.effective_outbox_dir)
    issue = outbox.find_open(_fingerprint(Quiet(run.night, run.torch_spec)))
    assert issue is not None and issue.title == "Quiet night 2026-11-20"
    assert issue.labels == ("performance", "nightbench", "quiet")
    text = outbox.path(issue.number).read_text()
    assert "measured nothing" in text and text.count("Still quiet.") == 1
    # Filed: a second filing files nothing new and tells the comment once (its key).
    alert.filing_state = FilingState.PENDING
    again = filing.file_alert(db, alert_id=alert.id, settings=settings, tracker=outbox)
    assert [f.action for f in again] == ["commented"]
    assert len(list(settings.effective_outbox_dir.glob("issue-*.md"))) == 1
    assert outbox.path(issue.number).read_text().count("Still quiet.") == 1


def test_a_kind_without_a_row_is_refused_with_its_name(db: Session, settings: Settings) -> None:
    run = Run(night=date(2026, 11, 20), torch_spec="nightly:2026-11-20", status="done")
    db.add(run)
    db.flush()
    alert = Alert(run_id=run.id, kind="unheard", status="open")
    db.add(alert)
    db.flush()
    with pytest.raises(InvalidInput, match="'unheard'"):
        filing.render_alert(db, alert_id=alert.id, settings=settings)
