"""The night's report: every result with its baseline, change and verdict (``nightbench report``).

Shape of :func:`run_report` (also ``nightbench report --json``)::

    {"run": {"id", "night", "kind", "status", "torch_spec", "torch_version", "torch_git_commit",
             "jobs": {"total", "done", "error", "missing"}},
     "results": [{"benchmark", "model", "mode", "device", "compiler", "metric", "unit",
                  "baseline", "value", "change", "p_value", "verdict", "samples", "iqr",
                  "error"}, ...],
     "regressions": [{"id", "benchmark", "metric", "direction", "baseline", "value", "change",
                      "p_value", "confirmation", "state", "alertable", "reason"}, ...],
     "alerts": [{"id", "kind", "status", "summary"}, ...]}
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Alert, Job, Regression, Run
from service.regressions.service import assess_run, history_nights
from service.runs.service import get_run, run_results


def latest_run_id(session: Session, *, kind: str = "nightly") -> int | None:
    return session.scalar(select(Run.id).where(Run.kind == kind).order_by(Run.id.desc()).limit(1))


def run_report(session: Session, *, run_id: int, settings: Settings) -> dict[str, Any]:
    """Build the report of run ``run_id``. Raises ``NotFound`` for an unknown run."""
    run = get_run(session, run_id)
    jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
    counts = Counter(j.status for j in jobs)
    assessed = {
        r.id: a for r, a, _ in assess_run(
            session, run=run, threshold_for=lambda m, b: settings.threshold_for(m, b),
            baseline_nights=settings.baseline_nights,
        )
    }
    regs = list(session.scalars(select(Regression).where(Regression.run_id == run_id).order_by(Regression.id)))
    by_result = {r.result_id: r for r in regs}
    results = []
    for res in run_results(session, run_id=run_id):
        a = assessed.get(res.id)
        verdict = "error" if res.error else (a.verdict if a else "recorded")
        baseline = a.baseline if a else None
        change = a.change if a else None
        if a is not None and a.verdict == "no_baseline" and res.median is not None:
            # Too few nights to judge, but still show the comparison with what there is.
            history = history_nights(session, result=res, limit=settings.baseline_nights)
            if history:
                baseline = statistics.median(statistics.median(n.samples) for n in history)
                change = res.median / baseline - 1 if baseline else None
        reg = by_result.get(res.id)
        if reg is not None and reg.direction == "regression":
            verdict = {"reproduced": "regression", "not_reproduced": "not reproduced",
                       "pending": "flagged", "not_possible": "flagged"}[reg.confirmation]
            if not reg.alertable and reg.confirmation != "not_reproduced":
                verdict = "regression (unstable)"
        results.append({
            "benchmark": res.benchmark, "model": res.model, "mode": res.mode, "device": res.device,
            "compiler": res.compiler, "metric": res.metric, "unit": res.unit,
            "baseline": baseline, "value": res.median,
            "change": change, "p_value": a.p_value if a else None,
            "verdict": verdict, "samples": len(res.samples), "iqr": res.iqr, "error": res.error,
        })
    alerts = session.scalars(select(Alert).where(Alert.run_id == run_id).order_by(Alert.id))
    return {
        "run": {
            "id": run.id, "night": run.night.isoformat(), "kind": run.kind, "status": run.status,
            "torch_spec": run.torch_spec, "torch_version": run.torch_version,
            "torch_git_commit": run.torch_git_commit,
            "jobs": {"total": len(jobs), "done": counts["done"], "error": counts["error"],
                     "missing": counts["missing"]},
        },
        "results": results,
        "regressions": [{
            "id": r.id, "benchmark": r.benchmark, "metric": r.metric, "direction": r.direction,
            "baseline": r.baseline, "value": r.value, "change": r.change, "p_value": r.p_value,
            "confirmation": r.confirmation, "state": r.state, "alertable": r.alertable,
            "reason": r.reason,
        } for r in regs],
        "alerts": [{"id": a.id, "kind": a.kind, "status": a.status, "summary": a.summary} for a in alerts],
    }
