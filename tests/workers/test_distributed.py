"""A small night through a real Celery worker process on the local Redis, stored in Postgres."""

from __future__ import annotations

import subprocess
import sys
from datetime import date

from sqlalchemy import func, select

from service.db import session_scope
from service.models import Job, Result, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import ROOT, WorkerPool, wait_until
from workers import nightly


def _run_status(run_id: int) -> str | None:
    with session_scope() as session:
        return session.scalar(select(Run.status).where(Run.id == run_id))


def test_night_through_a_worker_process(celery_workers: WorkerPool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    celery_workers.start("cpu", log_dir=tmp_path)
    specs = [BenchmarkSpec(model="resnet18", mode="eval"), BenchmarkSpec(model="resnet18", mode="train")]
    run_id = nightly.create_night(night=date(2026, 11, 5), benchmarks=specs)
    nightly.enqueue_jobs(run_id)
    wait_until(lambda: _run_status(run_id) == "complete", timeout=240, what=f"run {run_id} complete")
    with session_scope() as session:
        jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
        assert {j.status for j in jobs} == {"done"}
        assert all(j.worker and j.worker.startswith("w0@") for j in jobs)
        per_metric = session.execute(
            select(Result.model, Result.mode, Result.metric, func.count())
            .where(Result.run_id == run_id).group_by(Result.model, Result.mode, Result.metric)
        ).all()
        assert per_metric and all(count == 1 for *_, count in per_metric)
        assert {(m, mode) for m, mode, *_ in per_metric} == {("resnet18", "eval"), ("resnet18", "train")}
        run = session.get(Run, run_id)
        assert run is not None and run.finished_at is not None
        # Detection ran after the last job ended.
        assert run.finished_at >= max(j.finished_at for j in jobs if j.finished_at)


def test_nightly_cli_dispatches_to_workers(celery_workers: WorkerPool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    celery_workers.start("cpu", log_dir=tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "nightly", "--models", "resnet18", "--modes", "eval",
         "--date", "2026-11-06"], cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "complete" in proc.stdout
    with session_scope() as session:
        run = session.scalar(select(Run).where(Run.night == date(2026, 11, 6)))
        assert run is not None and run.status == "complete"
        worker = session.scalar(select(Job.worker).where(Job.run_id == run.id))
        assert worker and worker.startswith("w0@")
