"""A night without a result counts toward a step's wait in the nightly service (Postgres): the
detector reads the series' dates, not its count of results."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pytest

from service.db import session_scope
from service.models import Run
from service.regressions import service as regressions
from service.results.service import store_record
from service.runs import service as runs
from service.runs.service import BenchmarkSpec

ENV = {
    "cpu_model": "test-cpu",
    "threads": 1,
    "torch_version": "2.13.0+cpu",
    "torch_git_version": "f" * 40,
}
SPEC = BenchmarkSpec(model="dqn", mode="eval")
# A busy host (nights stray by up to 9%) that made one two-night excursion of +35%, back after
# it: a step of that size waits for its third night.
BUSY = [0.0, 6.1, -4.8, 8.7, -2.9, 3.8, -7.2, 1.6, 7.9, -4.1, 2.7, -9.0, 5.2, -1.3, 4.4, -6.0]
HISTORY = BUSY + BUSY[:6] + [35.0, 37.0] + BUSY + BUSY
DAY0 = date(2026, 8, 1)


def _night(day: int, offset_pct: float | None, rng: random.Random) -> int:
    """A nightly run on ``DAY0 + day`` measuring dqn eval at ``offset_pct`` above 10 ms, or
    failing (None); returns its id."""
    with session_scope() as session:
        run = runs.create_run(session, night=DAY0 + timedelta(days=day), benchmarks=[SPEC])
        job = runs.list_jobs(session, run_id=run.id)[0]
        if offset_pct is None:
            runs.end_job(session, job=job, error="worker lost")
            return run.id
        level = 10.0 * (1 + offset_pct / 100)
        samples = [level * (1 + rng.gauss(0, 0.001)) for _ in range(20)]
        store_record(
            session,
            run=run,
            job=job,
            record={
                "model": "dqn",
                "mode": "eval",
                "device": "cpu",
                "benchmark_version": "v1",
                "environment": ENV,
                "metrics": [
                    {
                        "metric": "latency",
                        "unit": "ms",
                        "samples": samples,
                        "median": sorted(samples)[10],
                        "iqr": 0.01,
                    }
                ],
            },
        )
        runs.end_job(session, job=job, error=None)
        return run.id


@pytest.mark.parametrize("failed_between", [True, False])
def test_a_steps_second_result_after_a_failed_night_is_raised(
    database_url: str,
    failed_between: bool,
) -> None:
    rng = random.Random(5)
    for day, offset in enumerate(HISTORY):
        _night(day, offset, rng)
    n = len(HISTORY)
    first = _night(n, 40.0, rng)
    if failed_between:
        _night(n + 1, None, rng)
    second = _night(n + 2 if failed_between else n + 1, 41.0, rng)
    with session_scope() as session:
        (assessed,) = regressions.assess_run(
            session,
            run=session.get(Run, second),
            threshold_for=lambda metric, name: 0.07,
            baseline_nights=120,
        )
        verdict = assessed.assessment
        assert verdict.verdict == "regression"
        # Three calendar nights: raised from its first night, as a step behind no excursion
        # is on its second. Two in a row: still a candidate, the host has strayed so before.
        assert verdict.confirmed is failed_between
        if failed_between:
            assert assessed.first_result.run_id == first
            assert "since 2026-09-26" in verdict.reason
