"""Runs whose results a runner posts over the API (``kind`` = ``ingest``).

A runner creates the run with the benchmarks it will measure, then posts suite records in
batches. Both steps are idempotent: a repeated run key returns the same run, and a record whose
benchmark the run already holds is left as stored (``store_record``'s rule), so a runner may
retry a request whose answer it lost. Records are stored in bulk (:func:`store_records`),
writing the rows ``store_record`` would. The run closes (``complete``/``incomplete``) when every
benchmark has reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, cast

import orjson
from sqlalchemy import ARRAY, Integer, Table, any_, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidInput
from service.models import Job, Result, Run
from service.models.base import utcnow
from service.results.service import get_or_create_machine, machine_fingerprint, series_key
from service.runs.service import BenchmarkSpec, create_run, get_run

FINISHED = ("complete", "incomplete", "failed")
Bench = tuple[str, str, str, str]


@dataclass
class Completeness:
    """Job counts of a run by status, and the benchmarks still pending or missing."""

    total: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    pending: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ended(self) -> int:
        return self.counts["done"] + self.counts["error"] + self.counts["missing"]

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.ended == self.total and not self.counts["missing"]


def _name(model: str, mode: str, device: str, compiler: str) -> str:
    name = f"{model}:{mode}:{device}"
    return name if compiler == "eager" else f"{name}:{compiler}"


def _bench(record: dict[str, Any]) -> Bench:
    return (record["model"], record["mode"], record["device"], record.get("compiler") or "eager")


def store_records(
    session: Session, *, run: Run, job_ids: dict[Bench, int], records: Sequence[dict[str, Any]],
) -> int:
    """Store many suite records of ``run`` at once: the rows ``store_record`` writes for each.

    ``store_record`` costs several round trips per record (its idempotency check, the machine
    lookup, the insert); an ingest batch of hundreds of records instead checks idempotency once
    (the caller), looks up each distinct machine once, and inserts every result in one
    executemany. The rows are the same: same series keys, machines, error results.

    Args:
        run: the run the records belong to.
        job_ids: the run's job id per ``(model, mode, device, compiler)``; every record's
            benchmark must be there.
        records: suite records not yet stored in the run (``suite/records.py`` shape).

    Returns:
        The number of result rows written.

    Raises:
        InvalidInput: a metric without samples or malformed (as ``store_record``).
    """
    machines: dict[tuple[str, str], Any] = {}
    rows: list[dict[str, Any]] = []
    now = utcnow()
    for record in records:
        model, mode, device, compiler = _bench(record)
        environment = dict(record.get("environment") or {})
        environment_json = orjson.dumps(environment).decode()
        machine = None
        if environment:
            fp = (machine_fingerprint(environment, device), device)
            machine = machines.get(fp)
            if machine is None:
                machine = machines[fp] = get_or_create_machine(
                    session, environment=environment, device=device)
        common = dict(
            run_id=run.id, job_id=job_ids[(model, mode, device, compiler)],
            machine_id=machine.id if machine else None, night=run.night, model=model, mode=mode,
            device=device, compiler=compiler, batch_size=record.get("batch_size"),
            environment=environment, environment_json=environment_json,
            benchmark_version=record.get("benchmark_version"),
            created_at=now, median=None, iqr=None, series_key=None, error=None,
        )
        if record.get("error"):
            rows.append({**common, "metric": "latency", "unit": "ms", "samples": [],
                         "sample_count": 0, "error": str(record["error"])})
            continue
        for m in record.get("metrics", []):
            try:
                samples = [float(x) for x in m["samples"]]
                metric, unit = str(m["metric"]), str(m["unit"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidInput(f"{model}:{mode}:{device}: malformed metric {m!r}: {exc}") from exc
            if not samples:
                raise InvalidInput(f"{model}:{mode}:{device}: metric {metric!r} has no samples")
            key = series_key(
                model=model, mode=mode, device=device, compiler=compiler, metric=metric,
                batch_size=record.get("batch_size"),
                benchmark_version=record.get("benchmark_version"),
                machine=machine.fingerprint if machine else "")
            rows.append({**common, "metric": metric, "unit": unit, "samples": samples,
                         "sample_count": len(samples), "median": m.get("median"),
                         "iqr": m.get("iqr"), "series_key": key})
    _insert_results(session, rows)
    first_env = next((r.get("environment") for r in records if r.get("environment")), None)
    if first_env and run.torch_version is None:
        run.torch_version = first_env.get("torch_version")
        run.torch_git_commit = first_env.get("torch_git_version")
    session.flush()
    return len(rows)


_COPY_COLUMNS = ("run_id", "job_id", "machine_id", "night", "model", "mode", "device", "compiler",
                 "batch_size", "metric", "unit", "samples", "sample_count", "median", "iqr",
                 "environment", "benchmark_version", "series_key", "error", "created_at")


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
        session.execute(insert(Result), [
            {k: v for k, v in row.items() if k != "environment_json"} for row in rows])
        return
    driver = conn.connection.driver_connection
    assert driver is not None
    # JSON columns go in as their text (orjson, once per record for the environment).
    with driver.cursor() as cur, cur.copy(
            f"COPY results ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([
                row["environment_json"] if c == "environment"
                else orjson.dumps(row[c]).decode() if c == "samples" else row[c]
                for c in _COPY_COLUMNS])


def _end_jobs(session: Session, ended: list[tuple[int, Any]]) -> None:
    """Mark jobs done (one UPDATE) or error with their reasons (one executemany)."""
    table = cast(Table, Job.__table__)
    now = utcnow()
    conn = session.connection()
    done = [job_id for job_id, error in ended if not error]
    if done:
        # One array parameter on Postgres: hundreds of placeholders cost more to parse.
        ids = (table.c.id == any_(bindparam("ids", done, type_=ARRAY(Integer)))
               if conn.dialect.name == "postgresql" else table.c.id.in_(done))
        conn.execute(update(table).where(ids).values(status="done", error=None, finished_at=now))
    failed = [{"job_id": job_id, "reason": str(error)} for job_id, error in ended if error]
    if failed:
        conn.execute(update(table).where(table.c.id == bindparam("job_id"))
                     .values(status="error", error=bindparam("reason"), finished_at=now), failed)
    # The session's Job objects predate these updates.
    session.expire_all()


def completeness(session: Session, *, run_id: int, list_limit: int = 200) -> Completeness:
    """Job counts by status; up to ``list_limit`` pending and missing benchmark names."""
    counts = Counter(dict(session.execute(
        select(Job.status, func.count()).where(Job.run_id == run_id).group_by(Job.status)).all()))
    out = Completeness(total=sum(counts.values()), counts=counts)
    for status, target in (("missing", out.missing), (None, out.pending)):
        stmt = select(Job.model, Job.mode, Job.device, Job.compiler).where(Job.run_id == run_id)
        stmt = (stmt.where(Job.status == status) if status
                else stmt.where(Job.status.in_(("queued", "running"))))
        target.extend(_name(*row) for row in session.execute(stmt.order_by(Job.id).limit(list_limit)))
    return out


def create_ingest_run(
    session: Session, *, night: date, benchmarks: Sequence[BenchmarkSpec], torch_spec: str,
    torch_version: str | None, torch_git_commit: str | None, key: str | None,
    note: str | None = None,
) -> tuple[Run, bool]:
    """Create an ``ingest`` run expecting ``benchmarks``; with ``key``, at most once.

    Returns:
        ``(run, created)``: ``created`` is False when ``key`` already named a run.

    Raises:
        InvalidInput: no benchmarks or a benchmark listed twice.
        Conflict: ``key`` names a run of another night.
    """
    if key is not None:
        existing = session.scalar(
            select(Run).where(Run.kind == "ingest", Run.options["ingest_key"].as_string() == key))
        if existing is not None:
            if existing.night != night:
                raise Conflict(f"key {key!r} already names run {existing.id} of night "
                               f"{existing.night}, not {night}")
            return existing, False
    run = create_run(session, night=night, benchmarks=benchmarks, torch_spec=torch_spec,
                     kind="ingest", options={"ingest_key": key} if key else {})
    run.torch_version = torch_version
    run.torch_git_commit = torch_git_commit
    run.note = note
    run.status = "running"
    run.started_at = utcnow()
    session.flush()
    return run, True


@dataclass(frozen=True)
class IngestOutcome:
    run: Run
    stored: int
    already_stored: int
    results: int


def ingest_records(session: Session, *, run_id: int, records: Sequence[dict[str, Any]]) -> IngestOutcome:
    """Store suite records as results of ingest run ``run_id`` and end their jobs.

    Args:
        records: suite records (``suite/records.py`` shape), validated by the caller's schema.

    Returns:
        How many records were stored now and how many the run already had.

    Raises:
        NotFound: no such run.
        Conflict: the run is not an ``ingest`` run, or it has finished and a record is new.
        InvalidInput: a record's benchmark is not one the run expects, or a record is malformed
            (see ``store_record``).
    """
    run = get_run(session, run_id)
    if run.kind != "ingest":
        raise Conflict(f"run {run_id} is a {run.kind} run; results are posted to ingest runs only")
    # One poster at a time per run: the row lock orders concurrent batches of the same run.
    session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
    # Every job of the run, as plain rows: a job that ended done or error holds its record (this
    # module writes both in one transaction), which makes the idempotency check one query.
    jobs = {(model, mode, device, compiler): (job_id, status)
            for job_id, model, mode, device, compiler, status in session.execute(
                select(Job.id, Job.model, Job.mode, Job.device, Job.compiler, Job.status)
                .where(Job.run_id == run_id))}
    wanted = {_bench(r) for r in records}
    unknown = sorted(_name(*b) for b in wanted - jobs.keys())
    if unknown:
        raise InvalidInput(f"run {run_id} does not expect {', '.join(unknown[:10])}"
                           + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
                           + "; list every benchmark when creating the run")
    fresh: list[dict[str, Any]] = []
    seen: set[Bench] = set()
    already = 0
    for record in records:
        bench = _bench(record)
        if bench in seen or jobs[bench][1] in ("done", "error"):
            already += 1
            continue
        if run.status in FINISHED:
            raise Conflict(f"run {run_id} is {run.status}; it takes no new results "
                           f"({_name(*bench)} was never reported)")
        seen.add(bench)
        fresh.append(record)
    job_ids = {bench: job_id for bench, (job_id, _) in jobs.items()}
    rows = store_records(session, run=run, job_ids=job_ids, records=fresh)
    if fresh:
        _end_jobs(session, [(job_ids[_bench(r)], r.get("error")) for r in fresh])
    stored = len(fresh)
    if stored and not session.scalar(select(func.count()).select_from(Job).where(
            Job.run_id == run_id, Job.status.in_(("queued", "running")))):
        # Every benchmark reported: detection follows on the workers' periodic sweep.
        run.status = "detecting"
        session.flush()
    return IngestOutcome(run=run, stored=stored, already_stored=already, results=rows)
