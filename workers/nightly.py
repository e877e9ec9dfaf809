"""One night: plan and enqueue the benchmarks, then detect, confirm, bisect and file.

State machine of a nightly run (rows in the database, so any worker may take the next step)::

    queued → running → detecting ─┬─ nothing alertable ─────────────→ complete | incomplete
                                  └─ regressions → confirmation run → bisect → file → complete

The last job of a run to end moves it to ``detecting`` (a conditional UPDATE, so exactly one
worker does) and enqueues ``night.finish``. Tasks are enqueued only after the transaction that
created their rows has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import date, datetime

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Run
from service.models.base import utcnow
from service.regressions import service as regressions
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from workers.app import queue_for

log = logging.getLogger(__name__)


def plan(
    catalog: Sequence[dict], *, models: Sequence[str] | None = None, modes: Sequence[str] = ("train", "eval"),
    devices: Sequence[str] = ("cpu",), compilers: Sequence[str] = ("eager",), device_class: str | None = None,
) -> list[BenchmarkSpec]:
    """The benchmarks of a night from the suite catalogue (``python -m suite list --json``).

    Raises:
        service.errors.InvalidInput: a requested model is not in the suite.
    """
    from service.errors import InvalidInput

    by_name = {m["name"]: m for m in catalog}
    names = list(models) if models else sorted(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidInput(f"unknown model(s): {', '.join(unknown)}; see `python -m suite list`")
    specs = []
    for name in names:
        info = by_name[name]
        for device in devices:
            if device not in info.get("devices", ["cpu"]):
                continue
            for mode in modes:
                if mode not in info.get("modes", ["train", "eval"]):
                    continue
                for compiler in compilers:
                    specs.append(BenchmarkSpec(model=name, mode=mode, device=device, compiler=compiler,
                                               queue=queue_for(device, device_class)))
    if not specs:
        raise InvalidInput("no benchmark matches the requested models, modes and devices")
    return specs


def create_night(
    *, night: date, benchmarks: Sequence[BenchmarkSpec], torch_spec: str = "current",
    commit_range: list[dict] | None = None, settings: Settings | None = None,
) -> int:
    """Create the night's run and its jobs (committed); returns the run id."""
    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.create_run(
            session, night=night, benchmarks=benchmarks, torch_spec=torch_spec,
            deadline_s=settings.night_deadline_s, commit_range=commit_range,
        )
        return run.id


def create_nights(
    *, night: date, torch_spec: str = "current", models: Sequence[str] | None = None,
    modes: Sequence[str] = ("train", "eval"), compilers: Sequence[str] = ("eager",),
    device_classes: Sequence[str] = ("cpu",),
) -> list[tuple[int, int]]:
    """Create one run per device class (``cpu`` or a GPU class such as ``h100``).

    Returns:
        ``(run_id, job_count)`` per device class, in order.

    Raises:
        service.errors.InvalidInput: a bad torch spec, model or device class.
    """
    from workers import benchmarking
    from workers.environments import parse_torch_spec

    spec = parse_torch_spec(torch_spec)  # a bad spec fails here, before any run exists
    catalog = benchmarking.list_suite()
    created = []
    for device_class in device_classes:
        device = "cpu" if device_class == "cpu" else "cuda"
        specs = plan(catalog, models=models, modes=modes, devices=[device], compilers=compilers,
                     device_class=None if device == "cpu" else device_class)
        created.append((create_night(night=night, benchmarks=specs, torch_spec=spec), len(specs)))
    return created


def dispatch_scheduled(*, night: date | None = None, settings: Settings | None = None) -> list[int]:
    """The beat-scheduled night (no GitHub Actions): create and enqueue tonight's runs from the
    ``schedule_*`` settings. Returns the run ids."""
    settings = settings or get_settings()
    created = create_nights(
        night=night or utcnow().date(), torch_spec=settings.schedule_torch_spec,
        models=settings.schedule_models or None, modes=settings.schedule_modes,
        device_classes=settings.schedule_device_classes,
    )
    for run_id, _ in created:
        enqueue_jobs(run_id)
    return [run_id for run_id, _ in created]


def queued_jobs(run_id: int) -> list[tuple[int, str, str]]:
    """``(job_id, queue, benchmark)`` of the run's jobs still queued, in id order."""
    with session_scope() as session:
        return [(j.id, j.queue, j.benchmark) for j in runs.list_jobs(session, run_id=run_id)
                if j.status == "queued"]


def send_job(job_id: int, queue: str) -> None:
    """Enqueue ``bench.run`` for one job (runs it here, now, in the embedded mode)."""
    from workers import tasks

    tasks.run_benchmark.apply_async(args=[job_id], queue=queue)


def enqueue_jobs(run_id: int) -> None:
    """Send one ``bench.run`` task per queued job of the run.

    Deadlines are not ETA tasks (an ETA beyond the broker's visibility timeout gets redelivered
    over and over on Redis); the periodic ``night.sweep_deadlines`` task checks them instead.
    """
    for job_id, queue, _ in queued_jobs(run_id):
        send_job(job_id, queue)


def threshold_for(settings: Settings) -> Callable[[str, str], float]:
    return lambda metric, benchmark: settings.threshold_for(metric, benchmark)


def finish(run_id: int, *, settings: Settings | None = None) -> None:
    """The step after a run's last job: detect (nightly) or apply the confirmation (confirm)."""
    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        kind, parent_id = run.kind, run.parent_run_id
    if kind == "confirm" and parent_id is not None:
        _after_confirmation(parent_id, run_id, settings)
    elif kind in ("nightly", "ingest"):
        _detect(run_id, settings)
    else:
        with session_scope() as session:
            runs.finish_run(session, run=runs.get_run(session, run_id))


def _detect(run_id: int, settings: Settings) -> None:
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        assessed = regressions.assess_run(
            session, run=run, threshold_for=threshold_for(settings),
            baseline_nights=settings.baseline_nights, unstable=unstable_benchmarks(session),
        )
        regressions.record_regressions(session, run=run, assessed=assessed,
                                       threshold_for=threshold_for(settings))
        pending = regressions.pending_regressions(session, run_id=run_id)
        if run.kind == "ingest":
            # Results posted by runners: no re-run here; the next night confirms instead.
            for r in pending:
                r.confirmation = "not_possible"
                r.reason += " No confirmation re-run for posted results; the next night decides."
            pending = []
        benchmarks = sorted({(r.model, r.mode, r.device, r.compiler) for r in pending})
        persisted = regressions.reproduced_regressions(session, run_id=run_id)
        confirm_id = None
        if benchmarks:
            jobs = {j.benchmark: j for j in runs.list_jobs(session, run_id=run_id)}
            specs = []
            for model, mode, device, compiler in benchmarks:
                spec = BenchmarkSpec(model=model, mode=mode, device=device, compiler=compiler)
                queue = jobs[spec.name].queue if spec.name in jobs else queue_for(device)
                specs.append(BenchmarkSpec(model=model, mode=mode, device=device, compiler=compiler,
                                           queue=queue))
            confirm = runs.create_run(
                session, night=run.night, benchmarks=specs, torch_spec=run.torch_spec,
                kind="confirm", parent_run_id=run.id, deadline_s=settings.night_deadline_s,
            )
            confirm_id = confirm.id
        elif not persisted:
            runs.finish_run(session, run=run)
    if confirm_id is not None:
        log.info("run %s: %d benchmark(s) flagged; confirming in run %s", run_id, len(benchmarks), confirm_id)
        enqueue_jobs(confirm_id)
    elif persisted:
        # Steps that already persisted over earlier nights need no re-run: straight to triage.
        triage(run_id, settings=settings)


def _after_confirmation(parent_id: int, confirm_id: int, settings: Settings) -> None:
    with session_scope() as session:
        parent = runs.get_run(session, parent_id)
        confirm_run = runs.get_run(session, confirm_id)
        regressions.apply_confirmation(
            session, parent=parent, confirm_run=confirm_run, threshold_for=threshold_for(settings),
            baseline_nights=settings.baseline_nights,
        )
        runs.finish_run(session, run=confirm_run)
    triage(parent_id, settings=settings)


def resolve_commit_range(run_id: int, *, settings: Settings | None = None) -> list[dict] | None:
    """The night's commit range, stored on the run: from the torch commit of the previous
    night, or, when a step raised tonight began on an earlier night, of the night two before
    that step's first night (:func:`service.regressions.service.range_start`) → tonight's.

    From a local clone (``source_repo_path``) when configured, else from GitHub's compare API
    (``source_github_repository``). Returns None, with a reason in the run's note, when either
    commit is unknown or the range cannot be read; detection and filing go on without it.
    """
    from workers import commits

    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        if run.commit_range is not None:
            return run.commit_range
        previous = regressions.range_start(session, run=run)
        good = previous.torch_git_commit if previous else None
        bad = run.torch_git_commit
        if previous is not None and previous.id != run.previous_run_id:
            _note_in(run, f"commit range starts at night {previous.night}: a step raised "
                          "tonight began on an earlier night")
    if not good or not bad or good == bad:
        reason = "no earlier night with a known commit" if not good else (
            "tonight's build has no git commit" if not bad else "same commit as the previous night")
        _note(run_id, f"commit range: none ({reason})")
        return None
    try:
        if settings.source_repo_path is not None:
            commit_list = commits.local_commit_range(settings.source_repo_path, good, bad)
        elif settings.source_github_repository:
            import github

            auth = github.Auth.Token(settings.github_token.get_secret_value()) if settings.github_token else None
            client = github.Github(base_url=settings.github_api_url, auth=auth, timeout=30)
            repo = client.get_repo(settings.source_github_repository)
            commit_list = commits.github_commit_range(repo, good, bad, with_files=False)
        else:
            _note(run_id, "commit range: none (no source repository configured)")
            return None
    except Exception as exc:  # noqa: BLE001 - any failure here must not stop the night
        log.warning("run %s: commit range %s..%s unavailable: %s", run_id, good[:10], bad[:10], exc)
        _note(run_id, f"commit range {good[:10]}..{bad[:10]} unavailable: {exc}")
        return None
    payload = [c.as_json() for c in commit_list]
    with session_scope() as session:
        runs.get_run(session, run_id).commit_range = payload
    return payload


def _note(run_id: int, text: str) -> None:
    with session_scope() as session:
        _note_in(runs.get_run(session, run_id), text)


def _note_in(run: Run, text: str) -> None:
    run.note = f"{run.note}\n{text}" if run.note else text


def triage(run_id: int, *, settings: Settings | None = None) -> None:
    """Bisect and file the run's reproduced regressions, then close the run."""
    from workers import bisecting, issues

    settings = settings or get_settings()
    resolve_commit_range(run_id, settings=settings)
    # Bisection of the confirmed latency regressions (workers/bisecting.py): while one runs,
    # its last step calls triage again, which then files with its outcome.
    night_bisection = bisecting.bisect_for_night(run_id, settings=settings)
    if night_bisection.pending:
        return
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        alert_id = _regression_alert_id(session, run)
        if alert_id is not None:
            issues.file_alert(session, alert_id=alert_id, settings=settings,
                              bisection=night_bisection.result)
        runs.finish_run(session, run=run)


def _regression_alert_id(session, run: Run) -> int | None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from service.models import Alert, Regression

    return session.scalar(
        select(Alert.id).join(Regression, Regression.alert_id == Alert.id).where(
            Alert.run_id == run.id, Alert.kind == "regression", Regression.confirmation == "reproduced",
        ).limit(1)
    )


def check_deadline(run_id: int, *, now: datetime | None = None) -> None:
    """At the run's deadline: jobs that never reported become ``missing`` with an alert; the
    run then finishes with what it has."""
    with session_scope() as session:
        missing = runs.mark_missing(session, run_id=run_id, now=now)
        proceed = bool(missing) and runs.begin_finishing(session, run_id=run_id)
    if missing:
        log.warning("run %s: %d job(s) missing at the deadline", run_id, len(missing))
    if proceed:
        from workers import tasks

        tasks.finish_run.apply_async(args=[run_id], queue="control")


def sweep_deadlines(now: datetime | None = None) -> list[int]:
    """Check every unfinished run whose deadline has passed, and detect regressions in runs
    posted through the API once all their results are in; returns the ids handled."""
    from sqlalchemy import select

    now = now or utcnow()
    with session_scope() as session:
        due = list(session.scalars(select(Run.id).where(
            Run.status.in_(("queued", "running")), Run.deadline_at.is_not(None), Run.deadline_at < now,
        )))
        posted = list(session.scalars(select(Run.id).where(
            Run.kind == "ingest", Run.status == "detecting")))
    for run_id in due:
        check_deadline(run_id, now=now)
    for run_id in posted:  # runs whose results were posted to the API, every benchmark in
        finish(run_id)
    return due + posted


def unstable_benchmarks(session) -> frozenset[str]:  # type: ignore[no-untyped-def]
    """Benchmark names marked unstable by ``nightbench suite stability``: shown, not alerted."""
    from service.stability.service import unstable_benchmarks as stored

    names = set()
    for model, mode, device, compiler in stored(session):
        name = f"{model}:{mode}:{device}"
        names.add(name if compiler == "eager" else f"{name}:{compiler}")
    return frozenset(names)
