"""``nightbench dispatch`` warns of each queue it filled that no worker listens to, naming the run
whose jobs wait there (real Redis broker, real ``nightbench worker`` process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import WorkerPool

ROOT = Path(__file__).resolve().parents[3]


def _dispatch(night: str) -> tuple[list[int], list[str]]:
    """Dispatch one eval benchmark to cpu and h100; the run ids and the warning lines."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "dispatch",
            "--date",
            night,
            "--models",
            "dqn",
            "--modes",
            "eval",
            "--device-class",
            "cpu",
            "--device-class",
            "h100",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])["runs"]
    return runs, [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]


def test_dispatch_warns_of_the_queues_no_worker_listens_to(
    database_url: str, broker_url: str, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    (cpu_run, gpu_run), warnings = _dispatch("2026-11-20")
    assert warnings == [
        "warning: queue `cpu` holds 1 message(s) and no worker listens to it (none answered "
        f"within 2 s): 1 job(s) of run {cpu_run} wait there until one does (nightbench worker "
        "--queue cpu)",
        "warning: queue `gpu.h100` holds 1 message(s) and no worker listens to it (none "
        f"answered within 2 s): 1 job(s) of run {gpu_run} wait there until one does "
        "(nightbench worker --queue gpu.h100)",
    ]

    # A worker on cpu: the next night warns of gpu.h100 alone, naming both nights' jobs there.
    celery_workers.start("cpu", log_dir=tmp_path)
    (_, next_gpu_run), warnings = _dispatch("2026-11-21")
    assert len(warnings) == 1 and warnings[0].startswith("warning: queue `gpu.h100` holds 2 ")
    assert f"1 job(s) of run {gpu_run}; 1 job(s) of run {next_gpu_run} wait there" in warnings[0]
