"""The status asks the workers which queues they consume when a queue holds messages, and names
each queue that holds messages and that no worker listens to, with what waits there (real
Redis broker, real ``nightbench worker`` process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import redis
from rich.console import Console
from sqlalchemy.orm import Session

from service.models import Bisection, Probe
from service.queues import QUEUE_NAMES
from service.runs.service import BenchmarkSpec, create_run
from service.status.broker import queue_listeners
from service.status.service import system_status
from tests.api.conftest import night
from tests.conftest import WorkerPool, wait_until


def _send(queue: str, times: int = 1) -> None:
    """Send the deadline sweep (a task that only reads and writes the database) to ``queue``,
    as the product sends its tasks."""
    from workers.app import app

    for _ in range(times):
        app.send_task("night.sweep_deadlines", queue=queue)


def _problems(db: Session, broker_url: str, prefix: str) -> dict[str, str]:
    state = system_status(db, broker_url=broker_url, queue_prefix=prefix)
    return {p.split("`")[1]: p for p in state.problems if p.startswith("queue `")}


def test_a_queue_no_worker_listens_to_is_a_problem_naming_what_waits_there(
    db: Session, broker_url: str, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    prefix = os.environ["NIGHTBENCH_QUEUE_PREFIX"]
    lengths = redis.Redis.from_url(broker_url)
    night_run = create_run(
        db,
        night=night(9),
        benchmarks=[
            BenchmarkSpec(model="dcgan", mode="eval"),
            BenchmarkSpec(model="dcgan", mode="train"),
        ],
    )
    bisection = Bisection(
        status="running",
        good="a" * 40,
        bad="b" * 40,
        benchmarks=["dcgan:eval:cuda"],
        config={"kind": "failure"},
        queue="gpu.h100",
    )
    db.add(bisection)
    db.flush()
    db.add(
        Probe(
            bisection_id=bisection.id,
            round=0,
            sha="c" * 40,
            index=1,
            purpose="search",
            benchmarks=["dcgan:eval:cuda"],
            samples_wanted=2,
            status="queued",
        )
    )
    db.flush()

    # Empty queues: nobody is asked, nothing is told.
    quiet = system_status(db, broker_url=broker_url, queue_prefix=prefix)
    assert quiet.queues == dict.fromkeys(QUEUE_NAMES, 0) and quiet.listeners is None
    assert not [p for p in quiet.problems if p.startswith("queue `")]

    # No worker at all: both queues holding messages are problems naming what waits there.
    _send("cpu", 2)
    _send("gpu.h100")
    state = system_status(db, broker_url=broker_url, queue_prefix=prefix)
    assert (state.queues["cpu"], state.queues["gpu.h100"]) == (2, 1)
    assert state.listeners == {name: [] for name in QUEUE_NAMES}
    lines = _problems(db, broker_url, prefix)
    assert set(lines) == {"cpu", "gpu.h100"}
    assert lines["cpu"] == (
        "queue `cpu` holds 2 message(s) and no worker listens to it (none answered within 2 s): "
        f"2 job(s) of run {night_run.id} wait there until one does "
        "(nightbench worker --queue cpu)"
    )
    assert f": bisection {bisection.id}'s 1 probe(s) wait there" in lines["gpu.h100"]

    # A worker on gpu.h100, busy (its pool process stopped): messages wait there, but a worker
    # listens, so only cpu is told; once it runs again it takes them.
    worker = celery_workers.start("gpu.h100", log_dir=tmp_path, name="w0")
    wait_until(
        lambda: lengths.llen(f"{prefix}gpu.h100") == 0,
        timeout=30,
        what="the worker to take the message waiting on gpu.h100",
    )
    pool = [
        int(pid)
        for pid in subprocess.run(
            ["pgrep", "-P", str(worker.pid)], capture_output=True, text=True
        ).stdout.split()
    ]
    assert pool, "the worker has no pool process"
    node = f"w0@{socket.gethostname()}"
    try:
        for pid in pool:
            os.kill(pid, signal.SIGSTOP)
        _send("gpu.h100", 2)
        # The worker may still take one (prefetch 1) and hand it to its stopped pool process,
        # never a second: one or two wait.
        wait_until(
            lambda: lengths.llen(f"{prefix}gpu.h100") in (1, 2),
            timeout=30,
            what="the messages on gpu.h100",
        )
        state = system_status(db, broker_url=broker_url, queue_prefix=prefix)
        assert state.queues["gpu.h100"] in (1, 2)
        assert state.listeners["gpu.h100"] == [node] and state.listeners["control"] == [node]
        assert state.listeners["cpu"] == []
        assert set(_problems(db, broker_url, prefix)) == {"cpu"}

        from workers.cli.status import _tables

        console = Console(record=True, width=200)
        for table in _tables(state):
            console.print(table)
        rows = {
            line.split("│")[1].strip(): line
            for line in console.export_text().splitlines()
            if line.count("│") == 4
        }
        assert rows["cpu"].split("│")[3].strip() == "none"
        assert rows["gpu.h100"].split("│")[3].strip() == node
    finally:
        for pid in pool:
            os.kill(pid, signal.SIGCONT)
    wait_until(
        lambda: lengths.llen(f"{prefix}gpu.h100") == 0,
        timeout=30,
        what="the worker to take the two messages once its pool runs",
    )
    assert set(_problems(db, broker_url, prefix)) == {"cpu"}
    assert queue_listeners(broker_url, prefix="another-deployment:") == {
        name: [] for name in QUEUE_NAMES
    }
