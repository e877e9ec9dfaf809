"""A broker restarted empty mid-night loses nothing (issue 40, finding 2): a Redis of this test's
own (never the shared one) holds a night's queued messages, restarts without persistence, and
the deadline sweep finds the queued jobs whose messages are gone and sends them again; a real
worker measures each benchmark once and the night completes."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from service.db import session_scope
from service.models import Job, Result, Run
from service.models.base import utcnow
from service.runs.service import BenchmarkSpec
from tests.conftest import WorkerPool, wait_until
from workers.night import deadline
from workers.night import plan as nightly

SPECS = [BenchmarkSpec(model="dqn", mode="eval"), BenchmarkSpec(model="dqn", mode="train")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """A Redis server of this test's own, keeping nothing on disk; its URL and a restart."""
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", str(tmp_path)]

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(url).ping()
                return proc
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.1)

    held = [start()]

    def restart() -> None:
        held[0].terminate()
        held[0].wait(timeout=30)
        held[0] = start()

    yield url, restart
    held[0].terminate()
    held[0].wait(timeout=30)


def test_a_broker_restarted_empty_loses_no_benchmark(
    celery_workers: WorkerPool,
    own_redis: tuple[str, Callable[[], None]],
    configure,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    url, restart = own_redis
    configure(broker_url=url, suite_min_seconds=0.5)
    run_id = nightly.create_night(night=date(2026, 11, 9), benchmarks=SPECS)
    nightly.enqueue_jobs(run_id)  # no worker yet: the messages wait in Redis
    assert redis.Redis.from_url(url).dbsize() > 0
    restart()  # nothing kept on disk: the night's messages are gone
    assert redis.Redis.from_url(url).dbsize() == 0
    celery_workers.start("cpu", log_dir=tmp_path, name="w0")
    # The sweep, as beat runs it, once the jobs have waited past step_resend_after_s.
    deadline.sweep_deadlines(now=utcnow() + timedelta(minutes=11))

    def run_done() -> bool:
        with session_scope() as session:
            return session.scalar(select(Run.status).where(Run.id == run_id)) == "complete"

    wait_until(run_done, timeout=300, interval=1, what="the night to complete after the restart")
    with session_scope() as session:
        jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
        counts = session.execute(
            select(Result.job_id, Result.metric, func.count())
            .where(Result.run_id == run_id)
            .group_by(Result.job_id, Result.metric)
        ).all()
    assert [(j.status, j.attempts) for j in jobs] == [("done", 1)] * len(SPECS)
    assert {job_id for job_id, *_ in counts} == {j.id for j in jobs}
    assert all(n == 1 for *_, n in counts), f"a result was stored twice: {counts}"
