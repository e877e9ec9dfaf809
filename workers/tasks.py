"""Celery tasks: thin, named, take ids, and survive being run twice.

Each body calls one domain function (one session scope) and sends the steps it returns
(:mod:`workers.enqueue`): a night is the chain ``bench.run`` → ``night.finish`` → (the
confirmation run's ``bench.run`` → ``night.finish``) → ``night.triage`` → ``bisect.advance`` /
``bisect.probe`` → ``bisect.profile`` → ``night.file``. No domain module imports this one.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.errors import InfrastructureError
from workers.ab import flow as ab_flow
from workers.ab import reporting as ab_reporting
from workers.app import app
from workers.bisect import celery_driver as bisecting
from workers.bisect import profile_probe
from workers.enqueue import Step, send
from workers.issues import failing_bisect, pending
from workers.issues import sync as issue_sync
from workers.night import deadline, finish, plan, triage
from workers.night import jobs as benchmarking

RETRYABLE = (OperationalError, PoolTimeout, BrokerError, InfrastructureError, ConnectionError)


class RetriedTask(Task):  # type: ignore[misc]
    """The retry policy of every task, written once.

    Acknowledged after it ran (a worker lost mid-task: the broker redelivers it, and the task
    survives running twice); retried on a database, broker or tracker outage (``RETRYABLE``)
    for at least the outage the deployment plans for (15 min, docs/deployment.md), never dropped
    within seconds: countdowns of 5, 10, 20, 40, 80 s, then 120 s each, 12 retries over 995 s.
    No jitter, so the sum is what it says (5 jittered retries gave up within 37 s of Postgres
    going down, docs/reliability.md). A task states only where it differs (fewer retries for a
    periodic one: beat sends it again).
    """

    acks_late = True
    autoretry_for = RETRYABLE
    retry_backoff = 5
    retry_backoff_max = 120
    retry_jitter = False
    max_retries = 12


class BenchmarkTask(RetriedTask):
    """A benchmark task that failed for good still ends its job, so the night can finish."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """End the job as failed and send ``night.finish`` if it was the run's last."""
        job_id = args[0] if args else kwargs.get("job_id")
        run_id = benchmarking.fail_job(job_id, reason=f"task failed: {type(exc).__name__}: {exc}")
        if run_id is not None:
            send([Step("night.finish", (run_id,))])


@app.task(name="bench.run", base=BenchmarkTask, bind=True)
def run_benchmark(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    """Measure one job; the job that ends its run enqueues ``night.finish``."""
    worker = self.request.hostname or f"in-process@{socket.gethostname()}"
    try:
        run_id = benchmarking.measure_job(job_id, worker=worker)
    except SoftTimeLimitExceeded:
        run_id = benchmarking.fail_job(
            job_id,
            reason=f"exceeded the task's soft time limit ({self.soft_time_limit or app.conf.task_soft_time_limit} s)",
        )
    if run_id is not None:
        send([Step("night.finish", (run_id,))])


@app.task(name="night.finish", base=RetriedTask)
def finish_run(run_id: int) -> None:
    """Detect / confirm once every job of the run has ended; then confirm jobs or triage."""
    send(finish.finish(run_id))
    finish.sent(run_id)


@app.task(name="night.triage", base=RetriedTask)
def triage_run(run_id: int) -> None:
    """Resolve the commit range and start the bisection of the run's confirmed regressions."""
    send(triage.triage(run_id))


@app.task(name="night.file", base=RetriedTask)
def file_run(run_id: int) -> None:
    """File the run's confirmed regressions (with the bisection's outcome) and close the run."""
    triage.file_night(run_id)


@app.task(name="night.check_deadline", base=RetriedTask)
def check_deadline(run_id: int) -> None:
    """Mark jobs that never reported as missing and raise a missing-data alert."""
    send(deadline.check_deadline(run_id))


@app.task(name="night.file_missing", base=RetriedTask)
def file_missing(run_id: int) -> None:
    """File the run's missing-data issue (one per machine class; a repeat finds it): one attempt
    of the durable filing, which keeps it pending for the retry when the tracker fails."""
    pending.file_missing_data(run_id)


@app.task(name="night.sweep_deadlines", base=RetriedTask, max_retries=3)
def sweep_deadlines() -> None:
    """Periodic (beat): check every unfinished run past its deadline."""
    deadline.sweep_deadlines()


@app.task(name="issues.sync", base=RetriedTask, max_retries=3)
def sync_issues() -> None:
    """Periodic (beat): read filed issues' state and labels back into triage states."""
    issue_sync.sync_from_tracker()


@app.task(name="issues.retry_filing", base=RetriedTask, max_retries=3)
def retry_filing() -> None:
    """Periodic (beat, and the deadline sweep): file every alert whose filing is pending and due,
    and report every A/B whose report GitHub refused and is due again."""
    pending.retry_pending()
    ab_reporting.retry_due()


@app.task(name="issues.bisect_failing", base=RetriedTask)
def bisect_failing(alert_id: int) -> None:
    """Start the bisection of each benchmark a ``failing`` alert reports newly failing."""
    send(failing_bisect.bisect_failing(alert_id))


@app.task(name="issues.tell_bisected", base=RetriedTask)
def tell_bisected(bisection_id: int) -> None:
    """A failure bisection ended: file its answer on the failing benchmark's issue."""
    send(failing_bisect.tell_bisected(bisection_id))


class ProbeTask(RetriedTask):
    """A probe task that failed for good ends its probe as skipped, so the bisection goes on."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """End the probe as skipped and send ``bisect.advance`` if it ended its round."""
        probe_id = args[0] if args else kwargs.get("probe_id")
        reason = f"probe task failed: {type(exc).__name__}: {exc}"
        ended = bisecting.fail_probe(probe_id, reason=reason)
        if ended is not None:
            send([bisecting.advance_step(ended)])


@app.task(name="bisect.probe", base=ProbeTask, bind=True)
def bisect_probe(self, probe_id: int) -> None:  # type: ignore[no-untyped-def]
    """Build and measure one commit of a bisection; the probe ending its round advances it."""
    worker = self.request.hostname or f"in-process@{socket.gethostname()}"
    bisection_id = bisecting.measure_probe(probe_id, worker=worker)
    if bisection_id is not None:
        send([bisecting.advance_step(bisection_id)])


class ProfileTask(RetriedTask):
    """A profile probe that failed for good stores why, and the night is filed all the same."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Store the failure as each unanswered benchmark's reason; send ``night.file``."""
        bisection_id = args[0] if args else kwargs.get("bisection_id")
        reason = f"profile task failed: {type(exc).__name__}: {exc}"
        send(profile_probe.give_up(bisection_id, reason=reason))


@app.task(name="bisect.profile", base=ProfileTask)
def profile_bisection(bisection_id: int) -> None:
    """Profile a finished bisection's builds either side of its answer, then file the night."""
    send(profile_probe.profile_bisection(bisection_id))


@app.task(name="bisect.advance", base=RetriedTask)
def advance_bisection(bisection_id: int) -> None:
    """Plan a bisection's next round from its rows, or store its outcome and file the night."""
    send(bisecting.step(bisection_id))


@app.task(name="night.dispatch", base=RetriedTask, acks_late=False, max_retries=3)
def dispatch_night() -> None:
    """Periodic (beat, when ``NIGHTBENCH_SCHEDULE_CRON`` is set): dispatch tonight's runs.

    ``acks_late=False``: a redelivered dispatch would create a second night.
    """
    plan.dispatch_scheduled()


class ABTask(RetriedTask):
    """An A/B whose run task failed for good stores why, and it is reported all the same."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Store the failure as the A/B's error; send ``ab.report``."""
        ab_id = args[0] if args else kwargs.get("ab_id")
        if isinstance(exc, SoftTimeLimitExceeded):
            limit = self.soft_time_limit or app.conf.task_soft_time_limit
            reason = (
                f"the A/B did not finish within the task's soft time limit ({limit} s): ask for "
                "fewer benchmarks (--models), or raise NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S (with "
                "_TASK_TIME_LIMIT_S and _VISIBILITY_TIMEOUT_S) on the workers"
            )
        else:
            reason = f"the A/B task failed: {type(exc).__name__}: {exc}"
        send(ab_flow.give_up(ab_id, reason=reason))


@app.task(name="ab.run", base=ABTask)
def run_ab(ab_id: int) -> None:
    """Build a pull request's merge base and head, measure them interleaved, judge, store."""
    send(ab_flow.measure(ab_id))


@app.task(name="ab.report", base=RetriedTask)
def report_ab(ab_id: int) -> None:
    """Report an A/B on its pull request: the comment edited in place, the commit status (a
    refusal is kept and retried by ``issues.retry_filing``)."""
    ab_reporting.report_ab(ab_id)
