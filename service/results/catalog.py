"""The models list: every model with its domain and the configurations measured lately."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import CatalogModel, Result, Run
from service.results.points import HISTORY_KINDS


def model_domains(session: Session, models: Sequence[str]) -> dict[str, str | None]:
    """The domain of each model from the models catalogue (None for one it does not know).

    The catalogue is filled from the ``model_domain`` the records carry as they are stored
    (:func:`service.results.records.catalogue_models`): the service reads no suite file.
    """
    known = dict(
        session.execute(
            select(CatalogModel.name, CatalogModel.domain).where(
                CatalogModel.name.in_(list(models))
            )
        ).all()
    )
    return {m: known.get(m) for m in models}


def list_models(
    session: Session, *, since: date | None, days: int
) -> tuple[date | None, list[Any]]:
    """Models with the configurations measured since ``since`` (default: ``days`` before the
    latest night), one row per (model, mode, device, compiler, metric, machine).

    Returns:
        ``(since used, rows)``; rows are ``(model, mode, device, compiler, metric, unit,
        machine_id, first night, last night, results)`` ordered by model.
    """
    if since is None:
        latest = session.scalar(select(func.max(Run.night)).where(Run.kind.in_(HISTORY_KINDS)))
        if latest is None:
            return None, []
        since = date.fromordinal(max(latest.toordinal() - days, 1))
    stmt = (
        select(
            Result.model,
            Result.mode,
            Result.device,
            Result.compiler,
            Result.metric,
            func.min(Result.unit),
            Result.machine_id,
            func.min(Result.night),
            func.max(Result.night),
            func.count(),
        )
        .join(Run, Run.id == Result.run_id)
        .where(Run.night >= since, Run.kind.in_(HISTORY_KINDS), Result.error.is_(None))
        .group_by(
            Result.model,
            Result.mode,
            Result.device,
            Result.compiler,
            Result.metric,
            Result.machine_id,
        )
        .order_by(
            Result.model,
            Result.mode,
            Result.device,
            Result.compiler,
            Result.metric,
            Result.machine_id,
        )
    )
    return since, list(session.execute(stmt).all())
