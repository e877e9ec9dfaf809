"""Missing data as an issue: a night whose benchmarks did not all report by its deadline.

A ``missing_data`` alert is a row; nobody reads rows. It is stored with its filing pending
(:func:`service.runs.service.mark_missing`) and filed like a regression alert, through the
durable filing state (:mod:`workers.issues.pending`: outbox, retry with backoff, status), by
:func:`file_missing_alert`: one issue per machine class (the jobs' queue) and night,
deduplicated by fingerprint (:func:`missing_data_fingerprint`): each benchmark that never
reported, the worker that last took it, its attempts and its last error, and what to do. When
the data comes later (a re-dispatch of that night, a late post to an ingest run),
:func:`note_arrivals` makes the alert pending again and the filing tells the issue once per
benchmark.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Alert, AlertStatus, FilingState, Job, JobStatus, Run, RunKind
from workers.issues.filing_state import alert_and_run, reopen
from workers.issues.markers import marker, run_marker
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.tracker import IssueTracker, searchable_labels

log = logging.getLogger(__name__)
LABELS = ("nightbench", "missing-data")


def missing_data_fingerprint(queue: str, night: str) -> str:
    """16 hex digits naming "the missing data of ``queue`` on ``night``" (one issue each)."""
    return hashlib.sha256(f"missing_data\0{queue}\0{night}".encode()).hexdigest()[:16]


def missing_data_labels(settings: Settings) -> tuple[str, ...]:
    """The labels of a missing-data issue: the deployment's first label, then ``LABELS``
    (:func:`workers.issues.tracker.searchable_labels`)."""
    return searchable_labels(settings, LABELS)


def render_missing_data(
    run: Run, jobs: list[Job], *, labels: Sequence[str] = LABELS
) -> list[RenderedIssue]:
    """One issue per machine class (queue) of ``jobs``, the run's jobs that never reported.

    Args:
        run: the run past its deadline.
        jobs: its jobs that never reported.
        labels: the issues' labels (:func:`missing_data_labels` for a deployment's).

    Raises:
        ValueError: ``jobs`` is empty.
    """
    if not jobs:
        raise ValueError("no missing job to file")
    by_queue: dict[str, list[Job]] = {}
    for job in jobs:
        by_queue.setdefault(job.queue, []).append(job)
    issues = []
    for queue, missing in sorted(by_queue.items()):
        fp = missing_data_fingerprint(queue, str(run.night))
        rows = "\n".join(
            f"| `{j.benchmark}` | {j.worker or 'never taken'} | {j.attempts} | "
            f"{(j.error or '').splitlines()[0] if j.error else ''} |"
            for j in missing
        )
        body = (
            f"**{len(missing)} benchmark(s) of night {run.night} on `{queue}` never reported** "
            f"by the run's deadline ({run.deadline_at:%Y-%m-%d %H:%M} UTC, run {run.id}, "
            f"build `{run.torch_spec}`). The night was judged on what came; these series have "
            f"no point for it, so a regression there would go unseen.\n\n"
            f"| benchmark | last worker | attempts | last error |\n| --- | --- | --- | --- |\n"
            f"{rows}\n\n"
            f"What to do: check that a worker serves `{queue}` (`nightbench status` lists the "
            f"workers seen in the last hour), then measure these again with `nightbench "
            f"dispatch --date {run.night} --torch '{run.torch_spec}' --models "
            f"{','.join(sorted({j.model for j in missing}))}`.\n\n"
            f"{marker(fp)}\n{run_marker(run.id)}\n"
        )
        title = (
            f"Missing data: {len(missing)} benchmark(s) of night {run.night} on {queue} "
            f"never reported"
        )
        issues.append(RenderedIssue(title=title, body=body, labels=tuple(labels), fingerprint=fp))
    return issues


def render_missing_alert(
    session: Session, *, alert_id: int, settings: Settings
) -> list[RenderedIssue]:
    """The issues the missing-data alert ``alert_id`` files, rendered, filing nothing.

    What the outbox keeps while the tracker cannot be reached: empty once the alert's issues
    were filed (what is left to do then is a comment, kept in the database: ``Alert.arrived``),
    and when none of its run's jobs is missing any more (a late post brought them all).

    Raises:
        NotFound: no alert ``alert_id``, or its run is gone.
    """
    alert, run = alert_and_run(session, alert_id, "missing_data")
    if alert.status == AlertStatus.FILED:
        return []
    jobs = list(
        session.scalars(
            select(Job)
            .where(Job.run_id == run.id, Job.status == JobStatus.MISSING)
            .order_by(Job.id)
        )
    )
    return render_missing_data(run, jobs, labels=missing_data_labels(settings)) if jobs else []


def file_missing_alert(
    session: Session, *, alert_id: int, settings: Settings, tracker: IssueTracker
) -> list[TrackedIssue]:
    """File the missing-data alert ``alert_id``: its issues, then what came since, told once.

    The first filing creates one issue per machine class with missing jobs (the tracker returns
    the open issue carrying the same fingerprint instead, so an issue whose creation answer was
    lost is not filed twice). Each filing then tells the open issue of each machine class the
    benchmarks of :func:`arrived_benchmarks` not yet told (``Alert.arrived``), in one comment
    whose key makes a repeat a no-op; a machine class with no open issue has nothing to tell.
    Only flushes; the caller (:func:`workers.issues.pending.file_durably`) commits, or rolls
    its savepoint back when the tracker failed, so nothing is recorded as filed or told then.

    Returns:
        The issues created or found, and those commented on.

    Raises:
        NotFound: no alert ``alert_id``, or its run is gone.
        InfrastructureError: the tracker kept failing (``TrackerAccessDenied``: it refused the
            credentials or the repository).
    """
    first = render_missing_alert(session, alert_id=alert_id, settings=settings)
    alert, run = alert_and_run(session, alert_id, "missing_data")
    done: dict[str, TrackedIssue] = {issue.fingerprint: tracker.create(issue) for issue in first}
    for created in done.values():
        log.warning("run %s: missing data filed as %s", run.id, created.url)
    came = arrived_benchmarks(session, run, alert=alert)
    known = set(alert.arrived or [])
    fresh = {q: [b for b in names if b not in known] for q, names in sorted(came.items())}
    for queue, names in fresh.items():
        fp = missing_data_fingerprint(queue, str(run.night))
        issue = (done.get(fp) or tracker.find_open(fp)) if names else None
        if issue is None:  # nothing came, or no open issue to tell
            continue
        still = sorted(
            j.benchmark
            for j in session.scalars(
                select(Job).where(
                    Job.run_id == run.id, Job.queue == queue, Job.status == JobStatus.MISSING
                )
            )
            if j.benchmark not in came[queue]
        )
        key = (
            "arrived-"
            + hashlib.sha256("\0".join([str(alert.id), *names]).encode()).hexdigest()[:12]
        )
        tracker.comment(issue.number, render_arrival(run.night, queue, names, still), key=key)
        done[fp] = issue
        log.info("run %s: data came for %s, told on %s", run.id, ", ".join(names), issue.url)
    alert.arrived = sorted(known | {b for names in fresh.values() for b in names}) or None
    alert.status = AlertStatus.FILED
    session.flush()
    return list(done.values())


def _aware(ts: datetime) -> datetime:
    """``ts`` as UTC-aware (SQLite gives naive datetimes back)."""
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


ARRIVALS_LOOKBACK_DAYS = 30  # missing-data alerts of older nights are no longer watched


def arrived_benchmarks(session: Session, run: Run, *, alert: Alert) -> dict[str, list[str]]:
    """Benchmarks of ``run`` that missed its deadline and whose data came since, by queue.

    A benchmark came when its job of ``run`` ended ``done`` after the missing-data ``alert``
    was raised (a late post to an ingest run) or when another run of the same night measured
    it (a re-dispatch).

    Returns:
        ``{queue: [benchmark, ...]}`` (sorted names; queues with nothing arrived left out).
    """
    jobs = list(session.scalars(select(Job).where(Job.run_id == run.id)))
    missed = [
        j
        for j in jobs
        if j.status == JobStatus.MISSING
        or (
            j.status == JobStatus.DONE
            and j.finished_at is not None
            and _aware(j.finished_at) > _aware(alert.created_at)
        )
    ]
    if not missed:
        return {}
    elsewhere = set(
        session.scalars(
            select(Job.id)
            .join(Run, Run.id == Job.run_id)
            .where(
                Run.night == run.night,
                Run.id != run.id,
                Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)),
                Job.status == JobStatus.DONE,
            )
            .where(Job.model.in_({j.model for j in missed}))
        )
    )
    done_elsewhere = (
        {
            (j.model, j.mode, j.device, j.compiler)
            for j in session.scalars(select(Job).where(Job.id.in_(elsewhere)))
        }
        if elsewhere
        else set()
    )
    out: dict[str, list[str]] = {}
    for j in missed:
        if j.status == JobStatus.DONE or (j.model, j.mode, j.device, j.compiler) in done_elsewhere:
            out.setdefault(j.queue, []).append(j.benchmark)
    return {q: sorted(names) for q, names in out.items()}


def render_arrival(night: date, queue: str, arrived: Sequence[str], still: Sequence[str]) -> str:
    """The comment telling a missing-data issue that data came (Markdown)."""
    listed = ", ".join(f"`{b}`" for b in arrived)
    rest = (
        f" Still missing: {', '.join(f'`{b}`' for b in still)}."
        if still
        else " Nothing of this night on this machine class is missing any more."
    )
    return (
        f"**Data arrived** for {len(arrived)} benchmark(s) of night {night} on `{queue}`: "
        f"{listed}. Stored for their series; the night was judged without them, so a "
        f"regression in them shows from the next night on.{rest}"
    )


def note_arrivals(*, today: date | None = None, now: datetime | None = None) -> list[int]:
    """Make each filed missing-data alert whose data came since pending again, to be told.

    Watches the missing-data alerts of the last ``ARRIVALS_LOOKBACK_DAYS`` nights; one whose
    issues were filed and for which :func:`arrived_benchmarks` holds benchmarks not yet told
    (``Alert.arrived``) goes back to ``pending`` (:func:`workers.issues.filing_state.reopen`).
    The durable filing's retry then posts the comment (:func:`file_missing_alert`), with the
    same backoff and status as any filing: GitHub away loses nothing. An alert still pending or
    failing tells it when it files. Runs from the deadline sweep; touches no tracker.

    Returns:
        The ids of the alerts made pending.
    """
    since = (today or date.today()) - timedelta(days=ARRIVALS_LOOKBACK_DAYS)
    reopened: list[int] = []
    with session_scope() as session:
        alerts = list(
            session.scalars(
                select(Alert)
                .join(Run, Run.id == Alert.run_id)
                .where(
                    Alert.kind == "missing_data",
                    Alert.filing_state == FilingState.FILED,
                    Run.night >= since,
                )
                .order_by(Alert.id)
            )
        )
        for alert in alerts:
            run = session.get(Run, alert.run_id)
            came = arrived_benchmarks(session, run, alert=alert) if run is not None else {}
            known = set(alert.arrived or [])
            if any(b not in known for names in came.values() for b in names) and reopen(
                alert, now=now
            ):
                reopened.append(alert.id)
    if reopened:
        log.info(
            "missing data came for alert(s) %s: to be told on their issues",
            ", ".join(map(str, reopened)),
        )
    return reopened
