"""Nothing lost, nothing stored twice: two real workers, one killed with SIGKILL mid-task."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import func, select

from service.db import session_scope
from service.models import Alert, Job, Result, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import WorkerPool, wait_until
from workers import nightly


def _jobs(run_id: int) -> list[Job]:
    with session_scope() as session:
        return list(session.scalars(select(Job).where(Job.run_id == run_id).order_by(Job.id)))


def test_sigkilled_worker_task_is_redelivered(
    celery_workers: WorkerPool, tmp_path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("NIGHTBENCH_SUITE_MIN_SECONDS", "4")  # long enough to be killed mid-way
    w0 = celery_workers.start("cpu", log_dir=tmp_path, name="w0")
    celery_workers.start("cpu", log_dir=tmp_path, name="w1")
    specs = [BenchmarkSpec(model=m, mode=mode) for m in ("resnet18", "dqn") for mode in ("eval", "train")]
    run_id = nightly.create_night(night=date(2026, 11, 7), benchmarks=specs)
    nightly.enqueue_jobs(run_id)

    def w0_busy() -> bool:
        return any(j.status == "running" and (j.worker or "").startswith("w0@") for j in _jobs(run_id))

    wait_until(w0_busy, timeout=120, interval=0.2, what="a job running on w0")
    victim = next(j for j in _jobs(run_id) if j.status == "running" and j.worker.startswith("w0@"))
    celery_workers.kill(w0)

    def run_done() -> bool:
        with session_scope() as session:
            return session.scalar(select(Run.status).where(Run.id == run_id)) == "complete"

    wait_until(run_done, timeout=300, interval=1, what="the night to complete after the kill")
    jobs = {j.id: j for j in _jobs(run_id)}
    assert {j.status for j in jobs.values()} == {"done"}
    assert jobs[victim.id].attempts >= 2, "the killed task was not redelivered"
    assert jobs[victim.id].worker.startswith("w1@")
    with session_scope() as session:
        counts = session.execute(
            select(Result.job_id, Result.metric, func.count()).where(Result.run_id == run_id)
            .group_by(Result.job_id, Result.metric)
        ).all()
    assert {job_id for job_id, *_ in counts} == set(jobs)
    assert all(n == 1 for *_, n in counts), f"a result was stored twice: {counts}"


def test_missing_report_past_deadline_raises_missing_data_alert(database_url: str) -> None:
    specs = [BenchmarkSpec(model="resnet18", mode="eval"), BenchmarkSpec(model="resnet18", mode="train")]
    run_id = nightly.create_night(night=date(2026, 11, 8), benchmarks=specs)
    jobs = _jobs(run_id)
    # Only the first job reports (measured for real); the second never does.
    nightly.send_job(jobs[0].id, jobs[0].queue)
    assert nightly.sweep_deadlines() == []  # before the deadline: nothing happens
    later = datetime.now(UTC) + timedelta(days=1)
    assert nightly.sweep_deadlines(now=later) == [run_id]
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "incomplete"
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id, Alert.kind == "missing_data"))
        assert alert is not None and "resnet18:train:cpu" in alert.summary
        statuses = {j.benchmark: j.status for j in session.scalars(select(Job).where(Job.run_id == run_id))}
    assert statuses == {"resnet18:eval:cpu": "done", "resnet18:train:cpu": "missing"}
    # A late report after the deadline does not reopen the run or store a second result set.
    nightly.send_job(jobs[1].id, jobs[1].queue)
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Result).where(
            Result.job_id == jobs[1].id)) == 0
