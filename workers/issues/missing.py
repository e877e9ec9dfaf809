"""Missing data as an issue: a night whose benchmarks did not all report by its deadline.

A ``missing_data`` alert is a row; nobody reads rows. It is stored with its filing pending
(:func:`service.runs.service.mark_missing`) and filed like any alert, through the durable
filing state (:mod:`workers.issues.pending`: outbox, retry with backoff, status) and the kind's
row (:data:`workers.issues.kinds.KINDS`): one issue per machine class (the jobs' queue) and
night, deduplicated by fingerprint (:func:`missing_data_fingerprint`): each benchmark that never
reported, the worker that last took it, its attempts and its last error, and what to do
(:mod:`workers.issues.render.missing`). When the data comes later (a re-dispatch of that night,
a late post to an ingest run), :func:`note_arrivals` makes the alert pending again and the
filing tells the issue once per benchmark (:func:`arrival_comments`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import date, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import session_scope
from service.models import Alert, AlertKind, FilingState, Run
from workers.issues.filing_state import reopen
from workers.issues.kind import FilingContext
from workers.issues.model import Arrival, Comment, FiledIssue, MissingDataReport
from workers.issues.render.missing import render_arrival
from workers.issues.reports.missing import arrived_benchmarks, missing_reports, still_missing
from workers.issues.trackers import IssueTracker

log = logging.getLogger(__name__)
LABELS = ("nightbench", "missing-data")


def missing_data_fingerprint(queue: str, night: str) -> str:
    """16 hex digits naming "the missing data of ``queue`` on ``night``" (one issue each)."""
    return hashlib.sha256(f"missing_data\0{queue}\0{night}".encode()).hexdigest()[:16]


def report_fingerprint(report: MissingDataReport) -> str:
    """The fingerprint of a missing-data report's issue."""
    return missing_data_fingerprint(report.queue, str(report.run.night))


def reports(session: Session, context: FilingContext) -> list[MissingDataReport]:
    """The missing-data kind's ``report``: one per machine class with jobs still missing."""
    return missing_reports(session, run=context.run)


def arrival_comments(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    filed: Mapping[str, FiledIssue],
) -> list[Comment]:
    """The missing-data kind's ``comments``: tell each machine class's issue the benchmarks of
    :func:`workers.issues.reports.missing.arrived_benchmarks` not yet told (``Alert.arrived``),
    in one comment whose key makes a repeat a no-op; records them as told (the caller's
    savepoint undoes it when the tracker fails). Only flushes.
    """
    alert, run = context.alert, context.run
    came = arrived_benchmarks(session, run, alert=alert)
    known = set(alert.arrived or [])
    fresh = {q: [b for b in names if b not in known] for q, names in sorted(came.items())}
    comments: list[Comment] = []
    for queue, names in fresh.items():
        if not names:
            continue
        still = [b for b in still_missing(session, run=run, queue=queue) if b not in came[queue]]
        key = (
            "arrived-"
            + hashlib.sha256("\0".join([str(alert.id), *names]).encode()).hexdigest()[:12]
        )
        body = render_arrival(Arrival(run.night, queue, tuple(names), tuple(still)))
        comments.append(
            Comment(key=key, body=body, fingerprint=missing_data_fingerprint(queue, str(run.night)))
        )
    alert.arrived = sorted(known | {b for names in fresh.values() for b in names}) or None
    session.flush()
    return comments


ARRIVALS_LOOKBACK_DAYS = 30  # missing-data alerts of older nights are no longer watched


def note_arrivals(*, today: date | None = None, now: datetime | None = None) -> list[int]:
    """Make each filed missing-data alert whose data came since pending again, to be told.

    Watches the missing-data alerts of the last ``ARRIVALS_LOOKBACK_DAYS`` nights; one whose
    issues were filed and for which :func:`arrived_benchmarks` holds benchmarks not yet told
    (``Alert.arrived``) goes back to ``pending`` (:func:`workers.issues.filing_state.reopen`).
    The durable filing's retry then posts the comment (:func:`arrival_comments`), with the
    same backoff and status as any filing: GitHub away loses nothing. An alert still pending or
    failing tells it when it files. Runs from the deadline sweep; touches no tracker.

    Returns:
        The ids of the alerts made pending.
    """
    since = (today or date.today()) - timedelta(days=ARRIVALS_LOOKBACK_DAYS)
    reopened: list[int] = []
    with session_scope() as session:
        alerts = list(
            session.scalars(
                select(Alert)
                .join(Run, Run.id == Alert.run_id)
                .where(
                    Alert.kind == AlertKind.MISSING_DATA,
                    Alert.filing_state == FilingState.FILED,
                    Run.night >= since,
                )
                .order_by(Alert.id)
            )
        )
        for alert in alerts:
            run = session.get(Run, alert.run_id)
            came = arrived_benchmarks(session, run, alert=alert) if run is not None else {}
            known = set(alert.arrived or [])
            if any(b not in known for names in came.values() for b in names) and reopen(
                alert, now=now
            ):
                reopened.append(alert.id)
    if reopened:
        log.info(
            "missing data came for alert(s) %s: to be told on their issues",
            ", ".join(map(str, reopened)),
        )
    return reopened
