"""``GET /api/status``: what runs, what is late, who works.

Unauthenticated and costly (a dozen queries and, while a queue holds messages, a broadcast to
the workers that waits up to ``LISTEN_TIMEOUT_S``), so it is computed at most once at a time per
process and one answer serves every caller for ``STATUS_CACHE_S``; its database connection goes
back to the pool before the workers are asked. 80 concurrent calls used to hold 80 connections
through the broadcast: 16 answered 500 and ``/healthz`` stalled up to 33 s (docs/reliability.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request

from service.api import errors
from service.config import get_settings
from service.status.broker import broker_state
from service.status.schemas import StatusRead
from service.status.service import store_status, with_broker

router = APIRouter(prefix="/api/status", tags=["status"])

STATUS_CACHE_S = 5.0  # seconds one answer serves every caller


@dataclass
class _Cached:
    """The process's last answer (per app) and the lock that lets one caller compute it."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    answer: dict[str, Any] | None = None
    at: float = 0.0

    def fresh(self) -> dict[str, Any] | None:
        if self.answer is not None and time.monotonic() - self.at < STATUS_CACHE_S:
            return self.answer
        return None


def _compute(app: FastAPI) -> dict[str, Any]:
    settings = app.state.settings or get_settings()
    session = app.state.session_factory()
    try:
        stored = store_status(
            session,
            threshold_for=settings.threshold_for,
            resend_after_s=settings.step_resend_after_s,
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
    # The connection is back in the pool before the workers are asked.
    broker = broker_state(
        settings.broker_url, prefix=settings.queue_prefix, waiting_on=stored.waiting_on
    )
    return asdict(with_broker(stored, broker))


@router.get("", response_model=StatusRead, responses=errors(503))
async def status(request: Request) -> dict[str, Any]:
    """Each machine class's last night, the open runs (overdue ones flagged), the workers seen
    in the last hour, the filings pending, the queue lengths, and one line per problem a person
    should look at. Computed at most once every 5 s (``now`` says when)."""
    app = request.app
    cached: _Cached | None = getattr(app.state, "status_cache", None)
    if cached is None:
        cached = app.state.status_cache = _Cached()
    answer = cached.fresh()
    if answer is not None:
        return answer
    async with cached.lock:
        answer = cached.fresh()
        if answer is None:
            answer = await anyio.to_thread.run_sync(_compute, app)
            cached.answer, cached.at = answer, time.monotonic()
    return answer
