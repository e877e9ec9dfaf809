"""A small night through a real Celery worker process on the local Redis, stored in Postgres."""

from __future__ import annotations

import subprocess
import sys
from datetime import date

import pytest
from sqlalchemy import func, select

from service.db import session_scope
from service.models import Job, Result, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import ROOT, WorkerPool, wait_until
from workers.night import plan as nightly


def _run_status(run_id: int) -> str | None:
    with session_scope() as session:
        return session.scalar(select(Run.status).where(Run.id == run_id))


def test_night_through_a_worker_process(celery_workers: WorkerPool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    celery_workers.start("cpu", log_dir=tmp_path)
    specs = [
        BenchmarkSpec(model="resnet18", mode="eval"),
        BenchmarkSpec(model="resnet18", mode="train"),
    ]
    run_id = nightly.create_night(night=date(2026, 11, 5), benchmarks=specs)
    nightly.enqueue_jobs(run_id)
    wait_until(
        lambda: _run_status(run_id) == "complete", timeout=240, what=f"run {run_id} complete"
    )
    with session_scope() as session:
        jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
        assert {j.status for j in jobs} == {"done"}
        assert all(j.worker and j.worker.startswith("w0@") for j in jobs)
        per_metric = session.execute(
            select(Result.model, Result.mode, Result.metric, func.count())
            .where(Result.run_id == run_id)
            .group_by(Result.model, Result.mode, Result.metric)
        ).all()
        assert per_metric and all(count == 1 for *_, count in per_metric)
        assert {(m, mode) for m, mode, *_ in per_metric} == {
            ("resnet18", "eval"),
            ("resnet18", "train"),
        }
        run = session.get(Run, run_id)
        assert run is not None and run.finished_at is not None
        # Detection ran after the last job ended.
        assert run.finished_at >= max(j.finished_at for j in jobs if j.finished_at)


def test_nightly_cli_dispatches_to_workers(celery_workers: WorkerPool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    celery_workers.start("cpu", log_dir=tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "nightly",
            "--models",
            "resnet18",
            "--modes",
            "eval",
            "--date",
            "2026-11-06",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "complete" in proc.stdout
    with session_scope() as session:
        run = session.scalar(select(Run).where(Run.night == date(2026, 11, 6)))
        assert run is not None and run.status == "complete"
        worker = session.scalar(select(Job.worker).where(Job.run_id == run.id))
        assert worker and worker.startswith("w0@")


@pytest.mark.measured
def test_a_regressed_night_through_real_workers_to_its_filed_issue(
    celery_workers: WorkerPool,
    tmp_path,
    configure,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """The whole chain on worker processes: measure, detect, confirm by a re-run, file.

    Four quiet nights make the baseline; then the worker is restarted with the harness's
    injected work quadrupling resnet18 eval's step (real extra matmuls, measured for real), and
    the fifth night's candidate must come back from its confirmation re-run (a second run on
    the workers) and end as one issue in the outbox, with no eager mode anywhere. Four nights
    are a young baseline: one quiet night of a busy host's came out at +50% (30.6, 31.7, 47.8,
    32.1 ms), and a doubling measured at +126% and +148% was then not told from that noise.
    """
    from service.models import Alert, Regression

    configure(outbox_dir=tmp_path / "outbox")
    quiet = celery_workers.start("cpu", log_dir=tmp_path, name="w0")
    spec = [BenchmarkSpec(model="resnet18", mode="eval")]
    for day in range(1, 5):
        run_id = nightly.create_night(night=date(2026, 11, day), benchmarks=spec)
        nightly.enqueue_jobs(run_id)
        wait_until(
            lambda r=run_id: _run_status(r) == "complete", timeout=180, what=f"quiet night {day}"
        )
    celery_workers.kill(quiet)
    monkeypatch.setenv("NIGHTBENCH_SUITE_INJECT_WORK", "resnet18:eval=3.0")
    celery_workers.start("cpu", log_dir=tmp_path, name="w1")
    run_id = nightly.create_night(night=date(2026, 11, 5), benchmarks=spec)
    nightly.enqueue_jobs(run_id)

    def filed() -> bool:
        with session_scope() as session:
            return (
                session.scalar(
                    select(Alert.status).where(Alert.run_id == run_id, Alert.kind == "regression")
                )
                == "filed"
            )

    wait_until(filed, timeout=300, interval=1, what="the regression to be filed")
    with session_scope() as session:
        latency = session.scalar(
            select(Regression).where(Regression.run_id == run_id, Regression.metric == "latency")
        )
        assert latency is not None and latency.confirmation == "reproduced", latency
        assert latency.change is not None and latency.change > 0.3
        confirm = session.scalar(select(Run).where(Run.parent_run_id == run_id))
        assert confirm is not None and confirm.status == "complete"
        workers = set(
            session.scalars(select(Job.worker).where(Job.run_id.in_((run_id, confirm.id))))
        )
        assert workers and all(w.startswith("w1@") for w in workers)
    [issue] = (tmp_path / "outbox").glob("issue-*.md")
    assert "resnet18 eval cpu latency" in issue.read_text()
