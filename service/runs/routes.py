"""Runs: listing (cursor pages), detail, comparison, and ingest for runners that post results."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from sqlalchemy import select

from service.api import Cursor, FilterText, Id, Limit, Night, errors, url
from service.deps import SessionDep, SettingsDep, TokenDep
from service.models import Alert, Job, JobStatus, Run
from service.runs import ingest, processes
from service.runs.compare import compare_runs
from service.runs.schemas import (
    CompareRead,
    CompletenessRead,
    IngestRead,
    ProcessesCreate,
    ProcessesRead,
    RecordIn,
    RunCreate,
    RunRead,
    RunsPage,
    SkipIn,
    SkippedOut,
    SkippedRead,
)
from service.runs.service import BenchmarkSpec, get_run, run_results

router = APIRouter(prefix="/api/runs", tags=["runs"])


def summary(run: Run) -> dict[str, Any]:
    """A run as its summary reads it (the ``RunSummaryRead`` fields)."""
    return {
        "id": run.id,
        "night": run.night,
        "kind": run.kind,
        "status": run.status,
        "torch_spec": run.torch_spec,
        "torch_version": run.torch_version,
        "torch_git_commit": run.torch_git_commit,
        "expected_jobs": run.expected_jobs,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "url": url(f"/api/runs/{run.id}"),
    }


def _completeness(c: ingest.Completeness) -> CompletenessRead:
    return CompletenessRead(
        total=c.total,
        queued=c.counts["queued"],
        running=c.counts["running"],
        done=c.counts["done"],
        error=c.counts["error"],
        missing=c.counts["missing"],
        skipped=c.counts["skipped"],
        ended_fraction=c.ended / c.total if c.total else 0.0,
        complete=c.complete,
        pending=c.pending,
        missing_benchmarks=c.missing,
        skipped_benchmarks=[SkippedRead(benchmark=s.benchmark, reason=s.reason) for s in c.skipped],
    )


@router.get("", response_model=RunsPage, responses=errors(422))
def list_runs(
    session: SessionDep,
    limit: Limit = 50,
    cursor: Cursor = None,
    kind: FilterText = None,
    status: FilterText = None,
    since: Night = None,
    until: Night = None,
) -> dict[str, Any]:
    """Runs, newest first, ``limit`` per page; follow ``next_cursor`` for older ones."""
    stmt = select(Run).order_by(Run.id.desc()).limit(limit + 1)
    if cursor is not None:
        stmt = stmt.where(Run.id < cursor)
    if kind is not None:
        stmt = stmt.where(Run.kind == kind)
    if status is not None:
        stmt = stmt.where(Run.status == status)
    if since is not None:
        stmt = stmt.where(Run.night >= since)
    if until is not None:
        stmt = stmt.where(Run.night <= until)
    runs = list(session.scalars(stmt))
    more = len(runs) > limit
    runs = runs[:limit]
    return {"items": [summary(r) for r in runs], "next_cursor": runs[-1].id if more else None}


@router.get("/{run_id}", response_model=RunRead, responses=errors(404, 422))
def read_run(run_id: Id, session: SessionDep) -> dict[str, Any]:
    """A run with its results, errors and completeness (skipped benchmarks there, with their
    reasons: they are not errors)."""
    run = get_run(session, run_id)
    results = run_results(session, run_id=run_id)
    failed_jobs = session.scalars(
        select(Job)
        .where(Job.run_id == run_id, Job.status.in_((JobStatus.ERROR, JobStatus.MISSING)))
        .order_by(Job.id)
    )
    errs = [
        {"benchmark": r.benchmark, "source": "result", "status": "error", "error": r.error}
        for r in results
        if r.error
    ]
    # A job that went missing, or failed before storing an error result, has only its reason.
    reported = {e["benchmark"] for e in errs}
    errs += [
        {
            "benchmark": j.benchmark,
            "source": "job",
            "status": j.status,
            "error": j.error or j.status,
        }
        for j in failed_jobs
        if j.benchmark not in reported
    ]
    alerts = session.scalars(select(Alert).where(Alert.run_id == run_id).order_by(Alert.id))
    return {
        **summary(run),
        "note": run.note,
        "completeness": _completeness(ingest.completeness(session, run_id=run_id)),
        "results": [
            {
                "id": r.id,
                "benchmark": r.benchmark,
                "model": r.model,
                "mode": r.mode,
                "device": r.device,
                "compiler": r.compiler,
                "metric": r.metric,
                "unit": r.unit,
                "median": r.median,
                "iqr": r.iqr,
                "samples": len(r.samples or []),
                "series_key": r.series_key,
                "machine_id": r.machine_id,
                "error": r.error,
            }
            for r in results
        ],
        "errors": errs,
        "alerts": [
            {"id": a.id, "kind": a.kind, "status": a.status, "url": url(f"/api/alerts/{a.id}")}
            for a in alerts
        ],
    }


@router.get("/{a}/compare/{b}", response_model=CompareRead, responses=errors(404, 422))
def compare(
    a: Id,
    b: Id,
    session: SessionDep,
    settings: SettingsDep,
    alpha: float = Query(0.01, gt=0, lt=1, description="significance level"),
) -> dict[str, Any]:
    """Per benchmark metric of both runs: ratio of medians (b / a) and the Mann-Whitney U
    significance over processes (each run's result and its re-runs), one median per process."""
    run_a, run_b = get_run(session, a), get_run(session, b)
    result = compare_runs(
        session,
        a=a,
        b=b,
        alpha=alpha,
        threshold_for=lambda m, bench: settings.threshold_for(m, bench),
    )
    return {
        "a": summary(run_a),
        "b": summary(run_b),
        "alpha": alpha,
        "comparisons": [c.__dict__ for c in result.comparisons],
        "only_in_a": result.only_in_a,
        "only_in_b": result.only_in_b,
        "errors": result.errors,
    }


@router.post(
    "/{run_id}/processes",
    response_model=ProcessesRead,
    status_code=202,
    responses=errors(400, 401, 404, 409, 422),
)
def request_processes(
    run_id: Id, body: ProcessesCreate, session: SessionDep, token: TokenDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue more processes of a finished nightly run, on its own build, until each of its
    benchmarks has ``processes`` (measured or queued), so that a comparison has replicates
    (see ``GET /api/runs/{a}/compare/{b}``). Creates replicate runs (kind ``replicate``,
    ``parent_run_id`` = the run); the workers' periodic sweep sends their jobs. Asking again
    adds only what is still short. Needs a token."""
    request = processes.request_processes(
        session, run_id=run_id, processes=body.processes, deadline_s=settings.night_deadline_s
    )
    if not request.runs:
        dispatch = "nothing to send: every benchmark has its processes"
    elif settings.embedded:
        dispatch = (
            "no workers (embedded): `nightbench runs compare A B --processes N` measures them"
        )
    else:
        dispatch = "the workers' next deadline sweep (night.sweep_deadlines)"
    return {
        **request.__dict__,
        "benchmarks": [b.__dict__ for b in request.benchmarks],
        "dispatch": dispatch,
    }


# A run of the 20000 benchmarks RunCreate allows is ~2.4 MB of JSON; a body past this is refused
# unread (413) instead of parsed (a 16 MiB object of unknown keys held the event loop 4 s).
RUN_CREATE_MAX_BYTES = 4 * 1024 * 1024


@router.post(
    "",
    openapi_extra={"x-max-request-bytes": RUN_CREATE_MAX_BYTES},
    response_model=RunRead,
    status_code=201,
    responses={
        **errors(400, 401, 409, 413, 422),
        200: {"model": RunRead, "description": "the run this key made"},
    },
)
def create_run(
    body: RunCreate, session: SessionDep, token: TokenDep, response: Response, settings: SettingsDep
) -> dict[str, Any]:
    """Create a run whose results a runner will post (kind ``ingest``). Needs a token."""
    specs = [
        BenchmarkSpec(
            model=b.model,
            mode=b.mode,
            device=b.device,
            compiler=b.compiler,
            batch_size=b.batch_size,
            queue="ingest",
        )
        for b in body.benchmarks
    ]
    run, created = ingest.create_ingest_run(
        session,
        night=body.night,
        benchmarks=specs,
        torch_spec=body.torch_spec,
        torch_version=body.torch_version,
        torch_git_commit=body.torch_git_commit,
        key=body.key,
        note=body.note,
        deadline_s=settings.night_deadline_s,
    )
    if not created:
        response.status_code = 200
    return read_run(run.id, session)


@router.post(
    "/{run_id}/results", response_model=IngestRead, responses=errors(400, 401, 404, 409, 422)
)
def post_results(
    run_id: Id,
    records: Annotated[
        list[RecordIn], Body(min_length=1, max_length=5000, description="suite records, 1 to 5000")
    ],
    session: SessionDep,
    token: TokenDep,
) -> dict[str, Any]:
    """Store suite records (the ``python -m suite run`` JSON, a list of them) in an ingest
    run. Idempotent: a benchmark the run already holds is left as stored. Needs a token."""
    outcome = ingest.ingest_records(
        session, run_id=run_id, records=[r.model_dump() for r in records]
    )
    return {
        "run_id": run_id,
        "stored": outcome.stored,
        "already_stored": outcome.already_stored,
        "results": outcome.results,
        "status": outcome.run.status,
        "completeness": _completeness(ingest.completeness(session, run_id=run_id)),
    }


# 20000 withdrawals (every benchmark a run may list) with short reasons fit; a request of long
# reasons for that many is refused unread (413): send it in parts.
SKIPPED_MAX_BYTES = 4 * 1024 * 1024


@router.post(
    "/{run_id}/skipped",
    openapi_extra={"x-max-request-bytes": SKIPPED_MAX_BYTES},
    response_model=SkippedOut,
    responses=errors(400, 401, 404, 409, 413, 422),
)
def post_skipped(
    run_id: Id,
    skips: Annotated[
        list[SkipIn],
        Body(
            min_length=1,
            max_length=20000,
            description="benchmarks the runner will not measure, 1 to 20000, each with a reason",
        ),
    ],
    session: SessionDep,
    token: TokenDep,
) -> dict[str, Any]:
    """Withdraw benchmarks of an ingest run that its runner cannot measure (a model that does
    not import there, a mode its device does not offer), each with the reason. Their jobs end
    ``skipped``: ended for the run's completeness, never marked missing, never a failure; a
    record posted for one later is still stored. Idempotent: one skipped before is left as it
    is. All or nothing: 409 naming the benchmarks that already hold a result or went missing at
    the deadline, 422 naming those the run does not expect. Needs a token."""
    outcome = ingest.skip_benchmarks(
        session,
        run_id=run_id,
        skips=[
            ingest.Skip(
                model=s.model, mode=s.mode, device=s.device, compiler=s.compiler, reason=s.reason
            )
            for s in skips
        ],
    )
    return {
        "run_id": run_id,
        "skipped": outcome.skipped,
        "already_skipped": outcome.already_skipped,
        "status": outcome.run.status,
        "completeness": _completeness(ingest.completeness(session, run_id=run_id)),
    }
