"""The moves of an alert's filing state (:class:`~service.models.FilingState`), shared by the
regression and the missing-data filings.

``None`` → ``pending`` (:func:`mark_pending`); ``filed`` → ``pending`` again when a filed
missing-data issue has news to tell, the data that came later (:func:`reopen`). The retry that
files a pending alert, with its backoff (:func:`backoff`), is :mod:`workers.issues.pending`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from service.models import Alert, FilingState
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
