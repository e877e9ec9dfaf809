"""A/Bs of pull requests (and local ones): ``GET /api/ab/{id}``, ``GET /api/ab``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.ab.schemas import ABRead, ABSummary
from service.api import Id, errors
from service.deps import SessionDep
from service.errors import NotFound
from service.models import ABTest, Result, Run

router = APIRouter(tags=["ab"])


def _flagged(ab: ABTest) -> int:
    return sum(1 for r in ab.rows or [] if r.get("flagged"))


@router.get("/api/ab/{ab_id}", response_model=ABRead, responses=errors(404, 422))
def read_ab(ab_id: Id, session: SessionDep) -> dict[str, Any]:
    """An A/B: its rows (flagged first), the profile diffs of its regressions, every process's
    value on either side, and its report on the pull request."""
    ab = session.get(ABTest, ab_id)
    if ab is None:
        raise NotFound(f"no A/B {ab_id}")
    sides = {ab.base_run_id: "base", ab.head_run_id: "head"}
    processes = []
    run_ids = [i for i in sides if i is not None]
    if run_ids:
        stmt = (
            select(Result, Run.id)
            .join(Run, Run.id == Result.run_id)
            .where(Run.id.in_(run_ids))
            .order_by(Result.id)
        )
        for result, run_id in session.execute(stmt):
            processes.append(
                {
                    "side": sides[run_id],
                    "benchmark": result.benchmark,
                    "metric": result.metric,
                    "values": list(result.samples or []),
                    "error": result.error,
                }
            )
    return {
        **{c: getattr(ab, c) for c in ABRead.model_fields if hasattr(ABTest, c)},
        "flagged": _flagged(ab),
        "rows": list(ab.rows or []),
        "profiles": dict(ab.profiles or {}),
        "processes": processes,
    }


@router.get("/api/ab", response_model=list[ABSummary], responses=errors(422))
def list_ab(
    session: SessionDep,
    pr: Annotated[int | None, Query(ge=1, description="only this pull request's")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[dict[str, Any]]:
    """A/Bs, newest first."""
    stmt = select(ABTest).order_by(ABTest.id.desc()).limit(limit)
    if pr is not None:
        stmt = stmt.where(ABTest.pr_number == pr)
    return [
        {
            **{c: getattr(ab, c) for c in ABSummary.model_fields if hasattr(ABTest, c)},
            "flagged": _flagged(ab),
        }
        for ab in session.scalars(stmt)
    ]
