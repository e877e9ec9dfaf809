"""A running job's heartbeat: how a dead worker host is told from a slow benchmark.

With ``acks_late`` a job whose worker host died stays unacknowledged in Redis until the
broker's visibility timeout (hours: it must exceed the longest task). Instead of waiting for
it, the worker measuring a job writes ``jobs.heartbeat_at`` every ``job_heartbeat_s`` from a
thread beside the measurement; the deadline sweep (:func:`workers.night.deadline.requeue_lost`)
puts a running job silent for ``job_lost_after_s`` back in its queue. So a dead host's job is
measured again within ``job_lost_after_s`` plus the sweep's period (180 + 300 s by default).

A task that finds its job running with another worker's live heartbeat (the broker's own
redelivery of a job already requeued) waits until the heartbeat stops or the job ends: two
processes never measure one job side by side. A live heartbeat under the task's own worker name
is its dead pool process's (the task handed back when that process died): the job is measured
again at once (``workers.night.jobs``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

from service.config import get_settings
from service.db import session_scope
from service.models import JOB_ENDED, Job, JobStatus
from service.models.base import utcnow
from service.runs import service as runs

log = logging.getLogger(__name__)


def alive(job: Job, *, now: datetime | None = None) -> bool:
    """Whether the worker running ``job`` was heard of within ``job_lost_after_s``."""
    last = runs.last_sign_of_life(job)
    if job.status != JobStatus.RUNNING or last is None:
        return False
    silent = (now or utcnow()) - last
    return silent < timedelta(seconds=get_settings().job_lost_after_s)


@contextlib.contextmanager
def heartbeat(job_id: int, *, worker: str) -> Iterator[None]:
    """Write the job's heartbeat every ``job_heartbeat_s`` while the block runs.

    A beat that fails (the database briefly away) is logged and the next one tried; beats
    missed for ``job_lost_after_s`` make the job look lost, and it is measured again. In the
    embedded default nothing can be lost apart from the process itself: no thread is started.

    Args:
        job_id: the job being measured.
        worker: the worker name that holds it (``Job.worker``).
    """
    settings = get_settings()
    if settings.embedded:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(settings.job_heartbeat_s):
            try:
                with session_scope() as session:
                    if not runs.beat_job(session, job_id=job_id, worker=worker):
                        return  # no longer ours (ended, or requeued after a silence)
            except Exception as exc:  # noqa: BLE001 - a missed beat must not end the job
                log.warning("job %s: heartbeat not written (%s)", job_id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-job-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def wait_while_alive(job_id: int) -> bool:
    """Wait while another worker's heartbeat shows it measuring ``job_id``.

    Returns:
        True when the job ended meanwhile (nothing left to do), False when it is free to take
        (not running, or silent for ``job_lost_after_s``).
    """
    settings = get_settings()
    deadline = time.monotonic() + settings.job_lost_after_s + 2 * settings.job_heartbeat_s
    while True:
        with session_scope() as session:
            job = runs.get_job(session, job_id)
            if job.status in JOB_ENDED:
                return True
            if not alive(job) or time.monotonic() > deadline:
                return False
            worker = job.worker
        log.info("job %s: %s is measuring it; waiting for it to end or fall silent", job_id, worker)
        time.sleep(min(settings.job_heartbeat_s, 5.0))
