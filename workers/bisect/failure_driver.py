"""Failure bisections on Celery workers: the rows of :mod:`workers.bisect.failures`' search.

A failure bisection is a ``bisections`` row whose ``config["kind"]`` is ``failure`` and whose
one benchmark is the failing one; its probes are ``probes`` rows asking for ``RUNS`` samples,
each from its own suite process (does the benchmark run at that commit?: a sample for each run
that ran, the error of the last that failed), built by the same ``bisect.probe`` task as a
latency bisection's (:func:`workers.bisect.celery_driver.measure_probe`, which runs them with
:func:`run_failure_probe`).
:func:`workers.bisect.celery_driver.advance` hands such a row to :func:`advance_failures`,
which replays the rows into a :class:`~workers.bisect.failures.FailureSearch`, plans the next
round or stores the outcome in the shape the bisections endpoint reads
(:func:`failure_outcome_json`). The nightly starts one for a benchmark that has just failed
two nights in a row (:func:`workers.issues.failing_bisect.bisect_failing`), and its issue is
told the culprit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.models import PROBE_ENDED, Bisection, BisectionStatus, Probe, ProbeStatus
from service.models.base import utcnow
from workers.bisect.failures import (
    FAILED,
    OTHER,
    RAN,
    RUNS,
    FailureOutcome,
    FailureProbe,
    FailureSearch,
    failure_outcome,
    next_failure_probes,
    record_failures,
    start_failure_search,
)
from workers.bisect.measure import MeasureError, Measurer
from workers.bisect.report import commit_info
from workers.bisect.state import ProbeRequest, ProbeResult
from workers.builds.base import BuildEnvironment, BuildError
from workers.builds.registry import KINDS
from workers.commits import CommitInfo

FAILURE = "failure"
"""``Bisection.config["kind"]`` of a failure bisection."""


def is_failure(bisection: Bisection) -> bool:
    """Whether ``bisection`` searches for the commit that broke a benchmark."""
    return (bisection.config or {}).get("kind") == FAILURE


def create_failure_bisection(
    session: Session,
    *,
    commits: Sequence[CommitInfo | Mapping[str, Any]],
    benchmark: str,
    provider: Mapping[str, Any],
    alert_id: int | None = None,
    queue: str = "cpu",
    workers: int = 1,
    repo: str | None = None,
    issue: str | None = None,
    error: str | None = None,
) -> Bisection:
    """Record a failure bisection of ``commits`` for ``benchmark`` (flushes; the caller commits,
    then calls :func:`workers.bisect.celery_driver.step`).

    Args:
        session: database session.
        commits: the range ``[last good build, ..., first failing build]`` in first-parent order.
        benchmark: the failing suite benchmark (``model:mode:device[:compiler]``).
        provider: the build provider (as :func:`workers.bisect.celery_driver.create_bisection`).
        alert_id: the ``failing`` alert whose issue is told the outcome.
        queue: the Celery queue of the probes (the machine class it fails on).
        workers: commits probed per round.
        repo: the repository, for reports.
        issue: the fingerprint of the issue told the outcome (``config["issue"]``).
        error: the night's error (``config["error"]``): a probe failing with another
            signature counts neither way (:func:`workers.bisect.failures.failure_signature`).

    Returns:
        The :class:`~service.models.Bisection` row (``run_id`` None: it files no night).

    Raises:
        InvalidInput: fewer than two commits, no benchmark, or an unknown build provider.
    """
    rows = [c.as_json() if isinstance(c, CommitInfo) else dict(c) for c in commits]
    start_failure_search([str(r["sha"]) for r in rows], benchmark, workers)  # validates
    if provider.get("kind") not in KINDS:
        raise InvalidInput(f"provider: unknown build provider {provider.get('kind')!r}")
    bisection = Bisection(
        run_id=None,
        alert_id=alert_id,
        status=BisectionStatus.RUNNING,
        repo=repo,
        good=rows[0]["sha"],
        bad=rows[-1]["sha"],
        commits=rows,
        benchmarks=[benchmark],
        regression_ids=[],
        config={
            "kind": FAILURE,
            "workers": workers,
            "measure": {"suite": True},
            "issue": issue,
            "error": error,
        },
        provider=dict(provider),
        queue=queue,
    )
    session.add(bisection)
    session.flush()
    return bisection


def replay_failures(bisection: Bisection, probes: Sequence[Probe]) -> FailureSearch:
    """The search's state after the last round whose probes have all ended, from the rows."""
    state = start_failure_search(
        [c["sha"] for c in bisection.commits],
        bisection.benchmarks[0],
        int(bisection.config.get("workers", 1)),
        error=bisection.config.get("error"),
    )
    by_round: dict[int, list[Probe]] = {}
    for p in probes:
        by_round.setdefault(p.round, []).append(p)
    for number in sorted(by_round):
        rows = by_round[number]
        if number != state.round or any(p.status not in PROBE_ENDED for p in rows):
            break
        state = record_failures(state, [_probe(p, state.benchmark) for p in rows])
    return state


def _probe(row: Probe, benchmark: str) -> FailureProbe:
    """A probe row as the search reads it: skipped (did not build), or its runs: one sample
    per run that ran, the others failed."""
    if row.status == ProbeStatus.SKIPPED:
        return FailureProbe(
            row.index,
            row.sha,
            row.purpose,
            detail=row.reason or "did not build",
            skipped=True,
            round=row.round,
        )
    ran = len((row.samples or {}).get(benchmark) or [])
    failed = max(row.samples_wanted - ran, 0)
    detail = (row.errors or {}).get(benchmark) or (
        "the benchmark gave no samples" if failed else None
    )
    return FailureProbe(
        row.index,
        row.sha,
        row.purpose,
        ran,
        failed,
        detail,
        round=row.round,
        build_seconds=row.build_seconds,
    )


def run_failure_probe(
    request: ProbeRequest, *, build: Callable[[str], BuildEnvironment], measurer: Measurer
) -> ProbeResult:
    """Build a failure probe's commit and run its benchmark in ``request.samples`` suite
    processes, one timed iteration each.

    Returns:
        The :class:`ProbeResult`: the build failure as ``skipped``; else one sample (ms) per
        run that ran, and for a run that failed its error (the last one's, with how many of
        the runs failed).
    """
    try:
        env = build(request.sha)
    except BuildError as exc:
        return ProbeResult(request.sha, request.purpose, skipped=exc.detail())
    (benchmark,) = request.benchmarks
    taken, errors = [], []
    for _ in range(request.samples):
        try:
            taken.append(measurer.measure_once(env, benchmark, 1)[0])
        except MeasureError as exc:
            errors.append(exc.message)
    failed = (
        {benchmark: f"{errors[-1]} ({len(errors)} of {request.samples} runs failed)"}
        if errors
        else {}
    )
    return ProbeResult(
        request.sha,
        request.purpose,
        {benchmark: tuple(taken)},
        build_seconds=env.build_seconds,
        errors=failed,
    )


def advance_failures(
    session: Session, bisection: Bisection, probes: Sequence[Probe]
) -> tuple[list[Probe], bool]:
    """Plan the next round of a failure bisection whose last round has ended, or store its
    outcome (flushes only; the caller holds the bisection's row lock).

    Returns:
        ``(probe rows added, finished now)``: no rows while a round still runs.
    """
    state = replay_failures(bisection, probes)
    if any(p.round >= state.round for p in probes):
        return [], False  # this round is planned already and still running
    planned = next_failure_probes(state)
    if planned:
        rows = [
            Probe(
                bisection_id=bisection.id,
                round=state.round,
                sha=p.sha,
                index=p.index,
                purpose=p.purpose,
                benchmarks=[state.benchmark],
                samples_wanted=RUNS,
                status=ProbeStatus.QUEUED,
                attempts=0,
            )
            for p in planned
        ]
        session.add_all(rows)
        session.flush()
        return rows, False
    final = failure_outcome(state)
    assert final is not None
    bisection.result = failure_outcome_json(state, final, {c["sha"]: c for c in bisection.commits})
    bisection.outcome = final.kind
    bisection.builds, bisection.rounds = final.builds, final.rounds
    bisection.status = BisectionStatus.DONE
    bisection.finished_at = utcnow()
    session.flush()
    return [], True


def failure_outcome_json(
    state: FailureSearch, result: FailureOutcome, commits: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The outcome in the shape of a latency bisection's (``workers.bisect.report.outcome_json``:
    ``culprits``, ``benchmarks``, ``probes``), plus ``search: "failure"``, ``error``, the
    benchmark's error at the culprit, and ``other``, the probes that failed differently from
    the night (``sha``, ``error``) and were stepped around."""
    culprits = []
    if result.culprit is not None:
        info = commit_info(commits[result.culprit])
        culprits.append(
            {
                "sha": info.sha,
                "title": info.title or None,
                "author": info.author_name or None,
                "author_email": info.author_email or None,
                "pr_number": info.pr_number,
                "date": info.date.isoformat(),
                "benchmarks": [state.benchmark],
                "change": {state.benchmark: None},
            }
        )
    return {
        "search": FAILURE,
        "outcome": result.kind,
        "good": state.commits[0],
        "bad": state.commits[-1],
        "commits": len(state.commits) - 1,
        "builds": result.builds,
        "rounds": result.rounds,
        "culprits": culprits,
        "error": result.error,
        "benchmarks": [
            {
                "benchmark": state.benchmark,
                "status": result.kind,
                "culprit": result.culprit,
                "range": list(result.range),
                "change": None,
                "reason": result.reason,
            }
        ],
        "skipped": [{"sha": p.sha, "reason": p.detail} for p in state.probes if p.skipped],
        "other": [{"sha": p.sha, "error": p.detail} for p in state.probes if p.status == OTHER],
        "probes": [
            {
                "round": p.round,
                "sha": p.sha,
                "index": p.index,
                "purpose": p.purpose,
                "status": "skipped" if p.skipped else "measured",
                "build_seconds": p.build_seconds,
                "reason": p.detail if p.skipped else None,
                "results": []
                if p.skipped
                else [
                    {
                        "benchmark": state.benchmark,
                        "samples": [],
                        "vs_good": None,
                        "vs_bad": None,
                        "side": {RAN: "good", FAILED: "bad"}.get(p.status, "undecided"),
                        "error": p.detail if p.failed or p.other else None,
                    }
                ],
            }
            for p in state.probes
        ],
    }
