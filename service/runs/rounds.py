"""A night's own rounds of processes (``NIGHTBENCH_NIGHT_PROCESSES``): replicate runs in order.

Most of the process-to-process noise of a host is its speed drifting over minutes, shared by
every benchmark measured at that time (docs/benchmarks.md, "Where the noise comes from"). So a
night of k processes per benchmark is measured in k rounds, one after the other: round 1 is the
night itself (every benchmark once), round r > 1 a replicate run of the same benchmarks on the
same build (``parent_run_id`` = the night, ``options["origin"] = "night"``,
:data:`service.series.NIGHT_ROUND`), sent when the round before it has ended. A confirmation
run gets its rounds the same way. Detection reads the median of the per-process medians
(:func:`service.series.night_samples`).

These replicate runs are told from those a comparison asks for (:mod:`service.runs.processes`)
by their origin: they carry no ``options["dispatch"]``, so the sweep never claims them (the
night's ``night.finish`` sends their jobs), and only they count in the night's level.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import JOB_ENDED, RUN_OPEN, Job, Result, Run, RunKind
from service.runs.service import BenchmarkSpec, create_run, list_jobs
from service.series import NIGHT_ROUND, PAIRED_ROUND, is_night_round, is_paired_round


def _replicates(session: Session, run_id: int) -> list[Run]:
    return list(session.scalars(select(Run).where(
        Run.parent_run_id == run_id, Run.kind == RunKind.REPLICATE).order_by(Run.id)))


def _job_specs(session: Session, run_id: int) -> list[BenchmarkSpec]:
    """Every benchmark of run ``run_id``'s jobs, on their queues: what a round measures again."""
    return [BenchmarkSpec(model=j.model, mode=j.mode, device=j.device, compiler=j.compiler,
                          batch_size=j.batch_size, queue=j.queue)
            for j in list_jobs(session, run_id=run_id)]


def night_rounds(session: Session, *, run_id: int) -> list[Run]:
    """The rounds (replicate runs of origin ``night``) of run ``run_id``, in id order."""
    return [c for c in _replicates(session, run_id) if is_night_round(c.options)]


def paired_rounds(session: Session, *, run_id: int) -> list[Run]:
    """The paired rounds (replicate runs of origin ``paired``: the previous night's build measured
    beside a confirmation re-run, :mod:`service.regressions.paired`) of run ``run_id``."""
    return [c for c in _replicates(session, run_id) if is_paired_round(c.options)]


def run_queue(session: Session, *, run_id: int) -> str:
    """The queue run ``run_id``'s jobs measure on (one device class a run: ``cpu``,
    ``gpu.h100``, ...); ``cpu`` for a run without jobs."""
    queue = session.scalar(select(Job.queue).where(Job.run_id == run_id).order_by(Job.id).limit(1))
    return queue or "cpu"


def lock_run(session: Session, *, run_id: int) -> Run:
    """Run ``run_id`` with its row locked for update (Postgres; SQLite has one writer anyway),
    so that two ``night.finish`` of one night never send the same round twice."""
    return session.scalars(select(Run).where(Run.id == run_id).with_for_update()).one()


def create_round(session: Session, *, parent: Run, rounds: int, deadline_s: float | None) -> Run:
    """Create the next round of ``parent`` (a nightly or confirmation run): every benchmark of
    its jobs once more, on its build and queues (only ``flush()``; the caller commits, then
    sends the round's jobs).

    A benchmark whose process failed in an earlier round is measured again: a failed process
    only leaves its night with one process fewer. The parent's deadline moves to the round's
    when that is later, so a night waiting for its rounds is not shown as overdue.

    Args:
        session: an open session.
        parent: the run whose processes the round adds.
        rounds: the processes per benchmark wanted (k); the round is number
            ``len(night_rounds) + 2`` of them.
        deadline_s: seconds from now after which a job of the round not reported is missing.

    Returns:
        The round's run (kind ``replicate``).
    """
    number = len(night_rounds(session, run_id=parent.id)) + 2
    child = create_run(
        session, night=parent.night, benchmarks=_job_specs(session, parent.id),
        torch_spec=parent.torch_spec,
        kind=RunKind.REPLICATE, parent_run_id=parent.id, deadline_s=deadline_s,
        options={"origin": NIGHT_ROUND, "round": number, "rounds": rounds})
    if child.deadline_at is not None and parent.deadline_at is not None:
        parent.deadline_at = max(_aware(parent.deadline_at), _aware(child.deadline_at))
    session.flush()
    return child


def create_paired_round(
    session: Session, *, parent: Run, torch_spec: str, rounds: int, deadline_s: float | None,
) -> Run:
    """Create the next paired round of confirmation run ``parent``: every benchmark of its jobs
    once, on the build ``torch_spec`` (the previous night's) and the same queues (only
    ``flush()``; the caller commits, then sends its jobs interleaved with the re-run's round).

    Returns:
        The round's run (kind ``replicate``, ``options["origin"] = "paired"``, its number among
        the paired rounds in ``options["round"]``).
    """
    number = len(paired_rounds(session, run_id=parent.id)) + 1
    child = create_run(
        session, night=parent.night, benchmarks=_job_specs(session, parent.id),
        torch_spec=torch_spec,
        kind=RunKind.REPLICATE, parent_run_id=parent.id, deadline_s=deadline_s,
        options={"origin": PAIRED_ROUND, "round": number, "rounds": rounds})
    session.flush()
    return child


def _aware(ts: datetime) -> datetime:
    # SQLite hands back naive datetimes even for timezone=True columns.
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def rounds_left(session: Session, *, run_id: int, processes: int) -> int | None:
    """How many rounds run ``run_id`` still needs for ``processes`` processes per benchmark:
    0 when all have ended, None while one of them is still measuring (nothing to do yet).

    A confirmation run with paired rounds also waits for those, and for its own jobs: its first
    paired round is measured beside its own jobs, and may end before them."""
    rounds = night_rounds(session, run_id=run_id)
    paired = paired_rounds(session, run_id=run_id)
    if any(r.status in RUN_OPEN for r in (*rounds, *paired)):
        return None
    if paired and session.scalar(select(Job.id).where(
            Job.run_id == run_id, Job.status.not_in(JOB_ENDED)).limit(1)) is not None:
        return None
    return max(0, processes - 1 - len(rounds))


def rounds_note(session: Session, *, run: Run) -> str | None:
    """One line for the run's note on its processes, e.g. ``"3 processes per benchmark (rounds:
    runs 12, 13); fewer: dqn:eval:cpu 2"``; None for a run without rounds."""
    rounds = night_rounds(session, run_id=run.id)
    if not rounds:
        return None
    wanted = len(rounds) + 1
    measured: Counter[str] = Counter()
    for run_id in (run.id, *(r.id for r in rounds)):
        names = {BenchmarkSpec(model=m, mode=mo, device=d, compiler=c).name
                 for m, mo, d, c in session.execute(
                     select(Result.model, Result.mode, Result.device, Result.compiler)
                     .where(Result.run_id == run_id, Result.error.is_(None)))}
        measured.update(names)
    fewer = ", ".join(f"{name} {n}" for name, n in sorted(measured.items()) if n < wanted)
    ids = ", ".join(str(r.id) for r in rounds)
    return (f"{wanted} processes per benchmark, the level of each the median of their medians "
            f"(rounds: runs {ids})" + (f"; fewer: {fewer}" if fewer else ""))

