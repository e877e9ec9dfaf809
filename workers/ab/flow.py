"""An A/B through the workers: asked for, measured on a worker, reported on the pull request.

The chain: :func:`request_ab` (the workflow's ``nightbench ab --pr N --dispatch``: reads the
PR, refuses a fork or a requester without write access, stores the A/B) → ``ab.run`` on the
measuring queue (:func:`measure`: builds both commits with the configured provider, measures,
judges, stores) → ``ab.report`` on ``control`` (:func:`workers.ab.reporting.report_ab`). A
run task that fails for good stores the failure (:func:`give_up`) and is reported all the same.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InvalidInput
from service.models import ABStatus
from service.models.base import utcnow
from workers.ab import store
from workers.ab.reporting import REPORT_FAILURES, make_reporter
from workers.ab.run import ABRequest, run_ab
from workers.builds.registry import provider_from_spec, spec_from_settings
from workers.enqueue import Step

log = logging.getLogger(__name__)

WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
"""Who may ask for an A/B: it builds and runs the PR's code on the workers."""


def request_ab(
    request: ABRequest,
    *,
    pr_number: int | None = None,
    requested_by: str | None = None,
    queue: str = "cpu",
    settings: Settings | None = None,
) -> tuple[int, list[Step]]:
    """Store an A/B and say what to send.

    With ``pr_number``, the PR is read from GitHub and its commits replace ``request``'s: base
    = its merge base, head = its head commit; a PR from a fork, or a requester without write
    access, is refused (stored ``failed`` with the reason, and reported on the PR).

    Args:
        request: what to measure, and the commits of a local A/B.
        pr_number: the pull request in ``github_repository``.
        requested_by: the GitHub login that asked (its permission is checked), or ``cli``.
        queue: the queue the measuring goes to (``cpu``, ``gpu.<class>``).
        settings: the settings (default: the process's).

    Returns:
        The A/B's id and the steps to send (``ab.run`` on ``queue``, or ``ab.report`` for a
        refusal).

    Raises:
        InvalidInput: a PR without GitHub configured, or no build provider configured.
        NotFound, InfrastructureError: GitHub could not give the PR.
    """
    settings = settings or get_settings()
    spec = spec_from_settings(settings)
    if spec is None:
        raise InvalidInput(
            "no build provider is configured: set NIGHTBENCH_BISECT_PROVIDER (checkout, "
            "python-overlay, wheel) and its options; an A/B builds both commits with it"
        )
    if pr_number is None:
        if spec.get("kind") == "python-overlay" and not spec.get("base_sha"):
            spec = {**spec, "base_sha": request.base_sha}
        with session_scope() as session:
            ab = store.create_ab(
                session, request, provider_spec=spec, requested_by=requested_by, queue=queue
            )
            return ab.id, [Step("ab.run", (ab.id,), queue=queue)]
    reporter = make_reporter(settings)
    if reporter is None:
        raise InvalidInput(
            "an A/B of a pull request needs GitHub: set NIGHTBENCH_GITHUB_REPOSITORY and "
            "NIGHTBENCH_GITHUB_TOKEN"
        )
    pr = reporter.pull_request(pr_number)
    refusal = None
    if pr.is_fork:
        refusal = (
            f"PR #{pr_number} comes from a fork ({pr.head_repository or 'deleted'}): an A/B "
            "builds and runs the PR's code on the workers, which hold the repository's secrets, "
            "so it runs only for branches of the repository itself"
        )
    elif requested_by and reporter.permission(requested_by) not in WRITE_PERMISSIONS:
        refusal = (
            f"{requested_by} may not start an A/B: it runs the PR's code on the workers, so "
            "it takes write access to the repository"
        )
    ab_request = replace(request, base_sha=pr.merge_base, head_sha=pr.head_sha)
    if spec.get("kind") == "python-overlay" and not spec.get("base_sha"):
        # Each side's .py files are laid over the installed build, taken to be the merge
        # base's (the base's nightly): the base side is that build, the head its PR's files.
        spec = {**spec, "base_sha": pr.merge_base}
    with session_scope() as session:
        ab = store.create_ab(
            session,
            ab_request,
            provider_spec=spec,
            repository=settings.github_repository,
            pr_number=pr_number,
            requested_by=requested_by,
            queue=queue,
        )
        if refusal is not None:
            ab.options = {**ab.options, "refused": True}
            store.fail(session, ab, refusal)
            return ab.id, [Step("ab.report", (ab.id,))]
        return ab.id, [Step("ab.run", (ab.id,), queue=queue)]


def measure(ab_id: int, *, settings: Settings | None = None) -> list[Step]:
    """Build, measure and judge A/B ``ab_id`` (the ``ab.run`` task); then its report is owed.

    A build that fails is the A/B's error, not the task's. Running twice measures again (a
    redelivered task after a lost worker): the later figures replace the earlier ones.

    Returns:
        ``ab.report`` for a pull request's A/B; nothing for a local one.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        ab = store.get_ab(session, ab_id)
        if ab.status in (ABStatus.DONE, ABStatus.FAILED):
            return _report_steps(ab.pr_number, ab_id)
        ab.status, ab.started_at = ABStatus.RUNNING.value, utcnow()
        request = ABRequest.from_options(ab.base_sha, ab.head_sha, ab.options)
        spec = dict(ab.options.get("provider") or {})
        pr_number, head = ab.pr_number, ab.head_sha
    _pending_status(pr_number, head, settings)
    work_dir = (settings.bisect_work_dir or Path(settings.data_dir) / "bisect") / f"ab-{ab_id}"
    provider = provider_from_spec(spec, work_dir=work_dir)
    outcome = run_ab(
        request,
        provider,
        threshold_for=settings.threshold_for,
        progress=lambda line: log.info("A/B %d: %s", ab_id, line),
    )
    with session_scope() as session:
        ab = store.get_ab(session, ab_id)
        store.save_outcome(session, ab, outcome)
    return _report_steps(pr_number, ab_id)


def give_up(ab_id: int, *, reason: str) -> list[Step]:
    """A/B ``ab_id``'s run task failed for good: store ``reason`` and report it."""
    with session_scope() as session:
        ab = store.get_ab(session, ab_id)
        if ab.status in (ABStatus.DONE, ABStatus.FAILED):
            return []
        store.fail(session, ab, reason)
        return _report_steps(ab.pr_number, ab_id)


def _report_steps(pr_number: int | None, ab_id: int) -> list[Step]:
    return [Step("ab.report", (ab_id,))] if pr_number is not None else []


def _pending_status(pr_number: int | None, head: str, settings: Settings) -> None:
    """Best effort: the head's status says the A/B is measuring (a refusal is only logged:
    the report at the end is the durable one)."""
    if pr_number is None:
        return
    reporter = make_reporter(settings)
    if reporter is None:
        return
    try:
        reporter.set_status(head, state="pending", description="nightbench A/B: measuring")
    except REPORT_FAILURES as exc:
        log.warning("A/B of PR #%d: could not set the pending status: %s", pr_number, exc)
