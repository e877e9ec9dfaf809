"""Telling a regression's issue that its series is back at its level from before it.

:mod:`service.regressions.back` records the night (``Regression.back_night``) and why; the
nightly then makes the regression's filed alert pending again, and the durable filing
(:mod:`workers.issues.pending`) posts the comments :func:`back_comments` returns (the regression
kind's ``comments``): once on each open issue the regression is reported in (the comment's key
makes a repeat a no-op), recording ``Regression.back_told_at``. An issue closed meanwhile has
been triaged: it is not told.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.models import IssueRecord, IssueRegression
from service.models.base import utcnow
from workers.issues.kind import FilingContext
from workers.issues.model import Comment, FiledIssue
from workers.issues.render.back import render_back
from workers.issues.reports.regression import reproduced
from workers.issues.trackers import IssueTracker


def back_comments(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    filed: Mapping[str, FiledIssue],
    *,
    now: datetime | None = None,
) -> list[Comment]:
    """One comment for each open issue of ``tracker`` reporting one of the alert's reproduced
    regressions that is back and not yet told; records ``back_told_at`` (the caller's savepoint
    undoes it when the tracker fails). Only flushes.

    Returns:
        The comments to post, with the issue and regression each tells.

    Raises:
        InfrastructureError: the tracker failed while checking an issue is still open.
    """
    comments: list[Comment] = []
    for regression in reproduced(session, context.alert.id):
        if regression.back_night is None or regression.back_told_at is not None:
            continue
        records = session.scalars(
            select(IssueRecord)
            .join(IssueRegression, IssueRegression.issue_id == IssueRecord.id)
            .where(
                IssueRegression.regression_id == regression.id,
                IssueRecord.tracker == tracker.kind,
                IssueRecord.location == tracker.location,
                IssueRecord.state == "open",
            )
            .order_by(IssueRecord.id)
        )
        body = render_back(regression)
        comments.extend(
            Comment(
                key=f"back-{regression.id}",
                body=body,
                number=record.number,
                url=record.url,
                fingerprint=record.fingerprint,
                record_id=record.id,
                regression_ids=(regression.id,),
                action="told",
            )
            for record in list(records)
            if _still_open(tracker, record)
        )
        regression.back_told_at = now or utcnow()
    session.flush()
    return comments


def _still_open(tracker: IssueTracker, record: IssueRecord) -> bool:
    """Whether ``record``'s issue is open in the tracker; one closed (or gone) since the last
    sync is recorded as closed (sync-back moves its regressions)."""
    try:
        state = tracker.get(record.number).state
    except NotFound:
        state = "closed"
    if state != "open":
        record.state = state
    return state == "open"
