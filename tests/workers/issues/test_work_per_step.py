"""A regression in time says whether the work per step (cpu_instructions) moved with it."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest

from service.config import get_settings
from service.db import session_scope
from service.results.service import store_record
from service.runs import service as runs
from tests.nights import ENV, SPEC
from workers.night import deadline


def _night(day: int, latency_ms: float, count: float, rng: random.Random) -> int:
    """A posted night of dqn eval with its latency and its instruction count, then the sweep."""
    with session_scope() as session:
        run = runs.create_run(session, night=date(2026, 10, day), kind="ingest", benchmarks=[SPEC])
        job = runs.list_jobs(session, run_id=run.id)[0]
        times = [latency_ms * (1 + rng.gauss(0, 0.01)) for _ in range(20)]
        counts = [count * (1 + rng.gauss(0, 0.0005)) for _ in range(3)]
        store_record(
            session,
            run=run,
            job=job,
            record={
                "model": SPEC.model,
                "mode": SPEC.mode,
                "device": "cpu",
                "benchmark_version": "v1",
                "environment": {**ENV, "torch_git_version": f"{day:040x}"},
                "metrics": [
                    {
                        "metric": "latency",
                        "unit": "ms",
                        "samples": times,
                        "median": sorted(times)[10],
                    },
                    {
                        "metric": "cpu_instructions",
                        "unit": "instructions",
                        "samples": counts,
                        "median": sorted(counts)[1],
                    },
                ],
            },
        )
        runs.end_job(session, job=job, error=None)
        run.status = "detecting"
        run_id = run.id
    assert deadline.sweep_deadlines() == [run_id]
    return run_id


def _issues() -> list[str]:
    outbox = Path(get_settings().effective_outbox_dir)
    return [p.read_text() for p in sorted(outbox.glob("*.md"))]


@pytest.mark.parametrize(
    ("count_after", "says"),
    [
        (100e6, "The work per step did not change: cpu_instructions 100.0 M instr →"),
        (112e6, "The work per step moved too: cpu_instructions 100.0 M instr → 112.0 M instr"),
    ],
)
def test_a_latency_regression_says_whether_the_count_moved(
    database_url: str, configure: Callable[..., None], count_after: float, says: str
) -> None:
    rng = random.Random(3)
    for day in range(1, 11):
        _night(day, 10.0, 100e6, rng)
    for day in (11, 12):
        _night(day, 13.0, count_after, rng)
    issues = _issues()
    assert issues, "no issue was filed"
    body = "\n".join(issues)
    assert "dqn eval cpu latency +3" in body
    assert says in body, body[-4000:]
