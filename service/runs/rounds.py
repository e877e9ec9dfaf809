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
night's ``night.finish`` sends their jobs), and only they count in the night's level. When the
night's own process of a benchmark failed, the first round that measures it stands in for it
(:func:`store_measured`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.models import JOB_ENDED, RUN_OPEN, Job, Result, Run, RunKind
from service.results.records import record_benchmark
from service.results.service import store_record
from service.runs import count_plan
from service.runs.service import BenchmarkSpec, create_run, list_jobs
from service.series import (
    COUNT_ROUND,
    NIGHT_ROUND,
    PAIRED_ROUND,
    is_count_round,
    is_night_round,
    is_paired_round,
)


def _replicates(session: Session, run_id: int) -> list[Run]:
    return list(
        session.scalars(
            select(Run)
            .where(Run.parent_run_id == run_id, Run.kind == RunKind.REPLICATE)
            .order_by(Run.id)
        )
    )


def _job_specs(session: Session, run_id: int) -> list[BenchmarkSpec]:
    """Every benchmark of run ``run_id``'s jobs, on their queues: what a round measures again."""
    return [
        BenchmarkSpec(
            model=j.model,
            mode=j.mode,
            device=j.device,
            compiler=j.compiler,
            batch_size=j.batch_size,
            queue=j.queue,
        )
        for j in list_jobs(session, run_id=run_id)
    ]


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
        session,
        night=parent.night,
        benchmarks=_job_specs(session, parent.id),
        torch_spec=parent.torch_spec,
        kind=RunKind.REPLICATE,
        parent_run_id=parent.id,
        deadline_s=deadline_s,
        options={"origin": NIGHT_ROUND, "round": number, "rounds": rounds},
    )
    if child.deadline_at is not None and parent.deadline_at is not None:
        parent.deadline_at = max(_aware(parent.deadline_at), _aware(child.deadline_at))
    session.flush()
    return child


def create_paired_round(
    session: Session,
    *,
    parent: Run,
    torch_spec: str,
    rounds: int,
    deadline_s: float | None,
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
        session,
        night=parent.night,
        benchmarks=_job_specs(session, parent.id),
        torch_spec=torch_spec,
        kind=RunKind.REPLICATE,
        parent_run_id=parent.id,
        deadline_s=deadline_s,
        options={"origin": PAIRED_ROUND, "round": number, "rounds": rounds},
    )
    session.flush()
    return child


def count_round(session: Session, *, run_id: int) -> Run | None:
    """The count pass of run ``run_id`` (:data:`service.series.COUNT_ROUND`), if it has one."""
    return next((r for r in _replicates(session, run_id) if is_count_round(r.options)), None)


def create_count_round(
    session: Session,
    *,
    parent: Run,
    models: Callable[[str], bool],
    deadline_s: float | None,
    budget_s: float = 0.0,
    batch: int = 1,
) -> Run | None:
    """Create the count pass of ``parent`` (a nightly or confirmation run whose timed rounds
    have ended): each of its CPU benchmarks whose model ``models`` accepts, counted once on the
    same build and queue (only ``flush()``; the caller commits, then sends its jobs).

    A nightly run's pass is planned under ``budget_s`` CPU seconds of one core
    (:func:`service.runs.count_plan.plan_count_pass`, ``batch`` benchmarks a valgrind
    process): when the whole pass does not fit, the benchmarks counted longest ago are counted
    and the night's note says how many were left for the next nights. A confirmation run's
    pass counts every candidate (0: no budget).

    Returns:
        The count pass's run (kind ``replicate``, ``options["origin"] = "count"``), or None
        when no benchmark of ``parent`` is to be counted.
    """
    specs = [s for s in _job_specs(session, parent.id) if s.device == "cpu" and models(s.model)]
    if not specs:
        return None
    history: dict[str, count_plan.CountHistory] = {}
    for queue in sorted({s.queue for s in specs}):
        mine = [s for s in specs if s.queue == queue]
        history.update(count_plan.count_history(session, specs=mine, queue=queue))
    if budget_s > 0 and parent.kind == RunKind.NIGHTLY:
        plan = count_plan.plan_count_pass(specs, history, budget_s=budget_s, batch=batch)
        specs = list(plan.counted)
        line = plan.note()
        if line and line not in (parent.note or ""):
            parent.note = f"{parent.note}\n{line}" if parent.note else line
    estimates = {s.name: count_plan.estimated_cost(s, history) for s in specs}
    child = create_run(
        session,
        night=parent.night,
        benchmarks=specs,
        torch_spec=parent.torch_spec,
        kind=RunKind.REPLICATE,
        parent_run_id=parent.id,
        deadline_s=deadline_s,
        options={"origin": COUNT_ROUND, "estimates": estimates},
    )
    if child.deadline_at is not None and parent.deadline_at is not None:
        parent.deadline_at = max(_aware(parent.deadline_at), _aware(child.deadline_at))
    session.flush()
    return child


def note_not_counted(session: Session, *, run: Run, reason: str) -> None:
    """Say once in the night's note (``run``'s parent, a count pass's night) why instructions
    were not counted: no valgrind on the host (the metric is skipped), or one benchmark's count
    failed (``"model:mode:cpu: reason"``); the rest of the night stands. Only flushes."""
    night = session.get(Run, run.parent_run_id) if run.parent_run_id is not None else run
    if night is None:
        return
    line = f"cpu_instructions not counted: {reason}"
    if line not in (night.note or ""):
        night.note = f"{night.note}\n{line}" if night.note else line
        session.flush()


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
    if (
        paired
        and session.scalar(
            select(Job.id).where(Job.run_id == run_id, Job.status.not_in(JOB_ENDED)).limit(1)
        )
        is not None
    ):
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
        names = {
            BenchmarkSpec(model=m, mode=mo, device=d, compiler=c).name
            for m, mo, d, c in session.execute(
                select(Result.model, Result.mode, Result.device, Result.compiler).where(
                    Result.run_id == run_id, Result.error.is_(None)
                )
            )
        }
        measured.update(names)
    fewer = ", ".join(f"{name} {n}" for name, n in sorted(measured.items()) if n < wanted)
    ids = ", ".join(str(r.id) for r in rounds)
    return (
        f"{wanted} processes per benchmark, the level of each the median of their medians "
        f"(rounds: runs {ids})" + (f"; fewer: {fewer}" if fewer else "")
    )


def store_measured(
    session: Session, *, run: Run, job: Job | None, record: dict[str, Any]
) -> list[Result]:
    """Store a benchmark record of ``run``'s job (:func:`service.results.service.store_record`),
    in the night when the record is a round's stand-in for the night's own failed process.

    Detection, history and reports read a night's own results and add its rounds' processes to
    them (:func:`service.series.night_samples`). A failed process in a round leaves the night
    with one process fewer; but when it was the night's own process that failed, the night held
    only an error for the benchmark, and the benchmark went unassessed however many rounds
    measured it. So the first round that measures such a benchmark stands in: its results are
    stored in the night, the night's error result moves to that round (where the failed
    processes of rounds are kept), and the night's note says so. The same holds for a
    confirmation run and its rounds. Nothing is deleted: both results keep their jobs.

    Args:
        session: the caller's session (this function only flushes).
        run: the run of the job (a night, a round, any run).
        job: the job that measured the record, if any.
        record: the record (``suite/records.py`` shape).

    Returns:
        The stored results (one per metric), as :func:`~service.results.service.store_record`.

    Raises:
        InvalidInput: the record lacks ``model``, ``mode`` or ``device``, or a metric is
            malformed.
    """
    target = _count_target(session, run=run, record=record) or _stand_in_for(
        session, run=run, record=record
    )
    return store_record(session, run=target or run, job=job, record=record)


def _count_target(session: Session, *, run: Run, record: dict[str, Any]) -> Run | None:
    """The night (or confirmation run) a count pass's record belongs to: its
    ``cpu_instructions`` are the night's own metric, read where its latency is; None for a run
    that is not a count pass."""
    if run.kind != RunKind.REPLICATE or run.parent_run_id is None:
        return None
    if not is_count_round(run.options) or record.get("error"):
        return None  # a failed count stays in the count pass, as a round's failed process does
    return session.get(Run, run.parent_run_id)


def _stand_in_for(session: Session, *, run: Run, record: dict[str, Any]) -> Run | None:
    """The night (``run``'s parent, locked) whose own failed process ``record`` stands in for,
    with the night's error result moved to ``run``; None when the record goes to ``run``."""
    if (
        record.get("error")
        or run.kind != RunKind.REPLICATE
        or run.parent_run_id is None
        or not is_night_round(run.options)
    ):
        return None
    model, mode, device, compiler = record_benchmark(record)

    def rows(run_id: int) -> list[Result]:
        return list(
            session.scalars(
                select(Result).where(
                    Result.run_id == run_id,
                    Result.model == model,
                    Result.mode == mode,
                    Result.device == device,
                    Result.compiler == compiler,
                )
            )
        )

    if rows(run.id):
        return None  # a redelivered task: the round already holds this benchmark
    night = lock_run(session, run_id=run.parent_run_id)
    failed = rows(night.id)
    if not failed or any(r.error is None for r in failed):
        return None
    for result in failed:
        result.run_id = run.id
    session.flush()
    line = (
        f"{benchmark_name(model, mode, device, compiler)}: the night's own process failed "
        f"({failed[0].error}); round {(run.options or {}).get('round')} (run {run.id}) "
        f"measured it in its place"
    )
    night.note = f"{night.note}\n{line}" if night.note else line
    return night


def failed_processes(session: Session, *, run_id: int) -> list[dict[str, Any]]:
    """The failed processes of the benchmarks run ``run_id`` measured in its other processes
    (a failure in a round, or the night's own process a round stood in for).

    A benchmark that no process measured is an error result of the night itself, reported as
    such; these are the failures that only took a process from a benchmark's night. The
    process is numbered by the job that ran it: 1 for the night's own, r for round r.

    Returns:
        ``[{"benchmark", "process", "run_id", "error"}, ...]`` in process order; ``run_id`` is
        the run the error result is stored in. Empty for a run without rounds.
    """
    number = {
        run_id: 1,
        **{r.id: (r.options or {}).get("round") for r in night_rounds(session, run_id=run_id)},
    }
    if len(number) == 1:
        return []
    measured = {
        benchmark_name(*row)
        for row in session.execute(
            select(Result.model, Result.mode, Result.device, Result.compiler).where(
                Result.run_id == run_id, Result.error.is_(None)
            )
        )
    }
    failed = session.execute(
        select(Result, Job.run_id)
        .outerjoin(Job, Job.id == Result.job_id)
        .where(Result.run_id.in_(number), Result.error.is_not(None))
    )
    out = [
        {
            "benchmark": r.benchmark,
            "process": number.get(job_run or r.run_id),
            "run_id": r.run_id,
            "error": r.error,
        }
        for r, job_run in failed
        if r.benchmark in measured
    ]
    return sorted(out, key=lambda e: (e["process"] or 0, e["benchmark"]))
