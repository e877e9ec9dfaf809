"""Runs posted through the API are checked too: the periodic sweep runs detection on them."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date
from pathlib import Path

from sqlalchemy import select

from service.db import session_scope
from service.models import Regression, Run
from tests.nights import ENV, posted_night


def _posted_night(day: int, level_ms: float, rng: random.Random) -> int:
    return posted_night(date(2026, 8, day), level_ms, rng)


def test_posted_runs_are_detected_and_filed(database_url: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    for day in range(1, 9):
        _posted_night(day, 10.0, rng)
    first = _posted_night(9, 13.0, rng)
    second = _posted_night(10, 13.0, rng)
    with session_scope() as session:
        assert session.get(Run, first).status == "complete"
        regs = list(
            session.scalars(
                select(Regression).where(
                    Regression.direction == "regression", Regression.alertable.is_(True)
                )
            )
        )
        assert regs, "a persistent +30% step in posted results was not flagged"
        assert all(r.confirmation in ("reproduced", "not_possible") for r in regs)
        assert any(r.run_id == second and r.confirmation == "reproduced" for r in regs)
        assert session.get(Run, second).status == "complete"
    assert list((tmp_path / "nightbench" / "outbox").glob("*.md")), "no issue written"


def test_unstable_benchmark_is_shown_not_alerted(configure: Callable[..., None]) -> None:
    from service.models import BenchmarkStability
    from service.results.records import get_or_create_machine

    # These nights are quiet: the nightly stability re-check would un-darken the benchmark after
    # five of them (tests/workers/night/test_stability_recheck.py). Here the stored verdict must
    # hold, so the re-check never has enough processes.
    configure(stability_recheck_min_processes=1000)
    with session_scope() as session:
        machine = get_or_create_machine(session, environment=ENV, device="cpu")
        session.add(
            BenchmarkStability(
                model="dqn",
                mode="eval",
                device="cpu",
                compiler="eager",
                repeats=5,
                cv=0.2,
                spread=0.3,
                threshold=0.07,
                unstable=True,
                medians_ms=[1.0, 1.3],
                machine_id=machine.id,
            )
        )
    rng = random.Random(3)
    for day in range(1, 9):
        _posted_night(day, 10.0, rng)
    _posted_night(9, 13.0, rng)
    last = _posted_night(10, 13.0, rng)
    with session_scope() as session:
        regs = list(session.scalars(select(Regression).where(Regression.direction == "regression")))
        assert regs and all(not r.alertable for r in regs)
        assert any(r.run_id == last for r in regs)
        assert "unstable" in regs[0].reason
