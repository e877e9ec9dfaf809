"""A bisection's outcome as JSON: what ``nightbench bisect --json`` prints (the local driver's
:class:`~workers.bisect.local_driver.BisectionReport`) and what the Celery driver stores in the
bisection's row, with the details of the culprit commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.models.base import utcnow
from workers.bisect.state import BisectionState, Outcome
from workers.commits import CommitInfo


def outcome_json(
    state: BisectionState, result: Outcome, info: Mapping[str, CommitInfo] | None = None
) -> dict[str, object]:
    """The JSON form of a bisection's outcome (see
    :meth:`workers.bisect.local_driver.BisectionReport.as_json`)."""
    info = info or {}
    changes = {b.benchmark: b.change for b in result.benchmarks}
    culprits = []
    for sha, names in result.culprits:
        c = info.get(sha)
        culprits.append(
            {
                "sha": sha,
                "title": c.title if c else None,
                "author": c.author_name if c else None,
                "author_email": c.author_email if c else None,
                "pr_number": c.pr_number if c else None,
                "date": c.date.isoformat() if c else None,
                "benchmarks": list(names),
                "change": {n: changes.get(n) for n in names},
            }
        )
    return {
        "outcome": result.kind,
        "good": state.good,
        "bad": state.bad,
        "commits": len(state.commits) - 1,
        "builds": result.builds,
        "rounds": result.rounds,
        "culprits": culprits,
        "benchmarks": [
            {
                "benchmark": b.benchmark,
                "status": b.status,
                "culprit": b.culprit,
                "range": list(b.range),
                "change": b.change,
                "reason": b.reason,
            }
            for b in result.benchmarks
        ],
        "skipped": [{"sha": sha, "reason": reason} for sha, reason in result.skipped],
        "probes": [
            {
                "round": p.round,
                "sha": p.sha,
                "index": p.index,
                "purpose": p.purpose,
                "status": p.status,
                "build_seconds": p.build_seconds,
                "reason": p.reason,
                "results": [
                    {
                        "benchmark": r.benchmark,
                        "samples": list(r.samples),
                        "vs_good": r.vs_good,
                        "vs_bad": r.vs_bad,
                        "side": r.side,
                        "error": r.error,
                        "reference_rounds": list(r.reference_rounds),
                    }
                    for r in p.results
                ],
            }
            for p in state.probes
        ],
    }


def commit_info(data: Mapping[str, Any]) -> CommitInfo:
    """A commit as the bisection's row stores it (:meth:`CommitInfo.as_json`), for the report."""
    from datetime import datetime

    return CommitInfo(
        sha=data["sha"],
        title=data.get("title") or "",
        author_name=data.get("author") or "",
        author_email=data.get("author_email") or "",
        date=datetime.fromisoformat(data["date"]) if data.get("date") else utcnow(),
        pr_number=data.get("pr_number"),
        files=tuple(data.get("files") or ()),
        parent=data.get("parent"),
    )
