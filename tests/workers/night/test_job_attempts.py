"""A job whose worker keeps dying: counted, capped, and told; an infrastructure error is not a loss."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Job, Result
from service.runs.service import BenchmarkSpec
from workers.night import jobs
from workers.night import plan as nightly

# An interpreter that does not exist: measuring with it raises (OSError) before anything runs.
NO_PYTHON = jobs.SuiteCommand(python="/nonexistent/python3")


def _job_left_running_by(worker: str, losses: int) -> tuple[int, int]:
    """A night of one job that ``losses`` workers started and died on; (run id, job id)."""
    run_id = nightly.create_night(
        night=date(2026, 11, 20), benchmarks=[BenchmarkSpec(model="dcgan", mode="eval")]
    )
    with session_scope() as session:
        job = session.scalars(select(Job).where(Job.run_id == run_id)).one()
        job.status, job.attempts, job.worker = "running", losses, worker
        return run_id, job.id


def test_a_job_that_killed_its_worker_three_times_ends_as_an_error(database_url: str) -> None:
    run_id, job_id = _job_left_running_by("w0@gpu-07", losses=3)
    # Not started again: NO_PYTHON would raise if it were.
    assert jobs.measure_job(job_id, worker="w1@gpu-08", command=NO_PYTHON) == run_id
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job.status == "error" and job.attempts == 3
        assert "its worker died 3 times while running it (last w0@gpu-07)" in job.error
        assert "NIGHTBENCH_JOB_MAX_WORKER_LOSSES=3" in job.error
        result = session.scalars(select(Result).where(Result.run_id == run_id)).one()
        assert result.error == job.error


def test_under_the_cap_a_lost_job_is_measured_again(database_url: str) -> None:
    _, job_id = _job_left_running_by("w0@gpu-07", losses=2)
    with pytest.raises(OSError):
        jobs.measure_job(job_id, worker="w1@gpu-08", command=NO_PYTHON)  # it did start
    with session_scope() as session:
        job = session.get(Job, job_id)
        # The infrastructure error put it back, uncounted: two losses, not three.
        assert (job.status, job.attempts, job.worker) == ("queued", 2, "w1@gpu-08")


def test_the_cap_is_a_setting(configure: Callable[..., None]) -> None:
    configure(job_max_worker_losses=1)
    _, job_id = _job_left_running_by("w0@gpu-07", losses=1)
    jobs.measure_job(job_id, worker="w1@gpu-08", command=NO_PYTHON)
    with session_scope() as session:
        assert "died 1 times" in session.get(Job, job_id).error
