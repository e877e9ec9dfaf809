"""The system's state from the stored rows: each machine class's last night, the runs still
open (and those past their deadline), the workers seen lately, the alerts whose issue is not
filed yet, the broker's queue lengths (and, when a queue holds messages, the workers listening
to it), the benchmarks the nightly stability re-check darkened or un-darkened in the last week,
and the problems to tell.

A machine class is the queue its jobs go to (``cpu``, ``gpu.h100``; ``ingest`` for results
posted by runners): the one name dispatch, workers and the deployment share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.metrics import ALERT_METRICS, METRIC_TABLE, exact_levels, metric
from service.models import (
    FILING_UNFILED,
    PROBE_ENDED,
    RUN_OPEN,
    ABStatus,
    ABTest,
    Alert,
    AlertKind,
    Bisection,
    BisectionStatus,
    FilingState,
    Job,
    JobStatus,
    Probe,
    ReportState,
    Result,
    Run,
    RunKind,
)
from service.models.base import utcnow
from service.regressions.failing import FailingBenchmark, failing_benchmarks
from service.regressions.sensitivity import is_coarse, series_smallest_change, window_noise_of
from service.regressions.unstable import alerts_from
from service.results.points import HISTORY_KINDS
from service.runs.service import finish_owed, idle_queued_jobs
from service.stability.recheck import stability_changes
from service.stability.service import list_stability
from service.status.broker import BrokerState, broker_state

WORKER_WINDOW = timedelta(hours=1)
_KIND_WORDS = {"missing_data": "missing-data ", "failing": "failing-benchmark "}
STABILITY_WINDOW = timedelta(days=7)  # the status lists stability changes of the last week
BISECTION_STALE = timedelta(hours=24)  # a bisection running longer is a problem to tell


@dataclass(frozen=True)
class MachineClassStatus:
    """A machine class's last measured night (``nights_behind``: days from it to today)."""

    queue: str
    last_night: date
    last_result_at: datetime | None
    nights_behind: int


@dataclass(frozen=True)
class OpenRun:
    """A run not yet finished: its age (s since created) and whether its deadline passed."""

    id: int
    kind: str
    night: date
    status: str
    age_s: float
    deadline_at: datetime | None
    overdue: bool
    jobs_pending: int


@dataclass(frozen=True)
class WorkerSeen:
    """A worker that started a job in the last hour (name as Celery gives it, ``name@host``)."""

    worker: str
    last_started_at: datetime
    jobs: int


@dataclass(frozen=True)
class PendingFiling:
    """An alert whose issue is not filed yet: ``pending``, or ``failed_retrying`` after an error.

    ``kind``: ``regression``, ``missing_data`` (its issue, or the comment that its data came),
    or ``failing`` (a benchmark failing night after night).

    ``age_s``: seconds since its filing became pending; ``next_attempt_at``: when the retry
    tries again (backoff).
    """

    alert_id: int
    run_id: int
    night: date
    state: str
    attempts: int
    last_error: str | None
    pending_since: datetime | None
    age_s: float
    next_attempt_at: datetime | None
    kind: str = AlertKind.REGRESSION


@dataclass(frozen=True)
class StabilityChange:
    """A benchmark the nightly stability re-check darkened (``to`` unstable: shown, alerted only
    beyond its noise) or un-darkened (``to`` stable: alerts again) on a recent night."""

    benchmark: str
    machine_id: int
    run_id: int
    night: date
    from_verdict: str
    to_verdict: str
    source: str


@dataclass(frozen=True)
class UnstableBenchmark:
    """A benchmark marked unstable on a machine now: shown, and alerted only on a latency
    regression of at least ``alerts_from`` (a fraction; None: never, its spread unknown).
    ``still_alerts_on``: the metrics its device measures that the host's speed does not move
    (peak memory, instruction counts), which alert as on any benchmark."""

    benchmark: str
    machine_id: int
    spread: float | None
    alerts_from: float | None
    still_alerts_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class CoarseSeries:
    """A series whose noise lets the detector see only steps above its threshold.

    Attributes:
        benchmark: ``model:mode:device[:compiler]``.
        metric: the metric.
        machine_id: the machine it is measured on (None: unknown).
        threshold: its threshold (fraction).
        smallest_change: the smallest step raised within three nights 95% of the time at its
            noise (fraction; :mod:`service.regressions.sensitivity`).
        noise: its night-to-night noise (fraction).
        nights: nights in its baseline window.
    """

    benchmark: str
    metric: str
    machine_id: int | None
    threshold: float
    smallest_change: float
    noise: float
    nights: int


RESEND_AFTER_S = 600.0  # Settings.step_resend_after_s's default


@dataclass(frozen=True)
class SystemStatus:
    """The whole answer; ``problems`` holds one line per thing a person should look at.

    ``queues``: messages waiting in each Celery queue of the broker, or None without a broker
    (or when it could not be read: then a problem says so). ``listeners``: when a queue held
    messages, the workers that answered consuming each queue (None: nobody was asked).
    ``unstable``: the benchmarks marked unstable now, of ``judged`` stored verdicts (benchmark
    and machine): how much of the suite alerts only beyond its noise. ``coarse``: the series
    whose smallest detectable change is above their threshold (:func:`coarse_series`), of
    ``sensed`` series with a baseline.
    """

    now: datetime
    machine_classes: list[MachineClassStatus]
    open_runs: list[OpenRun]
    workers: list[WorkerSeen]
    problems: list[str] = field(default_factory=list)
    pending_filings: list[PendingFiling] = field(default_factory=list)
    queues: dict[str, int] | None = None
    listeners: dict[str, list[str]] | None = None
    stability_changes: list[StabilityChange] = field(default_factory=list)
    unstable: list[UnstableBenchmark] = field(default_factory=list)
    judged: int = 0
    failing: list[FailingBenchmark] = field(default_factory=list)
    bisections: list[RunningBisection] = field(default_factory=list)
    coarse: list[CoarseSeries] = field(default_factory=list)
    sensed: int = 0


@dataclass(frozen=True)
class RunningBisection:
    """A bisection not yet ended.

    Attributes:
        id: the bisection.
        search: ``latency`` (a night's regressions; the night's issue is filed when it ends) or
            ``failure`` (a failing benchmark; its issue is told the culprit when it ends).
        benchmarks: what it bisects.
        run_id: the night it is for (None for a failure bisection or one started by hand).
        queue: where its probes go.
        age_s: seconds since it started.
        rounds: rounds planned so far.
        probes_waiting: probes of its last round queued or running.
    """

    id: int
    search: str
    benchmarks: list[str]
    run_id: int | None
    queue: str
    age_s: float
    rounds: int
    probes_waiting: int


def running_bisections(session: Session, *, now: datetime) -> list[RunningBisection]:
    """Bisections still running, oldest first."""
    rows = session.scalars(
        select(Bisection).where(Bisection.status == BisectionStatus.RUNNING).order_by(Bisection.id)
    ).all()
    probes = {
        b: (int(r or 0), int(w or 0))
        for b, r, w in session.execute(
            select(
                Probe.bisection_id,
                func.max(Probe.round) + 1,
                func.count().filter(Probe.status.not_in(PROBE_ENDED)),
            )
            .where(Probe.bisection_id.in_([b.id for b in rows]))
            .group_by(Probe.bisection_id)
        )
    }
    return [
        RunningBisection(
            id=b.id,
            search=(b.config or {}).get("kind") or "latency",
            benchmarks=list(b.benchmarks or []),
            run_id=b.run_id,
            queue=b.queue,
            age_s=(now - (_aware(b.created_at) or now)).total_seconds(),
            rounds=probes.get(b.id, (0, 0))[0],
            probes_waiting=probes.get(b.id, (0, 0))[1],
        )
        for b in rows
    ]


def _bisection_problems(bisections: list[RunningBisection]) -> list[str]:
    """One line per bisection running longer than ``BISECTION_STALE``: what waits on it."""
    out = []
    for b in bisections:
        if b.age_s <= BISECTION_STALE.total_seconds():
            continue
        waits = (
            f"night run {b.run_id}'s issue is filed when it ends"
            if b.run_id is not None
            else "its issue is told the culprit when it ends"
            if b.search == "failure"
            else "nothing is told until it ends"
        )
        out.append(
            f"bisection {b.id} ({b.search}: {', '.join(b.benchmarks)}) has run "
            f"{b.age_s / 3600:.1f} h, {b.rounds} round(s); {b.probes_waiting} probe(s) "
            f"wait on `{b.queue}` (no worker takes them, or a build or benchmark hangs: "
            f"nightbench bisect-resume {b.id} sends them again); {waits}"
        )
    return out


def unstable_now(
    session: Session,
    threshold_for: Callable[[str, str], float] | None = None,
) -> tuple[list[UnstableBenchmark], int]:
    """The verdicts in force that are unstable, and how many verdicts are stored (unknown ones
    left out); ``threshold_for(metric, "model:mode")`` gives the latency threshold (default
    0.07) under each one's bar (``UnstableRule``)."""
    rows = [r for r in list_stability(session) if r.unstable is not None]
    out = []
    for r in rows:
        if r.unstable:
            thr = threshold_for("latency", f"{r.model}:{r.mode}") if threshold_for else 0.07
            out.append(
                UnstableBenchmark(
                    benchmark_name(r.model, r.mode, r.device, r.compiler),
                    r.machine_id,
                    r.spread,
                    alerts_from(r.spread, thr),
                    still_alerts_on=tuple(
                        m.name
                        for m in METRIC_TABLE
                        if m.alerts and not m.rule.host_bound and r.device in m.devices
                    ),
                )
            )
    return out, len(rows)


COARSE_LOOKBACK = timedelta(days=60)
"""How far back :func:`coarse_series` reads nights: twice the detector's window."""


def coarse_series(
    session: Session,
    *,
    today: date,
    threshold_for: Callable[[str, str], float] | None = None,
) -> tuple[list[CoarseSeries], int]:
    """The alerting series whose smallest detectable change is above their threshold, worst
    first, and how many series with a baseline were judged.

    Each series' latest ``window`` nights (of the last :data:`COARSE_LOOKBACK`) are its
    baseline window; a reset inside it (a raised step, an expected change) is not looked for,
    so a series that stepped lately reads noisier than the detector holds it.

    Args:
        session: an open database session.
        today: the date to look back from.
        threshold_for: ``(metric, "model:mode") -> threshold`` (default: the metric's own).
    """
    rows = session.execute(
        select(
            Result.series_key,
            Result.model,
            Result.mode,
            Result.device,
            Result.compiler,
            Result.metric,
            Result.machine_id,
            Result.median,
        )
        .join(Run, Run.id == Result.run_id)
        .where(
            Run.kind.in_(HISTORY_KINDS),  # a series' own nights: no re-runs or replicates
            Result.error.is_(None),
            Result.night >= today - COARSE_LOOKBACK,
            Result.metric.in_(ALERT_METRICS),
            Result.median.isnot(None),
            Result.series_key.isnot(None),
        )
        .order_by(Result.series_key, Result.night, Result.id)
    ).all()
    levels: dict[str, list[float]] = {}
    identity: dict[str, tuple[str, str, str, str, str, int | None]] = {}
    for row in rows:
        key = str(row.series_key)
        levels.setdefault(key, []).append(float(row.median))
        identity[key] = (row.model, row.mode, row.device, row.compiler, row.metric, row.machine_id)
    coarse, sensed = [], 0
    for key, values in levels.items():
        model, mode, device, compiler, metric_name, machine_id = identity[key]
        threshold = (
            threshold_for(metric_name, f"{model}:{mode}")
            if threshold_for is not None
            else metric(metric_name).threshold
        )
        memory = exact_levels(metric_name)
        smallest = series_smallest_change(values, threshold, memory=memory)
        if smallest is None:
            continue
        sensed += 1
        if is_coarse(smallest, threshold):
            noise, nights = window_noise_of(values, memory=memory)
            coarse.append(
                CoarseSeries(
                    benchmark=benchmark_name(model, mode, device, compiler),
                    metric=metric_name,
                    machine_id=machine_id,
                    threshold=threshold,
                    smallest_change=smallest,
                    noise=math.expm1(noise),
                    nights=nights,
                )
            )
    coarse.sort(key=lambda c: c.smallest_change / c.threshold, reverse=True)
    return coarse, sensed


def _aware(ts: datetime | None) -> datetime | None:
    """``ts`` as UTC-aware (SQLite hands back naive timestamps)."""
    return ts.replace(tzinfo=utcnow().tzinfo) if ts is not None and ts.tzinfo is None else ts


def machine_classes(session: Session, *, today: date) -> list[MachineClassStatus]:
    """The last night each machine class measured a benchmark (nightly or posted runs)."""
    rows = session.execute(
        select(Job.queue, func.max(Run.night), func.max(Job.finished_at))
        .join(Run, Run.id == Job.run_id)
        .where(Job.status == JobStatus.DONE, Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)))
        .group_by(Job.queue)
        .order_by(Job.queue)
    ).all()
    return [
        MachineClassStatus(
            queue=q, last_night=night, last_result_at=_aware(at), nights_behind=(today - night).days
        )
        for q, night, at in rows
    ]


def open_runs(session: Session, *, now: datetime) -> list[OpenRun]:
    """Runs still queued, running or detecting, oldest first."""
    pending = dict(
        session.execute(
            select(Job.run_id, func.count())
            .join(Run, Run.id == Job.run_id)
            .where(Run.status.in_(RUN_OPEN), Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
            .group_by(Job.run_id)
        ).all()
    )
    runs = session.scalars(select(Run).where(Run.status.in_(RUN_OPEN)).order_by(Run.id))
    out = []
    for run in runs:
        deadline = _aware(run.deadline_at)
        created = _aware(run.created_at) or now
        out.append(
            OpenRun(
                id=run.id,
                kind=run.kind,
                night=run.night,
                status=run.status,
                age_s=(now - created).total_seconds(),
                deadline_at=deadline,
                overdue=deadline is not None and deadline < now,
                jobs_pending=pending.get(run.id, 0),
            )
        )
    return out


def workers_seen(session: Session, *, now: datetime) -> list[WorkerSeen]:
    """Workers that started a job within ``WORKER_WINDOW`` of ``now``."""
    rows = session.execute(
        select(Job.worker, func.max(Job.started_at), func.count())
        .where(Job.worker.is_not(None), Job.started_at >= now - WORKER_WINDOW)
        .group_by(Job.worker)
        .order_by(Job.worker)
    ).all()
    return [
        WorkerSeen(worker=str(w), last_started_at=_aware(at) or now, jobs=n) for w, at, n in rows
    ]


def pending_filings(session: Session, *, now: datetime) -> list[PendingFiling]:
    """Alerts whose filing is pending or failing, longest pending first."""
    rows = session.execute(
        select(Alert, Run.night)
        .join(Run, Run.id == Alert.run_id)
        .where(Alert.filing_state.in_(FILING_UNFILED))
        .order_by(Alert.filing_pending_since, Alert.id)
    ).all()
    out = []
    for alert, night in rows:
        since = _aware(alert.filing_pending_since)
        out.append(
            PendingFiling(
                alert_id=alert.id,
                run_id=alert.run_id,
                night=night,
                state=str(alert.filing_state),
                attempts=alert.filing_attempts,
                last_error=alert.filing_error,
                pending_since=since,
                age_s=(now - since).total_seconds() if since else 0.0,
                next_attempt_at=_aware(alert.filing_next_at),
                kind=alert.kind,
            )
        )
    return out


def waiting_on(session: Session, bisections: list[RunningBisection]) -> dict[str, list[str]]:
    """Per queue, what the database says waits there: the queued jobs of each open run and
    the probes of each running bisection (``["2 job(s) of run 12", "bisection 7's probes"]``)."""
    out: dict[str, list[str]] = {}
    for queue, run_id, n in session.execute(
        select(Job.queue, Job.run_id, func.count())
        .join(Run, Run.id == Job.run_id)
        .where(Job.status == JobStatus.QUEUED, Run.status.in_(RUN_OPEN))
        .group_by(Job.queue, Job.run_id)
        .order_by(Job.queue, Job.run_id)
    ):
        out.setdefault(queue, []).append(f"{n} job(s) of run {run_id}")
    for b in bisections:
        if b.probes_waiting:
            out.setdefault(b.queue, []).append(f"bisection {b.id}'s {b.probes_waiting} probe(s)")
    return out


AB_STALE = timedelta(hours=2)
"""A pull request's A/B queued or running longer than this is a problem: no worker took it,
or its task hangs (the default set takes minutes; one task's limit is 30 min)."""


def ab_problems(session: Session, *, now: datetime) -> list[str]:
    """One line per A/B a person should look at: its report refused by GitHub (kept and retried),
    or the A/B itself queued or running over :data:`AB_STALE`."""
    lines = []
    stuck = select(ABTest).where(
        ABTest.status.in_([ABStatus.QUEUED.value, ABStatus.RUNNING.value]),
        ABTest.created_at < now - AB_STALE,
    )
    for ab in session.scalars(stuck.order_by(ABTest.id)):
        if (ab.options or {}).get("queue") == "local":
            continue  # measured by a nightbench ab on someone's machine, not by the workers
        where = f"PR #{ab.pr_number}" if ab.pr_number is not None else "by hand"
        hours = (now - ab.created_at).total_seconds() / 3600
        lines.append(
            f"A/B {ab.id} ({where}) has been {ab.status} for {hours:.1f} h: no worker of its "
            f"queue ({(ab.options or {}).get('queue') or 'cpu'}) took it, or its task hangs"
        )
    refused = select(ABTest).where(ABTest.report_state == ReportState.FAILED_RETRYING.value)
    for ab in session.scalars(refused.order_by(ABTest.id)):
        lines.append(
            f"A/B {ab.id}: reporting on PR #{ab.pr_number} failed {ab.report_attempts} "
            f"time(s): {ab.report_error}; retried at {ab.next_report_at} (or now: nightbench "
            "issues retry)"
        )
    return lines


def system_status(
    session: Session,
    *,
    now: datetime | None = None,
    stale_after_nights: int = 1,
    broker_url: str | None = None,
    queue_prefix: str = "",
    threshold_for: Callable[[str, str], float] | None = None,
    resend_after_s: float = RESEND_AFTER_S,
) -> SystemStatus:
    """Everything above, and the problems: a run past its deadline, an ingest run open over a
    day, a machine class that has not measured for more than ``stale_after_nights`` nights, a
    benchmark failing ``FAILING_NIGHTS`` nights in a row (:func:`failing_benchmarks`), a failed
    filing, a broker that cannot be read, a queue holding messages that no worker listens to
    (:func:`service.status.broker.broker_state`), a bisection running over ``BISECTION_STALE``.

    :func:`store_status` then :func:`with_broker`; the API calls them apart so that no database
    connection is held while the workers are asked (up to ``LISTEN_TIMEOUT_S``).

    Args:
        session: an open database session.
        now: the time to judge by (default: now, UTC).
        stale_after_nights: nights a machine class may go without results before it is told.
        broker_url: the broker whose queues to count (None: no queue lengths).
        queue_prefix: its key prefix.
        threshold_for: ``(metric, "model:mode") -> threshold`` for the unstable benchmarks'
            bars (:func:`unstable_now`).
        resend_after_s: how long a run's ``night.finish`` may be owed before it is a problem
            (``step_resend_after_s``: the deadline sweep sends it again then).
    """
    stored = store_status(
        session,
        now=now,
        stale_after_nights=stale_after_nights,
        threshold_for=threshold_for,
        resend_after_s=resend_after_s,
    )
    return with_broker(
        stored, broker_state(broker_url, prefix=queue_prefix, waiting_on=stored.waiting_on)
    )


@dataclass(frozen=True)
class StoredStatus:
    """What the database says: the status without the broker's part; per queue what waits
    there (named in the broker's problem lines); the bisections' problems (listed after the
    broker's)."""

    status: SystemStatus
    waiting_on: dict[str, list[str]]
    bisection_problems: list[str]
    # Per queue, the runs and their jobs queued and untouched for ``resend_after_s``.
    idle_queued: dict[str, dict[int, int]] = field(default_factory=dict)
    resend_after_s: float = RESEND_AFTER_S


def with_broker(stored: StoredStatus, broker: BrokerState) -> SystemStatus:
    """The stored status with the broker's queue lengths, listeners and problems, and a problem
    for each queue that holds no message while jobs wait queued on it (their messages were
    lost: a broker restarted empty; the deadline sweep sends them again)."""
    lost = [
        f"run {run_id}: {n} job(s) queued on `{queue}` for over "
        f"{stored.resend_after_s / 60:.0f} min while the queue holds no message (lost: a broker "
        "restarted empty?); the deadline sweep sends them again"
        for queue, by_run in sorted(stored.idle_queued.items())
        if broker.queues is not None and broker.queues.get(queue) == 0
        for run_id, n in sorted(by_run.items())
    ]
    return replace(
        stored.status,
        problems=stored.status.problems + broker.problems + lost + stored.bisection_problems,
        queues=broker.queues,
        listeners=broker.listeners,
    )


def store_status(
    session: Session,
    *,
    now: datetime | None = None,
    stale_after_nights: int = 1,
    threshold_for: Callable[[str, str], float] | None = None,
    resend_after_s: float = RESEND_AFTER_S,
) -> StoredStatus:
    """The status as the database tells it (:func:`system_status` without the broker).

    Args:
        session: an open database session.
        now: the time to judge by (default: now, UTC).
        stale_after_nights: nights a machine class may go without results before it is told.
        threshold_for: as :func:`system_status`.
        resend_after_s: as :func:`system_status`.
    """
    now = now or utcnow()
    classes = machine_classes(session, today=now.date())
    runs = open_runs(session, now=now)
    problems = [
        f"run {r.id} ({r.kind}, night {r.night}) is past its deadline by "
        f"{(now - r.deadline_at).total_seconds() / 3600:.1f} h with {r.jobs_pending} job(s) "
        f"not reported"
        for r in runs
        if r.overdue and r.deadline_at is not None
    ]
    problems += [
        f"run {r.id} ({r.kind}, night {r.night}) has been open {r.age_s / 3600:.1f} h "
        f"with no deadline"
        for r in runs
        if r.deadline_at is None and r.age_s > 86400
    ]
    problems += [
        f"run {r.id} ({r.kind}, night {r.night}): its jobs all ended "
        f"{(now - r.finish_owed_since).total_seconds() / 60:.0f} min ago and night.finish never "
        "ran (its message was lost); the deadline sweep sends it again"
        for r in finish_owed(session, before=now - timedelta(seconds=resend_after_s))
        if r.finish_owed_since is not None
    ]
    problems += [
        f"machine class {c.queue} last measured night {c.last_night} ({c.nights_behind} nights ago)"
        for c in classes
        if c.nights_behind > stale_after_nights
    ]
    failing = failing_benchmarks(session, today=now.date())
    problems += [
        f"benchmark {f.benchmark} on {f.queue} has failed {f.nights} nights in a row (since "
        f"{f.since}): {f.error}; its series has no point since, so a regression there goes "
        "unseen"
        for f in failing
    ]
    filings = pending_filings(session, now=now)
    problems += [
        f"alert {f.alert_id} (run {f.run_id}, night {f.night}): filing its "
        f"{_KIND_WORDS.get(f.kind, '')}issue failed "
        f"{f.attempts} time(s), pending {f.age_s / 3600:.1f} h: {f.last_error}; the issue waits "
        f"in the outbox, retried at {f.next_attempt_at} (or now: nightbench issues retry)"
        for f in filings
        if f.state == FilingState.FAILED_RETRYING
    ]
    problems += ab_problems(session, now=now)
    bisections = running_bisections(session, now=now)
    changes = [
        StabilityChange(
            benchmark=c["benchmark"],
            machine_id=c["machine_id"],
            run_id=c["run_id"],
            night=date.fromisoformat(c["night"]),
            from_verdict=c["from"],
            to_verdict=c["to"],
            source=str(c["source"]),
        )
        for c in stability_changes(session, since=now.date() - STABILITY_WINDOW)
    ]
    unstable, judged = unstable_now(session, threshold_for)
    coarse, sensed = coarse_series(session, today=now.date(), threshold_for=threshold_for)
    status = SystemStatus(
        now=now,
        machine_classes=classes,
        open_runs=runs,
        workers=workers_seen(session, now=now),
        problems=problems,
        pending_filings=filings,
        stability_changes=changes,
        unstable=unstable,
        judged=judged,
        failing=failing,
        bisections=bisections,
        coarse=coarse,
        sensed=sensed,
    )
    idle: dict[str, dict[int, int]] = {}
    for job in idle_queued_jobs(session, before=now - timedelta(seconds=resend_after_s)):
        by_run = idle.setdefault(job.queue, {})
        by_run[job.run_id] = by_run.get(job.run_id, 0) + 1
    return StoredStatus(
        status=status,
        waiting_on=waiting_on(session, bisections),
        bisection_problems=_bisection_problems(bisections),
        idle_queued=idle,
        resend_after_s=resend_after_s,
    )
