"""A regression's issue as a stored record: filed once per cause, commented on recurrence.

The regression kind's ``file_issue`` (:func:`file_regression_issue`). Dedup: an open
:class:`~service.models.IssueRecord` with the fingerprint gets a "still regressed on D" comment
(once per run). Without one, the tracker is asked for an open issue carrying the fingerprint
marker, which finds an issue whose creation was not recorded (a crash between the tracker's
answer and the commit): it is adopted, with a comment only if it was filed for another run.
Otherwise a new issue is created. Reading triage back from the issues is
:mod:`workers.issues.sync`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.models import Alert, IssueRecord, IssueRegression, Regression, Run
from workers.issues.kind import FilingContext
from workers.issues.model import FiledIssue, RenderedIssue, TrackedIssue
from workers.issues.render.regression import render_recurrence
from workers.issues.reports.regression import GroupReport
from workers.issues.trackers import IssueTracker

log = logging.getLogger(__name__)


def file_regression_issue(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    item: GroupReport,
    rendered: RenderedIssue,
) -> FiledIssue:
    """File one cause's issue of a regression alert, or comment on its open one; record it.

    Raises:
        InfrastructureError: the tracker kept failing.
    """
    run, alert, group, report = context.run, context.alert, item.group, item.report
    record = open_record(session, tracker, rendered.fingerprint)
    created_now = False
    if record is None:
        # Not recorded: an issue created by an attempt that crashed before its commit still
        # carries the marker; otherwise file a new one (create looks for the marker again).
        found = tracker.find_open(rendered.fingerprint)
        if found is None:
            found = tracker.create(rendered)
            created_now = found.run_id in (None, run.id)
        # A record closed here but open there (reopened) keeps its recorded state: sync-back
        # reads the reopening and moves the regressions back to untriaged.
        record = _existing_record(session, tracker, found) or _new_record(
            session, tracker=tracker, issue=found, rendered=rendered, run=run, alert=alert
        )
    if record.run_id == run.id:
        action = "created" if created_now else "adopted"
    else:
        action = "commented"
        tracker.comment(record.number, render_recurrence(report), key=f"run-{run.id}")
        log.info("run %s: commented on issue #%d (still regressed)", run.id, record.number)
    if created_now:
        log.info("alert %s: filed %s", alert.id, record.url)
    record.last_night = max(record.last_night, run.night)
    linked = _link(session, record, group.regressions)
    session.flush()
    return FiledIssue(
        number=record.number,
        url=record.url,
        action=action,
        fingerprint=rendered.fingerprint,
        record_id=record.id,
        regression_ids=linked,
    )


def open_record(session: Session, tracker: IssueTracker, fp: str) -> IssueRecord | None:
    """The recorded open issue with fingerprint ``fp``, checked against the tracker.

    An issue closed (or gone) since the last sync is recorded as closed and not returned, so a
    regression that came back gets a fresh issue rather than a comment on a closed one.
    """
    record = session.scalar(
        select(IssueRecord)
        .where(
            IssueRecord.fingerprint == fp,
            IssueRecord.tracker == tracker.kind,
            IssueRecord.location == tracker.location,
            IssueRecord.state == "open",
        )
        .order_by(IssueRecord.id.desc())
        .limit(1)
    )
    if record is None:
        return None
    try:
        current = tracker.get(record.number)
    except NotFound:
        record.state = "closed"
        return None
    if current.state != "open":
        # Leave labels and the watermark to sync-back, which moves the regressions.
        record.state = current.state
        return None
    return record


def _existing_record(
    session: Session, tracker: IssueTracker, issue: TrackedIssue
) -> IssueRecord | None:
    return session.scalar(
        select(IssueRecord).where(
            IssueRecord.tracker == tracker.kind,
            IssueRecord.location == tracker.location,
            IssueRecord.number == issue.number,
        )
    )


def _new_record(
    session: Session,
    *,
    tracker: IssueTracker,
    issue: TrackedIssue,
    rendered: RenderedIssue,
    run: Run,
    alert: Alert,
) -> IssueRecord:
    record = IssueRecord(
        fingerprint=rendered.fingerprint,
        tracker=tracker.kind,
        location=tracker.location,
        number=issue.number,
        url=issue.url,
        title=issue.title,
        state=issue.state,
        state_reason=issue.state_reason,
        labels=list(issue.labels),
        alert_id=alert.id,
        run_id=issue.run_id if issue.run_id is not None else run.id,
        first_night=run.night,
        last_night=run.night,
        remote_updated_at=issue.updated_at,
    )
    session.add(record)
    session.flush()
    return record


def _link(
    session: Session, record: IssueRecord, regressions: Sequence[Regression]
) -> tuple[int, ...]:
    have = set(
        session.scalars(
            select(IssueRegression.regression_id).where(IssueRegression.issue_id == record.id)
        )
    )
    for regression in regressions:
        if regression.id not in have:
            session.add(IssueRegression(issue_id=record.id, regression_id=regression.id))
            have.add(regression.id)
    return tuple(sorted(have))
