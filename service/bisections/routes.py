"""Bisections: probes, verdicts and culprit."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api import Id, errors
from service.bisections.schemas import BisectionRead
from service.bisections.service import get_bisection
from service.deps import SessionDep

router = APIRouter(tags=["bisections"])


@router.get(
    "/api/bisections/{bisection_id}", response_model=BisectionRead, responses=errors(404, 422)
)
def read_bisection(bisection_id: Id, session: SessionDep) -> dict[str, Any]:
    """A bisection of a commit range: every probe with its samples and verdicts, and the
    culprit (or the narrowed range) per benchmark once it has ended."""
    view = get_bisection(session, bisection_id)
    b = view.bisection
    return {
        "id": b.id,
        "run_id": b.run_id,
        "alert_id": b.alert_id,
        "status": b.status,
        "search": (b.config or {}).get("kind") or "latency",
        "outcome": b.outcome,
        "good": b.good,
        "bad": b.bad,
        "commits": max(len(b.commits or []) - 1, 0),
        "benchmarks": list(b.benchmarks or []),
        "regression_ids": list(b.regression_ids or []),
        "builds": b.builds,
        "rounds": b.rounds,
        "error": b.error,
        "created_at": b.created_at,
        "finished_at": b.finished_at,
        "culprits": [
            {
                k: c.get(k)
                for k in ("sha", "title", "author", "pr_number", "benchmarks", "change")
                if c.get(k) is not None
            }
            for c in view.culprits
        ],
        "answers": [
            {
                "benchmark": a.get("benchmark"),
                "status": a.get("status"),
                "culprit": a.get("culprit"),
                "range": list(a.get("range") or []),
                "change": a.get("change"),
                "reason": a.get("reason") or "",
            }
            for a in view.answers
        ],
        "probes": [
            {
                "id": p.id,
                "round": p.round,
                "sha": p.sha,
                "index": p.index,
                "purpose": p.purpose,
                "status": p.status,
                "attempts": p.attempts,
                "worker": p.worker,
                "build_seconds": p.build_seconds,
                "benchmarks": list(p.benchmarks or []),
                "samples": p.samples,
                "errors": p.errors,
                "reason": p.reason,
                "verdicts": [
                    {
                        "benchmark": v.get("benchmark"),
                        "samples": v.get("samples") or [],
                        "vs_good": v.get("vs_good"),
                        "vs_bad": v.get("vs_bad"),
                        "side": v.get("side"),
                        "error": v.get("error"),
                        "reference_rounds": list(v.get("reference_rounds") or []),
                    }
                    for v in view.verdicts.get((p.round, p.sha), [])
                ],
            }
            for p in view.probes
        ],
        "commit_range": list(b.commits or []),
    }
