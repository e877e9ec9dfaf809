"""Telling a regression's issue that its series is back at its level from before it.

:mod:`service.regressions.back` records the night (``Regression.back_night``) and why; the
nightly then makes the regression's filed alert pending again, and the durable filing
(:mod:`workers.issues.pending`) calls :func:`tell_back`, which comments once on each open issue
the regression is reported in (the comment's key makes a repeat a no-op) and records
``Regression.back_told_at``. An issue closed meanwhile has been triaged: it is not told.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.models import IssueRecord, IssueRegression, Regression
from service.models.base import utcnow
from workers.issues.markdown import format_change, format_value
from workers.issues.tracker import IssueTracker

log = logging.getLogger(__name__)


def render_back(regression: Regression) -> str:
    """The comment telling an issue that ``regression``'s series is back (Markdown).

    Raises:
        ValueError: the regression is not back (``back_night`` is None).
    """
    if regression.back_night is None:
        raise ValueError(f"regression {regression.id} is not back")
    first = regression.first_night.isoformat() if regression.first_night else "its first night"
    return (
        f"**Back at its level from before this regression on {regression.back_night}**: "
        f"`{regression.benchmark}` {regression.metric} ({format_change(regression.change)} "
        f"against a baseline of {format_value(regression.baseline, regression.unit)}, first "
        f"night {first}).\n\n> {regression.back_reason or ''}\n\n"
        "If the step comes back, it is raised again. Close this issue as completed if a fix or "
        "a revert landed; if nothing did, look at the chart before closing it as not planned.\n"
    )


def tell_back(
    session: Session,
    *,
    tracker: IssueTracker,
    regressions: Sequence[Regression],
    now: datetime | None = None,
) -> list[tuple[IssueRecord, Regression]]:
    """Comment once on each open issue of ``tracker`` reporting one of ``regressions`` that is
    back and not yet told; record ``back_told_at``. Only flushes.

    Returns:
        ``(issue, regression)`` for each comment posted (or found posted: its key).

    Raises:
        InfrastructureError, InvalidInput: the tracker failed (the caller's savepoint undoes
            what was recorded, and the retry tells it).
    """
    told = []
    for regression in regressions:
        if regression.back_night is None or regression.back_told_at is not None:
            continue
        records = list(
            session.scalars(
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
        )
        body = render_back(regression)
        for record in records:
            if not _still_open(tracker, record):
                continue
            tracker.comment(record.number, body, key=f"back-{regression.id}")
            log.info(
                "regression %s back on %s: told on %s",
                regression.id,
                regression.back_night,
                record.url,
            )
            told.append((record, regression))
        regression.back_told_at = now or utcnow()
    session.flush()
    return told


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
