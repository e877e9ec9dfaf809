"""A series' stored history: what detection, confirmation, charts and issues all read.

A *series* is one metric of one benchmark on one machine and environment (``Result.series_key``;
see the glossary in docs/architecture.md). Kept below both :mod:`service.results` and
:mod:`service.regressions`, which each read it, so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.models import Result, Run

ALERT_METRICS = ("latency", "cpu_peak_mem", "gpu_peak_mem")
"""The metrics detection judges and alerts on (ms, bytes, bytes)."""


def series_history(
    session: Session, *, series_key: str, night: date, run_id: int, limit: int,
    kinds: Sequence[str] = ("nightly", "ingest", "confirm"),
) -> list[Result]:
    """Earlier results of a series, oldest first, before ``(night, run_id)``; errors excluded.

    At most ``limit`` results (the most recent ones). Confirmation re-runs are included (right
    after their night, as the detector expects them); probes of bisections are not.
    """
    stmt = (
        select(Result)
        .join(Run, Run.id == Result.run_id)
        .where(
            Result.series_key == series_key,
            Result.error.is_(None),
            Run.kind.in_(kinds),
            or_(Result.night < night, and_(Result.night == night, Result.run_id < run_id)),
        )
        .order_by(Result.night.desc(), Result.run_id.desc())
        .limit(limit)
    )
    return list(reversed(list(session.scalars(stmt))))
