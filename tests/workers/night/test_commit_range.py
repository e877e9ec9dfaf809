"""The night's commit range is read from a local clone and stored with the run."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from datetime import date
from pathlib import Path

from sqlalchemy import select

from service.db import session_scope
from service.models import Regression, Result
from service.regressions import service as regressions
from service.results.service import store_record
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from workers.night import triage as nightly

ENV = {"cpu_model": "test-cpu", "threads": 1, "torch_version": "2.13.0+cpu"}
SPEC = BenchmarkSpec(model="dqn", mode="eval")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def _make_repo(path: Path, n: int) -> list[str]:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "dev@example.com")
    _git(path, "config", "user.name", "Dev")
    shas = []
    for i in range(n):
        (path / "f.py").write_text(f"X = {i}\n")
        _git(path, "add", "f.py")
        _git(path, "commit", "-q", "-m", f"change {i} (#{100 + i})")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas


def _stored_night(day: int, commit: str) -> int:
    with session_scope() as session:
        run = runs.create_run(
            session,
            night=date(2026, 9, day),
            benchmarks=[BenchmarkSpec(model="resnet18", mode="eval")],
        )
        run.torch_git_commit = commit
        runs.finish_run(session, run=run, status="complete")
        return run.id


def test_range_from_local_clone(tmp_path: Path, configure: Callable[..., None]) -> None:
    shas = _make_repo(tmp_path / "src", 6)
    configure(source_repo_path=tmp_path / "src")
    _stored_night(1, shas[1])
    tonight = _stored_night(2, shas[4])
    commit_range = nightly.resolve_commit_range(tonight)
    assert commit_range is not None
    assert [c["sha"] for c in commit_range] == shas[1:5]
    assert commit_range[-1]["pr_number"] == 104
    with session_scope() as session:
        assert runs.get_run(session, tonight).commit_range == commit_range


def test_no_range_without_an_earlier_commit(database_url: str) -> None:
    tonight = _stored_night(3, "a" * 40)
    assert nightly.resolve_commit_range(tonight) is None
    with session_scope() as session:
        assert "no earlier night" in (runs.get_run(session, tonight).note or "")


def _night_with_latency(day: int, commit: str, level_ms: float, rng: random.Random) -> int:
    with session_scope() as session:
        run = runs.create_run(session, night=date(2026, 9, day), benchmarks=[SPEC])
        run.torch_git_commit = commit
        job = runs.list_jobs(session, run_id=run.id)[0]
        samples = [level_ms * (1 + rng.gauss(0, 0.01)) for _ in range(20)]
        store_record(
            session,
            run=run,
            job=job,
            record={
                "model": "dqn",
                "mode": "eval",
                "device": "cpu",
                "benchmark_version": "v1",
                "environment": {**ENV, "torch_git_version": commit},
                "metrics": [
                    {
                        "metric": "latency",
                        "unit": "ms",
                        "samples": samples,
                        "median": sorted(samples)[10],
                        "iqr": 0.1,
                    }
                ],
            },
        )
        runs.end_job(session, job=job, error=None)
        assessed = regressions.assess_run(
            session, run=run, threshold_for=lambda m, b: 0.07, baseline_nights=60
        )
        regressions.record_regressions(
            session, run=run, assessed=assessed, threshold_for=lambda m, b: 0.07
        )
        for r in regressions.pending_regressions(session, run_id=run.id):
            r.confirmation = "not_possible"  # no re-run: the next night decides
        runs.finish_run(session, run=run, status="complete")
        return run.id


def test_a_step_raised_on_its_second_night_is_searched_from_the_night_before_it(
    tmp_path: Path,
    configure: Callable[..., None],
) -> None:
    # Eight nights at 10 ms, then 13 ms from night 9 (commit 9), raised on night 10 once it
    # persisted: the culprit lies between night 8's build and night 9's. The range must hold
    # it: not from night 9's commit (the previous night's), but from night 7's, one night of
    # margin for a first night located from noisy nights.
    shas = _make_repo(tmp_path / "src", 12)
    configure(source_repo_path=tmp_path / "src")
    rng = random.Random(5)
    ids = {
        day: _night_with_latency(day, shas[day], 10.0 if day < 9 else 13.0, rng)
        for day in range(1, 11)
    }
    with session_scope() as session:
        (candidate,) = session.scalars(select(Regression).where(Regression.run_id == ids[9]))
        assert candidate.confirmation == "not_possible"
        assert candidate.first_night == date(2026, 9, 9)
        (raised,) = session.scalars(select(Regression).where(Regression.run_id == ids[10]))
        assert raised.confirmation == "reproduced", raised.reason
        assert raised.first_night == date(2026, 9, 9)
        first = session.get(Result, raised.first_result_id)
        assert first is not None and first.run_id == ids[9]
        start = regressions.range_start(session, run=runs.get_run(session, ids[10]))
        assert start is not None and start.id == ids[7]
    commit_range = nightly.resolve_commit_range(ids[10])
    assert commit_range is not None
    assert [c["sha"] for c in commit_range] == shas[7:11]
    with session_scope() as session:
        assert "starts at night 2026-09-07" in (runs.get_run(session, ids[10]).note or "")
    # A step that began tonight keeps the previous night's range.
    with session_scope() as session:
        start = regressions.range_start(session, run=runs.get_run(session, ids[9]))
        assert start is not None and start.id == ids[8]


def test_a_step_whose_second_night_came_out_low_is_searched_from_before_its_first_night(
    tmp_path: Path,
    configure: Callable[..., None],
) -> None:
    # Twenty nights at 10 ms, the culprit in night 21's build (12.8 ms), night 22 back at 10 ms
    # (a low night), then 13 ms: the step is raised on night 24 from the run of nights 23 and
    # 24, and its first night is 21, the night before the low one. Located at night 23, the
    # range (two nights before the first night) started at night 21's build and did not hold
    # the culprit.
    shas = _make_repo(tmp_path / "src", 25)
    configure(source_repo_path=tmp_path / "src")
    rng = random.Random(7)
    level = {21: 12.8, 22: 10.0, 23: 13.0, 24: 13.0}
    ids = {
        day: _night_with_latency(day, shas[day], level.get(day, 10.0), rng) for day in range(1, 25)
    }
    with session_scope() as session:
        raised = session.scalars(
            select(Regression).where(Regression.confirmation == "reproduced")
        ).all()
        assert [r.run_id for r in raised] == [ids[24]], [(r.run_id, r.reason) for r in raised]
        assert raised[0].first_night == date(2026, 9, 21), raised[0].reason
        start = regressions.range_start(session, run=runs.get_run(session, ids[24]))
        assert start is not None and start.id == ids[19]
    commit_range = nightly.resolve_commit_range(ids[24])
    assert commit_range is not None and shas[21] in [c["sha"] for c in commit_range]


def test_a_series_measured_some_nights_only_is_searched_from_its_point_before_the_step(
    tmp_path: Path,
    configure: Callable[..., None],
) -> None:
    # A series with a point every other night (a count pass in rotation): data on nights 1 to
    # 8, none on night 9 (the culprit's build, commit 9), 13 ms on night 10, reproduced there.
    # The previous night's build (9) already holds the culprit: the range must start at
    # night 8, the series' last point before the step.
    shas = _make_repo(tmp_path / "src", 11)
    configure(source_repo_path=tmp_path / "src")
    rng = random.Random(11)
    ids = {day: _night_with_latency(day, shas[day], 10.0, rng) for day in range(1, 9)}
    ids[9] = _stored_night(9, shas[9])
    with session_scope() as session:
        # Taken as the rotation leaves a night: a run of the queue, no point of this series.
        assert session.scalar(select(Result.id).where(Result.run_id == ids[9])) is None
    ids[10] = _night_with_latency(10, shas[10], 13.0, rng)
    with session_scope() as session:
        (step,) = session.scalars(select(Regression).where(Regression.run_id == ids[10]))
        assert step.first_night == date(2026, 9, 10), step.reason
        step.confirmation = "reproduced"  # as a count's re-count on the same build says
    with session_scope() as session:
        start = regressions.range_start(session, run=runs.get_run(session, ids[10]))
        assert start is not None and start.id == ids[8]
    commit_range = nightly.resolve_commit_range(ids[10])
    assert commit_range is not None
    assert [c["sha"] for c in commit_range] == shas[8:11]
