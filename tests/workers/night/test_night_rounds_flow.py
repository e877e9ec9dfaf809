"""A night of several processes per benchmark, measured for real (``python -m suite`` on dqn):
in-process (the embedded default's chain) and through a real worker and Redis."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress
from sqlalchemy import func, select
from typer.testing import CliRunner

from service.db import session_scope
from service.models import Job, Result, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import WorkerPool, wait_until
from workers.cli import app
from workers.cli import progress as cli_progress
from workers.night import jobs
from workers.night import plan as nightly

SPECS = [BenchmarkSpec(model="dqn", mode="eval")]  # a process measures it in about a second


def _family(run_id: int) -> tuple[str | None, list[tuple[str, str, int | None, int]]]:
    """The run's status, and ``(kind, status, round, results without an error)`` per child."""
    with session_scope() as session:
        run = session.get(Run, run_id)
        children = session.scalars(select(Run).where(Run.parent_run_id == run_id).order_by(Run.id))
        return run.status if run else None, [
            (
                c.kind,
                c.status,
                c.options.get("round"),
                session.scalar(
                    select(func.count())
                    .select_from(Result)
                    .where(
                        Result.run_id == c.id, Result.error.is_(None), Result.metric == "latency"
                    )
                )
                or 0,
            )
            for c in children
        ]


def test_an_embedded_night_measures_its_rounds_before_it_finishes(
    configure: Callable[..., None],
) -> None:
    configure(night_processes=3)
    run_id = nightly.create_night(night=date(2026, 6, 1), benchmarks=SPECS)

    nightly.enqueue_jobs(run_id)  # embedded: the whole chain runs here, round after round

    status, children = _family(run_id)
    assert status == "complete"
    assert children == [("replicate", "complete", 2, 1), ("replicate", "complete", 3, 1)]
    with session_scope() as session:
        note = session.get(Run, run_id).note  # type: ignore[union-attr]
    assert note is not None and note.startswith("3 processes per benchmark")
    out = CliRunner().invoke(app, ["report", "--run", str(run_id)])
    assert out.exit_code == 0, out.output
    assert "median of per-process medians, 3 processes per benchmark" in " ".join(
        out.output.split()
    )


def test_an_embedded_night_whose_own_process_failed_is_measured_by_its_round(
    configure: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The night's own process of dqn fails (as a crashed process's record reads); its round
    measures dqn for real and stands in, so the night has dqn's result and is judged on it."""
    configure(night_processes=2)
    measure = jobs._run_in_build
    started: list[str] = []

    def first_crashes(spec: dict, **kwargs: object) -> dict:  # type: ignore[type-arg]
        started.append(spec["model"])
        if len(started) == 1:
            return {**spec, "error": "exited with code -11 (SIGSEGV)"}
        return measure(spec, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs, "_run_in_build", first_crashes)
    run_id = nightly.create_night(night=date(2026, 6, 4), benchmarks=SPECS)

    nightly.enqueue_jobs(run_id)

    status, children = _family(run_id)
    assert status == "complete" and started == ["dqn", "dqn"]
    [(kind, round_status, number, measured)] = children
    assert (kind, round_status, number, measured) == ("replicate", "complete", 2, 0)
    with session_scope() as session:
        [(error, job_run)] = session.execute(
            select(Result.error, Job.run_id)
            .join(Job, Job.id == Result.job_id)
            .where(Result.model == "dqn", Result.error.is_not(None))
        ).all()
        night = session.scalars(
            select(Result).where(Result.run_id == run_id, Result.metric == "latency")
        ).one()
        note = session.get(Run, run_id).note  # type: ignore[union-attr]
    assert error.startswith("exited with code -11") and job_run == run_id
    assert night.error is None and night.samples and night.series_key is not None
    assert note is not None and "dqn:eval:cpu: the night's own process failed" in note
    out = CliRunner().invoke(app, ["report", "--run", str(run_id)])
    assert out.exit_code == 0, out.output
    assert (
        "process failed dqn:eval:cpu, process 1 (the night reads its others): exited with "
        "code -11 (SIGSEGV)"
    ) in " ".join(out.output.split())


def test_the_night_s_progress_bar_counts_every_round(
    configure: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(night_processes=3)
    run_id = nightly.create_night(night=date(2026, 6, 3), benchmarks=SPECS)
    bars: list[Progress] = []

    def recorded() -> Progress:
        bars.append(Progress(console=Console(file=io.StringIO())))
        return bars[-1]

    monkeypatch.setattr(cli_progress, "progress_bar", recorded)
    cli_progress.measure(run_id, 1)

    [task] = bars[0].tasks
    # Three processes of dqn (the night's job and two rounds): the bar ends at 3 of 3, not at
    # 1 of 1 before the rounds begin.
    assert (task.completed, task.total) == (3, 3)
    assert task.description == "dqn:eval:cpu"


def test_a_night_through_a_worker_sends_its_rounds_itself(
    celery_workers: WorkerPool,
    configure: Callable[..., None],
    tmp_path: Path,
) -> None:
    configure(night_processes=2)  # the worker inherits the variable
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    run_id = nightly.create_night(night=date(2026, 6, 2), benchmarks=SPECS)

    nightly.enqueue_jobs(run_id)

    wait_until(
        lambda: _family(run_id)[0] == "complete",
        timeout=240,
        what=f"run {run_id} complete after its rounds",
    )
    assert _family(run_id)[1] == [("replicate", "complete", 2, 1)]
