"""Postgres down mid-night loses nothing (issue 40, finding 2): a Postgres cluster of this test's
own (``initdb``, ``pg_ctl``; never the shared one) is stopped while a real worker measures a
night and started again 45 s later; the tasks retry through the outage and every benchmark is
measured and stored once."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import func, select

from service.db import session_scope
from service.migrate import upgrade
from service.models import Job, Result, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import WorkerPool, wait_until
from workers.night import plan as nightly

SPECS = [BenchmarkSpec(model="dqn", mode="eval"), BenchmarkSpec(model="dqn", mode="train")]
OUTAGE_S = 45


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(*args: str) -> list[str]:
    # Postgres refuses to run as root; the tools run as the postgres user where we are root.
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else list(args)


@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A Postgres cluster of this test's own: its URL, a stop and a start."""
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.fail("initdb and pg_ctl of the installed Postgres are needed")
    # Outside pytest's private tmp folder: the postgres user must reach it.
    base = Path(tempfile.mkdtemp(prefix="nightbench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    data, port = base / "data", _free_port()
    subprocess.run(
        _as_postgres("initdb", "-D", str(data), "--auth=trust", "-U", "postgres"),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"

    def start() -> None:
        subprocess.run(
            _as_postgres(
                "pg_ctl", "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"
            ),
            check=True,
            capture_output=True,
        )

    def stop() -> None:
        subprocess.run(
            _as_postgres("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"),
            check=True,
            capture_output=True,
        )

    start()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE nightbench")
    try:
        yield url.rsplit("/", 1)[0] + "/nightbench", stop, start
    finally:
        subprocess.run(
            _as_postgres("pg_ctl", "-D", str(data), "-m", "immediate", "stop"), capture_output=True
        )
        shutil.rmtree(base, ignore_errors=True)


def test_postgres_down_mid_night_loses_no_benchmark(
    celery_workers: WorkerPool,
    own_postgres: tuple[str, Callable[[], None], Callable[[], None]],
    configure,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    url, stop, start = own_postgres
    upgrade(url)
    configure(database_url=url, suite_min_seconds=2)
    run_id = nightly.create_night(night=date(2026, 11, 10), benchmarks=SPECS)
    celery_workers.start("cpu", log_dir=tmp_path, name="w0")
    nightly.enqueue_jobs(run_id)

    def measuring() -> bool:
        with session_scope() as session:
            return bool(
                session.scalar(
                    select(func.count()).where(Job.run_id == run_id, Job.status == "running")
                )
            )

    wait_until(measuring, timeout=120, interval=0.2, what="a job running")
    from service.db import get_engine

    get_engine().dispose()
    stop()  # mid-benchmark: its heartbeat, its results and the next task all meet a dead store
    time.sleep(OUTAGE_S)
    start()

    def run_done() -> bool:
        with session_scope() as session:
            return session.scalar(select(Run.status).where(Run.id == run_id)) == "complete"

    wait_until(run_done, timeout=400, interval=2, what="the night to complete after the outage")
    with session_scope() as session:
        jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
        counts = session.execute(
            select(Result.job_id, Result.metric, func.count())
            .where(Result.run_id == run_id)
            .group_by(Result.job_id, Result.metric)
        ).all()
    assert [j.status for j in jobs] == ["done"] * len(SPECS), [(j.status, j.error) for j in jobs]
    assert {job_id for job_id, *_ in counts} == {j.id for j in jobs}
    assert all(n == 1 for *_, n in counts), f"a result was stored twice: {counts}"
