"""API fixtures: the app on the rolled-back test session, a client, a token, seeded nights."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.auth import create_token
from service.main import create_app
from service.models import Regression, Result, Run
from service.results.service import store_record
from service.runs.service import BenchmarkSpec, create_run, end_job, finish_run, list_jobs
from suite.registry import model_domain

ROOT_DIR = Path(__file__).resolve().parents[2]
CPU_ENV = {
    "cpu_model": "Test CPU 3000",
    "threads": 1,
    "cpu_count": 2,
    "device_class": "cpu",
    "hostname": "bench-1",
}


@pytest.fixture
def db(session: Session) -> Session:
    return session


@pytest.fixture
def app(db: Session) -> FastAPI:
    conn = db.connection()
    return create_app(
        session_factory=lambda: Session(
            bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
    )


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def token(db: Session) -> str:
    _, plain = create_token(db, name="test-runner")
    db.flush()
    return plain


@pytest.fixture
def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_record(
    model: str,
    mode: str,
    metrics: dict[str, list[float]],
    *,
    device: str = "cpu",
    compiler: str = "eager",
    env: dict[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """A suite record with the given raw samples per metric."""
    units = {"latency": "ms"}
    return {
        "model": model,
        "mode": mode,
        "device": device,
        "compiler": compiler,
        "batch_size": 4,
        "benchmark_version": "v1",
        # As the harness writes it: the suite's own models carry their domain.
        "environment": {**CPU_ENV, "model_domain": model_domain(model), **(env or {})},
        "metrics": []
        if error
        else [
            {
                "metric": m,
                "unit": units.get(m, "bytes"),
                "samples": s,
                "median": float(np.median(s)),
                "iqr": float(np.subtract(*np.percentile(s, [75, 25]))),
            }
            for m, s in metrics.items()
        ],
        "error": error,
    }


def add_night(
    session: Session,
    night: date,
    records: list[dict[str, Any]],
    *,
    torch_version: str = "2.13.0",
    commit: str = "a" * 40,
    kind: str = "nightly",
) -> Run:
    """A finished run of ``night`` holding ``records``, stored the way workers store them."""
    specs = [
        BenchmarkSpec(model=r["model"], mode=r["mode"], device=r["device"], compiler=r["compiler"])
        for r in records
    ]
    run = create_run(session, night=night, benchmarks=specs, kind=kind)
    run.torch_version, run.torch_git_commit = torch_version, commit
    jobs = {j.benchmark: j for j in list_jobs(session, run_id=run.id)}
    for r, spec in zip(records, specs, strict=True):
        store_record(session, run=run, job=jobs[spec.name], record=r)
        end_job(session, job=jobs[spec.name], error=r.get("error"))
    finish_run(session, run=run)
    session.flush()
    return run


def latency_series(
    n: int,
    *,
    level: float = 10.0,
    step_at: int | None = None,
    step: float = 1.2,
    seed: int = 0,
    samples: int = 9,
) -> list[list[float]]:
    """``n`` nights of latency samples (ms), optionally stepping up by ``step`` at ``step_at``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        mean = level * (step if step_at is not None and i >= step_at else 1.0)
        out.append([float(x) for x in rng.normal(mean, mean * 0.01, samples)])
    return out


def flag(
    session: Session,
    result: Result,
    *,
    direction: str = "regression",
    confirmation: str = "reproduced",
    state: str = "untriaged",
    baseline: float = 10.0,
    alert_id: int | None = None,
) -> Regression:
    """Store a regression row for ``result`` as the detector would."""
    value = float(result.median or 0)
    reg = Regression(
        run_id=result.run_id,
        result_id=result.id,
        series_key=result.series_key,
        model=result.model,
        mode=result.mode,
        device=result.device,
        compiler=result.compiler,
        metric=result.metric,
        unit=result.unit,
        direction=direction,
        baseline=baseline,
        value=value,
        change=value / baseline - 1,
        p_value=0.001,
        threshold=0.07,
        alertable=direction == "regression",
        confirmation=confirmation,
        state=state,
        reason="seeded",
        alert_id=alert_id,
    )
    session.add(reg)
    session.flush()
    return reg


START = date(2026, 1, 1)


def night(i: int) -> date:
    return START + timedelta(days=i)


def rows(points: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A series' column lists (``points``) as one dict per night."""
    return [dict(zip(points, values, strict=True)) for values in zip(*points.values(), strict=True)]
