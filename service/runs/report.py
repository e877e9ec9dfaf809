"""The night's report: every result with its baseline, change and verdict (``nightbench report``).

Shape of :func:`run_report` (also ``nightbench report --json``)::

    {"run": {"id", "night", "kind", "status", "torch_spec", "torch_version", "torch_git_commit",
             "jobs": {"total", "done", "error", "missing", "skipped"}},
     "results": [{"benchmark", "model", "mode", "device", "compiler", "metric", "unit",
                  "baseline", "value", "change", "p_value", "verdict", "smallest_change",
                  "samples", "iqr", "error", "processes"}, ...],
     "regressions": [{"id", "benchmark", "metric", "direction", "baseline", "value", "change",
                      "p_value", "confirmation", "state", "alertable", "reason"}, ...],
     "alerts": [{"id", "kind", "status", "summary"}, ...],
     "environment_changes": ["build variant cpu → cu130: an environment change, not a regression",
                             ...],
     "stability_changes": [{"benchmark", "machine_id", "from", "to", "cv", "spread", "source"},
                           ...],
     "failed_processes": [{"benchmark", "process", "run_id", "error"}, ...],
     "skipped": [{"benchmark", "reason"}, ...]}

``environment_changes`` compares the build identity of tonight's results (``torch_variant``,
``requirements_hash``; ``service/results/records.py``) with the previous run's: such a change
starts new series (no baseline), so the report says why instead of leaving it to look like a
regression or a gap. ``processes`` is how many processes tonight's level stands on (1, or more
with ``NIGHTBENCH_NIGHT_PROCESSES``; ``value`` is then the median of their medians).
``stability_changes`` lists the benchmarks whose stability verdict the
night's re-check changed (:mod:`service.stability.recheck`): ``unstable`` → ``stable`` alerts
again from the next night, ``stable`` → ``unstable`` is shown and alerted only on a regression
beyond ``DetectorParams.unstable_beyond`` (3) times its spread. ``failed_processes`` lists the
processes that failed on benchmarks the night still measured in its other processes
(:func:`service.runs.rounds.failed_processes`): process 1 is the night's own. ``skipped`` lists
the benchmarks a posted run's runner withdrew (``POST /api/runs/{id}/skipped``: a model not
available there, a mode its device does not offer) with its reason: neither an error nor missing.
Results are in benchmark order, each benchmark's metrics in the metric table's order
(:data:`service.metrics.METRICS`: latency first). ``smallest_change`` is the smallest step the verdict could have seen: the step its series' noise
lets the detector raise within three nights 95% of the time, against the nights before tonight
(:mod:`service.regressions.sensitivity`; None without a baseline).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.metrics import ALERT_METRICS, exact_levels
from service.metrics import order as metric_order
from service.models import Alert, Confirmation, Job, JobStatus, Regression, Result, Run, RunKind
from service.regressions.rules import DEFAULT_PARAMS
from service.regressions.sensitivity import series_smallest_change
from service.regressions.service import assess_run, history_nights, unstable_spreads
from service.regressions.unstable import alerts_from
from service.results.records import build_identity
from service.runs.rounds import failed_processes
from service.runs.service import get_run, run_results
from service.series import night_processes, round_results
from service.stability.recheck import stability_changes


def latest_run_id(session: Session, *, kind: str = RunKind.NIGHTLY) -> int | None:
    """The newest run of ``kind`` (``nightly``, ``confirmation``, ...), or None if there is none."""
    return session.scalar(select(Run.id).where(Run.kind == kind).order_by(Run.id.desc()).limit(1))


NOT_A_REGRESSION = "an environment change, not a regression"
"""What a build identity change means in the night's report: its new series have no baseline."""


def environment_changes(
    previous: dict[str, Any] | None,
    tonight: dict[str, Any] | None,
    *,
    meaning: str = NOT_A_REGRESSION,
) -> list[str]:
    """What changed in the build's identity between two runs' environments, as report lines.

    The identity is :func:`service.results.records.build_identity`: the torch wheel's variant
    and the hash of the environment's frozen suite requirements.

    Args:
        previous: an environment of the earlier results (None: no earlier run).
        tonight: an environment of this run's results (None: no result with one).
        meaning: what the change means where the line is shown, after the colon (the night's
            report: :data:`NOT_A_REGRESSION`; an issue says the build moved beside the commits).

    Returns:
        One line per changed part, e.g. ``"build variant cpu → cu130: an environment change, not
        a regression"``; empty when nothing changed or either side is unknown.
    """
    if not previous or not tonight:
        return []
    (old_variant, old_reqs), (new_variant, new_reqs) = (
        build_identity(previous),
        build_identity(tonight),
    )
    lines = []
    if old_variant != new_variant:
        lines.append(f"build variant {old_variant or 'none'} → {new_variant or 'none'}: {meaning}")
    if old_reqs != new_reqs:
        lines.append(
            f"suite requirements {old_reqs[:12] or 'unrecorded'} → "
            f"{new_reqs[:12] or 'unrecorded'}: {meaning}"
        )
    return lines


def run_environment_changes(
    session: Session, *, run: Run, meaning: str = NOT_A_REGRESSION
) -> list[str]:
    """:func:`environment_changes` between the run before ``run`` (its ``previous_run_id``, else
    the latest earlier run of its kind) and ``run``, each read from one measured result."""
    return environment_changes(
        _run_environment(session, _previous_run_id(session, run)),
        _run_environment(session, run.id),
        meaning=meaning,
    )


def _run_environment(session: Session, run_id: int | None) -> dict[str, Any] | None:
    """The environment of one measured result of the run (None when it has none)."""
    if run_id is None:
        return None
    return (
        session.scalar(
            select(Result.environment)
            .where(Result.run_id == run_id, Result.error.is_(None))
            .order_by(Result.id)
            .limit(1)
        )
        or None
    )


def _previous_run_id(session: Session, run: Run) -> int | None:
    if run.previous_run_id is not None:
        return run.previous_run_id
    return session.scalar(
        select(Run.id)
        .where(Run.kind == run.kind, Run.night < run.night)
        .order_by(Run.night.desc(), Run.id.desc())
        .limit(1)
    )


def run_report(session: Session, *, run_id: int, settings: Settings) -> dict[str, Any]:
    """Build the report of run ``run_id``. Raises ``NotFound`` for an unknown run."""
    run = get_run(session, run_id)
    jobs = list(session.scalars(select(Job).where(Job.run_id == run_id)))
    counts = Counter(j.status for j in jobs)
    assessed = {
        item.result.id: item.assessment
        for item in assess_run(
            session,
            run=run,
            threshold_for=lambda m, b: settings.threshold_for(m, b),
            baseline_nights=settings.baseline_nights,
        )
    }
    rounds = round_results(session, run_ids=[run_id])
    regs = list(
        session.scalars(
            select(Regression).where(Regression.run_id == run_id).order_by(Regression.id)
        )
    )
    by_result = {r.result_id: r for r in regs}
    results = []
    ordered = sorted(
        run_results(session, run_id=run_id),
        key=lambda r: (r.model, r.mode, r.device, r.compiler, metric_order(r.metric)),
    )
    for res in ordered:
        a = assessed.get(res.id)
        verdict = "error" if res.error else (a.verdict if a else "recorded")
        baseline = a.baseline if a else None
        change = a.change if a else None
        n = len(night_processes(res, rounds.get((run_id, res.series_key or ""), []))) or 1
        # With several processes, tonight's level is the median of their medians.
        level = a.value if a is not None and n > 1 else res.median
        if a is not None and a.verdict == "no_baseline" and level is not None:
            # Too few nights to judge, but still show the comparison with what there is.
            history = history_nights(session, result=res, limit=settings.baseline_nights)
            if history:
                baseline = statistics.median(statistics.median(h.samples) for h in history)
                change = level / baseline - 1 if baseline else None
        reg = by_result.get(res.id)
        if reg is not None and reg.direction == "regression":
            verdict = {
                "reproduced": "regression",
                "not_reproduced": "not reproduced",
                "pending": "flagged",
                "not_possible": "flagged",
            }[reg.confirmation]
            if not reg.alertable and reg.confirmation != Confirmation.NOT_REPRODUCED:
                verdict = _unstable_verdict(session, reg, res.machine_id)
        smallest = None
        if a is not None and not res.error and res.metric in ALERT_METRICS:
            earlier = history_nights(session, result=res, limit=DEFAULT_PARAMS.window)
            smallest = series_smallest_change(
                [statistics.median(h.samples) for h in earlier if h.samples],
                settings.threshold_for(res.metric, f"{res.model}:{res.mode}"),
                memory=exact_levels(res.metric),
            )
        results.append(
            {
                "benchmark": res.benchmark,
                "model": res.model,
                "mode": res.mode,
                "device": res.device,
                "compiler": res.compiler,
                "metric": res.metric,
                "unit": res.unit,
                "baseline": baseline,
                "value": level,
                "processes": n,
                "change": change,
                "p_value": a.p_value if a else None,
                "verdict": verdict,
                "smallest_change": smallest,
                "samples": len(res.samples),
                "iqr": res.iqr,
                "error": res.error,
            }
        )
    alerts = session.scalars(select(Alert).where(Alert.run_id == run_id).order_by(Alert.id))
    return {
        "run": {
            "id": run.id,
            "night": run.night.isoformat(),
            "kind": run.kind,
            "status": run.status,
            "torch_spec": run.torch_spec,
            "torch_version": run.torch_version,
            "torch_git_commit": run.torch_git_commit,
            "note": run.note,
            "jobs": {
                "total": len(jobs),
                "done": counts["done"],
                "error": counts["error"],
                "missing": counts["missing"],
                "skipped": counts["skipped"],
            },
        },
        "results": results,
        "regressions": [
            {
                "id": r.id,
                "benchmark": r.benchmark,
                "metric": r.metric,
                "direction": r.direction,
                "baseline": r.baseline,
                "value": r.value,
                "change": r.change,
                "p_value": r.p_value,
                "confirmation": r.confirmation,
                "state": r.state,
                "alertable": r.alertable,
                "reason": r.reason,
            }
            for r in regs
        ],
        "alerts": [
            {"id": a.id, "kind": a.kind, "status": a.status, "summary": a.summary} for a in alerts
        ],
        "environment_changes": run_environment_changes(session, run=run),
        "stability_changes": stability_changes(session, run_id=run.id),
        "failed_processes": failed_processes(session, run_id=run.id),
        "skipped": [
            {"benchmark": j.benchmark, "reason": j.error or ""}
            for j in sorted(jobs, key=lambda j: j.id)
            if j.status == JobStatus.SKIPPED
        ],
    }


def _unstable_verdict(session: Session, reg: Regression, machine_id: int | None) -> str:
    """``"regression (unstable, alerts from +45.0%)"``: a regression shown, not alerted, by the
    verdict of its series' machine."""
    spreads = unstable_spreads(session, by_machine=True)
    spread = spreads.get((reg.model, reg.mode, reg.device, reg.compiler, machine_id))
    bar = alerts_from(spread, reg.threshold)
    return (
        "regression (unstable)"
        if bar is None
        else (f"regression (unstable, alerts from {bar * 100:+.1f}%)")
    )
