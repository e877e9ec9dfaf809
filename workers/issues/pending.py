"""Filing as a durable state of its own: an alert's issue is pending until it is filed.

An alert's ``filing_state`` (:class:`~service.models.FilingState`) goes ``pending`` →
``filed``, or ``failed_retrying`` → ``filed``; the moves are :mod:`workers.issues.filing_state`.
Every kind of alert goes this way (:data:`workers.issues.kinds.KINDS`): a confirmed regression
alert (pending when its night is filed), a missing-data alert (stored pending with the jobs it
names, at the run's deadline; pending again when data it lacked comes later, until the comment
saying so is posted), a failing-benchmark alert. :func:`file_durably` makes one
attempt inside a savepoint: a failure (GitHub rejecting the token or the repository, a 5xx burst
longer than the client's retries, GitHub unreachable) rolls back what the attempt wrote, records
the error, the attempts and the next attempt's time on the alert, and writes the rendered issue
to the local outbox, so the finding is never lost while GitHub is away. A refused credential is
logged at once in one line naming the setting to fix.

The retry (:func:`retry_pending`) runs from the periodic ``issues.retry_filing`` task (beat),
the deadline sweep, ``nightbench issues retry`` and each night's filing step. It files each due
alert through :func:`workers.issues.filing.file_alert` (the row of its kind: regression,
missing data, failing benchmark), whose fingerprint dedup finds
an issue created by an attempt whose answer was lost (apply-then-502), so an issue is filed
exactly once (a comment: once per key); the outbox copy is then marked filed with the issue's
URL.

Backoff: the n-th failure waits ``min(BACKOFF_FIRST * 2 ** (n - 1), BACKOFF_MAX)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InfrastructureError, InvalidInput, NotFound, TrackerAccessDenied
from service.models import FILING_UNFILED, Alert, AlertKind, FilingState
from service.models.base import utcnow
from workers.issues import filing
from workers.issues.filing_state import BACKOFF_FIRST, BACKOFF_MAX, backoff, mark_pending
from workers.issues.model import RenderedIssue
from workers.issues.reports import causes
from workers.issues.reports.causes import BisectionInput
from workers.issues.trackers import IssueTracker, make_tracker
from workers.issues.trackers.outbox import OutboxTracker

log = logging.getLogger(__name__)

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "FilingAttempt",
    "any_due",
    "backoff",
    "due_alert_ids",
    "file_durably",
    "file_missing_data",
    "mark_pending",
    "retry_due",
    "retry_pending",
]


@dataclass(frozen=True)
class FilingAttempt:
    """What one attempt at filing an alert did.

    Attributes:
        alert_id: the alert.
        state: its filing state after the attempt (a :class:`~service.models.FilingState`).
        error: the attempt's error, when it failed.
        urls: the filed issues' URLs, or the outbox files holding them after a failure.
    """

    alert_id: int
    state: str
    error: str | None
    urls: tuple[str, ...]


def file_durably(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    tracker: IssueTracker | None = None,
    bisection: BisectionInput | None = None,
    now: datetime | None = None,
) -> FilingAttempt:
    """Attempt to file alert ``alert_id``; a failure is recorded and the issue kept in the outbox.

    Only flushes; the caller commits (a failed attempt's record is what it commits then).

    Args:
        session: database session.
        alert_id: the alert (made pending here if it was not yet).
        settings: the tracker's settings, the outbox folder.
        tracker: where issues go; default :func:`workers.issues.trackers.make_tracker`.
        bisection: the bisection's outcome; default read back from the alert's run.
        now: the time of the attempt (default: now).

    Returns:
        The attempt: ``filed`` (also when it was filed before), or ``failed_retrying``.

    Raises:
        NotFound: no alert ``alert_id``.
    """
    now = now or utcnow()
    alert = session.get(Alert, alert_id, with_for_update=True, populate_existing=True)
    if alert is None:
        raise NotFound(f"alert {alert_id} does not exist")
    if alert.filing_state == FilingState.FILED:
        return FilingAttempt(alert_id, FilingState.FILED, None, ())
    mark_pending(alert, now=now)
    if bisection is None and filing.kind_row(alert).reads_bisection:
        bisection = causes.night_bisection_input(session, run_id=alert.run_id)
    try:
        tracker = tracker or make_tracker(settings)
        with session.begin_nested():
            filed = _file(session, alert, settings=settings, tracker=tracker, bisection=bisection)
    except (InfrastructureError, InvalidInput) as exc:
        return _failed(session, alert_id, exc, settings=settings, bisection=bisection, now=now)
    alert.filing_state = FilingState.FILED
    alert.filing_attempts += 1
    alert.filing_error = None
    alert.filing_next_at = None
    alert.filed_at = now
    session.flush()
    if tracker.kind != OutboxTracker.kind:
        _mark_outbox_filed(settings, {f.fingerprint: f.url for f in filed})
    if alert.filing_attempts > 1:
        log.info("alert %s: filed after %d attempts", alert_id, alert.filing_attempts)
    return FilingAttempt(alert_id, FilingState.FILED, None, tuple(f.url for f in filed))


def _failed(
    session: Session,
    alert_id: int,
    exc: InfrastructureError | InvalidInput,
    *,
    settings: Settings,
    bisection: BisectionInput | None,
    now: datetime,
) -> FilingAttempt:
    """Record a failed attempt on the alert and keep its issue(s) in the outbox."""
    alert = session.get(Alert, alert_id, with_for_update=True, populate_existing=True)
    if alert is None:
        raise NotFound(f"alert {alert_id} does not exist")
    alert.filing_state = FilingState.FAILED_RETRYING
    alert.filing_attempts += 1
    alert.filing_error = exc.message
    next_at = alert.filing_next_at = now + backoff(alert.filing_attempts)
    paths = _to_outbox(session, alert_id, settings=settings, bisection=bisection)
    session.flush()
    kept = f"kept in the outbox ({', '.join(paths)})" if paths else "nothing to keep"
    # One line, no traceback: the message says what failed and, for a refusal, what to fix.
    level = (
        logging.ERROR if isinstance(exc, TrackerAccessDenied | InvalidInput) else logging.WARNING
    )
    log.log(
        level,
        "alert %s: filing failed (attempt %d, next at %s): %s; %s",
        alert_id,
        alert.filing_attempts,
        next_at.isoformat(timespec="seconds"),
        exc.message,
        kept,
    )
    return FilingAttempt(alert_id, FilingState.FAILED_RETRYING, exc.message, tuple(paths))


def _to_outbox(
    session: Session, alert_id: int, *, settings: Settings, bisection: BisectionInput | None
) -> list[str]:
    """Write the alert's rendered issues to the outbox (a repeat finds them by fingerprint)."""
    rendered = _render(session, alert_id, settings=settings, bisection=bisection)
    try:
        outbox = OutboxTracker(settings.effective_outbox_dir)
        return [outbox.create(issue).url for issue in rendered]
    except InfrastructureError as exc:
        log.error("alert %s: %s", alert_id, exc.message)
        return []


@dataclass(frozen=True)
class _Filed:
    """An issue an attempt filed, found or commented on: its fingerprint and URL."""

    fingerprint: str
    url: str


def _file(
    session: Session,
    alert: Alert,
    *,
    settings: Settings,
    tracker: IssueTracker,
    bisection: BisectionInput | None,
) -> list[_Filed]:
    """File ``alert`` through its kind's row (:func:`workers.issues.filing.file_alert`).

    Raises:
        InfrastructureError, InvalidInput: the tracker failed (the caller's savepoint undoes it).
    """
    filed = filing.file_alert(
        session, alert_id=alert.id, settings=settings, tracker=tracker, bisection=bisection
    )
    return [_Filed(f.fingerprint, f.url) for f in filed]


def _render(
    session: Session, alert_id: int, *, settings: Settings, bisection: BisectionInput | None
) -> list[RenderedIssue]:
    """The issues :func:`_file` would create for alert ``alert_id`` (what the outbox keeps)."""
    return filing.render_alert(session, alert_id=alert_id, settings=settings, bisection=bisection)


def _mark_outbox_filed(settings: Settings, urls: dict[str, str]) -> None:
    """Mark the outbox copies of the issues just filed (fingerprint → URL) as filed."""
    if not settings.effective_outbox_dir.is_dir():
        return
    try:
        outbox = OutboxTracker(settings.effective_outbox_dir)
        for fingerprint, url in urls.items():
            kept = outbox.find_open(fingerprint)
            if kept is not None:
                outbox.mark_filed(kept.number, url)
    except InfrastructureError as exc:
        # Filed all the same; the outbox copy only says so later (nobody files it twice: its
        # fingerprint finds the filed issue).
        log.warning("the filed issues' outbox copies are not marked filed: %s", exc.message)


def due_alert_ids(
    session: Session, *, now: datetime | None = None, force: bool = False
) -> list[int]:
    """Alerts whose filing is pending or failed and due at ``now`` (all of them with ``force``).

    Args:
        session: database session.
        now: the time to judge by (default: now).
        force: ignore the backoff (``nightbench issues retry --now``).

    Returns:
        Their ids, oldest pending first.
    """
    query = select(Alert.id).where(Alert.filing_state.in_(FILING_UNFILED))
    if not force:
        query = query.where(
            or_(Alert.filing_next_at.is_(None), Alert.filing_next_at <= (now or utcnow()))
        )
    return list(session.scalars(query.order_by(Alert.filing_pending_since, Alert.id)))


def retry_due(
    session: Session,
    *,
    settings: Settings,
    tracker: IssueTracker | None = None,
    now: datetime | None = None,
    force: bool = False,
) -> list[FilingAttempt]:
    """One attempt for each alert whose filing is due, in ``session`` (each in a savepoint).

    Only flushes; the caller commits.

    Args:
        session: database session.
        settings: the tracker's settings, the outbox folder.
        tracker: where issues go; default from ``settings``.
        now: the time to judge by (default: now).
        force: ignore the backoff.

    Returns:
        One :class:`FilingAttempt` per due alert.
    """
    return [
        file_durably(session, alert_id=alert_id, settings=settings, tracker=tracker, now=now)
        for alert_id in due_alert_ids(session, now=now, force=force)
    ]


def retry_pending(
    *, settings: Settings | None = None, now: datetime | None = None, force: bool = False
) -> list[FilingAttempt]:
    """:func:`retry_due`, each alert in a session scope of its own (committed one by one).

    Args:
        settings: default :func:`service.config.get_settings`.
        now: the time to judge by (default: now).
        force: ignore the backoff.

    Returns:
        One :class:`FilingAttempt` per due alert.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        ids = due_alert_ids(session, now=now, force=force)
    attempts = []
    for alert_id in ids:
        with session_scope() as session:
            attempts.append(file_durably(session, alert_id=alert_id, settings=settings, now=now))
    return attempts


def file_missing_data(
    run_id: int,
    *,
    settings: Settings | None = None,
    tracker: IssueTracker | None = None,
    now: datetime | None = None,
) -> FilingAttempt | None:
    """One attempt at filing the missing-data alert of run ``run_id`` (``night.file_missing``).

    The alert was stored pending with the jobs it names (:func:`service.runs.service.mark_missing`),
    so a failure here, or this task never running, leaves it to the retry.

    Returns:
        The attempt; None when the run has no missing-data alert to file (none, or one of a
        replicate run, which is not filed).
    """
    settings = settings or get_settings()
    with session_scope() as session:
        alert_id = session.scalar(
            select(Alert.id).where(
                Alert.run_id == run_id,
                Alert.kind == AlertKind.MISSING_DATA,
                Alert.filing_state.is_not(None),
            )
        )
        if alert_id is None:
            return None
        return file_durably(session, alert_id=alert_id, settings=settings, tracker=tracker, now=now)


def any_due(*, now: datetime | None = None) -> bool:
    """True when some alert's filing is due (the deadline sweep then sends the retry)."""
    with session_scope() as session:
        return bool(due_alert_ids(session, now=now))
