"""The progress bar of a night: every process it measures, its rounds and re-runs included.

A night with ``NIGHTBENCH_NIGHT_PROCESSES`` k measures each benchmark k times (its own jobs, then
k - 1 rounds: :mod:`service.runs.rounds`), and a candidate's confirmation re-run as many times
again. The bar counts ``bench.run`` jobs of the night and of every run measuring for it, its
total grown as re-runs appear, so it does not sit at "done" while rounds are still measuring.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.config import get_settings
from service.models import RunStatus
from workers.cli.common import console
from workers.enqueue import Step


def progress_bar() -> Progress:
    """A bar on the console: description, bar, done of total, time elapsed."""
    return Progress(
        TextColumn("[bold]{task.description:<32}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def measure(run_id: int, total: int) -> None:
    """Run (embedded) or wait for (distributed) run ``run_id``'s jobs and the rounds and re-runs
    they lead to, with a progress bar of ``total`` jobs times the night's processes."""
    from workers.night import plan as night_mod

    per_night = get_settings().processes_for(night_mod.run_queue(run_id))
    with progress_bar() as progress:
        bar = progress.add_task("measuring", total=total * per_night)
        if not get_settings().embedded:
            _wait_for_run(run_id, progress, bar)
            return

        def observe(step: Step, done: bool) -> None:
            if step.task != "bench.run":
                return
            task = progress.tasks[bar]
            if done:
                progress.advance(bar)
            elif task.total is not None and task.completed >= task.total:
                progress.update(bar, total=task.completed + 1)  # a re-run beyond the plan
            if not done:
                progress.update(bar, description=night_mod.job_benchmark(step.args[0]))

        for job_id, queue, _ in night_mod.queued_jobs(run_id):
            night_mod.send_job(job_id, queue, observer=observe)


def _wait_for_run(run_id: int, progress: Progress, bar: Any) -> None:
    from sqlalchemy import func, or_, select

    from service.db import session_scope
    from service.models import JOB_ENDED, Job, Run

    children = select(Run.id).where(Run.parent_run_id == run_id)
    family = or_(Run.id == run_id, Run.parent_run_id == run_id, Run.parent_run_id.in_(children))
    while True:
        with session_scope() as session:
            counts = session.execute(
                select(func.count(), func.count().filter(Job.status.in_(JOB_ENDED)))
                .select_from(Job)
                .join(Run, Run.id == Job.run_id)
                .where(family)
            ).one()
            status = session.scalar(select(Run.status).where(Run.id == run_id))
        jobs, ended = counts
        total = progress.tasks[bar].total or 0
        progress.update(
            bar, completed=ended, total=max(total, jobs), description=f"run {run_id}: {status}"
        )
        if status in (RunStatus.COMPLETE, RunStatus.INCOMPLETE, RunStatus.FAILED):
            return
        time.sleep(2)
