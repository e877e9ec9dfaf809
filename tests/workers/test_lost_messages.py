"""Steps whose message the broker lost are sent again by the deadline sweep (issue 40, findings
2 and 3): a run whose last job ended while the broker was down (``night.finish`` never sent) is
finished, and named by the status while it waits; a queued job whose message is gone (a broker
restarted without persistence) is sent again, once, while its queue is empty. Real Postgres,
real Redis."""

from __future__ import annotations

import os
from datetime import date, timedelta

import redis
from sqlalchemy import select

from service.db import session_scope
from service.models import Job, Run
from service.models.base import utcnow
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from service.status.service import system_status
from workers.enqueue import Step
from workers.night import deadline
from workers.night.plan import create_night

SPECS = [BenchmarkSpec(model="resnet18", mode="eval")]


def _last_job_ended_but_nothing_sent(run_id: int) -> None:
    """What a worker did before its ``send([night.finish])`` met a dead broker."""
    with session_scope() as session:
        for job in runs.list_jobs(session, run_id=run_id):
            runs.start_job(session, job=job, worker="w@host")
            runs.end_job(session, job=job, error="it crashed")
        assert runs.begin_finishing(session, run_id=run_id)


def test_a_run_whose_finish_was_lost_is_finished_by_the_sweep(database_url: str) -> None:
    run_id = create_night(night=date(2026, 11, 14), benchmarks=SPECS)
    _last_job_ended_but_nothing_sent(run_id)
    now = utcnow()
    assert deadline.resend_lost(now=now + timedelta(minutes=5)) == []  # may still be on its way
    later = now + timedelta(minutes=11)
    assert deadline.resend_lost(now=later) == [Step("night.finish", (run_id,))]
    with session_scope() as session:
        [line] = [p for p in system_status(session, now=later).problems if "night.finish" in p]
    assert line.startswith(f"run {run_id} (nightly, night 2026-11-14)") and "11 min ago" in line

    deadline.sweep_deadlines(now=later)  # embedded: the steps run here

    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert (run.status, run.finish_owed_since) == ("complete", None)
        assert not [p for p in system_status(session, now=later).problems if "night.finish" in p]
    assert deadline.resend_lost(now=later + timedelta(hours=1)) == []


def test_a_queued_job_whose_message_was_lost_is_sent_again_once(broker_url: str) -> None:
    prefix = os.environ["NIGHTBENCH_QUEUE_PREFIX"]
    broker = redis.Redis.from_url(broker_url)
    run_id = create_night(night=date(2026, 11, 14), benchmarks=SPECS)  # its message: never sent
    with session_scope() as session:
        [job] = session.scalars(select(Job).where(Job.run_id == run_id))
        job_id, queue = job.id, job.queue
    later = utcnow() + timedelta(minutes=11)
    assert deadline.resend_lost(now=utcnow()) == []  # not idle long enough yet
    steps = deadline.resend_lost(now=later)
    assert steps == [Step("bench.run", (job_id,), queue)]

    def lost_lines() -> list[str]:
        with session_scope() as session:
            state = system_status(session, now=later, broker_url=broker_url, queue_prefix=prefix)
        return [p for p in state.problems if "holds no message" in p]

    [line] = lost_lines()  # the status names them while they wait
    assert line.startswith(f"run {run_id}: 1 job(s) queued on `{queue}` for over 10 min"), line
    # Once a message waits in its queue again, nothing more is sent for it.
    from workers.app import app

    app.send_task("bench.run", args=[job_id], queue=queue)
    assert broker.llen(f"{prefix}{queue}") == 1
    assert deadline.resend_lost(now=later) == []
    assert lost_lines() == []
