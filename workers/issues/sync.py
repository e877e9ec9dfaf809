"""Reading triage back from filed issues into the regressions they speak for.

Sync-back (:func:`sync_issues`, periodic task ``issues.sync``): for each recorded issue the
tracker reports as changed, the linked regressions move to ``expected`` (label ``expected``;
detection then restarts the series' baseline there), ``invalid`` (closed with the label
``invalid`` or as not planned), ``fixed`` (closed otherwise; ``reverted`` stays), or back to
``untriaged`` (reopened, or the ``expected`` label removed from an open issue).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import IssueRecord, IssueRegression, Regression
from service.models.base import utcnow
from service.regressions.service import set_state
from workers.issues.model import TrackedIssue
from workers.issues.trackers import IssueTracker, make_tracker

log = logging.getLogger(__name__)

EXPECTED_LABEL = "expected"
INVALID_LABEL = "invalid"
# Sync re-reads a few minutes before the newest change it has seen: GitHub's ``since`` has
# whole seconds and clocks differ; reading a change twice is harmless.
SYNC_OVERLAP = timedelta(minutes=5)


@dataclass(frozen=True)
class SyncReport:
    """What a sync-back pass did.

    Attributes:
        seen: issues the tracker reported as changed that have a record here.
        changed: regression id -> the triage state it was moved to.
    """

    seen: int
    changed: Mapping[int, str] = field(default_factory=dict)


def desired_state(previous: IssueRecord, issue: TrackedIssue) -> str | None:
    """The triage state the issue asks for its regressions, or ``None`` for no change.

    Args:
        previous: the issue as last recorded (state and labels before this change).
        issue: the issue as the tracker has it now.
    """
    labels = {name.lower() for name in issue.labels}
    had = {name.lower() for name in previous.labels}
    if EXPECTED_LABEL in labels:
        return "expected"
    if issue.state == "closed":
        if INVALID_LABEL in labels or issue.state_reason == "not_planned":
            return "invalid"
        return "fixed"
    if previous.state == "closed" or EXPECTED_LABEL in had:
        return "untriaged"
    return None


def sync_issues(
    session: Session, *, tracker: IssueTracker, since: datetime | None = None
) -> SyncReport:
    """Read the tracker's issue states back into the regressions they speak for.

    Args:
        session: database session (only flushed).
        tracker: the tracker the issues were filed in.
        since: look at issues changed since then; default: a few minutes before the newest
            change already seen (everything on the first pass).

    Returns:
        The issues looked at and the regressions moved.
    """
    records = {
        r.number: r
        for r in session.scalars(
            select(IssueRecord).where(
                IssueRecord.tracker == tracker.kind, IssueRecord.location == tracker.location
            )
        )
    }
    if not records:
        return SyncReport(seen=0)
    if since is None:
        seen_at = [r.remote_updated_at for r in records.values() if r.remote_updated_at]
        since = max(seen_at) - SYNC_OVERLAP if seen_at else None
    now = utcnow()
    changed: dict[int, str] = {}
    seen = 0
    for issue in tracker.updated_since(since):
        record = records.get(issue.number)
        if record is None:
            continue
        seen += 1
        state = desired_state(record, issue)
        if state is not None:
            changed.update(_apply(session, record, state))
        record.state = issue.state
        record.state_reason = issue.state_reason
        record.labels = list(issue.labels)
        record.title = issue.title
        if record.remote_updated_at is None or issue.updated_at > record.remote_updated_at:
            record.remote_updated_at = issue.updated_at
        record.synced_at = now
    session.flush()
    if changed:
        log.info("sync: %d regression(s) moved from %d issue(s)", len(changed), seen)
    return SyncReport(seen=seen, changed=changed)


def _apply(session: Session, record: IssueRecord, state: str) -> dict[int, str]:
    moved = {}
    linked = session.scalars(
        select(Regression)
        .join(IssueRegression, IssueRegression.regression_id == Regression.id)
        .where(IssueRegression.issue_id == record.id)
        .order_by(Regression.id)
    )
    for regression in linked:
        if regression.state == state or (state == "fixed" and regression.state == "reverted"):
            continue
        set_state(session, regression_id=regression.id, state=state)
        moved[regression.id] = state
    return moved


def sync_from_tracker(settings: Settings | None = None) -> SyncReport:
    """One sync-back pass against the configured tracker, committed (the periodic task's body)."""
    settings = settings or get_settings()
    tracker = make_tracker(settings)
    with session_scope() as session:
        return sync_issues(session, tracker=tracker)
