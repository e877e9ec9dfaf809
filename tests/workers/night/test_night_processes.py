"""Several processes of each benchmark per night (``NIGHTBENCH_NIGHT_PROCESSES``), Postgres.

``finish`` is driven directly, round by round, with stored results: each process's samples lie
within 0.5% of the level it is given, so its median is that level and a night's level is the
median of the per-process levels. Eight earlier nights at 10 ms are the baseline.
"""

from __future__ import annotations

import random
from datetime import date, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from service.config import Settings
from service.db import session_scope
from service.models import Job, Regression, Result, Run
from service.regressions import service as regressions
from service.results.history import model_history
from service.results.points import HistoryFilter
from service.runs import rounds
from service.runs import service as runs
from service.runs.processes import claim_pending, request_processes
from service.runs.report import run_report
from service.runs.service import BenchmarkSpec
from workers.enqueue import Step
from workers.night.finish import finish, triage_step

ENV = {
    "cpu_model": "rounds-cpu",
    "threads": 1,
    "torch_version": "2.13.0+cpu",
    "torch_git_version": "d" * 40,
}
FIRST = date(2026, 7, 1)
K3 = Settings(count_instructions=False, night_processes=3)


def _threshold(metric: str, benchmark: str) -> float:
    return 0.07


def _measure(run_id: int, levels: dict[str, float | None], rng: random.Random) -> None:
    """End every job of the run: ``model`` measured at ``levels[model]`` ms (None: an error)."""
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        for job in runs.list_jobs(session, run_id=run_id):
            level = levels[job.model]
            record: dict = {
                "model": job.model,
                "mode": "eval",
                "device": "cpu",  # type: ignore[type-arg]
                "benchmark_version": "v1",
                "environment": ENV,
            }
            if level is None:
                record["error"] = "exited with code -11"
            else:
                samples = [level * (1 + rng.uniform(-0.005, 0.005)) for _ in range(12)]
                record["metrics"] = [
                    {
                        "metric": "latency",
                        "unit": "ms",
                        "samples": samples,
                        "median": sorted(samples)[6],
                        "iqr": 0.01,
                    }
                ]
            rounds.store_measured(session, run=run, job=job, record=record)
            runs.end_job(session, job=job, error=record.get("error"))
        assert runs.begin_finishing(session, run_id=run_id)


def _run(day: int, models: list[str], *, kind: str = "nightly", parent: int | None = None) -> int:
    with session_scope() as session:
        run = runs.create_run(
            session,
            night=FIRST + timedelta(days=day),
            kind=kind,
            parent_run_id=parent,
            deadline_s=3600,
            benchmarks=[BenchmarkSpec(model=m, mode="eval") for m in models],
        )
        return run.id


def _baseline(models: list[str], rng: random.Random) -> None:
    for day in range(8):
        run_id = _run(day, models)
        _measure(run_id, dict.fromkeys(models, 10.0), rng)
        with session_scope() as session:
            runs.finish_run(session, run=runs.get_run(session, run_id), status="complete")


def _round_of(steps: list[Step], parent: int) -> int:
    """The replicate run whose jobs ``steps`` are: a round of ``parent``'s processes."""
    assert steps and {s.task for s in steps} == {"bench.run"}
    with session_scope() as session:
        [run_id] = set(
            session.scalars(select(Job.run_id).where(Job.id.in_([s.args[0] for s in steps])))
        )
        run = session.get(Run, run_id)
        assert run is not None and run.kind == "replicate" and run.parent_run_id == parent
        assert run.options["origin"] == "night" and "dispatch" not in run.options
        return run_id


def _children(run_id: int) -> list[tuple[str, str, int]]:
    with session_scope() as session:
        return [
            (c.kind, c.status, c.options.get("round"))
            for c in session.scalars(
                select(Run).where(Run.parent_run_id == run_id).order_by(Run.id)
            )
        ]


def _regressions(run_id: int) -> dict[str, tuple[str, str]]:
    with session_scope() as session:
        return {
            r.model: (r.confirmation, r.reason)
            for r in session.scalars(
                select(Regression).where(
                    Regression.run_id == run_id, Regression.direction == "regression"
                )
            )
        }


def test_a_night_of_three_processes_is_judged_on_the_median_of_their_medians(
    database_url: str,
) -> None:
    rng = random.Random(5)
    models = ["dqn", "ppo", "dcgan"]
    _baseline(models, rng)
    night = _run(8, models)
    # dqn: an outlier first process; ppo: a step in the two later processes; dcgan: a failed one.
    _measure(night, {"dqn": 13.0, "ppo": 10.0, "dcgan": 10.0}, rng)

    second = _round_of(finish(night, settings=K3), night)
    with session_scope() as session:
        # Not detected yet; the night alone would make dqn a candidate and leave ppo unchanged.
        assert session.scalar(select(Regression.id).where(Regression.run_id == night)) is None
        alone = {
            a.result.model: a.assessment.verdict
            for a in regressions.assess_run(
                session,
                run=runs.get_run(session, night),
                threshold_for=_threshold,
                baseline_nights=60,
            )
        }
        assert alone == {"dqn": "regression", "ppo": "unchanged", "dcgan": "unchanged"}
        assert claim_pending(session) == []  # the sweep never sends a night's rounds
        parent, child = session.get(Run, night), session.get(Run, second)
        assert parent.status == "detecting" and parent.deadline_at >= child.deadline_at
    # A second night.finish of the same night sends no second round.
    assert finish(night, settings=K3) == []
    _measure(second, {"dqn": 10.0, "ppo": 13.0, "dcgan": None}, rng)
    third = _round_of(finish(second, settings=K3), night)
    assert _children(night) == [("replicate", "complete", 2), ("replicate", "queued", 3)]
    _measure(third, {"dqn": 10.1, "ppo": 13.1, "dcgan": 10.05}, rng)

    confirm_steps = finish(third, settings=K3)

    assert [c[:2] for c in _children(night)] == [("replicate", "complete")] * 2 + [
        ("confirm", "queued")
    ]
    found = _regressions(night)
    assert set(found) == {"ppo"}  # dqn's outlier is outvoted, ppo's step is in 2 of 3
    confirmation, reason = found["ppo"]
    assert confirmation == "pending" and reason.endswith("Tonight: median of 3 processes.")
    with session_scope() as session:
        confirm_run = session.scalars(
            select(Run).where(Run.parent_run_id == night, Run.kind == "confirm")
        ).one()
        assert [s.args[0] for s in confirm_steps] == [
            j.id for j in runs.list_jobs(session, run_id=confirm_run.id)
        ]
        report = run_report(session, run_id=night, settings=K3)
        note = session.get(Run, night).note
    rows = {r["model"]: r for r in report["results"] if r["metric"] == "latency"}
    assert {m: r["processes"] for m, r in rows.items()} == {"dqn": 3, "ppo": 3, "dcgan": 2}
    assert rows["dqn"]["value"] == pytest.approx(10.0, rel=0.02)
    assert rows["ppo"]["value"] == pytest.approx(13.0, rel=0.02)
    assert note is not None and "3 processes per benchmark" in note
    assert f"runs {second}, {third}" in note and "fewer: dcgan:eval:cpu 2" in note

    # The confirmation re-run gets its three processes too: alone it would not reproduce.
    confirm_id = confirm_run.id
    _measure(confirm_id, {"ppo": 10.0}, rng)
    round2 = _round_of(finish(confirm_id, settings=K3), confirm_id)
    assert _regressions(night)["ppo"][0] == "pending"
    _measure(round2, {"ppo": 13.0}, rng)
    round3 = _round_of(finish(round2, settings=K3), confirm_id)
    _measure(round3, {"ppo": 12.9}, rng)

    assert finish(round3, settings=K3) == [triage_step(night)]

    confirmation, reason = _regressions(night)["ppo"]
    assert confirmation == "reproduced"
    assert "Confirmation re-run: median of 3 processes." in reason
    assert _children(confirm_id) == [("replicate", "complete", 2), ("replicate", "complete", 3)]


def test_one_process_a_night_detects_at_once_without_rounds(database_url: str) -> None:
    rng = random.Random(6)
    _baseline(["dqn"], rng)
    night = _run(8, ["dqn"])
    _measure(night, {"dqn": 13.0}, rng)

    steps = finish(night, settings=Settings(count_instructions=False, night_processes=1))

    assert [c[:2] for c in _children(night)] == [("confirm", "queued")]
    assert steps and {s.task for s in steps} == {"bench.run"}
    confirmation, reason = _regressions(night)["dqn"]
    assert confirmation == "pending" and "processes" not in reason


def test_a_queue_s_own_number_of_processes_overrides_the_default(database_url: str) -> None:
    # CPU nights in two processes, every other queue in one: a gpu.h100 night detects at once.
    by_queue = Settings(
        count_instructions=False, night_processes=1, night_processes_by_queue={"cpu": 2}
    )
    assert (by_queue.processes_for("cpu"), by_queue.processes_for("gpu.h100")) == (2, 1)
    rng = random.Random(9)
    _baseline(["dqn"], rng)
    cpu = _run(8, ["dqn"])
    _measure(cpu, {"dqn": 10.0}, rng)
    with session_scope() as session:
        gpu = runs.create_run(
            session,
            night=FIRST + timedelta(days=8),
            deadline_s=3600,
            benchmarks=[BenchmarkSpec(model="ppo", mode="eval", queue="gpu.h100")],
        ).id
    _measure(gpu, {"ppo": 10.0}, rng)

    _round_of(finish(cpu, settings=by_queue), cpu)
    assert finish(gpu, settings=by_queue) == [] and _children(gpu) == []
    with pytest.raises(ValidationError, match="night_processes_by_queue"):
        Settings(count_instructions=False, night_processes_by_queue={"cpu": 0})


def test_later_nights_read_each_earlier_night_as_its_processes(database_url: str) -> None:
    """History nights carry their per-process medians; processes a comparison asked for on an
    old night stay out of its level, so every night keeps the same number of processes."""
    rng = random.Random(8)
    _baseline(["dqn"], rng)
    night = _run(8, ["dqn"])
    _measure(night, {"dqn": 10.4}, rng)
    second = _round_of(finish(night, settings=K3), night)
    _measure(second, {"dqn": 10.0}, rng)
    third = _round_of(finish(second, settings=K3), night)
    _measure(third, {"dqn": 9.8}, rng)
    assert finish(third, settings=K3) == []
    with session_scope() as session:
        asked = request_processes(session, run_id=night, processes=5)
    assert asked.jobs == 2  # the night's own rounds count as its processes in a comparison
    for run_id in asked.runs:
        _measure(run_id, {"dqn": 50.0}, rng)
    later = _run(9, ["dqn"])
    _measure(later, {"dqn": 10.0}, rng)

    with session_scope() as session:
        result = session.scalars(select(Result).where(Result.run_id == later)).one()
        nights = regressions.history_nights(session, result=result, limit=60)

    assert [len(n.samples) for n in nights] == [12] * 8 + [3]
    assert sorted(nights[-1].samples) == pytest.approx([9.8, 10.0, 10.4], rel=0.006)
    # The history chart plots the same level: the median of the three (not the night's own
    # 10.4 ms, nor with the 50 ms processes a comparison asked for).
    with session_scope() as session:
        [series] = model_history(session, model="dqn", filters=HistoryFilter(), settings=K3).series
        levels = dict(zip(series.run_id.tolist(), series.median.tolist(), strict=True))
    assert levels[night] == pytest.approx(10.0, rel=0.006)
    assert levels[later] == pytest.approx(10.0, rel=0.006)


def test_a_round_past_its_deadline_leaves_the_night_with_fewer_processes(
    database_url: str,
) -> None:
    from service.models.base import utcnow
    from workers.night.deadline import check_deadline

    rng = random.Random(9)
    k2 = Settings(count_instructions=False, night_processes=2)
    _baseline(["dqn"], rng)
    night = _run(8, ["dqn"])
    _measure(night, {"dqn": 10.0}, rng)
    second = _round_of(finish(night, settings=k2), night)

    # Its worker never came: missing at the deadline, not filed (the night has measured dqn).
    steps = check_deadline(second, now=utcnow() + timedelta(seconds=k2.night_deadline_s + 60))

    assert steps == [Step("night.finish", (second,))]
    assert finish(second, settings=k2) == []
    with session_scope() as session:
        parent, child = session.get(Run, night), session.get(Run, second)
        assert parent is not None and child is not None
        assert (parent.status, child.status) == ("complete", "incomplete")
        assert parent.note is not None and parent.note.endswith("; fewer: dqn:eval:cpu 1")
        report = run_report(session, run_id=night, settings=k2)
    [row] = [r for r in report["results"] if r["metric"] == "latency"]
    assert row["processes"] == 1 and row["verdict"] == "unchanged"


def test_a_night_whose_own_process_failed_is_judged_on_its_rounds(database_url: str) -> None:
    """The night's own process of a benchmark failed: the rounds that measured it stand in, so
    a step in them is still caught (it went unassessed when the night held only the error)."""
    rng = random.Random(11)
    models = ["dqn", "ppo", "dcgan"]
    _baseline(models, rng)
    night = _run(8, models)
    # dqn: first process failed, a +30% step in the other two; ppo: failed in rounds 1 and 2,
    # +30% in round 3; dcgan: failed in round 1, unchanged after.
    _measure(night, {"dqn": None, "ppo": None, "dcgan": None}, rng)
    second = _round_of(finish(night, settings=K3), night)
    _measure(second, {"dqn": 13.0, "ppo": None, "dcgan": 10.0}, rng)
    third = _round_of(finish(second, settings=K3), night)
    _measure(third, {"dqn": 13.1, "ppo": 13.0, "dcgan": 10.05}, rng)

    finish(third, settings=K3)

    found = _regressions(night)
    assert set(found) == {"dqn", "ppo"}
    assert all(confirmation == "pending" for confirmation, _ in found.values())
    assert found["dqn"][1].endswith("Tonight: median of 2 processes.")
    with session_scope() as session:
        report = run_report(session, run_id=night, settings=K3)
        note = session.get(Run, night).note
        # Every result is kept: each failed process's error sits in the round that stood in.
        errors = {
            (r.model, r.run_id)
            for r in session.scalars(select(Result).where(Result.error.is_not(None)))
        }
        job_runs = {
            r.model: session.get(Job, r.job_id).run_id
            for r in session.scalars(
                select(Result).where(Result.run_id == night, Result.error.is_(None))
            )
        }
    assert errors == {("dqn", second), ("dcgan", second), ("ppo", third), ("ppo", second)}
    assert job_runs == {"dqn": second, "dcgan": second, "ppo": third}
    rows = {r["model"]: r for r in report["results"] if r["metric"] == "latency"}
    assert {m: (r["processes"], r["verdict"]) for m, r in rows.items()} == {
        "dqn": (2, "flagged"),
        "ppo": (1, "flagged"),
        "dcgan": (2, "unchanged"),
    }
    assert rows["dqn"]["value"] == pytest.approx(13.0, rel=0.02)
    assert report["run"]["jobs"]["error"] == 3
    # Each failure, numbered by the process that failed (1: the night's own), where it is kept.
    assert [(f["benchmark"], f["process"], f["run_id"]) for f in report["failed_processes"]] == [
        ("dcgan:eval:cpu", 1, second),
        ("dqn:eval:cpu", 1, second),
        ("ppo:eval:cpu", 1, third),
        ("ppo:eval:cpu", 2, second),
    ]
    assert note is not None
    assert (
        f"dqn:eval:cpu: the night's own process failed (exited with code -11); round 2 "
        f"(run {second}) measured it in its place"
    ) in note
    assert "ppo:eval:cpu: the night's own process failed (exited with code -11); round 3" in note
    assert "fewer: dcgan:eval:cpu 2, dqn:eval:cpu 2, ppo:eval:cpu 1" in note

    # The next night reads this one in dqn's history: a second night at 13 confirms the step
    # that began on it (without the stand-in, tonight would be the step's first night).
    following = _run(9, ["dqn"])
    _measure(following, {"dqn": 13.0}, rng)
    with session_scope() as session:
        [item] = regressions.assess_run(
            session,
            run=runs.get_run(session, following),
            threshold_for=_threshold,
            baseline_nights=60,
        )
        assert item.assessment.confirmed and item.assessment.first_night == 8
        assert item.first_result.run_id == night


def test_a_redelivered_round_record_is_stored_once(database_url: str) -> None:
    rng = random.Random(12)
    _baseline(["dqn"], rng)
    night = _run(8, ["dqn"])
    _measure(night, {"dqn": None}, rng)
    second = _round_of(finish(night, settings=K3), night)
    record = {
        "model": "dqn",
        "mode": "eval",
        "device": "cpu",
        "benchmark_version": "v1",
        "environment": ENV,
        "metrics": [{"metric": "latency", "unit": "ms", "samples": [10.0] * 12, "median": 10.0}],
    }
    with session_scope() as session:
        run = runs.get_run(session, second)
        [job] = runs.list_jobs(session, run_id=second)
        first = rounds.store_measured(session, run=run, job=job, record=record)
        again = rounds.store_measured(session, run=run, job=job, record=record)
        assert [r.run_id for r in first] == [night]
        assert [(r.run_id, r.error is not None) for r in again] == [(second, True)]
        assert (
            session.scalar(
                select(func.count())
                .select_from(Result)
                .where(Result.model == "dqn", Result.night == FIRST + timedelta(days=8))
            )
            == 2
        )


def test_a_young_series_shows_its_change_from_the_median_of_the_processes(
    database_url: str,
) -> None:
    # Two nights: too few to judge, but the report still compares; tonight's first process at
    # 13 ms is outvoted by its rounds at 10 ms, and the change shown is the level's, not 13's.
    rng = random.Random(11)
    first = _run(0, ["dqn"])
    _measure(first, {"dqn": 10.0}, rng)
    with session_scope() as session:
        runs.finish_run(session, run=runs.get_run(session, first), status="complete")
    night = _run(1, ["dqn"])
    _measure(night, {"dqn": 13.0}, rng)
    steps = finish(night, settings=K3)
    for _ in range(2):
        round_id = _round_of(steps, night)
        _measure(round_id, {"dqn": 10.0}, rng)
        steps = finish(round_id, settings=K3)
    with session_scope() as session:
        report = run_report(session, run_id=night, settings=K3)
    [row] = [r for r in report["results"] if r["metric"] == "latency"]
    assert row["verdict"] == "no_baseline" and row["processes"] == 3
    assert row["value"] == pytest.approx(10.0, rel=0.01)
    assert row["change"] == pytest.approx(row["value"] / row["baseline"] - 1)
    assert abs(row["change"]) < 0.02


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5", ""])
def test_a_bad_night_processes_setting_names_the_variable(
    value: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NIGHTBENCH_NIGHT_PROCESSES", value)
    with pytest.raises(ValidationError) as error:
        Settings()
    assert "NIGHTBENCH_NIGHT_PROCESSES must be a whole number" in str(error.value)
    assert f"got {value!r}" in str(error.value)


def test_night_processes_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().night_processes == 1
    monkeypatch.setenv("NIGHTBENCH_NIGHT_PROCESSES", "4")
    assert Settings().night_processes == 4
