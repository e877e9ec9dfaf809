"""Filing an alert, whatever its kind: report, render, file, tell (:func:`file_alert`).

The kind's row (:data:`workers.issues.kinds.KINDS`, shaped by :mod:`workers.issues.kind`)
gives each step: ``report`` (queries, one report per issue), ``fingerprint`` and ``render``
(pure Markdown), ``file_issue`` (the tracker, deduplicated by fingerprint) and ``comments``
(what its open issues are told, once each). The durable filing state around it (pending,
retry, outbox) is :mod:`workers.issues.pending`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import InvalidInput
from service.models import Alert, AlertStatus
from workers.issues.filing_state import alert_and_run
from workers.issues.kind import AlertKindRow, FilingContext
from workers.issues.kinds import KINDS
from workers.issues.model import Comment, FiledIssue, RenderedIssue
from workers.issues.reports.causes import BisectionInput
from workers.issues.trackers import IssueTracker, make_tracker, searchable_labels

log = logging.getLogger(__name__)

__all__ = ["FiledIssue", "file_alert", "kind_row", "render_alert"]


def kind_row(alert: Alert) -> AlertKindRow:
    """The filing table's row for ``alert``'s kind.

    Raises:
        InvalidInput: the kind has no row (nothing knows how to file it).
    """
    row = KINDS.get(alert.kind)
    if row is None:
        raise InvalidInput(
            f"alert {alert.id} is of kind {alert.kind!r}, which the filing table does not know"
        )
    return row


def file_alert(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    tracker: IssueTracker | None = None,
    bisection: BisectionInput | None = None,
) -> list[FiledIssue]:
    """File alert ``alert_id``: its issues (one per report of its kind), then its comments.

    Safe to call again for the same alert (a retried task): issues already filed are found (in
    the database, or by their marker in the tracker) and neither filed nor commented on twice;
    once the alert is filed, a call only posts the comments its kind has news for. Only
    flushes; the caller commits (:func:`workers.issues.pending.file_durably`, or rolls its
    savepoint back when the tracker failed, so nothing is recorded as filed or told then).

    Args:
        session: database session.
        alert_id: the alert.
        settings: for the tracker (when ``tracker`` is None), labels, links, sample windows.
        tracker: where issues go; default :func:`workers.issues.trackers.make_tracker`.
        bisection: for a regression, the bisection of the alert's commit range, when one
            ran; without it the regressions are reported against the night's commit range.

    Returns:
        One :class:`FiledIssue` per issue created, found or commented on; empty when the kind
        had nothing to file or tell.

    Raises:
        NotFound: no alert ``alert_id``, or its run is gone.
        InvalidInput: the alert's kind has no row in the table.
        InfrastructureError: the tracker kept failing (nothing is recorded for the issues not
            yet filed; a retry picks up where this stopped); :class:`~service.errors.TrackerAccessDenied`
            when it refused the credentials or the repository.
    """
    alert, run = alert_and_run(session, alert_id)
    row = kind_row(alert)
    context = FilingContext(alert=alert, run=run, settings=settings, bisection=bisection)
    if not row.has_news(session, context):
        return []
    tracker = tracker or make_tracker(settings)
    filed = []
    for report, rendered in _rendered(session, row, context):
        issue = row.file_issue(session, context, tracker, report, rendered)
        if issue.action == "created":
            log.info("alert %s (%s): filed %s", alert.id, alert.kind, issue.url)
        filed.append(issue)
    alert.status = AlertStatus.FILED
    by_fingerprint = {f.fingerprint: f for f in filed}
    for comment in row.comments(session, context, tracker, by_fingerprint):
        told = _post(tracker, comment, by_fingerprint)
        if told is not None:
            log.info("alert %s (%s): told %s (%s)", alert.id, alert.kind, told.url, comment.key)
            filed.append(told)
    session.flush()
    return filed


def render_alert(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    bisection: BisectionInput | None = None,
) -> list[RenderedIssue]:
    """The issues :func:`file_alert` would file for alert ``alert_id``, rendered, filing nothing.

    What the outbox keeps while the tracker cannot be reached: empty once the alert's issues
    were filed (what is left to do then is a comment, kept in the database).

    Raises:
        NotFound: no alert ``alert_id``, or its run is gone.
        InvalidInput: the alert's kind has no row in the table.
    """
    alert, run = alert_and_run(session, alert_id)
    row = kind_row(alert)
    context = FilingContext(alert=alert, run=run, settings=settings, bisection=bisection)
    return [rendered for _, rendered in _rendered(session, row, context)]


def _rendered(
    session: Session, row: AlertKindRow, context: FilingContext
) -> list[tuple[object, RenderedIssue]]:
    """Each report of the alert and its issue; none once the alert's issues were filed."""
    if context.alert.status == AlertStatus.FILED:
        return []
    labels = searchable_labels(context.settings, row.labels)
    return [
        (report, row.render(report, row.fingerprint(report), labels))
        for report in row.report(session, context)
    ]


def _post(
    tracker: IssueTracker, comment: Comment, filed: Mapping[str, FiledIssue]
) -> FiledIssue | None:
    """Post ``comment`` on its issue (the one named, filed now, or open in the tracker)."""
    number, url = comment.number, comment.url
    if number is None and comment.fingerprint:
        issue = filed.get(comment.fingerprint) or tracker.find_open(comment.fingerprint)
        number, url = (issue.number, issue.url) if issue is not None else (None, "")
    if number is None:  # no open issue to tell (closed since, or never filed)
        return None
    tracker.comment(number, comment.body, key=comment.key)
    return FiledIssue(
        number=number,
        url=url,
        action=comment.action,
        fingerprint=comment.fingerprint or "",
        record_id=comment.record_id,
        regression_ids=comment.regression_ids,
    )
