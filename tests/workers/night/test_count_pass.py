"""The count pass of a CPU night (cpu_instructions): after the timed processes, in processes of
its own under valgrind, batched, stored in the night; skipped and said so without valgrind."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Job, Result, Run
from service.runs.service import BenchmarkSpec
from service.series import is_count_round
from workers.night import plan as nightly


def _night(run_id: int) -> tuple[Run, list[Run], list[Result]]:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        children = list(session.scalars(select(Run).where(Run.parent_run_id == run_id)))
        results = list(session.scalars(select(Result).where(Result.run_id == run_id)))
        session.expunge_all()
        return run, children, results


def test_a_host_without_valgrind_skips_the_count_and_the_night_stands(
    configure: Callable[..., None], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configure(count_instructions=True)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # the suite runs by its absolute path; no valgrind
    run_id = nightly.create_night(
        night=date(2026, 6, 1), benchmarks=[BenchmarkSpec(model="dqn", mode="eval")]
    )

    nightly.enqueue_jobs(run_id)

    run, children, results = _night(run_id)
    assert run.status == "complete"
    assert "cpu_instructions not counted: valgrind is not installed" in (run.note or "")
    [count] = children
    assert is_count_round(count.options) and count.status == "complete"
    assert {r.metric for r in results if r.error is None} >= {"latency", "cpu_peak_mem"}
    assert not [r for r in results if r.metric == "cpu_instructions"]
    with session_scope() as session:
        jobs = list(session.scalars(select(Job).where(Job.run_id == count.id)))
        assert [(j.status, j.error) for j in jobs] == [("done", None)]


def test_counting_is_off_where_the_settings_say(configure: Callable[..., None]) -> None:
    configure(count_instructions=True, count_models='["ncf*"]')
    run_id = nightly.create_night(
        night=date(2026, 6, 2), benchmarks=[BenchmarkSpec(model="dqn", mode="eval")]
    )

    nightly.enqueue_jobs(run_id)

    run, children, _ = _night(run_id)
    assert run.status == "complete" and children == []  # dqn is not among the counted models


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_count_pass_counts_the_nights_benchmarks_in_one_valgrind_process(
    configure: Callable[..., None],
) -> None:
    configure(count_instructions=True, count_batch=2)
    specs = [BenchmarkSpec(model="dqn", mode="eval", batch_size=8)] * 1 + [
        BenchmarkSpec(model="ncf", mode="eval", batch_size=8)
    ]
    run_id = nightly.create_night(night=date(2026, 6, 3), benchmarks=specs)

    nightly.enqueue_jobs(run_id)

    run, children, results = _night(run_id)
    assert run.status == "complete", run.note
    [count] = children
    assert is_count_round(count.options) and count.status == "complete"
    counted = {r.model: r for r in results if r.metric == "cpu_instructions"}
    assert set(counted) == {"dqn", "ncf"}, [(r.model, r.metric, r.error) for r in results]
    for r in counted.values():
        assert r.error is None and r.unit == "instructions" and r.median > 100_000
        assert r.series_key and r.series_key != next(
            x.series_key for x in results if x.model == r.model and x.metric == "latency"
        )
        # One valgrind process counted both: import torch under valgrind was paid once.
        counter = r.environment["counter"]
        assert counter["process_benchmarks"] == 2 and counter["tool"] == "callgrind"
    assert len({r.environment["counter"]["process_wall_s"] for r in counted.values()}) == 1
