"""Keeping A/Bs: the ``ab_tests`` row and the processes as two runs of kind ``ab``.

The processes go to the run of their side (``options``: ``{"ab_id", "side", "sha"}``), one
:class:`~service.models.Result` per benchmark metric whose samples are the replicates (per
process the median of its iterations or its peak; per counted step the instructions), with no
series key: no series, baseline or chart reads them.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import InvalidInput, NotFound
from service.metrics import METRICS
from service.models import ABStatus, ABTest, ReportState, Result, Run, RunKind, RunStatus
from service.models.base import utcnow
from workers.ab.run import ABOutcome, ABRequest
from workers.bisect.measure import parse_benchmark


def create_ab(
    session: Session,
    request: ABRequest,
    *,
    provider_spec: dict[str, Any] | None,
    repository: str | None = None,
    pr_number: int | None = None,
    requested_by: str | None = None,
    queue: str = "cpu",
) -> ABTest:
    """Store a new A/B, ``queued`` (flushed: its id is set).

    Args:
        session: an open session (the caller commits).
        request: what to measure.
        provider_spec: the build provider's spec (``workers.builds.registry``), kept with it.
        repository: the pull request's ``owner/name``, or None for a local A/B.
        pr_number: the pull request, or None for a local A/B.
        requested_by: who asked (a GitHub login, ``cli``).
        queue: the queue that measures it (``cpu``, ``gpu.<class>``; ``local`` on this machine).
    """
    ab = ABTest(
        status=ABStatus.QUEUED.value,
        repository=repository,
        pr_number=pr_number,
        requested_by=requested_by,
        base_sha=request.base_sha,
        head_sha=request.head_sha,
        options={**request.as_options(), "provider": provider_spec, "queue": queue},
        rows=[],
        profiles={},
        report_state=(
            ReportState.PENDING.value if pr_number is not None else ReportState.NONE.value
        ),
    )
    session.add(ab)
    session.flush()
    return ab


def get_ab(session: Session, ab_id: int) -> ABTest:
    """A/B ``ab_id``.

    Raises:
        NotFound: there is none.
    """
    ab = session.get(ABTest, ab_id)
    if ab is None:
        raise NotFound(f"no A/B {ab_id}")
    return ab


def save_outcome(session: Session, ab: ABTest, outcome: ABOutcome) -> None:
    """Keep what ``ab`` found: its rows, profiles or error, and the processes as two runs.

    The A/B is ``done`` when measured (whatever its rows say) and ``failed`` when a build
    failed. A report is then owed on a pull request's A/B (``pending``).
    """
    ab.rows = [row.as_dict() for row in outcome.rows]
    ab.profiles = dict(outcome.profiles)
    ab.error = outcome.error
    ab.status = ABStatus.FAILED.value if outcome.error else ABStatus.DONE.value
    ab.finished_at = utcnow()
    ab.options = {
        **ab.options,
        "build_seconds": outcome.build_seconds,
        "remeasured": outcome.remeasured,
    }
    if ab.pr_number is not None:
        ab.report_state = ReportState.PENDING.value
        ab.next_report_at = None
    if outcome.measured:
        ab.base_run_id = _side_run(session, ab, "base", ab.base_sha, outcome).id
        ab.head_run_id = _side_run(session, ab, "head", ab.head_sha, outcome).id


def fail(session: Session, ab: ABTest, error: str) -> None:
    """Mark ``ab`` failed with ``error`` (a PR that cannot be read, a fork refused, a task
    that failed for good); its report is owed like a finished one's."""
    ab.status = ABStatus.FAILED.value
    ab.error = error
    ab.finished_at = utcnow()
    if ab.pr_number is not None:
        ab.report_state = ReportState.PENDING.value


def _side_run(session: Session, ab: ABTest, side: str, sha: str, outcome: ABOutcome) -> Run:
    index = 0 if side == "base" else 1
    today = date.today()
    run = Run(
        night=today,
        kind=RunKind.AB.value,
        torch_spec=f"ab:{sha[:12]}",
        status=RunStatus.COMPLETE.value,
        options={"ab_id": ab.id, "side": side, "sha": sha},
        started_at=ab.started_at,
        finished_at=ab.finished_at,
        note=f"A/B {ab.id}: the {side} ({sha[:12]})",
    )
    session.add(run)
    session.flush()
    for benchmark, metrics in outcome.measured.items():
        model, mode, device, compiler = _parts(benchmark)
        for metric, pair in metrics.items():
            measured = pair[index]
            values = [] if measured.error else list(measured.values)
            session.add(
                Result(
                    run_id=run.id,
                    night=today,
                    model=model,
                    mode=mode,
                    device=device,
                    compiler=compiler,
                    metric=metric,
                    unit=METRICS[metric].unit,
                    samples=values,
                    median=float(np.median(values)) if values else None,
                    error=measured.error,
                )
            )
    return run


def _parts(benchmark: str) -> tuple[str, str, str, str]:
    """A suite benchmark's parts; a command's name stands as a CPU eval model."""
    try:
        b = parse_benchmark(benchmark)
    except InvalidInput:
        return benchmark[:128], "eval", "cpu", "eager"
    return b.model, b.mode, b.device, b.compiler


def latest_for_pr(session: Session, repository: str, pr_number: int) -> ABTest | None:
    """The newest A/B of a pull request (the one whose report the comment should show)."""
    return session.scalar(
        select(ABTest)
        .where(ABTest.repository == repository, ABTest.pr_number == pr_number)
        .order_by(ABTest.id.desc())
        .limit(1)
    )
