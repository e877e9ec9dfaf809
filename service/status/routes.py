"""``GET /api/status``: what runs, what is late, who works."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from service.config import get_settings
from service.deps import SessionDep
from service.status.schemas import StatusRead
from service.status.service import system_status

router = APIRouter(prefix="/api/status", tags=["status"])


@router.get("", response_model=StatusRead)
def status(session: SessionDep) -> dict[str, Any]:
    """Each machine class's last night, the open runs (overdue ones flagged), the workers seen
    in the last hour, the filings pending, the queue lengths, and one line per problem a person
    should look at."""
    settings = get_settings()
    return asdict(
        system_status(
            session,
            broker_url=settings.broker_url,
            queue_prefix=settings.queue_prefix,
            threshold_for=settings.threshold_for,
        )
    )
