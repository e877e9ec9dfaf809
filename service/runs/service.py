"""Runs and their jobs: creation, job life cycle, completion and missing data."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.errors import InvalidInput, NotFound
from service.models import (
    JOB_ENDED,
    Alert,
    AlertKind,
    AlertStatus,
    FilingState,
    Job,
    JobStatus,
    Result,
    Run,
    RunKind,
    RunStatus,
)
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
        """The benchmark's name, ``model:mode:device[:compiler]``."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)


def create_run(
    session: Session,
    *,
    night: date,
    benchmarks: Sequence[BenchmarkSpec],
    torch_spec: str = "current",
    kind: str = RunKind.NIGHTLY,
    parent_run_id: int | None = None,
    deadline_s: float | None = None,
    commit_range: list[dict[str, Any]] | None = None,
    options: dict[str, Any] | None = None,
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
    previous = (
        session.scalar(
            select(Run)
            .where(
                Run.kind == RunKind.NIGHTLY,
                Run.night <= night,
                Run.status.in_((RunStatus.COMPLETE, RunStatus.INCOMPLETE)),
            )
            .order_by(Run.night.desc(), Run.id.desc())
            .limit(1)
        )
        if kind == RunKind.NIGHTLY
        else None
    )
    run = Run(
        night=night,
        kind=kind,
        torch_spec=torch_spec,
        parent_run_id=parent_run_id,
        status=RunStatus.QUEUED,
        expected_jobs=len(benchmarks),
        previous_run_id=previous.id if previous else None,
        commit_range=commit_range,
        options=options or {},
        deadline_at=utcnow() + timedelta(seconds=deadline_s) if deadline_s else None,
    )
    session.add(run)
    session.flush()
    session.add_all(
        Job(
            run_id=run.id,
            model=b.model,
            mode=b.mode,
            device=b.device,
            compiler=b.compiler,
            batch_size=b.batch_size,
            queue=b.queue,
            status=JobStatus.QUEUED,
        )
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
    """The run's jobs in id order."""
    return list(session.scalars(select(Job).where(Job.run_id == run_id).order_by(Job.id)))


def start_job(session: Session, *, job: Job, worker: str) -> None:
    """Mark ``job`` running on ``worker`` and count the attempt; its run starts too."""
    job.status = JobStatus.RUNNING
    job.attempts += 1
    job.worker = worker
    job.started_at = job.heartbeat_at = utcnow()
    session.execute(
        update(Run)
        .where(Run.id == job.run_id, Run.status == RunStatus.QUEUED)
        .values(status=RunStatus.RUNNING, started_at=utcnow())
    )
    session.flush()


def beat_job(session: Session, *, job_id: int, worker: str) -> bool:
    """Write a running job's heartbeat (now); False when ``worker`` no longer holds it."""
    done = cast(
        CursorResult[Any],
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
            .values(heartbeat_at=utcnow())
        ),
    )
    return bool(done.rowcount)


def last_sign_of_life(job: Job) -> datetime | None:
    """When the worker running ``job`` was last heard of: its heartbeat, else its start."""
    return job.heartbeat_at or job.started_at


def lost_jobs(session: Session, *, silent_since: datetime) -> list[Job]:
    """Running jobs of open runs whose worker has not been heard of since ``silent_since``,
    locked for update (skipping rows another sweep holds), in id order."""
    stmt = (
        select(Job)
        .join(Run, Run.id == Job.run_id)
        .where(
            Job.status == JobStatus.RUNNING,
            Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)),
            func.coalesce(Job.heartbeat_at, Job.started_at) < silent_since,
        )
        .order_by(Job.id)
        .with_for_update(of=Job, skip_locked=True)
    )
    return list(session.scalars(stmt))


def claim_queued_jobs(
    session: Session,
    *,
    run_id: int,
    exclude: int,
    limit: int,
    worker: str,
    cost: Callable[[Job], float] | None = None,
    budget: float = math.inf,
) -> list[Job]:
    """Start up to ``limit`` of run ``run_id``'s queued jobs (not ``exclude``) on ``worker``,
    under their row locks (skipping rows another worker holds), in id order: a batch measured
    in one process (a count pass). Only flushes.

    With ``cost``, a job is claimed only while the claimed jobs' costs add up to at most
    ``budget`` (one that does not fit is left queued for another process; a cheaper one after it
    may still be claimed).

    Returns:
        The jobs claimed (now ``running``).
    """
    if limit <= 0:
        return []
    stmt = (
        select(Job)
        .where(Job.run_id == run_id, Job.id != exclude, Job.status == JobStatus.QUEUED)
        .order_by(Job.id)
        .with_for_update(skip_locked=True)
    )
    jobs: list[Job] = []
    spent = 0.0
    for job in session.scalars(stmt if cost is not None else stmt.limit(limit)):
        if len(jobs) >= limit:
            break
        if cost is not None:
            if spent + cost(job) > budget:
                continue
            spent += cost(job)
        jobs.append(job)
    for job in jobs:
        start_job(session, job=job, worker=worker)
    session.flush()
    return jobs


def end_job(session: Session, *, job: Job, error: str | None) -> None:
    """Mark ``job`` done (or error, with its reason)."""
    job.status = JobStatus.ERROR if error else JobStatus.DONE
    job.error = error
    job.finished_at = utcnow()
    session.flush()


def jobs_pending(session: Session, *, run_id: int) -> int:
    """How many jobs of the run have not ended."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.run_id == run_id, Job.status.not_in(JOB_ENDED))
        )
        or 0
    )


def begin_finishing(session: Session, *, run_id: int) -> bool:
    """Move the run to ``detecting`` if every job has ended; True for the one caller that did.

    A conditional UPDATE makes this safe when the last two jobs end at once on two workers, and
    when a task is delivered twice: exactly one caller sees True.
    """
    if jobs_pending(session, run_id=run_id):
        return False
    moved = cast(
        CursorResult[Any],
        session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)))
            .values(status=RunStatus.DETECTING, finish_owed_since=utcnow())
        ),
    ).rowcount
    session.flush()
    return bool(moved)


def finish_sent(session: Session, *, run_id: int) -> None:
    """``night.finish`` of the run has run and sent its next steps: nothing is owed any more."""
    session.execute(update(Run).where(Run.id == run_id).values(finish_owed_since=None))
    session.flush()


def idle_queued_jobs(session: Session, *, before: datetime) -> list[Job]:
    """Queued jobs of open runs (not posted ones: their results come over the API) untouched
    since before ``before`` (started or heard of last, else their run created, before it)."""
    return list(
        session.scalars(
            select(Job)
            .join(Run, Run.id == Job.run_id)
            .where(
                Job.status == JobStatus.QUEUED,
                Run.status.in_((RunStatus.QUEUED, RunStatus.RUNNING)),
                Run.kind != RunKind.INGEST,
                func.coalesce(Job.heartbeat_at, Job.started_at, Run.created_at) < before,
            )
            .order_by(Job.id)
        )
    )


def finish_owed(session: Session, *, before: datetime) -> list[Run]:
    """Runs still ``detecting`` whose ``night.finish`` has been owed since before ``before``
    (its message was lost: the broker was down when the last job ended, or restarted empty)."""
    return list(
        session.scalars(
            select(Run)
            .where(
                Run.status == RunStatus.DETECTING,
                Run.finish_owed_since.is_not(None),
                Run.finish_owed_since < before,
            )
            .order_by(Run.id)
        )
    )


def finish_run(session: Session, *, run: Run, status: str | None = None) -> None:
    """Close the run: ``complete``, or ``incomplete`` when a job went missing."""
    if status is None:
        missing = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.run_id == run.id, Job.status == JobStatus.MISSING)
        )
        status = RunStatus.INCOMPLETE if missing else RunStatus.COMPLETE
    run.status = status
    run.finished_at = utcnow()
    session.flush()


def mark_missing(session: Session, *, run_id: int, now: datetime | None = None) -> list[Job]:
    """Past the run's deadline, mark every job that has not reported as ``missing``.

    Returns the jobs marked (empty before the deadline or when all reported), and opens a
    ``missing_data`` alert naming them, its filing ``pending`` and due now (not for a
    ``replicate`` run), for the durable filing of ``workers.issues.pending``.
    """
    run = get_run(session, run_id)
    now = now or utcnow()
    if run.deadline_at is None or now < _aware(run.deadline_at):
        return []
    jobs = list(
        session.scalars(
            select(Job).where(Job.run_id == run_id, Job.status.not_in(JOB_ENDED)).with_for_update()
        )
    )
    for job in jobs:
        job.status = JobStatus.MISSING
        job.error = f"no report by the deadline {run.deadline_at:%Y-%m-%d %H:%M} UTC"
        job.finished_at = now
    if jobs:
        names = ", ".join(j.benchmark for j in jobs)
        alert = session.scalar(
            select(Alert).where(Alert.run_id == run_id, Alert.kind == AlertKind.MISSING_DATA)
        )
        if alert is None:
            # Stored with its filing pending, in the transaction that marks the jobs: whatever
            # becomes of the task that files it, the filing retry finds it (a replicate run,
            # asked for a comparison, is no night: its missing data is not filed).
            filed = run.kind != RunKind.REPLICATE
            session.add(
                Alert(
                    run_id=run_id,
                    kind=AlertKind.MISSING_DATA,
                    status=AlertStatus.OPEN,
                    summary=f"{len(jobs)} benchmark(s) never reported: {names}",
                    filing_state=FilingState.PENDING if filed else None,
                    filing_pending_since=now if filed else None,
                    filing_next_at=now if filed else None,
                )
            )
    session.flush()
    return jobs


def _aware(ts: datetime) -> datetime:
    # SQLite hands back naive datetimes even for timezone=True columns.
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def run_results(session: Session, *, run_id: int) -> list[Result]:
    """The run's results (errors included)."""
    return list(
        session.scalars(
            select(Result)
            .where(Result.run_id == run_id)
            .order_by(Result.model, Result.mode, Result.device, Result.compiler, Result.metric)
        )
    )


def run_records(session: Session, *, run_id: int) -> list[dict[str, Any]]:
    """The run's results as suite records (``suite/records.py`` shape), one per benchmark.

    The inverse of ``service.results.records.result_rows``: a benchmark's result rows (one per
    metric) become one record with its metrics (samples, median and IQR in the stored units:
    ms, bytes); an error result becomes a record with ``error`` and no metrics.

    Args:
        session: an open database session.
        run_id: the run.

    Returns:
        Records ordered by model, mode, device and compiler.

    Raises:
        NotFound: no such run.
    """
    get_run(session, run_id)
    records: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for result in run_results(session, run_id=run_id):
        bench = (result.model, result.mode, result.device, result.compiler)
        record = records.setdefault(
            bench,
            {
                "model": result.model,
                "mode": result.mode,
                "device": result.device,
                "compiler": result.compiler,
                "batch_size": result.batch_size,
                "benchmark_version": result.benchmark_version,
                "environment": dict(result.environment or {}),
                "metrics": [],
                "error": None,
            },
        )
        if result.error:
            record["error"] = result.error
            continue
        record["metrics"].append(
            {
                "metric": result.metric,
                "unit": result.unit,
                "samples": list(result.samples or []),
                "median": result.median,
                "iqr": result.iqr,
            }
        )
    return list(records.values())
