"""What a model's history reads besides its points: identities, builds, samples, verdicts.

The points themselves come from :mod:`service.results.points`; :mod:`service.results.history`
puts these reads together. Each is one query, returning plain values (dicts and arrays).
"""

from __future__ import annotations

from datetime import date
from typing import Any

import numpy as np
from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from service.models import Machine, Regression, Result, Run
from service.results.points import HISTORY_KINDS, fetch

# A stored verdict: (regression id, direction, confirmation, state, result id of the step's
# first night).
StoredVerdict = tuple[int, str, str, str, int]


def result_identities(
    session: Session,
    result_ids: list[int],
) -> tuple[dict[int, tuple[Any, ...]], dict[int, Machine]]:
    """Result id -> (mode, device, compiler, metric, unit, batch size, version, machine id),
    and the machines they name (one query)."""
    if not result_ids:
        return {}, {}
    rows = session.execute(
        select(
            Result.id,
            Result.mode,
            Result.device,
            Result.compiler,
            Result.metric,
            Result.unit,
            Result.batch_size,
            Result.benchmark_version,
            Result.machine_id,
            Machine,
        )
        .outerjoin(Machine, Machine.id == Result.machine_id)
        .where(Result.id.in_(result_ids))
    )
    meta: dict[int, tuple[Any, ...]] = {}
    machines: dict[int, Machine] = {}
    for row in rows:
        meta[row[0]] = tuple(row[1:9])
        if row[9] is not None:
            machines[row[9].id] = row[9]
    return meta, machines


_BUILDS = (
    select(Run.id, Run.torch_version, Run.torch_git_commit)
    .where(
        Run.night >= bindparam("first"),
        Run.night <= bindparam("last"),
        or_(*(Run.kind == kind for kind in HISTORY_KINDS)),
    )
    .order_by(Run.id)
)


def run_builds(
    session: Session, first: date, last: date
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of the period: ids (sorted), torch versions and git commits, as arrays."""
    rows = fetch(session, _BUILDS, {"first": first, "last": last})
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object), np.zeros(0, dtype=object)
    ids, versions, commits = zip(*rows, strict=True)
    return (
        np.array(ids, dtype=np.int64),
        np.array(versions, dtype=object),
        np.array(commits, dtype=object),
    )


def result_samples(session: Session, result_ids: list[int]) -> dict[int, Any]:
    """Result id -> its raw samples."""
    return dict(
        session.execute(select(Result.id, Result.samples).where(Result.id.in_(result_ids))).all()
    )


def stored_regressions(session: Session, keys: list[str]) -> dict[str, dict[int, StoredVerdict]]:
    """series_key -> result_id -> (regression id, direction, confirmation, state, result id of
    the step's first night)."""
    out: dict[str, dict[int, StoredVerdict]] = {}
    if not keys:
        return out
    rows = session.execute(
        select(
            Regression.series_key,
            Regression.result_id,
            Regression.id,
            Regression.direction,
            Regression.confirmation,
            Regression.state,
            func.coalesce(Regression.first_result_id, Regression.result_id),
        ).where(Regression.series_key.in_(keys))
    )
    for key, result_id, reg_id, direction, confirmation, state, first_id in rows:
        out.setdefault(key, {})[result_id] = (reg_id, direction, confirmation, state, first_id)
    return out
