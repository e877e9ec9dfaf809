"""Stored nights of one latency series (dqn eval on a test CPU), shared by the detection tests."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

from sqlalchemy.orm import Session

from service.db import session_scope
from service.models import Run
from service.results.service import store_record
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from workers.night import deadline

ENV = {
    "cpu_model": "test-cpu",
    "threads": 1,
    "torch_version": "2.13.0+cpu",
    "torch_git_version": "f" * 40,
}
SPEC = BenchmarkSpec(model="dqn", mode="eval")


def store_latency(
    session: Session,
    run: Run,
    level_ms: float,
    rng: random.Random,
    commit: str | None = None,
    spec: BenchmarkSpec = SPEC,
    environment: dict[str, Any] | None = None,
) -> None:
    """Store 20 latency samples around ``level_ms`` (1% noise) as the result of ``run``'s job of
    ``spec``, measured on torch commit ``commit`` (default ``ENV``'s), in ``environment``
    (default ``ENV``)."""
    job = next(j for j in runs.list_jobs(session, run_id=run.id) if j.model == spec.model)
    samples = [level_ms * (1 + rng.gauss(0, 0.01)) for _ in range(20)]
    env = environment if environment is not None else ENV
    env = {**env, "torch_git_version": commit} if commit else env
    store_record(
        session,
        run=run,
        job=job,
        record={
            "model": spec.model,
            "mode": spec.mode,
            "device": "cpu",
            "benchmark_version": "v1",
            "environment": env,
            "metrics": [
                {
                    "metric": "latency",
                    "unit": "ms",
                    "samples": samples,
                    "median": sorted(samples)[10],
                    "iqr": 0.1,
                }
            ],
        },
    )
    runs.end_job(session, job=job, error=None)


def posted_night(
    night: date,
    level_ms: float | None,
    rng: random.Random,
    error: str | None = None,
    commit: str | None = None,
    spec: BenchmarkSpec = SPEC,
) -> int:
    """A night of results posted through the API (an ingest run) for ``spec`` on torch commit
    ``commit`` (default ``ENV``'s), then the deadline sweep that detects, triages and files
    it; returns the run's id. With ``error``, the benchmark failed that night (no samples)."""
    with session_scope() as session:
        run = runs.create_run(session, night=night, kind="ingest", benchmarks=[spec])
        if error is None:
            assert level_ms is not None
            store_latency(session, run, level_ms, rng, commit, spec)
        else:
            job = runs.list_jobs(session, run_id=run.id)[0]
            env = {**ENV, "torch_git_version": commit} if commit else ENV
            store_record(
                session,
                run=run,
                job=job,
                record={
                    "model": spec.model,
                    "mode": spec.mode,
                    "device": "cpu",
                    "benchmark_version": "v1",
                    "environment": env,
                    "metrics": [],
                    "error": error,
                },
            )
            runs.end_job(session, job=job, error=error)
        run.status = "detecting"  # what the ingest endpoint does once every benchmark is in
        run_id = run.id
    assert deadline.sweep_deadlines() == [run_id]
    return run_id
