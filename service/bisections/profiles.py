"""The profile probe's answer for a regression, as the API serves it.

A night's bisection ends with a profile probe (``workers/bisect/profile_probe.py``): one
:class:`~service.models.BisectionProfile` row per benchmark profiled, holding the diff of the
two builds' profiles (:func:`service.profiles.diff_json`) and each build's Chrome trace. A
regression's profile is the row of its own benchmark in the latest bisection that searched it;
when its benchmark was not profiled itself (one benchmark is profiled per cause), the row of
the same cause: the same culprit, or the same commit range.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from service.bisections.service import bisections_for_regressions
from service.errors import NotFound
from service.models import Bisection, BisectionOutcome, BisectionProfile, ProfileStatus, Regression

TraceSide = Literal["before", "after"]


def regression_profile(
    session: Session, regression_id: int, *, with_traces: bool = False
) -> BisectionProfile:
    """The profile probe's row for a regression (module docstring for which row).

    Args:
        session: database session.
        regression_id: the regression.
        with_traces: load the rows' traces too (they are left unread otherwise).

    Raises:
        NotFound: no such regression, no bisection searched it, or its bisection has no profile
            (profiling was off, or the probe has not run yet); the message says which.
    """
    regression = session.get(Regression, regression_id)
    if regression is None:
        raise NotFound(f"regression {regression_id} does not exist")
    bisection_ids = bisections_for_regressions(session, [regression_id]).get(regression_id)
    if not bisection_ids:
        raise NotFound(f"regression {regression_id} was not bisected, so nothing was profiled")
    bisection = session.get(Bisection, bisection_ids[-1])
    assert bisection is not None
    query = select(BisectionProfile).where(BisectionProfile.bisection_id == bisection.id)
    if with_traces:
        query = query.options(
            undefer(BisectionProfile.trace_before), undefer(BisectionProfile.trace_after)
        )
    rows = list(session.scalars(query.order_by(BisectionProfile.id)))
    if not rows:
        raise NotFound(
            f"bisection {bisection.id} of regression {regression_id} has no profile: it is "
            "still running, or profile_regressions was off when it ended"
        )
    name = f"{regression.model}:{regression.mode}:{regression.device}"
    own = next((r for r in rows if r.benchmark == name), None)
    if own is not None:
        return own
    answer = next(
        (a for a in (bisection.result or {}).get("benchmarks") or [] if a.get("benchmark") == name),
        None,
    )
    same = _same_cause(rows, answer)
    if same is None:
        raise NotFound(
            f"regression {regression_id} ({name}) was not profiled by bisection {bisection.id}; "
            f"it profiled {', '.join(r.benchmark for r in rows)}"
        )
    return same


def _same_cause(
    rows: list[BisectionProfile], answer: dict[str, Any] | None
) -> BisectionProfile | None:
    """The row profiling the builds ``answer`` (the regression's benchmark's answer) names."""
    if answer is None:
        return None
    if answer.get("status") == BisectionOutcome.CULPRIT and answer.get("culprit"):
        return next((r for r in rows if r.culprit and r.after == answer["culprit"]), None)
    span = answer.get("range") or []
    if span:
        return next((r for r in rows if not r.culprit and r.after == span[-1]), None)
    return None


def profile_trace(session: Session, regression_id: int, side: TraceSide) -> bytes:
    """One build's Chrome trace of a regression's profile, gzip-compressed JSON.

    Raises:
        NotFound: as :func:`regression_profile`, or no trace was kept (a failed probe, or a
            profile of instruction counts, which has none).
    """
    row = regression_profile(session, regression_id, with_traces=True)
    data = row.trace_before if side == "before" else row.trace_after
    if data is None:
        why = (
            row.reason
            if row.status != ProfileStatus.DONE
            else f"a {row.metric} profile keeps no trace"
        )
        raise NotFound(f"regression {regression_id}'s profile has no {side} trace: {why}")
    return data
