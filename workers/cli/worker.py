"""``nightbench worker``: a Celery worker process on the configured broker."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from service.config import get_settings
from workers.cli.common import fail as _fail


def worker(
    queue: Annotated[list[str], typer.Option(help="queue(s): cpu, gpu.<class>")] = ["cpu"],  # noqa: B006
    gpu: Annotated[int | None, typer.Option(help="GPU index this worker owns")] = None,
    cpus: Annotated[str | None, typer.Option(help="CPU affinity, e.g. 0-3 or 0,2")] = None,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    name: Annotated[str | None, typer.Option(help="worker node name")] = None,
    loglevel: str = "INFO",
    beat: Annotated[
        bool,
        typer.Option(
            "--beat",
            help="also run the periodic tasks (deadline sweep, filing retry, triage sync) "
            "in this worker, where no beat process is deployed; on one worker only",
        ),
    ] = False,
) -> None:
    """Run a Celery worker on the configured broker (one task at a time per GPU).

    With ``--beat`` the worker embeds Celery's scheduler (``celery worker -B``): a deployment
    without a separate beat process still sweeps deadlines, retries filings and syncs triage.
    """
    settings = get_settings()
    if settings.embedded:
        _fail("nightbench worker needs NIGHTBENCH_BROKER_URL (e.g. redis://127.0.0.1:6379/0)")
    if gpu is not None:
        # Stays: CUDA reads it only from the environment, in the suite processes that inherit it.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        concurrency = 1
    if cpus:
        os.sched_setaffinity(0, _parse_cpus(cpus))
    from workers.app import app as celery_app

    queues = ",".join(dict.fromkeys([*queue, "control"]))
    node = name or f"nightbench-{'-'.join(queue)}-{os.getpid()}@%h"
    argv = [
        "worker",
        "-Q",
        queues,
        f"--concurrency={concurrency}",
        "--prefetch-multiplier=1",
        "-n",
        node,
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
    ]
    if beat:
        schedule = settings.data_dir / "beat-schedule"
        schedule.parent.mkdir(parents=True, exist_ok=True)
        argv += ["--beat", f"--schedule={schedule}"]
    celery_app.worker_main(argv)


def _parse_cpus(spec: str) -> set[int]:
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        _fail(f"--cpus must look like 0-3 or 0,2, got {spec!r}")
    return cpus
