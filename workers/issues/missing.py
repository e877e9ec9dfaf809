"""Missing data as an issue: a night whose benchmarks did not all report by its deadline.

A ``missing_data`` alert is a row; nobody reads rows. :func:`file_missing_data` files it like a
regression, through the configured tracker (GitHub, or the Markdown outbox), one issue per
machine class (the jobs' queue) and night, deduplicated by fingerprint: each benchmark that
never reported, the worker that last took it, its attempts and its last error, and what to do.
When the data comes later (a re-dispatch of that night, a late post to an ingest run),
:func:`note_arrivals` tells the issue once per benchmark.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Alert, Job, JobStatus, Run, RunKind
from workers.issues.markers import marker, run_marker
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.tracker import IssueTracker, make_tracker

log = logging.getLogger(__name__)
LABELS = ("nightbench", "missing-data")


def missing_data_fingerprint(queue: str, night: str) -> str:
    """16 hex digits naming "the missing data of ``queue`` on ``night``" (one issue each)."""
    return hashlib.sha256(f"missing_data\0{queue}\0{night}".encode()).hexdigest()[:16]


def render_missing_data(run: Run, jobs: list[Job]) -> list[RenderedIssue]:
    """One issue per machine class (queue) of ``jobs``, the run's jobs that never reported.

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
            f"{(j.error or '').splitlines()[0] if j.error else ''} |" for j in missing)
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
            f"{marker(fp)}\n{run_marker(run.id)}\n")
        title = (f"Missing data: {len(missing)} benchmark(s) of night {run.night} on {queue} "
                 f"never reported")
        issues.append(RenderedIssue(title=title, body=body, labels=LABELS, fingerprint=fp))
    return issues


def file_missing_data(run_id: int, *, settings: Settings | None = None,
                      tracker: IssueTracker | None = None) -> list[TrackedIssue]:
    """File the missing-data issue(s) of run ``run_id`` (none when nothing is missing).

    Safe to run twice: the tracker returns the open issue carrying the same fingerprint.

    Returns:
        The issues filed or found, one per machine class with missing jobs.
    """
    settings = settings or get_settings()
    tracker = tracker or make_tracker(settings)
    with session_scope() as session:
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id,
                                                   Alert.kind == "missing_data"))
        run = session.get(Run, run_id)
        if alert is None or run is None:
            return []
        jobs = list(session.scalars(select(Job).where(
            Job.run_id == run_id, Job.status == JobStatus.MISSING).order_by(Job.id)))
        if not jobs:
            return []
        issues = render_missing_data(run, jobs)
    filed = [tracker.create(issue) for issue in issues]
    for issue in filed:
        log.warning("run %s: missing data filed as %s", run_id, issue.url)
    return filed


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
    missed = [j for j in jobs if j.status == JobStatus.MISSING
              or (j.status == JobStatus.DONE and j.finished_at is not None
                  and _aware(j.finished_at) > _aware(alert.created_at))]
    if not missed:
        return {}
    elsewhere = set(session.scalars(
        select(Job.id).join(Run, Run.id == Job.run_id).where(
            Run.night == run.night, Run.id != run.id, Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)),
            Job.status == JobStatus.DONE)
        .where(Job.model.in_({j.model for j in missed}))))
    done_elsewhere = {(j.model, j.mode, j.device, j.compiler) for j in session.scalars(
        select(Job).where(Job.id.in_(elsewhere)))} if elsewhere else set()
    out: dict[str, list[str]] = {}
    for j in missed:
        if j.status == JobStatus.DONE or (j.model, j.mode, j.device, j.compiler) in done_elsewhere:
            out.setdefault(j.queue, []).append(j.benchmark)
    return {q: sorted(names) for q, names in out.items()}


def render_arrival(night: date, queue: str, arrived: Sequence[str], still: Sequence[str]) -> str:
    """The comment telling a missing-data issue that data came (Markdown)."""
    listed = ", ".join(f"`{b}`" for b in arrived)
    rest = (f" Still missing: {', '.join(f'`{b}`' for b in still)}." if still
            else " Nothing of this night on this machine class is missing any more.")
    return (f"**Data arrived** for {len(arrived)} benchmark(s) of night {night} on `{queue}`: "
            f"{listed}. Stored for their series; the night was judged without them, so a "
            f"regression in them shows from the next night on.{rest}")


def note_arrivals(*, today: date | None = None, settings: Settings | None = None,
                  tracker: IssueTracker | None = None) -> list[str]:
    """Tell each open missing-data issue, once per benchmark, that its data came.

    Watches the missing-data alerts of the last ``ARRIVALS_LOOKBACK_DAYS`` nights; for each,
    :func:`arrived_benchmarks` not yet told (``Alert.arrived``) become one comment on the issue
    of their machine class (found by its fingerprint; none open: nothing to tell). Runs from the
    deadline sweep. Safe to repeat: comments carry a key, and what was told is recorded.

    Returns:
        The benchmarks told about now.

    Raises:
        InfrastructureError: the tracker could not be reached (nothing is recorded as told).
    """
    settings = settings or get_settings()
    since = (today or date.today()) - timedelta(days=ARRIVALS_LOOKBACK_DAYS)
    told: list[str] = []
    with session_scope() as session:
        alerts = list(session.scalars(select(Alert).join(Run, Run.id == Alert.run_id).where(
            Alert.kind == "missing_data", Run.night >= since)))
        for alert in alerts:
            run = session.get(Run, alert.run_id)
            came = arrived_benchmarks(session, run, alert=alert) if run is not None else {}
            known = set(alert.arrived or [])
            fresh = {q: [b for b in names if b not in known] for q, names in came.items()}
            fresh = {q: names for q, names in fresh.items() if names}
            if run is None or not fresh:
                continue
            tracker = tracker or make_tracker(settings)
            for queue, names in sorted(fresh.items()):
                issue = tracker.find_open(missing_data_fingerprint(queue, str(run.night)))
                if issue is not None:
                    missing_now = sorted(
                        j.benchmark for j in session.scalars(select(Job).where(
                            Job.run_id == run.id, Job.queue == queue,
                            Job.status == JobStatus.MISSING))
                        if j.benchmark not in came.get(queue, []))
                    key = "arrived-" + hashlib.sha256(
                        "\0".join([str(alert.id), *names]).encode()).hexdigest()[:12]
                    tracker.comment(issue.number, render_arrival(run.night, queue, names,
                                                                 missing_now), key=key)
                told.extend(names)
            alert.arrived = sorted(known | {b for names in fresh.values() for b in names})
    if told:
        log.info("missing data came for %d benchmark(s): %s", len(told), ", ".join(told))
    return told
