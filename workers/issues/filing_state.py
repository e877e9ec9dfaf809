"""The moves of an alert's filing state (:class:`~service.models.FilingState`), shared by the
regression and the missing-data filings.

``None`` → ``pending`` (:func:`mark_pending`); ``filed`` → ``pending`` again when a filed
issue has news to tell, the data that came later or a series back at its level (:func:`reopen`).
The retry that files a pending alert, with its backoff (:func:`backoff`), is
:mod:`workers.issues.pending`; each kind's filing reads its alert with :func:`alert_and_run`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.errors import NotFound
from service.models import Alert, FilingState, Run
from service.models.base import utcnow

BACKOFF_FIRST = timedelta(minutes=5)
BACKOFF_MAX = timedelta(hours=6)


def backoff(attempts: int) -> timedelta:
    """How long to wait after the ``attempts``-th failed attempt (1 or more).

    ``min(BACKOFF_FIRST * 2 ** (attempts - 1), BACKOFF_MAX)``: 5 min, 10 min, 20 min, … 6 h.
    """
    return min(BACKOFF_FIRST * 2 ** max(attempts - 1, 0), BACKOFF_MAX)


def mark_pending(alert: Alert, *, now: datetime | None = None) -> None:
    """Make ``alert``'s filing pending, due now, unless it is already pending or filed."""
    if alert.filing_state is None:
        now = now or utcnow()
        alert.filing_state = FilingState.PENDING
        alert.filing_pending_since = now
        alert.filing_next_at = now


def reopen(alert: Alert, *, now: datetime | None = None) -> bool:
    """Make a filed ``alert``'s filing pending again, due now (a new round of attempts).

    Used when a filed issue has more to be told (a missing-data issue whose data came): what
    to tell stays in the database until an attempt tells it.

    Returns:
        True when the alert was ``filed`` and is now ``pending``; False when it was not filed
        (a pending or failing filing tells the news when it files; ``None``: nothing to file).
    """
    if alert.filing_state != FilingState.FILED:
        return False
    now = now or utcnow()
    alert.filing_state = FilingState.PENDING
    alert.filing_attempts = 0
    alert.filing_error = None
    alert.filing_pending_since = now
    alert.filing_next_at = now
    return True


def alert_and_run(session: Session, alert_id: int, kind: str | None = None) -> tuple[Alert, Run]:
    """Alert ``alert_id`` (of ``kind`` when given), locked for this filing, and its run.

    Raises:
        NotFound: no such alert (of that kind), or its run is gone.
    """
    alert = session.get(Alert, alert_id, with_for_update=True, populate_existing=True)
    if alert is None or (kind is not None and alert.kind != kind):
        what = f"{kind.replace('_', '-')} alert" if kind else "alert"
        raise NotFound(f"{what} {alert_id} does not exist")
    run = session.get(Run, alert.run_id)
    if run is None:
        raise NotFound(f"run {alert.run_id} of alert {alert_id} does not exist")
    return alert, run
