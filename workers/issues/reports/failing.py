"""What a ``failing`` alert's issues and comments say: queries only.

The failing-streak rule itself is :mod:`service.regressions.failing`.
"""

from __future__ import annotations

import hashlib
from datetime import date

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Bisection, BisectionStatus, JobStatus, Run
from service.regressions.failing import (
    FailingBenchmark,
    newly_failing,
    runs_again,
    streak_nights,
)
from workers.bisect.failure_driver import is_failure
from workers.issues.model import FailedNight, FailingReport, FailureBisected, RunsAgain
from workers.issues.reports.missing import night_run


def failing_fingerprint(queue: str, benchmark: str, since: date) -> str:
    """16 hex digits naming "``benchmark`` failing on ``queue`` since ``since``" (one issue per
    benchmark and streak: later nights of the same streak find the same issue)."""
    return hashlib.sha256(f"failing\0{queue}\0{benchmark}\0{since}".encode()).hexdigest()[:16]


def failure_bisections(session: Session, alert_id: int) -> list[Bisection]:
    """The failure bisections started for the ``failing`` alert ``alert_id``, oldest first."""
    return [
        b
        for b in session.scalars(
            select(Bisection).where(Bisection.alert_id == alert_id).order_by(Bisection.id)
        )
        if is_failure(b)
    ]


def failing_report(
    session: Session, *, run: Run, failing: FailingBenchmark, alert_id: int, settings: Settings
) -> FailingReport:
    """The issue of ``failing`` as of ``run``'s night: its failing nights, its last good night,
    the failure bisection started for it (if any)."""
    rows = streak_nights(session, failing, run.night)
    failed = [(r, j) for r, j in rows if r.night >= failing.since and j.status == JobStatus.ERROR]
    good = next((r for r, j in rows if j.status == JobStatus.DONE), None)
    key = failing_fingerprint(failing.queue, failing.benchmark, failing.since)
    started = [b for b in failure_bisections(session, alert_id) if b.config.get("issue") == key]
    return FailingReport(
        benchmark=failing.benchmark,
        queue=failing.queue,
        model=failing.model,
        mode=failing.mode,
        device=failing.device,
        compiler=failing.compiler,
        nights=failing.nights,
        since=failing.since,
        run=night_run(run),
        failed=tuple(FailedNight(night_run(r), j.error) for r, j in failed),
        last_good=night_run(good) if good is not None else None,
        source_repository=settings.source_repository,
        bisection_id=started[-1].id if started else None,
        bisection_commits=len(started[-1].commits) - 1 if started else None,
        bisect_provider=bool(settings.bisect_provider),
    )


def failing_reports(
    session: Session, *, run: Run, alert_id: int, settings: Settings
) -> list[FailingReport]:
    """One report per benchmark of ``run`` newly failing (its streak reached the rule tonight)."""
    return [
        failing_report(session, run=run, failing=f, alert_id=alert_id, settings=settings)
        for f in newly_failing(session, run=run)
    ]


def running_again(session: Session, *, run: Run) -> list[RunsAgain]:
    """The benchmarks ``run`` measured after a streak of failures (their issues are told)."""
    return [
        RunsAgain(
            run=night_run(run),
            benchmark=f.benchmark,
            queue=f.queue,
            nights=f.nights,
            since=f.since,
        )
        for f in runs_again(session, run=run)
    ]


def finished_bisections(
    session: Session, *, alert_id: int, settings: Settings
) -> list[tuple[str, FailureBisected]]:
    """``(issue fingerprint, answer)`` of each finished failure bisection of the alert."""
    return [
        (
            b.config.get("issue", ""),
            FailureBisected(
                id=b.id,
                benchmark=b.benchmarks[0],
                outcome=b.outcome,
                result=dict(b.result),
                source_repository=settings.source_repository,
            ),
        )
        for b in failure_bisections(session, alert_id)
        if b.status == BisectionStatus.DONE and b.result
    ]
