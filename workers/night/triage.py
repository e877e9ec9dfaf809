"""A night's confirmed regressions: their commit range, the bisection, and the filed issue.

``night.triage`` (:func:`triage`) stores the night's commit range and starts the bisection of
the reproduced latency regressions (:mod:`workers.bisect.celery_driver`); the bisection's last
step sends ``night.file`` (:func:`file_night`), which files the alert with the bisection's
outcome and closes the run. Without a bisection to run, triage sends ``night.file`` at once.
"""

from __future__ import annotations

import logging

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Alert, AlertKind, Confirmation, Run
from service.regressions import service as regressions
from service.runs import service as runs
from workers import commits
from workers.bisect import celery_driver as bisecting
from workers.enqueue import Step
from workers.issues import pending
from workers.issues.reports import causes

log = logging.getLogger(__name__)


def resolve_commit_range(run_id: int, *, settings: Settings | None = None) -> list[dict] | None:
    """The night's commit range, stored on the run: from the torch commit of the previous
    night, or, when a step raised tonight began on an earlier night, of the night two before
    that step's first night (:func:`service.regressions.service.range_start`) → tonight's.

    From a local clone (``source_repo_path``) when configured, else from GitHub's compare API
    (``source_github_repository``). Returns None, with a reason in the run's note, when either
    commit is unknown or the range cannot be read; detection and filing go on without it.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        if run.commit_range is not None:
            return run.commit_range
        previous = regressions.range_start(session, run=run)
        good = previous.torch_git_commit if previous else None
        bad = run.torch_git_commit
        if previous is not None and previous.id != run.previous_run_id:
            _note_in(
                run,
                f"commit range starts at night {previous.night}: a step raised "
                "tonight began on an earlier night",
            )
    if not good or not bad or good == bad:
        reason = (
            "no earlier night with a known commit"
            if not good
            else (
                "tonight's build has no git commit"
                if not bad
                else "same commit as the previous night"
            )
        )
        _note(run_id, f"commit range: none ({reason})")
        return None
    try:
        commit_list = commits.commit_range(settings, good, bad)
        if commit_list is None:
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


def triage(run_id: int, *, settings: Settings | None = None) -> list[Step]:
    """Resolve the night's commit range and start the bisection of its reproduced regressions.

    Returns:
        The bisection's first steps while one runs (its end sends ``night.file``), else
        ``night.file`` itself.
    """
    settings = settings or get_settings()
    resolve_commit_range(run_id, settings=settings)
    bisection = bisecting.bisect_for_night(run_id, settings=settings)
    if bisection.pending:  # its end sends night.file
        return list(bisection.steps)
    return [Step("night.file", (run_id,))]


def file_night(run_id: int, *, settings: Settings | None = None) -> None:
    """Close the run and file its reproduced regressions, with its bisection's outcome when one
    finished; then retry the filings of earlier nights that are due.

    Filing is a state of its own (:mod:`workers.issues.pending`): the run closes even when the
    tracker fails, and the alert stays pending, its issue in the outbox, until a retry files it.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        alert_id = _regression_alert_id(session, runs.get_run(session, run_id))
        if alert_id is not None:
            alert = session.get(Alert, alert_id, with_for_update=True)
            if alert is not None:
                pending.mark_pending(alert)
    # Committed: whatever the attempt below meets (a full disk, a crash), the alert is pending
    # and the periodic retry files it.
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        if alert_id is not None:
            bisection = causes.night_bisection_input(session, run_id=run_id)
            pending.file_durably(session, alert_id=alert_id, settings=settings, bisection=bisection)
        runs.finish_run(session, run=run)
    pending.retry_pending(settings=settings)


def _regression_alert_id(session, run: Run) -> int | None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from service.models import Alert, Regression

    return session.scalar(
        select(Alert.id)
        .join(Regression, Regression.alert_id == Alert.id)
        .where(
            Alert.run_id == run.id,
            Alert.kind == AlertKind.REGRESSION,
            Regression.confirmation == Confirmation.REPRODUCED,
        )
        .limit(1)
    )
