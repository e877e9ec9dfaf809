"""Confirmation re-runs decide what stays in a run's alert (Postgres)."""

from __future__ import annotations

import random
from datetime import date

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Alert, Regression, Run
from service.regressions import service as regressions
from service.results.service import store_record
from service.runs import service as runs
from service.runs.service import BenchmarkSpec

ENV = {"cpu_model": "test-cpu", "threads": 1, "torch_version": "2.13.0+cpu",
       "torch_git_version": "f" * 40}
SPEC = BenchmarkSpec(model="dqn", mode="eval")


def _threshold(metric: str, benchmark: str) -> float:
    return 0.07


def _store(session, run: Run, level_ms: float, rng: random.Random) -> None:  # type: ignore[no-untyped-def]
    job = runs.list_jobs(session, run_id=run.id)[0]
    samples = [level_ms * (1 + rng.gauss(0, 0.01)) for _ in range(20)]
    store_record(session, run=run, job=job, record={
        "model": "dqn", "mode": "eval", "device": "cpu", "benchmark_version": "v1",
        "environment": ENV, "metrics": [{"metric": "latency", "unit": "ms", "samples": samples,
                                         "median": sorted(samples)[10], "iqr": 0.1}]})
    runs.end_job(session, job=job, error=None)


def _candidate_night(rng: random.Random) -> int:
    """Eight nights at 10 ms, then one at 13 ms: a candidate regression in an open alert."""
    for day in range(1, 10):
        with session_scope() as session:
            run = runs.create_run(session, night=date(2026, 9, day), benchmarks=[SPEC])
            _store(session, run, 10.0 if day < 9 else 13.0, rng)
            run_id = run.id
    with session_scope() as session:
        run = session.get(Run, run_id)
        assessed = regressions.assess_run(session, run=run, threshold_for=_threshold,
                                          baseline_nights=60)
        alert = regressions.record_regressions(session, run=run, assessed=assessed,
                                               threshold_for=_threshold)
        assert alert is not None and alert.summary.startswith("1 regression(s)")
    return run_id


@pytest.mark.parametrize(("rerun_ms", "reproduced"), [(13.0, True), (10.0, False)])
def test_confirmation_keeps_a_reproduced_regression_and_drops_a_blip_from_the_alert(
    database_url: str, rerun_ms: float, reproduced: bool,
) -> None:
    rng = random.Random(11)
    parent_id = _candidate_night(rng)
    with session_scope() as session:
        parent = session.get(Run, parent_id)
        confirm = runs.create_run(session, night=parent.night, benchmarks=[SPEC], kind="confirm",
                                  parent_run_id=parent_id)
        _store(session, confirm, rerun_ms, rng)
        got = regressions.apply_confirmation(session, parent=parent, confirm_run=confirm,
                                             threshold_for=_threshold, baseline_nights=60)
    with session_scope() as session:
        (regression,) = session.scalars(select(Regression).where(Regression.run_id == parent_id))
        alert = session.scalar(select(Alert).where(Alert.run_id == parent_id))
        if reproduced:
            assert [r.id for r in got] == [regression.id]
            assert regression.confirmation == "reproduced" and regression.alertable
            assert alert is not None and regression.alert_id == alert.id
            assert alert.summary.startswith("1 regression(s)")
        else:
            assert got == []
            assert regression.confirmation == "not_reproduced" and not regression.alertable
            # The blip is kept for the record but is no longer part of any alert, and the
            # alert it left empty is gone.
            assert regression.alert_id is None and alert is None
            assert "Not reproduced by the confirmation re-run" in regression.reason
