"""A night's count pass under its budget: every benchmark when the pass fits, else a rotation
that counts the benchmarks counted longest ago first (service/runs/count_plan.py)."""

from __future__ import annotations

from collections import Counter
from datetime import date

import pytest

from service.db import session_scope
from service.models import RunKind
from service.results.service import store_record
from service.runs import rounds
from service.runs import service as runs
from service.runs.count_plan import CountHistory, plan_count_pass
from service.runs.service import BenchmarkSpec

SPECS = [BenchmarkSpec(model=m, mode="eval") for m in ("a", "b", "c", "d", "e", "f")]


def _names(specs: tuple[BenchmarkSpec, ...]) -> list[str]:
    return [s.model for s in specs]


def test_a_pass_within_its_budget_counts_every_benchmark_in_order() -> None:
    history = {s.name: CountHistory(date(2026, 1, 1), 100.0) for s in SPECS}
    # 6 x 100 s of steps + 2 valgrind processes of 3 benchmarks x 65 s = 730 s.
    plan = plan_count_pass(SPECS, history, budget_s=730, batch=3, process_cpu_s=65)
    assert _names(plan.counted) == ["a", "b", "c", "d", "e", "f"]
    assert plan.deferred == () and plan.note() is None
    assert plan.estimated_cpu_s == pytest.approx(730)
    # No budget (0): everything, whatever it costs.
    assert len(plan_count_pass(SPECS, history, budget_s=0, batch=1).counted) == 6


def test_over_its_budget_the_longest_uncounted_go_first_and_a_cheaper_one_fills_the_rest() -> None:
    history = {
        "a:eval:cpu": CountHistory(date(2026, 1, 5), 100.0),
        "b:eval:cpu": CountHistory(date(2026, 1, 2), 400.0),
        "c:eval:cpu": CountHistory(date(2026, 1, 3), 100.0),
        "d:eval:cpu": CountHistory(date(2026, 1, 4), 100.0),
        "f:eval:cpu": CountHistory(date(2026, 1, 1), 50.0),
    }  # "e" was never counted: it goes first, at the median known cost (100 s).
    plan = plan_count_pass(SPECS, history, budget_s=800, batch=6, process_cpu_s=65)
    # e 100, f 50, b 400, c 100 = 650 + 65 = 715; d would make 880 > 800; a (100) too.
    assert _names(plan.counted) == ["e", "f", "b", "c"]
    assert _names(plan.deferred) == ["d", "a"]
    assert plan.estimated_cpu_s == pytest.approx(715)
    note = plan.note()
    assert note is not None and "4 of 6 benchmarks counted tonight" in note
    assert "NIGHTBENCH_COUNT_BUDGET_S" in note


def test_the_oldest_is_counted_even_alone_over_the_budget() -> None:
    history = {s.name: CountHistory(date(2026, 1, 2), 10.0) for s in SPECS}
    history["c:eval:cpu"] = CountHistory(date(2026, 1, 1), 5000.0)
    plan = plan_count_pass(SPECS, history, budget_s=600, batch=8)
    assert _names(plan.counted) == ["c"]
    assert len(plan.deferred) == 5


def test_bad_budget_or_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="budget_s >= 0 and batch >= 1"):
        plan_count_pass(SPECS, {}, budget_s=-1, batch=8)
    with pytest.raises(ValueError, match="budget_s >= 0 and batch >= 1"):
        plan_count_pass(SPECS, {}, budget_s=10, batch=0)


def _count_record(model: str, samples: list[float], *, cpu_s: float) -> dict[str, object]:
    """A count pass's record of ``model`` eval (instructions per step), costing ``cpu_s``."""
    return {
        "model": model,
        "mode": "eval",
        "device": "cpu",
        "benchmark_version": "v1",
        "environment": {
            "cpu_model": "test-cpu",
            "threads": 1,
            "torch_version": "2.13.0+cpu",
            "counter": {"tool": "callgrind", "cpu_s": cpu_s},
        },
        "measures": ["cpu_instructions"],
        "metrics": [
            {
                "metric": "cpu_instructions",
                "unit": "instructions",
                "samples": samples,
                "median": sorted(samples)[len(samples) // 2],
                "iqr": 0.0,
            }
        ],
    }


def _count_night(day: int, *, budget_s: float, cost: dict[str, float]) -> list[str]:
    """A night of SPECS whose timed processes have ended; its count pass planned under
    ``budget_s``, each counted benchmark stored with the cost ``cost`` gives it. Returns the
    counted models."""
    with session_scope() as session:
        night = runs.create_run(session, night=date(2026, 9, day), benchmarks=SPECS)
        assert night.kind == RunKind.NIGHTLY
        count = rounds.create_count_round(
            session,
            parent=night,
            models=lambda model: True,
            deadline_s=None,
            budget_s=budget_s,
            batch=2,
        )
        assert count is not None
        counted = []
        for job in runs.list_jobs(session, run_id=count.id):
            store_record(
                session,
                run=count,
                job=job,
                record=_count_record(job.model, [1e8, 1e8], cpu_s=cost[job.model]),
            )
            runs.end_job(session, job=job, error=None)
            counted.append(job.model)
        runs.finish_run(session, run=count, status="complete")
        runs.finish_run(session, run=night, status="complete")
        if len(counted) < len(SPECS):
            assert f"{len(counted)} of {len(SPECS)} benchmarks counted tonight" in (
                night.note or ""
            )
        return sorted(counted)


def test_nights_in_rotation_count_every_benchmark_in_turn(database_url: str) -> None:
    cost = {"a": 200.0, "b": 200.0, "c": 200.0, "d": 200.0, "e": 200.0, "f": 200.0}
    # The first night knows no cost: 120 s assumed each, processes of 2 at 15 s
    # (count_plan.PROCESS_CPU_S): 4 x 120 + 2 x 15 = 510, 5 x 120 + 3 x 15 = 645 > 600: four.
    first = _count_night(1, budget_s=600, cost=cost)
    assert first == ["a", "b", "c", "d"]
    # Then the two never counted, then by the oldest count: each benchmark in turn.
    nights = [first] + [_count_night(day, budget_s=600, cost=cost) for day in range(2, 6)]
    assert nights[1] == ["e", "f"]  # 2 x 200 + 15 = 415; a third: 600 + 30 > 600
    seen = Counter(m for night in nights for m in night)
    assert set(seen) == set(cost)
    assert max(seen.values()) - min(seen.values()) <= 1
    # A confirmation's count pass counts every candidate, whatever the budget.
    with session_scope() as session:
        confirm = runs.create_run(
            session, night=date(2026, 9, 6), benchmarks=SPECS, kind=RunKind.CONFIRM
        )
        count = rounds.create_count_round(
            session, parent=confirm, models=lambda m: True, deadline_s=None, budget_s=1, batch=2
        )
        assert count is not None and len(runs.list_jobs(session, run_id=count.id)) == 6


def test_a_count_series_with_a_point_every_third_night_raises_its_step_on_its_first_point(
    database_url: str,
) -> None:
    from service.regressions import service as regressions

    spec = BenchmarkSpec(model="dqn", mode="eval")
    raised = {}
    for day in range(1, 29, 3):  # counted on nights 1, 4, ..., 28 (a rotation of three)
        level = 1.47e8 if day < 28 else 1.47e8 * 1.08  # +8% from night 28
        with session_scope() as session:
            run = runs.create_run(session, night=date(2026, 9, day), benchmarks=[spec])
            job = runs.list_jobs(session, run_id=run.id)[0]
            samples = [level * (1 + 1e-5 * i) for i in range(2)]
            store_record(
                session,
                run=run,
                job=job,
                record=_count_record("dqn", samples, cpu_s=60.0),
            )
            runs.end_job(session, job=job, error=None)
            assessed = regressions.assess_run(
                session, run=run, threshold_for=lambda m, b: 0.07, baseline_nights=60
            )
            raised[day] = [
                a.assessment
                for a in assessed
                if a.assessment.metric == "cpu_instructions"
                and a.assessment.verdict == "regression"
            ]
            runs.finish_run(session, run=run, status="complete")
    assert all(not raised[d] for d in raised if d < 28), raised
    (step,) = raised[28]
    assert step.change == pytest.approx(0.08, abs=0.002)


def test_a_count_process_claims_only_what_its_limit_leaves_room_for(database_url: str) -> None:
    cost = {"a": 300.0, "b": 500.0, "c": 100.0, "d": 200.0, "e": 50.0, "f": 400.0}
    _count_night(1, budget_s=0, cost=cost)  # every benchmark counted once: its cost stored
    with session_scope() as session:
        night = runs.create_run(session, night=date(2026, 9, 2), benchmarks=SPECS)
        count = rounds.create_count_round(
            session, parent=night, models=lambda m: True, deadline_s=None, budget_s=0, batch=8
        )
        assert count is not None
        estimates = count.options["estimates"]
        assert estimates == {f"{m}:eval:cpu": c for m, c in cost.items()}
        first, *rest = runs.list_jobs(session, run_id=count.id)
        runs.start_job(session, job=first, worker="w1")
        claimed = runs.claim_queued_jobs(
            session,
            run_id=count.id,
            exclude=first.id,
            limit=7,
            worker="w1",
            cost=lambda j: estimates[j.benchmark],
            budget=600.0,
        )
        # In id order: b (500) fits, c (100) fills it to 600; d, e, f no longer fit.
        assert [j.model for j in claimed] == ["b", "c"]
        assert all(j.status == "running" for j in claimed)
        assert {j.model for j in rest if j.status == "queued"} == {"d", "e", "f"}
