"""The commit that broke a failing benchmark: its bisection started, and its answer told.

On the night a benchmark's failures reach ``FAILING_NIGHTS`` in a row, the nightly files its
issue (:mod:`workers.issues.failing`) and sends ``issues.bisect_failing``
(:func:`bisect_failing`): for each benchmark newly failing, the commit range between the build
of its last good night and the build of its first failing night is bisected with pass/fail
probes (:mod:`workers.bisect.failures`) on the machine class it fails on. When the search ends
it sends ``issues.tell_bisected`` (:func:`tell_bisected`): the failing alert's filing goes
pending again and the durable filing comments the answer on the open issue, once.
"""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Alert, Bisection
from service.regressions.failing import FailingBenchmark
from workers import commits
from workers.bisect import celery_driver
from workers.bisect.failure_driver import create_failure_bisection
from workers.builds.registry import spec_from_settings
from workers.enqueue import Step
from workers.issues.failing import (
    FAILING,
    failing_fingerprint,
    failure_bisections,
    newly_failing,
    streak_ends,
)
from workers.issues.filing_state import alert_and_run, reopen

log = logging.getLogger(__name__)


def bisect_failing(alert_id: int, *, settings: Settings | None = None) -> list[Step]:
    """Start the failure bisection of each benchmark the ``failing`` alert ``alert_id`` reports
    newly failing, unless one was started already (idempotent: tasks run at least once).

    Nothing is started for a benchmark without a build provider configured, without a known
    torch commit on both ends of its streak, with the same commit on both, or when the commit
    range cannot be read (logged; its issue says so where it can).

    Returns:
        The first steps of the bisections started now.

    Raises:
        NotFound: no such alert, or its run is gone.
    """
    settings = settings or get_settings()
    provider = spec_from_settings(settings)
    if provider is None:
        log.info("alert %s: failing benchmarks not bisected: no build provider", alert_id)
        return []
    started: list[int] = []
    with session_scope() as session:
        _, run = alert_and_run(session, alert_id, FAILING)
        known = {b.config.get("issue") for b in failure_bisections(session, alert_id)}
        for failing in newly_failing(session, run=run):
            key = failing_fingerprint(failing.queue, failing.benchmark, failing.since)
            if key in known:
                continue
            bisection = _start(
                session,
                failing,
                until=run.night,
                provider=dict(provider),
                alert_id=alert_id,
                settings=settings,
                key=key,
            )
            if bisection is not None:
                started.append(bisection.id)
    return [s for bisection_id in started for s in celery_driver.step(bisection_id)]


def _start(
    session: Session,
    failing: FailingBenchmark,
    *,
    until: date,
    provider: dict[str, Any],
    alert_id: int,
    settings: Settings,
    key: str,
) -> Bisection | None:
    good, bad = streak_ends(session, failing, until)
    good_sha = good.torch_git_commit if good else None
    bad_sha = bad.torch_git_commit if bad else None
    if not good_sha or not bad_sha or good_sha == bad_sha:
        log.info(
            "%s: not bisected (last good build %s, first failing build %s)",
            failing.benchmark,
            good_sha,
            bad_sha,
        )
        return None
    try:
        commit_list = commits.commit_range(settings, good_sha, bad_sha)
    except Exception as exc:  # noqa: BLE001 - the issue is filed without it
        log.warning(
            "%s: commit range %s..%s unavailable: %s",
            failing.benchmark,
            good_sha[:10],
            bad_sha[:10],
            exc,
        )
        return None
    if not commit_list or len(commit_list) < 2:
        return None
    if provider["kind"] == "python-overlay":
        provider["base_sha"] = commit_list[0].sha
    bisection = create_failure_bisection(
        session,
        commits=commit_list,
        benchmark=failing.benchmark,
        provider=provider,
        alert_id=alert_id,
        queue=failing.queue,
        workers=settings.bisect_workers,
        repo=provider.get("repo"),
        issue=key,
        error=failing.error,
    )
    log.warning(
        "%s: bisecting %d commit(s) for the one that broke it, in bisection %s",
        failing.benchmark,
        len(commit_list) - 1,
        bisection.id,
    )
    return bisection


def tell_bisected(bisection_id: int) -> list[Step]:
    """A failure bisection ended: its alert's filing goes pending again, so the durable filing
    comments the answer on the issue (``issues.retry_filing``).

    Returns:
        The retry step (a filing still pending tells the answer when it files), or nothing when
        the bisection has no alert.
    """
    with session_scope() as session:
        bisection = session.get(Bisection, bisection_id)
        alert = session.get(Alert, bisection.alert_id) if bisection and bisection.alert_id else None
        if alert is None:
            return []
        reopen(alert)
    return [Step("issues.retry_filing", ())]
