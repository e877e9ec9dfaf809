"""Runs and their jobs: creation, job life cycle, completion and missing data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from service.errors import InvalidInput, NotFound
from service.models import JOB_ENDED, Alert, Job, Result, Run
from service.models.base import utcnow

MODES = ("train", "eval")
DEVICES = ("cpu", "cuda")
COMPILERS = ("eager", "inductor")


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark to run: model, mode, device, compiler, and the queue that measures it."""

    model: str
    mode: str
    device: str = "cpu"
    compiler: str = "eager"
    queue: str = "cpu"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidInput("benchmark model must not be empty")
        if self.mode not in MODES:
            raise InvalidInput(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.device not in DEVICES:
            raise InvalidInput(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.compiler not in COMPILERS:
            raise InvalidInput(f"compiler must be one of {COMPILERS}, got {self.compiler!r}")

    @property
    def name(self) -> str:
        base = f"{self.model}:{self.mode}:{self.device}"
        return base if self.compiler == "eager" else f"{base}:{self.compiler}"


def create_run(
    session: Session, *, night: date, benchmarks: Sequence[BenchmarkSpec], torch_spec: str = "current",
    kind: str = "nightly", parent_run_id: int | None = None, deadline_s: float | None = None,
    commit_range: list[dict[str, Any]] | None = None, options: dict[str, Any] | None = None,
) -> Run:
    """Create a queued run with one job per benchmark.

    Raises:
        InvalidInput: no benchmarks, or the same benchmark twice.
    """
    if not benchmarks:
        raise InvalidInput("a run needs at least one benchmark")
    names = [b.name for b in benchmarks]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise InvalidInput(f"benchmarks listed twice: {', '.join(dupes)}")
    previous = session.scalar(
        select(Run).where(Run.kind == "nightly", Run.night <= night, Run.status.in_(("complete", "incomplete")))
        .order_by(Run.night.desc(), Run.id.desc()).limit(1)
    ) if kind == "nightly" else None
    run = Run(
        night=night, kind=kind, torch_spec=torch_spec, parent_run_id=parent_run_id, status="queued",
        expected_jobs=len(benchmarks), previous_run_id=previous.id if previous else None,
        commit_range=commit_range, options=options or {},
        deadline_at=utcnow() + timedelta(seconds=deadline_s) if deadline_s else None,
    )
    session.add(run)
    session.flush()
    session.add_all(
        Job(run_id=run.id, model=b.model, mode=b.mode, device=b.device, compiler=b.compiler,
            batch_size=b.batch_size, queue=b.queue, status="queued")
        for b in benchmarks
    )
    session.flush()
    return run


def get_run(session: Session, run_id: int) -> Run:
    """The run with ``run_id``. Raises NotFound."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    return run


def get_job(session: Session, job_id: int, *, lock: bool = False) -> Job:
    """The job with ``job_id`` (row-locked with ``lock`` on Postgres). Raises NotFound."""
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    job = session.scalar(stmt)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    return job


def list_jobs(session: Session, *, run_id: int) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.run_id == run_id).order_by(Job.id)))


def start_job(session: Session, *, job: Job, worker: str) -> None:
    """Mark ``job`` running on ``worker`` and count the attempt; its run starts too."""
    job.status = "running"
    job.attempts += 1
    job.worker = worker
    job.started_at = utcnow()
    session.execute(
        update(Run).where(Run.id == job.run_id, Run.status == "queued")
        .values(status="running", started_at=utcnow())
    )
    session.flush()


def end_job(session: Session, *, job: Job, error: str | None) -> None:
    """Mark ``job`` done (or error, with its reason)."""
    job.status = "error" if error else "done"
    job.error = error
    job.finished_at = utcnow()
    session.flush()


def jobs_pending(session: Session, *, run_id: int) -> int:
    """How many jobs of the run have not ended."""
    return int(session.scalar(
        select(func.count()).select_from(Job).where(Job.run_id == run_id, Job.status.not_in(JOB_ENDED))
    ) or 0)


def begin_finishing(session: Session, *, run_id: int) -> bool:
    """Move the run to ``detecting`` if every job has ended; True for the one caller that did.

    A conditional UPDATE makes this safe when the last two jobs end at once on two workers, and
    when a task is delivered twice: exactly one caller sees True.
    """
    if jobs_pending(session, run_id=run_id):
        return False
    moved = cast(CursorResult[Any], session.execute(
        update(Run).where(Run.id == run_id, Run.status.in_(("queued", "running")))
        .values(status="detecting")
    )).rowcount
    session.flush()
    return bool(moved)


def finish_run(session: Session, *, run: Run, status: str | None = None) -> None:
    """Close the run: ``complete``, or ``incomplete`` when a job went missing."""
    if status is None:
        missing = session.scalar(
            select(func.count()).select_from(Job).where(Job.run_id == run.id, Job.status == "missing")
        )
        status = "incomplete" if missing else "complete"
    run.status = status
    run.finished_at = utcnow()
    session.flush()


def mark_missing(session: Session, *, run_id: int, now: datetime | None = None) -> list[Job]:
    """Past the run's deadline, mark every job that has not reported as ``missing``.

    Returns the jobs marked (empty before the deadline or when all reported), and opens a
    ``missing_data`` alert naming them.
    """
    run = get_run(session, run_id)
    now = now or utcnow()
    if run.deadline_at is None or now < _aware(run.deadline_at):
        return []
    jobs = list(session.scalars(
        select(Job).where(Job.run_id == run_id, Job.status.not_in(JOB_ENDED)).with_for_update()
    ))
    for job in jobs:
        job.status = "missing"
        job.error = f"no report by the deadline {run.deadline_at:%Y-%m-%d %H:%M} UTC"
        job.finished_at = now
    if jobs:
        names = ", ".join(j.benchmark for j in jobs)
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id, Alert.kind == "missing_data"))
        if alert is None:
            session.add(Alert(run_id=run_id, kind="missing_data", status="open",
                              summary=f"{len(jobs)} benchmark(s) never reported: {names}"))
    session.flush()
    return jobs


def _aware(ts: datetime) -> datetime:
    # SQLite hands back naive datetimes even for timezone=True columns.
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def run_results(session: Session, *, run_id: int) -> list[Result]:
    return list(session.scalars(
        select(Result).where(Result.run_id == run_id)
        .order_by(Result.model, Result.mode, Result.device, Result.compiler, Result.metric)
    ))
