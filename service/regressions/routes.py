"""Regressions (list, triage) and alerts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api import Cursor, FilterText, Id, Limit, Night, errors, url
from service.bisections.profiles import TraceSide, profile_trace, regression_profile
from service.bisections.schemas import ProfileRead
from service.bisections.service import bisections_for_regressions, culprits_for_regressions
from service.deps import SessionDep, TokenDep
from service.errors import NotFound
from service.metrics import INSTRUCTIONS
from service.models import Alert, ProfileStatus, Regression, Run
from service.regressions.schemas import (
    AlertRead,
    RegressionPatch,
    RegressionRead,
    RegressionsPage,
    TriageState,
)
from service.regressions.service import get_regression, list_alert_regressions, set_state

router = APIRouter(tags=["regressions"])


def regression_payloads(session: Session, regressions: list[Regression]) -> list[dict[str, Any]]:
    """Regressions as ``RegressionRead`` dicts, with nights, culprits and bisections."""
    ids = [r.id for r in regressions]
    nights = (
        dict(
            session.execute(
                select(Run.id, Run.night).where(Run.id.in_({r.run_id for r in regressions}))
            ).all()
        )
        if regressions
        else {}
    )
    culprits = culprits_for_regressions(session, ids)
    bisections = bisections_for_regressions(session, ids)
    return [
        {
            "id": r.id,
            "run_id": r.run_id,
            "night": nights.get(r.run_id),
            "first_night": r.first_night or nights.get(r.run_id),
            "alert_id": r.alert_id,
            "series_key": r.series_key,
            "benchmark": r.benchmark,
            "model": r.model,
            "mode": r.mode,
            "device": r.device,
            "compiler": r.compiler,
            "metric": r.metric,
            "unit": r.unit,
            "direction": r.direction,
            "baseline": r.baseline,
            "value": r.value,
            "change": r.change,
            "p_value": r.p_value,
            "threshold": r.threshold,
            "alertable": r.alertable,
            "confirmation": r.confirmation,
            "state": r.state,
            "reason": r.reason,
            "culprit": culprits.get(r.id),
            "bisection_ids": bisections.get(r.id, []),
            "back_night": r.back_night,
            "back_reason": r.back_reason,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "chart_url": url(f"/api/models/{r.model}/history.svg", series=r.series_key),
        }
        for r in regressions
    ]


@router.get("/api/regressions", response_model=RegressionsPage, responses=errors(422))
def list_regressions(
    session: SessionDep,
    state: TriageState | None = Query(None, description="triage state"),
    since: Night = None,
    direction: str | None = Query(None, pattern="^(regression|improvement)$"),
    model: FilterText = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """Regressions and improvements, newest first; ``since`` filters on the run's night."""
    stmt = (
        select(Regression)
        .join(Run, Run.id == Regression.run_id)
        .order_by(Regression.id.desc())
        .limit(limit + 1)
    )
    if state is not None:
        stmt = stmt.where(Regression.state == state)
    if since is not None:
        stmt = stmt.where(Run.night >= since)
    if direction is not None:
        stmt = stmt.where(Regression.direction == direction)
    if model is not None:
        stmt = stmt.where(Regression.model == model)
    if cursor is not None:
        stmt = stmt.where(Regression.id < cursor)
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": regression_payloads(session, rows),
        "next_cursor": rows[-1].id if more else None,
    }


@router.get(
    "/api/regressions/{regression_id}", response_model=RegressionRead, responses=errors(404, 422)
)
def read_regression(regression_id: Id, session: SessionDep) -> dict[str, Any]:
    """One regression or improvement."""
    return regression_payloads(session, [get_regression(session, regression_id)])[0]


@router.get(
    "/api/regressions/{regression_id}/profile",
    response_model=ProfileRead,
    responses=errors(404, 422),
)
def read_regression_profile(regression_id: Id, session: SessionDep) -> dict[str, Any]:
    """What changed between the builds either side of the regression's culprit (or its
    range's ends): every operator or function above the noise, and where the traces are."""
    row = regression_profile(session, regression_id)
    base = f"/api/regressions/{regression_id}/profile/trace"
    traced = row.status == ProfileStatus.DONE and row.metric != INSTRUCTIONS
    return {
        "regression_id": regression_id,
        "bisection_id": row.bisection_id,
        "benchmark": row.benchmark,
        "metric": row.metric,
        "before": row.before,
        "after": row.after,
        "culprit": row.culprit,
        "status": row.status,
        "reason": row.reason,
        "diff": row.diff,
        "traces": [f"{base}/before", f"{base}/after"] if traced else [],
    }


@router.get(
    "/api/regressions/{regression_id}/profile/trace/{side}",
    response_class=Response,
    responses={
        **errors(404, 422, json_route=False),
        200: {
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
            "description": "the build's Chrome trace, gzip-compressed JSON",
        },
    },
)
def read_regression_profile_trace(
    regression_id: Id, side: TraceSide, session: SessionDep
) -> Response:
    """One build's Chrome trace from the regression's profile (``before`` or ``after``), for
    Perfetto or ``chrome://tracing``."""
    data = profile_trace(session, regression_id, side)
    name = f"regression-{regression_id}-{side}.trace.json.gz"
    return Response(
        data,
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.patch(
    "/api/regressions/{regression_id}",
    response_model=RegressionRead,
    responses=errors(400, 401, 404, 422),
)
def triage(
    regression_id: Id, body: RegressionPatch, session: SessionDep, token: TokenDep
) -> dict[str, Any]:
    """Set the triage state (``expected`` resets the series' baseline there). Needs a token."""
    regression = set_state(session, regression_id=regression_id, state=body.state)
    return regression_payloads(session, [regression])[0]


@router.get("/api/alerts/{alert_id}", response_model=AlertRead, responses=errors(404, 422))
def read_alert(alert_id: Id, session: SessionDep) -> dict[str, Any]:
    """An alert (the regressions of one run, or a missing-data notice) with its regressions."""
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"alert {alert_id} does not exist")
    run = session.get(Run, alert.run_id)
    regressions = list_alert_regressions(session, alert_id=alert_id)
    return {
        "id": alert.id,
        "run_id": alert.run_id,
        "night": run.night if run else None,
        "kind": alert.kind,
        "status": alert.status,
        "summary": alert.summary,
        "created_at": alert.created_at,
        "regressions": regression_payloads(session, regressions),
    }
