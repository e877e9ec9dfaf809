"""Time from a worker host's death to its job being measured again, under the default settings.

Real parts only: two ``nightbench worker`` processes and one Celery beat on the local Redis, a
scratch database on the local Postgres, a night of three CPU benchmarks. When a job runs
on the first worker, its whole process group is SIGKILLed (the host dies: no task is rejected,
the broker keeps the message unacknowledged until its visibility timeout, 4 h by default).
The heartbeat (``job_heartbeat_s``, 30 s) stops; beat's deadline sweep (every 300 s) requeues
the job once it is silent for ``job_lost_after_s`` (180 s); the second worker measures it.
Reported: seconds from the kill to the job's second start, and to the night's completion.

    .venv/bin/python -m benchmarks.worker_loss --json worker_loss.json

Needs Postgres (``--admin-url``) and Redis (``--broker``); takes up to ten minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, date, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _start(
    args: list[str], env: dict[str, str], log: Path, ready: str | None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while ready and time.monotonic() < deadline:
        if ready in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"{args[2:5]} exited: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    if ready:
        raise RuntimeError(f"{args[2:5]} not ready: {log.read_text()[-2000:]}")
    return proc


def main() -> None:
    """Measure once and print the figures (and optionally write them as JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=4.0,
        help="least timed seconds per benchmark (the harness's iteration cap may end "
        "it sooner); the kill lands within a second of a job's start",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import sqlalchemy as sa

    scratch = f"nb_worker_loss_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{scratch}"'))
    db_url = args.admin_url.rsplit("/", 1)[0] + f"/{scratch}"
    work = Path(tempfile.mkdtemp(prefix="nb-worker-loss-"))
    env = {
        **os.environ,
        "NIGHTBENCH_DATABASE_URL": db_url,
        "NIGHTBENCH_BROKER_URL": args.broker,
        "NIGHTBENCH_QUEUE_PREFIX": f"{scratch}:",
        "NIGHTBENCH_DATA_DIR": str(work),
        "NIGHTBENCH_SUITE_MIN_SECONDS": str(args.min_seconds),
        "OMP_NUM_THREADS": "1",
    }
    os.environ.update(env)
    procs: list[subprocess.Popen[bytes]] = []
    console = Console()
    try:
        subprocess.run(
            [sys.executable, "-m", "workers.cli", "db", "upgrade"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        procs.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "workers.app",
                    "beat",
                    "--schedule",
                    str(work / "beat-schedule"),
                ],
                env,
                work / "beat.log",
                ready=None,
            )
        )
        w0 = _start(
            [sys.executable, "-m", "workers.cli", "worker", "--name", "w0@%h"],
            env,
            work / "w0.log",
            ready="ready.",
        )
        procs.append(w0)
        procs.append(
            _start(
                [sys.executable, "-m", "workers.cli", "worker", "--name", "w1@%h"],
                env,
                work / "w1.log",
                ready="ready.",
            )
        )
        figures = _measure(w0, console)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)'))
    table = Table(title="worker host killed mid-job, default settings")
    for col in (
        "kill → measured again (s)",
        "kill → night complete (s)",
        "attempts",
        "load average",
    ):
        table.add_column(col, justify="right")
    table.add_row(
        f"{figures['redelivered_s']:.0f}" if figures["redelivered_s"] else "never",
        f"{figures['complete_s']:.0f}",
        str(figures["attempts"]),
        figures["loadavg"],
    )
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


def _measure(w0: subprocess.Popen[bytes], console: Console) -> dict[str, object]:
    from sqlalchemy import select

    from service.db import session_scope
    from service.models import Job, Run
    from service.runs.service import BenchmarkSpec
    from workers.night import plan

    specs = [BenchmarkSpec(model=m, mode="eval") for m in ("resnet18", "dqn", "ncf")]
    run_id = plan.create_night(night=date(2026, 11, 25), benchmarks=specs)
    plan.enqueue_jobs(run_id)

    def jobs() -> list[Job]:
        with session_scope() as session:
            return list(session.scalars(select(Job).where(Job.run_id == run_id)))

    victim = None
    while victim is None:
        time.sleep(0.2)
        victim = next(
            (j for j in jobs() if j.status == "running" and (j.worker or "").startswith("w0@")),
            None,
        )
    os.killpg(w0.pid, signal.SIGKILL)  # mid-job: its measurement takes seconds
    killed = datetime.now(UTC)
    victim = next(j for j in jobs() if j.id == victim.id)
    if victim.status != "running":
        raise RuntimeError(f"job {victim.id} ended before the kill landed; run again")
    console.print(f"killed w0 while it measured {victim.benchmark} (job {victim.id})")
    redelivered = None
    while True:
        job = next(j for j in jobs() if j.id == victim.id)
        if redelivered is None and job.attempts >= 2 and job.started_at is not None:
            redelivered = (job.started_at - killed).total_seconds()
            console.print(f"measured again by {job.worker} after {redelivered:.0f} s")
        with session_scope() as session:
            status = session.scalar(select(Run.status).where(Run.id == run_id))
        if status == "complete":
            break
        if (datetime.now(UTC) - killed).total_seconds() > 1200:
            raise RuntimeError("the night did not complete within 20 minutes of the kill")
        time.sleep(2)
    return {
        "redelivered_s": redelivered,
        "attempts": job.attempts,
        "complete_s": (datetime.now(UTC) - killed).total_seconds(),
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }


if __name__ == "__main__":
    main()
