"""What a missing-data alert's issues say, and the data that came since: queries only."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, Job, JobStatus, Run, RunKind
from workers.issues.model import MissingDataReport, MissingJob, NightRun


def night_run(run: Run) -> NightRun:
    """``run`` as the issues name it."""
    return NightRun(
        id=run.id,
        night=run.night,
        torch_spec=run.torch_spec,
        torch_git_commit=run.torch_git_commit,
        deadline_at=run.deadline_at,
    )


def missing_reports(session: Session, *, run: Run) -> list[MissingDataReport]:
    """One report per machine class (queue) of ``run``'s jobs that never reported, by queue."""
    jobs = session.scalars(
        select(Job).where(Job.run_id == run.id, Job.status == JobStatus.MISSING).order_by(Job.id)
    )
    by_queue: dict[str, list[MissingJob]] = {}
    for j in jobs:
        by_queue.setdefault(j.queue, []).append(
            MissingJob(
                benchmark=j.benchmark,
                model=j.model,
                worker=j.worker,
                attempts=j.attempts,
                error=j.error,
            )
        )
    return [
        MissingDataReport(run=night_run(run), queue=queue, jobs=tuple(missing))
        for queue, missing in sorted(by_queue.items())
    ]


def still_missing(session: Session, *, run: Run, queue: str) -> list[str]:
    """The benchmarks of ``run`` on ``queue`` whose jobs are still ``missing``, sorted."""
    return sorted(
        j.benchmark
        for j in session.scalars(
            select(Job).where(
                Job.run_id == run.id, Job.queue == queue, Job.status == JobStatus.MISSING
            )
        )
    )


def arrived_benchmarks(session: Session, run: Run, *, alert: Alert) -> dict[str, list[str]]:
    """Benchmarks of ``run`` that missed its deadline and whose data came since, by queue.

    A benchmark came when its job of ``run`` ended ``done`` after the missing-data ``alert``
    was raised (a late post to an ingest run) or when another run of the same night measured
    it (a re-dispatch).

    Returns:
        ``{queue: [benchmark, ...]}`` (sorted names; queues with nothing arrived left out).
    """
    jobs = list(session.scalars(select(Job).where(Job.run_id == run.id)))
    missed = [
        j
        for j in jobs
        if j.status == JobStatus.MISSING
        or (
            j.status == JobStatus.DONE
            and j.finished_at is not None
            and j.finished_at > alert.created_at
        )
    ]
    if not missed:
        return {}
    elsewhere = set(
        session.scalars(
            select(Job.id)
            .join(Run, Run.id == Job.run_id)
            .where(
                Run.night == run.night,
                Run.id != run.id,
                Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)),
                Job.status == JobStatus.DONE,
            )
            .where(Job.model.in_({j.model for j in missed}))
        )
    )
    done_elsewhere = (
        {
            (j.model, j.mode, j.device, j.compiler)
            for j in session.scalars(select(Job).where(Job.id.in_(elsewhere)))
        }
        if elsewhere
        else set()
    )
    out: dict[str, list[str]] = {}
    for j in missed:
        if j.status == JobStatus.DONE or (j.model, j.mode, j.device, j.compiler) in done_elsewhere:
            out.setdefault(j.queue, []).append(j.benchmark)
    return {q: sorted(names) for q, names in out.items()}
