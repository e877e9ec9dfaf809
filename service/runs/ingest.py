"""Runs whose results a runner posts over the API (``kind`` = ``ingest``).

A runner creates the run with the benchmarks it will measure, then posts suite records in
batches. Both steps are idempotent: a repeated run key returns the same run, and a record whose
benchmark the run already holds is left as stored (``store_record``'s rule), so a runner may
retry a request whose answer it lost. Records are stored in bulk (:func:`store_records`),
writing the rows ``store_record`` would. A benchmark the runner cannot measure (a model not
available on it, a mode its device does not offer) is withdrawn with the reason
(:func:`skip_benchmarks`): its job ends ``skipped``, neither missing data nor a failure. The run
closes (``complete``/``incomplete``) when every benchmark has reported or been skipped.

Job states of an ingest run::

    queued ─┬─ record ────────→ done | error
            ├─ skip ──────────→ skipped ── record ──→ done | error  (a later post counts)
            └─ the deadline ──→ missing ── record ──→ done  (late data, run stays incomplete)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, cast

import orjson
from sqlalchemy import ARRAY, Integer, Table, any_, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.errors import Conflict, InvalidInput
from service.models import JOB_ENDED, Job, JobStatus, Machine, Result, Run, RunKind, RunStatus
from service.models.base import utcnow
from service.results.records import (
    Bench,
    adopt_torch_build,
    catalogue_models,
    record_machine,
    result_rows,
)
from service.runs.service import BenchmarkSpec, create_run, get_run, list_jobs

FINISHED = (RunStatus.COMPLETE, RunStatus.INCOMPLETE, RunStatus.FAILED)
# A job in these states holds its record.
_HOLDS_RESULT = (JobStatus.DONE, JobStatus.ERROR)
# Benchmarks named in one error message; the rest are counted.
_NAMED = 10


@dataclass(frozen=True)
class SkippedBenchmark:
    """A benchmark of a run withdrawn by its runner, and why."""

    benchmark: str
    reason: str


@dataclass
class Completeness:
    """Job counts of a run by status, and the benchmarks still pending, missing or skipped."""

    total: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    pending: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    skipped: list[SkippedBenchmark] = field(default_factory=list)

    @property
    def ended(self) -> int:
        """Jobs that ended: done, error, missing or skipped."""
        return sum(self.counts[status] for status in JOB_ENDED)

    @property
    def complete(self) -> bool:
        """Every job ended and none is missing (a skipped one has ended)."""
        return self.total > 0 and self.ended == self.total and not self.counts[JobStatus.MISSING]


def _name(model: str, mode: str, device: str, compiler: str) -> str:
    return benchmark_name(model, mode, device, compiler)


def _bench(record: dict[str, Any]) -> Bench:
    return (record["model"], record["mode"], record["device"], record.get("compiler") or "eager")


def store_records(
    session: Session,
    *,
    run: Run,
    job_ids: dict[Bench, int],
    records: Sequence[dict[str, Any]],
) -> int:
    """Store many suite records of ``run`` at once: the rows ``store_record`` writes for each.

    ``store_record`` costs several round trips per record (its idempotency check, the machine
    lookup, the insert); an ingest batch of hundreds of records instead checks idempotency once
    (the caller), looks up each distinct machine once, and inserts every result in one
    executemany. The rows are the same (both are made by
    :func:`service.results.records.result_rows`): same series keys, machines, error results.

    Args:
        session: an open database session.
        run: the run the records belong to.
        job_ids: the run's job id per ``(model, mode, device, compiler)``; every record's
            benchmark must be there.
        records: suite records not yet stored in the run (``suite/records.py`` shape).

    Returns:
        The number of result rows written.

    Raises:
        InvalidInput: a metric without samples or malformed (as ``store_record``).
    """
    machines: dict[str, Machine] = {}
    rows: list[dict[str, Any]] = []
    now = utcnow()
    for record in records:
        bench = _bench(record)
        machine = record_machine(session, record, known=machines)
        job_id = job_ids[bench]
        mine = result_rows(record, machine=machine)
        # The rows of a record share its environment: its JSON text is made once.
        environment_json = orjson.dumps(mine[0]["environment"]).decode() if mine else ""
        rows.extend(
            {
                **row,
                "run_id": run.id,
                "job_id": job_id,
                "night": run.night,
                "created_at": now,
                "environment_json": environment_json,
            }
            for row in mine
        )
    _insert_results(session, rows)
    catalogue_models(session, records)
    adopt_torch_build(run, records)
    session.flush()
    return len(rows)


_COPY_COLUMNS = (
    "run_id",
    "job_id",
    "machine_id",
    "night",
    "model",
    "mode",
    "device",
    "compiler",
    "batch_size",
    "metric",
    "unit",
    "samples",
    "sample_count",
    "median",
    "iqr",
    "environment",
    "benchmark_version",
    "series_key",
    "error",
    "created_at",
)


def _insert_results(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert result rows: ``COPY`` on Postgres, an executemany elsewhere.

    COPY takes a batch in one stream at a few microseconds a row; row-by-row INSERTs cost a
    statement each and batched multi-row INSERTs a long query to parse, both several times
    slower for the hundreds of rows of an ingest request.
    """
    if not rows:
        return
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        session.execute(
            insert(Result),
            [{k: v for k, v in row.items() if k != "environment_json"} for row in rows],
        )
        return
    driver = conn.connection.driver_connection
    assert driver is not None
    # JSON columns go in as their text (orjson, once per record for the environment).
    with (
        driver.cursor() as cur,
        cur.copy(f"COPY results ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(
                [
                    row["environment_json"]
                    if c == "environment"
                    else orjson.dumps(row[c]).decode()
                    if c == "samples"
                    else row[c]
                    for c in _COPY_COLUMNS
                ]
            )


def _end_jobs(session: Session, ended: list[tuple[int, Any]]) -> None:
    """Mark jobs done (one UPDATE) or error with their reasons (one executemany)."""
    table = cast(Table, Job.__table__)
    now = utcnow()
    conn = session.connection()
    done = [job_id for job_id, error in ended if not error]
    if done:
        # One array parameter on Postgres: hundreds of placeholders cost more to parse.
        ids = (
            table.c.id == any_(bindparam("ids", done, type_=ARRAY(Integer)))
            if conn.dialect.name == "postgresql"
            else table.c.id.in_(done)
        )
        conn.execute(
            update(table).where(ids).values(status=JobStatus.DONE, error=None, finished_at=now)
        )
    failed = [{"job_id": job_id, "reason": str(error)} for job_id, error in ended if error]
    if failed:
        conn.execute(
            update(table)
            .where(table.c.id == bindparam("job_id"))
            .values(status=JobStatus.ERROR, error=bindparam("reason"), finished_at=now),
            failed,
        )
    # The session's Job objects predate these updates.
    session.expire_all()


def completeness(session: Session, *, run_id: int, list_limit: int = 200) -> Completeness:
    """Job counts by status; up to ``list_limit`` pending, missing and skipped benchmarks (the
    skipped ones with their reasons), each list in job order."""
    counts = Counter(
        dict(
            session.execute(
                select(Job.status, func.count()).where(Job.run_id == run_id).group_by(Job.status)
            ).all()
        )
    )
    out = Completeness(total=sum(counts.values()), counts=counts)
    for statuses, target in (
        ((JobStatus.MISSING,), out.missing),
        ((JobStatus.QUEUED, JobStatus.RUNNING), out.pending),
    ):
        stmt = select(Job.model, Job.mode, Job.device, Job.compiler).where(
            Job.run_id == run_id, Job.status.in_(statuses)
        )
        target.extend(
            _name(*row) for row in session.execute(stmt.order_by(Job.id).limit(list_limit))
        )
    if counts[JobStatus.SKIPPED]:
        skipped = (
            select(Job.model, Job.mode, Job.device, Job.compiler, Job.error)
            .where(Job.run_id == run_id, Job.status == JobStatus.SKIPPED)
            .order_by(Job.id)
            .limit(list_limit)
        )
        out.skipped.extend(
            SkippedBenchmark(benchmark=_name(model, mode, device, compiler), reason=reason or "")
            for model, mode, device, compiler, reason in session.execute(skipped)
        )
    return out


def create_ingest_run(
    session: Session,
    *,
    night: date,
    benchmarks: Sequence[BenchmarkSpec],
    torch_spec: str,
    torch_version: str | None,
    torch_git_commit: str | None,
    key: str | None,
    note: str | None = None,
    deadline_s: float | None = None,
) -> tuple[Run, bool]:
    """Create an ``ingest`` run expecting ``benchmarks``; with ``key``, at most once.

    With ``deadline_s`` (the night's deadline, seconds from now), a run whose results have not
    all been posted by then is swept like a night: its missing benchmarks are marked and
    alerted, and detection runs on what came.

    Returns:
        ``(run, created)``: ``created`` is False when ``key`` already named this same run.

    Raises:
        InvalidInput: no benchmarks or a benchmark listed twice.
        Conflict: ``key`` names a run of another night, other benchmarks or another build.
    """

    def made_by_key() -> Run | None:
        existing = ingest_run_by_key(session, key=key) if key is not None else None
        if existing is not None and key is not None:
            _check_same_request(
                session,
                existing,
                key=key,
                night=night,
                benchmarks=benchmarks,
                torch_version=torch_version,
                torch_git_commit=torch_git_commit,
            )
        return existing

    existing = made_by_key()
    if existing is not None:
        return existing, False
    try:
        # A savepoint: a request racing with the same key loses at the unique index (waiting
        # for the winner's commit), and then answers with the winner's run.
        with session.begin_nested():
            run = create_run(
                session,
                night=night,
                benchmarks=benchmarks,
                torch_spec=torch_spec,
                kind=RunKind.INGEST,
                deadline_s=deadline_s,
            )
            run.ingest_key = key
            run.torch_version = torch_version
            run.torch_git_commit = torch_git_commit
            run.note = note
            run.status = RunStatus.RUNNING
            run.started_at = utcnow()
            session.flush()
    except IntegrityError:
        existing = made_by_key()
        if existing is None:
            raise
        return existing, False
    return run, True


def ingest_run_by_key(session: Session, *, key: str) -> Run | None:
    """The ingest run that ``key`` made, or None."""
    return session.scalar(select(Run).where(Run.ingest_key == key))


def _check_same_request(
    session: Session,
    existing: Run,
    *,
    key: str,
    night: date,
    benchmarks: Sequence[BenchmarkSpec],
    torch_version: str | None,
    torch_git_commit: str | None,
) -> None:
    """Raise Conflict unless a repeated ``key`` asks for the run it already made."""
    said = f"key {key!r} already names run {existing.id}"
    if existing.night != night:
        raise Conflict(f"{said} of night {existing.night}, not {night}")
    expected = sorted(j.benchmark for j in list_jobs(session, run_id=existing.id))
    if sorted(b.name for b in benchmarks) != expected:
        raise Conflict(
            f"{said} with other benchmarks ({', '.join(expected)}); a new request needs a new key"
        )
    for name, old, new in (
        ("torch_version", existing.torch_version, torch_version),
        ("torch_git_commit", existing.torch_git_commit, torch_git_commit),
    ):
        if old != new:
            raise Conflict(f"{said} with {name} {old!r}, not {new!r}")


@dataclass(frozen=True)
class IngestOutcome:
    """What an ingest stored: the run, new records, and records the run already had."""

    run: Run
    stored: int
    already_stored: int
    results: int


def _fresh_records(
    run: Run,
    status: dict[Bench, str],
    records: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], int]:
    """The records the run does not hold yet, and how many it already holds.

    Raises:
        Conflict: the run has finished and a record is new (an ``incomplete`` run still takes
            the records of its ``missing`` benchmarks, a ``complete`` or ``incomplete`` one
            those of its ``skipped`` benchmarks).
    """
    fresh: list[dict[str, Any]] = []
    seen: set[Bench] = set()
    already = 0
    for record in records:
        bench = _bench(record)
        if bench in seen or status[bench] in _HOLDS_RESULT:
            already += 1
            continue
        # Data that missed the deadline is still data: an incomplete run takes the records of
        # its missing benchmarks (stored for their series; the night was judged without them,
        # and the missing-data issue is told they came). So is a record of a benchmark its
        # runner had skipped (a shard re-run where the model imports after all).
        late = (run.status == RunStatus.INCOMPLETE and status[bench] == JobStatus.MISSING) or (
            run.status in (RunStatus.COMPLETE, RunStatus.INCOMPLETE)
            and status[bench] == JobStatus.SKIPPED
        )
        if run.status in FINISHED and not late:
            raise Conflict(
                f"run {run.id} is {run.status}; it takes no new results "
                f"({_name(*bench)} was never reported)"
            )
        seen.add(bench)
        fresh.append(record)
    return fresh, already


def ingest_records(
    session: Session, *, run_id: int, records: Sequence[dict[str, Any]]
) -> IngestOutcome:
    """Store suite records as results of ingest run ``run_id`` and end their jobs.

    Args:
        session: an open database session.
        run_id: the ingest run.
        records: suite records (``suite/records.py`` shape), validated by the caller's schema.

    Returns:
        How many records were stored now and how many the run already had.

    Raises:
        NotFound: no such run.
        Conflict: the run is not an ``ingest`` run, or it has finished and a record is new
            (an ``incomplete`` run takes the records of its ``missing`` benchmarks: late data
            is stored, its jobs end ``done``, the run stays ``incomplete``; a finished run takes
            those of its ``skipped`` benchmarks the same way).
        InvalidInput: a record's benchmark is not one the run expects, or a record is malformed
            (see ``store_record``).
    """
    run, jobs = _lock_ingest_run(session, run_id=run_id, posted="results")
    _refuse_unknown(run_id, {_bench(r) for r in records} - jobs.keys())
    fresh, already = _fresh_records(
        run, {bench: status for bench, (_, status) in jobs.items()}, records
    )
    job_ids = {bench: job_id for bench, (job_id, _) in jobs.items()}
    rows = store_records(session, run=run, job_ids=job_ids, records=fresh)
    if fresh:
        _end_jobs(session, [(job_ids[_bench(r)], r.get("error")) for r in fresh])
    stored = len(fresh)
    if stored:
        _detect_when_all_ended(session, run=run)
    return IngestOutcome(run=run, stored=stored, already_stored=already, results=rows)


def _lock_ingest_run(
    session: Session, *, run_id: int, posted: str
) -> tuple[Run, dict[Bench, tuple[int, str]]]:
    """Ingest run ``run_id`` under its row lock (one poster at a time per run: concurrent
    batches are ordered), and its jobs as ``{bench: (job_id, status)}``.

    A job that ended done or error holds its record (this module writes both in one
    transaction), so these plain rows make a request's idempotency check one query.

    Raises:
        NotFound: no such run.
        Conflict: the run is not an ``ingest`` run (``posted`` names what was posted).
    """
    run = get_run(session, run_id)
    if run.kind != RunKind.INGEST:
        raise Conflict(f"run {run_id} is a {run.kind} run; {posted} are posted to ingest runs only")
    session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
    jobs = {
        (model, mode, device, compiler): (job_id, status)
        for job_id, model, mode, device, compiler, status in session.execute(
            select(Job.id, Job.model, Job.mode, Job.device, Job.compiler, Job.status).where(
                Job.run_id == run_id
            )
        )
    }
    return run, jobs


def _named(names: Sequence[str]) -> str:
    """The first ``_NAMED`` of ``names``, and how many more."""
    more = len(names) - _NAMED
    return ", ".join(names[:_NAMED]) + (f" and {more} more" if more > 0 else "")


def _refuse_unknown(run_id: int, unknown: set[Bench]) -> None:
    """Raise InvalidInput naming the benchmarks of a request that run ``run_id`` does not
    expect (sorted); nothing when there are none."""
    if unknown:
        raise InvalidInput(
            f"run {run_id} does not expect {_named(sorted(_name(*b) for b in unknown))}"
            "; list every benchmark when creating the run"
        )


def _detect_when_all_ended(session: Session, *, run: Run) -> None:
    """Move an open ingest run to ``detecting`` once none of its jobs is queued or running:
    detection follows on the workers' periodic sweep (``night.sweep_deadlines``)."""
    if run.status in FINISHED or run.status == RunStatus.DETECTING:
        return
    pending = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.run_id == run.id, Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
    )
    if not pending:
        run.status = RunStatus.DETECTING
        session.flush()


@dataclass(frozen=True)
class Skip:
    """A benchmark a runner withdraws from its ingest run, and why (stripped, non-empty)."""

    model: str
    mode: str
    device: str
    compiler: str
    reason: str

    @property
    def bench(self) -> Bench:
        """``(model, mode, device, compiler)``."""
        return (self.model, self.mode, self.device, self.compiler)


@dataclass(frozen=True)
class SkipOutcome:
    """What a skip request changed: the run, benchmarks skipped now, and those skipped before
    (their first reason kept)."""

    run: Run
    skipped: int
    already_skipped: int


def skip_benchmarks(session: Session, *, run_id: int, skips: Sequence[Skip]) -> SkipOutcome:
    """Withdraw benchmarks of ingest run ``run_id`` that its runner will not measure.

    Each named job still ``queued`` (or ``running``) ends ``skipped``, its reason stored in
    ``Job.error``: it counts as ended for the run's completeness and finish, the deadline sweep
    does not mark it missing (no missing-data alert names it), and the failing streak does not
    read it. A benchmark already skipped is left as it is (idempotent: a retried request
    changes nothing). A record posted for a skipped benchmark later is still stored and its job
    ends ``done`` (:func:`ingest_records`). When no job is left queued or running, the run goes
    ``detecting``, as when its last record is posted. The request is all or nothing: a refused
    one changes no job.

    Args:
        session: an open database session.
        run_id: the ingest run.
        skips: the benchmarks withdrawn, each once, with a non-empty reason (validated by the
            caller's schema).

    Returns:
        How many benchmarks were skipped now and how many had been skipped before.

    Raises:
        NotFound: no such run.
        Conflict: the run is not an ``ingest`` run; or a named benchmark already holds a result
            (``done`` or ``error``: nothing stored is replaced) or went ``missing`` at the run's
            deadline (its missing-data alert stands; a late record is still taken), each named.
        InvalidInput: a benchmark listed twice, a blank reason, or a benchmark the run does not
            expect, each named.
    """
    names = [_name(*s.bench) for s in skips]
    twice = sorted({n for n, count in Counter(names).items() if count > 1})
    if twice:
        raise InvalidInput(f"benchmarks listed twice: {_named(twice)}; skip each once")
    blank = sorted(_name(*s.bench) for s in skips if not s.reason.strip())
    if blank:
        raise InvalidInput(f"a skip needs a reason: none given for {_named(blank)}")
    run, jobs = _lock_ingest_run(session, run_id=run_id, posted="skips")
    _refuse_unknown(run_id, {s.bench for s in skips} - jobs.keys())
    held = sorted(_name(*s.bench) for s in skips if jobs[s.bench][1] in _HOLDS_RESULT)
    if held:
        raise Conflict(
            f"run {run_id} holds results for {_named(held)}; a benchmark with a result is not "
            "skipped (nothing was changed)"
        )
    missed = sorted(_name(*s.bench) for s in skips if jobs[s.bench][1] == JobStatus.MISSING)
    if missed:
        raise Conflict(
            f"run {run_id} marked {_named(missed)} missing at its deadline; its missing-data "
            "alert stands (a late record is still taken; nothing was changed)"
        )
    fresh = [s for s in skips if jobs[s.bench][1] in (JobStatus.QUEUED, JobStatus.RUNNING)]
    if fresh:
        table = cast(Table, Job.__table__)
        session.connection().execute(
            update(table)
            .where(table.c.id == bindparam("job_id"))
            .values(status=JobStatus.SKIPPED, error=bindparam("reason"), finished_at=utcnow()),
            [{"job_id": jobs[s.bench][0], "reason": s.reason.strip()} for s in fresh],
        )
        # The session's Job objects predate this update.
        session.expire_all()
        _detect_when_all_ended(session, run=run)
    return SkipOutcome(run=run, skipped=len(fresh), already_skipped=len(skips) - len(fresh))
