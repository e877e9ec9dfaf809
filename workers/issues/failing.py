"""A benchmark failing night after night as an issue: its series has no point while it fails.

On the night a benchmark's failures reach ``FAILING_NIGHTS`` nights in a row on a machine class
(the rule: :mod:`service.regressions.failing`), the nightly stores a ``failing`` alert with its
filing pending (:func:`note_failing`), filed like any alert through the durable filing
(:mod:`workers.issues.pending`) and the kind's row (:data:`workers.issues.kinds.KINDS`): one
issue per benchmark and streak (:func:`failing_fingerprint`), with the error, the nights, the
last good night's build and the commit range between it and the first failing night
(:mod:`workers.issues.render.failing`). That range is bisected to the first commit at which the
benchmark fails (:mod:`workers.issues.failing_bisect`), and the answer commented on the issue;
a benchmark that runs again is told too (:func:`failing_comments`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, AlertStatus, Run
from service.regressions.failing import (
    FAILING_NIGHTS,
    newly_failing,
    runs_again,
    streak_ends,
)
from workers.issues.filing_state import mark_pending
from workers.issues.kind import FilingContext
from workers.issues.model import Comment, FailingReport, FiledIssue
from workers.issues.render.failing import render_bisected, render_runs_again
from workers.issues.reports.failing import (
    failing_fingerprint,
    failing_reports,
    failure_bisections,
    finished_bisections,
    running_again,
)
from workers.issues.trackers import IssueTracker

log = logging.getLogger(__name__)
FAILING = AlertKind.FAILING
LABELS = ("nightbench", "benchmark-failure")

__all__ = [
    "FAILING",
    "LABELS",
    "failing_comments",
    "failing_fingerprint",
    "failure_bisections",
    "newly_failing",
    "note_failing",
    "report_fingerprint",
    "reports",
    "streak_ends",
]


def note_failing(session: Session, *, run: Run) -> Alert | None:
    """Store ``run``'s ``failing`` alert, its filing pending and due now, when a benchmark's
    failures reach ``FAILING_NIGHTS`` nights in a row tonight (:func:`newly_failing`) or a
    benchmark that had failed so runs again (its issue is told); the filing step or its retry
    files it. Idempotent. Only flushes.

    Returns:
        The alert, or None when there is nothing of the kind tonight.
    """
    fresh, again = newly_failing(session, run=run), runs_again(session, run=run)
    if not fresh and not again:
        return None
    alert = session.scalar(select(Alert).where(Alert.run_id == run.id, Alert.kind == FAILING))
    if alert is None:
        alert = Alert(run_id=run.id, kind=FAILING, status=AlertStatus.OPEN)
        session.add(alert)
    mark_pending(alert)
    parts = []
    if fresh:
        parts.append(
            f"failing {FAILING_NIGHTS} nights in a row: " + ", ".join(f.benchmark for f in fresh)
        )
    if again:
        parts.append("runs again: " + ", ".join(f.benchmark for f in again))
    alert.summary = "; ".join(parts)
    session.flush()
    log.warning("run %s: %s", run.id, alert.summary)
    return alert


def report_fingerprint(report: FailingReport) -> str:
    """The fingerprint of a failing benchmark's issue."""
    return failing_fingerprint(report.queue, report.benchmark, report.since)


def reports(session: Session, context: FilingContext) -> list[FailingReport]:
    """The failing kind's ``report``: one per benchmark newly failing tonight."""
    return failing_reports(
        session, run=context.run, alert_id=context.alert.id, settings=context.settings
    )


def failing_comments(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    filed: Mapping[str, FiledIssue],
) -> list[Comment]:
    """The failing kind's ``comments``: each benchmark that runs again tonight, told on its open
    issue; each finished failure bisection's answer, told on its open issue. Once each (keys)."""
    again = [
        Comment(
            key=f"runs-again-{context.run.id}",
            body=render_runs_again(a),
            fingerprint=failing_fingerprint(a.queue, a.benchmark, a.since),
        )
        for a in running_again(session, run=context.run)
    ]
    bisected = [
        Comment(key=f"bisected-{b.id}", body=render_bisected(b), fingerprint=issue)
        for issue, b in finished_bisections(
            session, alert_id=context.alert.id, settings=context.settings
        )
    ]
    return again + bisected
