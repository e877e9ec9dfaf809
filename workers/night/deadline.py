"""Deadlines: jobs that never reported are missing, and the night finishes with what it has.

Deadlines are not ETA tasks (an ETA beyond the broker's visibility timeout is redelivered over
and over on Redis): the periodic ``night.sweep_deadlines`` task checks them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from service.config import get_settings
from service.db import session_scope
from service.errors import InfrastructureError
from service.models import JobStatus, Run, RunKind, RunStatus
from service.models.base import utcnow
from service.runs import service as runs
from service.status.broker import queue_lengths
from workers.enqueue import Step, send
from workers.issues import missing, pending
from workers.night.jobs import fail_job
from workers.night.replicate import dispatch_pending

log = logging.getLogger(__name__)


def check_deadline(run_id: int, *, now: datetime | None = None) -> list[Step]:
    """At the run's deadline: jobs that never reported become ``missing`` with an alert, stored
    with its filing pending and filed as an issue (``night.file_missing``, one attempt; the
    filing retry makes the others; not for a replicate run, asked for a comparison); the run
    then finishes with what it has."""
    with session_scope() as session:
        missing = runs.mark_missing(session, run_id=run_id, now=now)
        proceed = bool(missing) and runs.begin_finishing(session, run_id=run_id)
        # More processes asked for a comparison are no night: what they miss is not filed.
        file = bool(missing) and runs.get_run(session, run_id).kind != RunKind.REPLICATE
    if missing:
        log.warning("run %s: %d job(s) missing at the deadline", run_id, len(missing))
    steps = [Step("night.file_missing", (run_id,))] if file else []
    return steps + ([Step("night.finish", (run_id,))] if proceed else [])


def sweep_deadlines(now: datetime | None = None) -> list[int]:
    """Requeue the jobs whose worker fell silent (:func:`requeue_lost`), send again the steps
    whose message was lost (:func:`resend_lost`), check every unfinished
    run whose deadline has passed, make missing-data alerts whose data came pending again
    (:func:`workers.issues.missing.note_arrivals`), detect regressions in runs
    posted through the API once all their results are in, and send ``issues.retry_filing``
    when an alert's filing is due; returns the run ids handled."""
    from sqlalchemy import select

    now = now or utcnow()
    with session_scope() as session:
        due = list(
            session.scalars(
                select(Run.id).where(
                    Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)),
                    Run.deadline_at.is_not(None),
                    Run.deadline_at < now,
                )
            )
        )
        posted = list(
            session.scalars(
                select(Run.id).where(Run.kind == RunKind.INGEST, Run.status == RunStatus.DETECTING)
            )
        )
    steps = requeue_lost(now=now)
    steps += resend_lost(now=now)
    steps += [step for run_id in due for step in check_deadline(run_id, now=now)]
    # Runs whose results were posted to the API, every benchmark in: detection is next.
    steps += [Step("night.finish", (run_id,)) for run_id in posted]
    # More processes asked for over the API (POST /api/runs/{id}/processes): measured now.
    steps += dispatch_pending()
    # Missing data that came since (a re-dispatch, a late post): its filed alert is pending
    # again (due at the clock's now, which the retry task judges by), and the filing retry
    # below tells its issue.
    missing.note_arrivals(today=now.date())
    # Where no beat runs the retry, the sweep (cron, or a deployment's own timer) sends it.
    if pending.any_due(now=now):
        steps.append(Step("issues.retry_filing", ()))
    send(steps)
    return due + posted


def requeue_lost(now: datetime | None = None) -> list[Step]:
    """The ``bench.run`` steps of running jobs whose worker fell silent (a dead host).

    A running job whose heartbeat (:mod:`workers.night.heartbeat`) is older than
    ``job_lost_after_s`` goes back to ``queued`` (its attempt stays counted) and its step is
    returned, so it is measured again within minutes instead of at the broker's visibility
    timeout. A job that has lost its worker ``job_max_worker_losses`` times ends as an error
    result saying so (and the run's next step is returned when that ended it).

    Args:
        now: the sweep's time (default: now, UTC).

    Returns:
        Steps to send: ``bench.run`` per requeued job, ``night.finish`` per run this ended.
    """
    settings = get_settings()
    silent_since = (now or utcnow()) - timedelta(seconds=settings.job_lost_after_s)
    steps: list[Step] = []
    given_up: list[tuple[int, int, str | None]] = []
    with session_scope() as session:
        for job in runs.lost_jobs(session, silent_since=silent_since):
            if job.attempts >= settings.job_max_worker_losses:
                given_up.append((job.id, job.attempts, job.worker))
                continue
            log.warning(
                "job %s (%s): no heartbeat from %s since %s; queued again",
                job.id,
                job.benchmark,
                job.worker,
                runs.last_sign_of_life(job),
            )
            job.status = JobStatus.QUEUED
            steps.append(Step("bench.run", (job.id,), job.queue))
    for job_id, lost, worker in given_up:
        run_id = fail_job(
            job_id,
            reason=(
                f"not measured: its worker fell silent {lost} times while running it (last "
                f"{worker}); a benchmark that kills its worker host is not started again "
                f"(NIGHTBENCH_JOB_MAX_WORKER_LOSSES={settings.job_max_worker_losses})"
            ),
        )
        if run_id is not None:
            steps.append(Step("night.finish", (run_id,)))
    return steps


def resend_lost(now: datetime | None = None) -> list[Step]:
    """The steps whose message the broker lost, to send again.

    A broker down when a run's last job ended, or restarted without persistence, loses what was
    sent or waiting; the database still says what was due:

    * a run ``detecting`` whose ``night.finish`` has been owed for ``step_resend_after_s``
      (:func:`service.runs.service.finish_owed`): ``night.finish`` again (it survives a
      duplicate: each step it takes is a conditional update under the run's lock);
    * queued jobs untouched for ``step_resend_after_s`` whose queue holds no message at all:
      ``bench.run`` again. An empty queue is what tells a lost message from a long queue (a
      message still waiting is never doubled); the next sweep finds the queue holding the new
      one. Without a broker (embedded) or when it cannot be read, no job is re-sent.

    Args:
        now: the sweep's time (default: now, UTC).

    Returns:
        Steps to send.
    """
    settings = get_settings()
    before = (now or utcnow()) - timedelta(seconds=settings.step_resend_after_s)
    steps: list[Step] = []
    with session_scope() as session:
        for run in runs.finish_owed(session, before=before):
            log.warning(
                "run %s: night.finish owed since %s never ran (its message was lost); sent again",
                run.id,
                run.finish_owed_since,
            )
            steps.append(Step("night.finish", (run.id,)))
        idle = [(j.id, j.queue, j.benchmark) for j in runs.idle_queued_jobs(session, before=before)]
    if not idle:
        return steps
    try:
        lengths = queue_lengths(settings.broker_url, prefix=settings.queue_prefix)
    except InfrastructureError as exc:
        log.warning("queued jobs not checked for lost messages: %s", exc.message)
        return steps
    for job_id, queue, benchmark in idle:
        if lengths is not None and lengths.get(queue) == 0:
            log.warning(
                "job %s (%s): queued, its queue %s empty; sent again", job_id, benchmark, queue
            )
            steps.append(Step("bench.run", (job_id,), queue))
    return steps
