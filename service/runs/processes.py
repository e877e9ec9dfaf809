"""More processes of a run, asked for to compare it: replicate runs on the run's own build.

A comparison of two runs (:mod:`service.runs.compare`) takes one value per process; a night
measures each benchmark in one process, so two nights alone can never say. Asking a run for
``n`` processes creates child runs of kind ``replicate`` (``parent_run_id`` = the run, same
night and build spec, one job per benchmark still short of ``n``), measured by the workers like
the confirmation re-run of :mod:`workers.night.finish`. Their results are the run's further
processes in the comparison; detection and confirmation never read them (series history takes
nightly, posted and confirmation results only). A night's own rounds of processes
(``NIGHTBENCH_NIGHT_PROCESSES``, :mod:`service.runs.rounds`) are replicate runs too, marked
``options["origin"] = "night"``: they count as measured processes here, and only they count
in the night's level.

The rows are all this module writes. Who sends their jobs is marked on the run
(``options["dispatch"]``): ``pending`` until the workers' periodic sweep, or the command that
asked and measures them itself, claims them (:func:`claim_pending`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidInput
from service.models import RUN_OPEN, Job, JobStatus, Result, Run, RunKind
from service.runs.service import BenchmarkSpec, create_run, get_run, list_jobs

MAX_PROCESSES = 50
DISPATCH_PENDING = "pending"
DISPATCH_CLAIMED = "claimed"


@dataclass(frozen=True)
class BenchmarkProcesses:
    """One benchmark of a run: processes measured, processes queued, and those just added."""

    benchmark: str
    measured: int
    queued: int
    added: int


@dataclass(frozen=True)
class ProcessRequest:
    """What asking run ``run_id`` for ``processes`` processes queued: the replicate runs
    created (ids, one process of each benchmark still short per run) and their job count."""

    run_id: int
    processes: int
    runs: list[int]
    jobs: int
    benchmarks: list[BenchmarkProcesses]


def _measured(session: Session, family: list[int]) -> Counter[str]:
    """Processes that measured each benchmark without an error, over the runs ``family``."""
    rows = session.execute(
        select(Result.run_id, Result.model, Result.mode, Result.device, Result.compiler)
        .where(Result.run_id.in_(family), Result.error.is_(None))
        .distinct()
    )
    return Counter(
        BenchmarkSpec(model=m, mode=mo, device=d, compiler=c).name for _, m, mo, d, c in rows
    )


def process_counts(session: Session, *, run_id: int) -> dict[str, tuple[int, int]]:
    """Per benchmark the run measured: ``(measured, queued)`` processes, where ``measured``
    counts the run and its child runs (confirmation, replicate) holding a result without an
    error, and ``queued`` the jobs of its replicate runs not ended yet.

    Raises:
        NotFound: no such run.
    """
    get_run(session, run_id)
    children = list(session.scalars(select(Run.id).where(Run.parent_run_id == run_id)))
    measured = _measured(session, [run_id, *children])
    own = _measured(session, [run_id])
    waiting = Counter(
        j.benchmark
        for j in session.scalars(
            select(Job)
            .join(Run, Run.id == Job.run_id)
            .where(
                Run.parent_run_id == run_id,
                Run.kind == RunKind.REPLICATE,
                Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
            )
        )
    )
    return {name: (measured[name], waiting[name]) for name in sorted(own)}


def _queue(jobs: dict[str, Job], name: str, device: str) -> str:
    job = jobs.get(name)
    return job.queue if job is not None else ("cpu" if device == "cpu" else "gpu.default")


def request_processes(
    session: Session,
    *,
    run_id: int,
    processes: int,
    deadline_s: float | None = None,
) -> ProcessRequest:
    """Queue replicate runs until every benchmark of run ``run_id`` has ``processes`` processes
    (measured or queued); nothing is created when each already has.

    The k-th replicate run holds the benchmarks still short of ``processes`` by at least k, so
    each benchmark gets its missing processes, one per run (one job is one process). Only
    ``flush()``: the caller commits, then sends the jobs or leaves them to the sweep.

    Args:
        session: an open session.
        run_id: a finished nightly run.
        processes: processes wanted per benchmark, 2 to ``MAX_PROCESSES``.
        deadline_s: seconds from now after which a job not reported is missing.

    Raises:
        InvalidInput: ``processes`` out of range, or the run is not a nightly run (posted
            results, probes and re-runs have no build the workers can measure again here).
        NotFound: no such run.
        Conflict: the run is still being measured, or it measured no benchmark without an
            error (there is nothing to repeat).
    """
    if not 2 <= processes <= MAX_PROCESSES:
        raise InvalidInput(f"processes must be between 2 and {MAX_PROCESSES}, got {processes}")
    run = get_run(session, run_id)
    if run.kind != RunKind.NIGHTLY:
        raise InvalidInput(
            f"run {run_id} is a {run.kind} run; more processes are measured for "
            f"nightly runs only, on their own build"
        )
    if run.status in RUN_OPEN:
        raise Conflict(
            f"run {run_id} is still {run.status}; ask for more processes once it has finished"
        )
    counts = process_counts(session, run_id=run_id)
    if not counts:
        raise Conflict(
            f"run {run_id} has no result without an error; there is no measured benchmark to repeat"
        )
    short = {
        name: max(0, processes - measured - queued) for name, (measured, queued) in counts.items()
    }
    specs = _specs(session, run_id=run_id)
    created: list[int] = []
    for k in range(1, max(short.values()) + 1):
        batch = [specs[name] for name, n in short.items() if n >= k]
        child = create_run(
            session,
            night=run.night,
            benchmarks=batch,
            torch_spec=run.torch_spec,
            kind=RunKind.REPLICATE,
            parent_run_id=run_id,
            deadline_s=deadline_s,
            options={"processes": processes, "dispatch": DISPATCH_PENDING},
        )
        created.append(child.id)
    return ProcessRequest(
        run_id=run_id,
        processes=processes,
        runs=created,
        jobs=sum(short.values()),
        benchmarks=[
            BenchmarkProcesses(benchmark=name, measured=m, queued=q, added=short[name])
            for name, (m, q) in counts.items()
        ],
    )


def _specs(session: Session, *, run_id: int) -> dict[str, BenchmarkSpec]:
    """The run's benchmarks measured without an error, as it measured them (batch size, queue)."""
    jobs = {j.benchmark: j for j in list_jobs(session, run_id=run_id)}
    specs: dict[str, BenchmarkSpec] = {}
    for r in session.scalars(
        select(Result).where(Result.run_id == run_id, Result.error.is_(None)).order_by(Result.id)
    ):
        name = BenchmarkSpec(model=r.model, mode=r.mode, device=r.device, compiler=r.compiler).name
        specs.setdefault(
            name,
            BenchmarkSpec(
                model=r.model,
                mode=r.mode,
                device=r.device,
                compiler=r.compiler,
                batch_size=r.batch_size,
                queue=_queue(jobs, name, r.device),
            ),
        )
    return specs


def claim_pending(session: Session, *, parent_ids: list[int] | None = None) -> list[int]:
    """Replicate runs whose jobs nobody has sent yet, claimed (marked so) for the caller to
    send; those of ``parent_ids`` only when given. Rows another claimer holds are skipped.

    Sending a job twice is harmless (a job measured once is not measured again), so a claim
    lost between the commit and the send leaves at worst jobs for the deadline to mark missing.
    """
    stmt = (
        select(Run)
        .where(Run.kind == RunKind.REPLICATE, Run.status.in_(RUN_OPEN))
        .order_by(Run.id)
        .with_for_update(skip_locked=True)
    )
    if parent_ids is not None:
        stmt = stmt.where(Run.parent_run_id.in_(parent_ids))
    claimed = []
    for run in session.scalars(stmt):
        if (run.options or {}).get("dispatch") == DISPATCH_PENDING:
            run.options = {**run.options, "dispatch": DISPATCH_CLAIMED}
            claimed.append(run.id)
    session.flush()
    return claimed


def open_replicates(session: Session, *, parent_ids: list[int]) -> list[int]:
    """Replicate runs of ``parent_ids`` not finished yet, in id order."""
    return list(
        session.scalars(
            select(Run.id)
            .where(
                Run.kind == RunKind.REPLICATE,
                Run.parent_run_id.in_(parent_ids),
                Run.status.in_(RUN_OPEN),
            )
            .order_by(Run.id)
        )
    )
