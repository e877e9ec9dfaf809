"""More processes of a night, measured on its build, for a comparison by process.

Real Postgres, real ``python -m suite`` subprocesses measuring a small model; the embedded
path runs the jobs in this process, the distributed one through a real worker and Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date

from sqlalchemy import func, select
from typer.testing import CliRunner

from service.db import session_scope
from service.models import Job, Regression, Result, Run
from service.runs.compare import smallest_p_value
from service.runs.processes import request_processes
from service.runs.service import BenchmarkSpec
from tests.conftest import ROOT, WorkerPool, wait_until
from workers.cli import app
from workers.night import plan as nightly
from workers.night.deadline import sweep_deadlines

MODEL = "dqn"  # small: a process measures it in about a second
SPECS = [BenchmarkSpec(model=MODEL, mode="eval")]


def _night(day: int) -> int:
    run_id = nightly.create_night(night=date(2026, 11, day), benchmarks=SPECS)
    for job_id, queue, _ in nightly.queued_jobs(run_id):
        nightly.send_job(job_id, queue)
    return run_id


def _children(run_id: int) -> list[tuple[str, str, int]]:
    """``(kind, status, results without an error)`` of the run's child runs, in id order."""
    with session_scope() as session:
        children = session.scalars(select(Run).where(Run.parent_run_id == run_id).order_by(Run.id))
        return [
            (
                c.kind,
                c.status,
                session.scalar(
                    select(func.count(func.distinct(Result.model))).where(
                        Result.run_id == c.id, Result.error.is_(None)
                    )
                )
                or 0,
            )
            for c in children
        ]


def _compare(*args: str) -> dict:  # type: ignore[type-arg]
    out = CliRunner().invoke(app, ["runs", "compare", *args, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output[out.output.index("{") :])


def test_identical_builds_need_processes_and_get_them_when_asked(database_url: str) -> None:
    a, b = _night(1), _night(2)
    # One process a side: never a regression, an honest "not enough processes".
    alone = _compare(str(a), str(b))
    rows = {c["metric"]: c for c in alone["comparisons"]}
    assert {"latency", "cpu_peak_mem"} <= set(rows)
    for c in rows.values():
        assert (c["a_processes"], c["b_processes"]) == (1, 1)
        assert c["verdict"] == "not enough processes" and c["p_value"] is None
    # Asked for 4 a side: 3 more processes of each night, measured on its build, then compared.
    asked = _compare(str(a), str(b), "--processes", "4", "--alpha", "0.05")
    assert [(r["run_id"], r["jobs"], len(r["runs"])) for r in asked["requests"]] == [
        (a, 3, 3),
        (b, 3, 3),
    ]
    for parent in (a, b):
        assert _children(parent) == [("replicate", "complete", 1)] * 3
    floor = smallest_p_value(4, 4)
    assert floor < 0.05
    for c in asked["comparisons"]:
        assert (c["a_processes"], c["b_processes"]) == (4, 4), c
        assert c["verdict"] != "not enough processes" and c["p_value"] >= floor - 1e-12
    # The replicate runs are no night: nothing was detected in them, nothing confirmed.
    with session_scope() as session:
        kinds = set(session.scalars(select(Run.kind)))
        judged = set(
            session.scalars(select(Run.kind).join(Regression, Regression.run_id == Run.id))
        )
    assert kinds == {"nightly", "replicate"} and "replicate" not in judged
    # Asking again for what is already there measures nothing.
    again = _compare(str(a), str(b), "--processes", "4", "--alpha", "0.05")
    assert [r["jobs"] for r in again["requests"]] == [0, 0]
    assert len(_children(a)) == 3


def test_bad_requests_fail_clearly_and_store_nothing(database_url: str) -> None:
    a = _night(3)
    runner = CliRunner()
    for args, words in (
        ([str(a), "2147483000", "--processes", "3"], "run 2147483000 does not exist"),
        ([str(a), str(a), "--processes", "1"], "greater than or equal to 2"),
        ([str(a), str(a), "--alpha", "1.5"], "--alpha must be between 0 and 1"),
    ):
        out = runner.invoke(app, ["runs", "compare", *args])
        assert out.exit_code == 2 and words in " ".join(out.output.split()), out.output
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1
    failed = nightly.create_night(
        night=date(2026, 11, 4), benchmarks=[BenchmarkSpec(model="no_such_model", mode="eval")]
    )
    for job_id, queue, _ in nightly.queued_jobs(failed):
        nightly.send_job(job_id, queue)
    out = runner.invoke(app, ["runs", "compare", str(a), str(failed), "--processes", "3"])
    assert out.exit_code == 2 and "no result without an error" in out.output, out.output
    # Both runs are checked before either is asked: the good one got nothing either.
    assert _children(a) == [] and _children(failed) == []


def test_processes_asked_over_the_api_are_sent_by_the_sweep_to_a_worker(
    celery_workers: WorkerPool,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    run_id = nightly.create_night(night=date(2026, 11, 5), benchmarks=SPECS)
    nightly.enqueue_jobs(run_id)
    wait_until(
        lambda: _children(run_id) == [] and _status(run_id) == "complete",
        timeout=240,
        what=f"run {run_id} complete",
    )
    with session_scope() as session:  # what POST /api/runs/{id}/processes does
        asked = request_processes(session, run_id=run_id, processes=3)
    assert asked.jobs == 2 and _children(run_id) == [("replicate", "queued", 0)] * 2
    sweep_deadlines()
    wait_until(
        lambda: _children(run_id) == [("replicate", "complete", 1)] * 2,
        timeout=240,
        what="replicate runs measured by the worker",
    )
    with session_scope() as session:
        workers = set(
            session.scalars(
                select(Job.worker)
                .join(Run, Run.id == Job.run_id)
                .where(Run.parent_run_id == run_id)
            )
        )
    assert workers and all(w.startswith("w0@") for w in workers)
    # The command line, with a broker, sends what it asks for and waits for the workers.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "runs",
            "compare",
            str(run_id),
            str(run_id),
            "--processes",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "4|4" in proc.stdout and "workers measuring" in proc.stdout
    assert _children(run_id) == [("replicate", "complete", 1)] * 3


def _status(run_id: int) -> str | None:
    with session_scope() as session:
        return session.scalar(select(Run.status).where(Run.id == run_id))


def test_a_replicate_run_past_its_deadline_finishes_without_a_missing_data_issue(
    database_url: str,
) -> None:
    from datetime import timedelta

    from service.models.base import utcnow
    from workers.night.deadline import check_deadline

    run_id = _night(6)
    with session_scope() as session:
        asked = request_processes(session, run_id=run_id, processes=2, deadline_s=1)
    [child] = asked.runs
    steps = check_deadline(child, now=utcnow() + timedelta(seconds=5))
    assert [s.task for s in steps] == ["night.finish"]  # no night.file_missing
    with session_scope() as session:
        jobs = session.scalars(select(Job.status).where(Job.run_id == child)).all()
    assert jobs == ["missing"]
