"""Reporting an A/B on its pull request, durably.

A pull request's A/B owes a report once it is measured or has failed (``report_state``
``pending``). :func:`report_ab` makes one attempt: it reads the PR (its head now: a push during
the run is said in the comment), edits the PR's one A/B comment in place (or creates it) and
sets the commit status on the measured head. A refusal (GitHub down, a token refused, a 5xx
burst longer than the client's retries) leaves the report ``failed_retrying`` with the error,
the attempts and the next attempt's time (the filing's backoff: 5 min, doubling to 6 h);
:func:`retry_due` (from the periodic ``issues.retry_filing`` and ``nightbench issues retry``) tries
again. An A/B whose PR has a newer A/B is ``superseded``: stored, never posted over the newer
one's figures.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import or_, select

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InfrastructureError, InvalidInput, NotFound, TrackerAccessDenied
from service.models import ABStatus, ABTest, ReportState
from service.models.base import utcnow
from workers.ab.github import PullRequestReporter
from workers.ab.report import ABView, comment_body, status_of
from workers.ab.store import get_ab, latest_for_pr
from workers.ab.verdicts import ABRow
from workers.issues.filing_state import backoff

log = logging.getLogger(__name__)

REPORT_FAILURES = (InfrastructureError, NotFound, InvalidInput)
"""What a refused report raises (:class:`TrackerAccessDenied` is an InfrastructureError)."""


def make_reporter(settings: Settings) -> PullRequestReporter | None:
    """The reporter the settings configure (``github_repository`` and ``github_token``), or
    None without GitHub."""
    token = settings.github_token
    if not settings.github_repository or token is None or not token.get_secret_value():
        return None
    return PullRequestReporter(settings.github_repository, token, api_url=settings.github_api_url)


def view_of(ab: ABTest, *, settings: Settings, current_head: str | None = None) -> ABView:
    """The report's view of a stored A/B."""
    code = ab.repository or settings.source_repository
    return ABView(
        ab_id=ab.id,
        base_sha=ab.base_sha,
        head_sha=ab.head_sha,
        rows=[ABRow.from_dict(r) for r in ab.rows or []],
        error=ab.error,
        refused=bool((ab.options or {}).get("refused")),
        options=ab.options or {},
        profiles=ab.profiles or {},
        pr_number=ab.pr_number,
        current_head=current_head,
        code_url=f"https://github.com/{code}" if code else None,
        api_url=settings.api_base_url,
    )


def report_ab(
    ab_id: int,
    *,
    settings: Settings | None = None,
    reporter: PullRequestReporter | None = None,
    now: datetime | None = None,
) -> str:
    """One attempt at reporting A/B ``ab_id`` on its pull request.

    Args:
        ab_id: the A/B.
        settings: the settings (default: the process's).
        reporter: the GitHub client (default: :func:`make_reporter`'s).
        now: the time of the attempt (tests).

    Returns:
        The report state after the attempt (a :class:`ReportState` value).

    Raises:
        NotFound: there is no A/B ``ab_id``.
    """
    settings = settings or get_settings()
    now = now or utcnow()
    with session_scope() as session:
        ab = get_ab(session, ab_id)
        owed = ab.report_state in (ReportState.PENDING, ReportState.FAILED_RETRYING)
        if not owed or ab.status not in (ABStatus.DONE, ABStatus.FAILED):
            return ab.report_state
        assert ab.pr_number is not None  # a local A/B owes no report
        newer = latest_for_pr(session, ab.repository or "", ab.pr_number)
        if newer is not None and newer.id != ab.id:
            ab.report_state = ReportState.SUPERSEDED.value
            log.info(
                "A/B %d: PR #%d has a newer A/B (%d); not reported", ab_id, ab.pr_number, newer.id
            )
            return ab.report_state
        reporter = reporter or make_reporter(settings)
        if reporter is None:
            ab.report_state = ReportState.NONE.value
            ab.report_error = "no GitHub configured (NIGHTBENCH_GITHUB_REPOSITORY, _TOKEN)"
            return ab.report_state
        try:
            pr = reporter.pull_request(ab.pr_number)
            view = view_of(ab, settings=settings, current_head=pr.head_sha)
            comment_id, url = reporter.upsert_comment(ab.pr_number, comment_body(view))
            state, description = status_of(view)
            reporter.set_status(
                ab.head_sha,
                state=state,
                description=description,
                target_url=url,
            )
        except REPORT_FAILURES as exc:
            ab.report_attempts += 1
            ab.report_state = ReportState.FAILED_RETRYING.value
            ab.report_error = exc.message
            ab.next_report_at = now + backoff(ab.report_attempts)
            level = logging.ERROR if isinstance(exc, TrackerAccessDenied) else logging.WARNING
            log.log(
                level,
                "A/B %d: reporting on PR #%d failed (attempt %d), retried at %s: %s",
                ab_id,
                ab.pr_number,
                ab.report_attempts,
                ab.next_report_at.isoformat(),
                exc.message,
            )
            return ab.report_state
        ab.report_state = ReportState.REPORTED.value
        ab.report_error = None
        ab.next_report_at = None
        ab.comment_id, ab.comment_url, ab.reported_head = comment_id, url, pr.head_sha
        log.info("A/B %d reported on PR #%d: %s (%s)", ab_id, ab.pr_number, state, url)
        return ab.report_state


def due_ids(*, now: datetime | None = None, force: bool = False) -> list[int]:
    """A/Bs whose report is owed and due (``force``: due or not)."""
    now = now or utcnow()
    with session_scope() as session:
        stmt = select(ABTest.id).where(
            ABTest.report_state.in_([ReportState.PENDING.value, ReportState.FAILED_RETRYING.value]),
            ABTest.status.in_([ABStatus.DONE.value, ABStatus.FAILED.value]),
        )
        if not force:
            stmt = stmt.where(or_(ABTest.next_report_at.is_(None), ABTest.next_report_at <= now))
        return list(session.scalars(stmt.order_by(ABTest.id)))


def retry_due(
    *,
    settings: Settings | None = None,
    reporter: PullRequestReporter | None = None,
    force: bool = False,
) -> dict[int, str]:
    """Report every A/B whose report is owed and due; ``{ab_id: state after}``."""
    settings = settings or get_settings()
    return {
        ab_id: report_ab(ab_id, settings=settings, reporter=reporter)
        for ab_id in due_ids(force=force)
    }
