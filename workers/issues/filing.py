"""Filing an alert's confirmed regressions as issues (:func:`file_alert`).

For one alert:

1. The reproduced regressions are grouped by cause (:mod:`workers.issues.causes`): one group per
   culprit commit, one per inconclusive narrowed range, and the rest under the night's commit
   range.
2. Each group becomes an :class:`~workers.issues.model.IssueReport` built from the database
   (:mod:`workers.issues.report`: baseline, tonight, sample counts, machine, recent nights,
   environment, confirmation re-run, bisection probes) and is rendered; its fingerprint covers
   benchmarks, metrics and cause.
3. Dedup: an open :class:`~service.models.IssueRecord` with the fingerprint gets a
   "still regressed on D" comment (once per run). Without one, the tracker is asked for an open
   issue carrying the fingerprint marker, which finds an issue whose creation was not recorded
   (a crash between the tracker's answer and the commit): it is adopted, with a comment only if
   it was filed for another run. Otherwise a new issue is created.

Reading triage back from the issues is :mod:`workers.issues.sync`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import NotFound
from service.models import (
    Alert,
    AlertStatus,
    Confirmation,
    IssueRecord,
    IssueRegression,
    Regression,
    Run,
)
from workers.issues import back
from workers.issues.causes import BisectionInput, _Group, _groups
from workers.issues.filing_state import alert_and_run
from workers.issues.model import IssueReport, RenderedIssue, TrackedIssue
from workers.issues.render import render_issue, render_recurrence
from workers.issues.report import build_report
from workers.issues.tracker import IssueTracker, make_tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FiledIssue:
    """What filing did for one group of regressions.

    Attributes:
        record_id: the :class:`~service.models.IssueRecord`.
        number: the issue number in its tracker.
        url: where to read it.
        action: ``created`` | ``commented`` (recurrence) | ``told`` (its series is back:
            :mod:`workers.issues.back`) | ``adopted`` (found by its marker,
            filed for this run by an attempt that did not get to record it).
        fingerprint: the fingerprint it carries.
        regression_ids: the regressions it now speaks for.
    """

    record_id: int
    number: int
    url: str
    action: str
    fingerprint: str
    regression_ids: tuple[int, ...]


def file_alert(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    tracker: IssueTracker | None = None,
    bisection: BisectionInput | None = None,
) -> list[FiledIssue]:
    """File the reproduced regressions of alert ``alert_id``: one issue per cause.

    Safe to call again for the same alert (a retried task): issues already filed for it are
    found (in the database, or by their marker in the tracker) and neither filed nor commented
    on twice; once the alert is filed, a call only tells its open issues of the regressions
    whose series is back since (:func:`workers.issues.back.tell_back`). Only flushes; the
    caller commits.

    Args:
        session: database session.
        alert_id: the alert.
        settings: for the tracker (when ``tracker`` is None), API links and sample windows.
        tracker: where issues go; default :func:`workers.issues.tracker.make_tracker`.
        bisection: the bisection of the alert's commit range, when one ran; without it the
            regressions are reported against the night's commit range.

    Returns:
        One :class:`FiledIssue` per group; empty when nothing was reproduced.

    Raises:
        NotFound: no alert ``alert_id``.
        InfrastructureError: the tracker kept failing (nothing is recorded for the groups not
            yet filed; a retry picks up where this stopped); :class:`~service.errors.TrackerAccessDenied`
            when it refused the credentials or the repository.
    """
    alert, run = alert_and_run(session, alert_id)
    regressions = _reproduced(session, alert_id)
    if not regressions:
        return []
    tracker = tracker or make_tracker(settings)
    # A filed alert made pending again has news for its issues, nothing more to file: filing
    # its groups again would file a fresh issue for one closed since.
    filed = (
        []
        if alert.status == AlertStatus.FILED
        else [
            _file_group(session, tracker=tracker, run=run, alert=alert, group=group, report=report)
            for group, report in _reports(session, alert, run, regressions, bisection, settings)
        ]
    )
    alert.status = AlertStatus.FILED
    told = back.tell_back(session, tracker=tracker, regressions=regressions)
    session.flush()
    return filed + [
        FiledIssue(
            record_id=record.id,
            number=record.number,
            url=record.url,
            action="told",
            fingerprint=record.fingerprint,
            regression_ids=(regression.id,),
        )
        for record, regression in told
    ]


def render_alert(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    bisection: BisectionInput | None = None,
) -> list[RenderedIssue]:
    """The issues :func:`file_alert` would file for alert ``alert_id``, rendered, filing nothing.

    What the outbox keeps while the tracker cannot be reached.

    Args:
        session: database session.
        alert_id: the alert.
        settings: for API links and sample windows.
        bisection: the bisection of the alert's commit range, when one ran.

    Returns:
        One rendered issue per group of reproduced regressions; empty when there is none.

    Raises:
        NotFound: no alert ``alert_id``.
    """
    alert, run = alert_and_run(session, alert_id)
    if alert.status == AlertStatus.FILED:  # what is left to do is a comment, kept in the database
        return []
    regressions = _reproduced(session, alert_id)
    return [
        render_issue(report)
        for _group, report in _reports(session, alert, run, regressions, bisection, settings)
    ]


def _reports(
    session: Session,
    alert: Alert,
    run: Run,
    regressions: list[Regression],
    bisection: BisectionInput | None,
    settings: Settings,
) -> list[tuple[_Group, IssueReport]]:
    """Each cause's group of ``regressions`` and the report built for it."""
    if not regressions:
        return []
    improvements = _improvements(session, run)
    return [
        (
            group,
            build_report(
                session,
                run=run,
                alert=alert,
                group=group,
                improvements=improvements,
                bisection=bisection,
                settings=settings,
            ),
        )
        for group in _groups(session, run, regressions, bisection)
    ]


def _reproduced(session: Session, alert_id: int) -> list[Regression]:
    """The alert's regressions that the confirmation re-run reproduced, oldest first."""
    return list(
        session.scalars(
            select(Regression)
            .where(
                Regression.alert_id == alert_id,
                Regression.direction == "regression",
                Regression.confirmation == Confirmation.REPRODUCED,
            )
            .order_by(Regression.id)
        )
    )


def _improvements(session: Session, run: Run) -> list[Regression]:
    """The run's improvements, oldest first (its issues list them beside the regressions)."""
    return list(
        session.scalars(
            select(Regression)
            .where(Regression.run_id == run.id, Regression.direction == "improvement")
            .order_by(Regression.id)
        )
    )


def _file_group(
    session: Session,
    *,
    tracker: IssueTracker,
    run: Run,
    alert: Alert,
    group: _Group,
    report: IssueReport,
) -> FiledIssue:
    rendered = render_issue(report)
    record = _open_record(session, tracker, rendered.fingerprint)
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
        record_id=record.id,
        number=record.number,
        url=record.url,
        action=action,
        fingerprint=rendered.fingerprint,
        regression_ids=linked,
    )


def _open_record(session: Session, tracker: IssueTracker, fp: str) -> IssueRecord | None:
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
