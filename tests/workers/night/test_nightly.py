"""The nightly check end to end in the embedded (in-process) mode, stored in Postgres."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from service.config import get_settings
from service.db import session_scope
from service.models import Job, Regression, Result, Run
from service.runs.report import run_report
from service.runs.service import BenchmarkSpec
from workers.cli import app
from workers.night import plan as nightly

MODEL = "resnet18"


def _night(day: int, benchmarks: list[BenchmarkSpec]) -> int:
    run_id = nightly.create_night(night=date(2026, 11, day), benchmarks=benchmarks)
    for job_id, queue, _ in nightly.queued_jobs(run_id):
        nightly.send_job(job_id, queue)
    return run_id


def test_cli_nightly_twice_compares_and_flags_nothing(database_url: str) -> None:
    runner = CliRunner()
    first = runner.invoke(
        app, ["nightly", "--models", MODEL, "--modes", "eval", "--date", "2026-11-01"]
    )
    assert first.exit_code == 0, first.output
    second = runner.invoke(
        app, ["nightly", "--models", MODEL, "--modes", "eval", "--date", "2026-11-02"]
    )
    assert second.exit_code == 0, second.output
    with session_scope() as session:
        runs = list(session.scalars(select(Run).where(Run.kind == "nightly").order_by(Run.id)))
        assert [r.status for r in runs] == ["complete", "complete"]
        assert runs[1].previous_run_id == runs[0].id
        assert runs[1].torch_version and runs[1].torch_git_commit
        report = run_report(session, run_id=runs[1].id, settings=get_settings())
        latency = next(r for r in report["results"] if r["metric"] == "latency")
        # The second night is compared with the first: a baseline value is shown.
        assert latency["baseline"] is not None and latency["value"] > 0
        assert (
            session.scalar(
                select(func.count())
                .select_from(Regression)
                .where(Regression.direction == "regression", Regression.alertable.is_(True))
            )
            == 0
        )
    as_json = runner.invoke(app, ["report", "--json"])
    assert as_json.exit_code == 0
    import json

    payload = json.loads(as_json.output)
    assert set(payload) >= {"run", "results", "regressions"}
    assert payload["run"]["id"] == runs[1].id


def test_failing_and_hanging_benchmarks_become_error_results(
    configure: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(suite_timeout_s=12)
    specs = [
        BenchmarkSpec(model=MODEL, mode="eval"),
        BenchmarkSpec(model="no_such_model", mode="eval"),  # the suite raises for it
        # Large enough that one warm-up iteration outlasts the 12 s timeout.
        BenchmarkSpec(model=MODEL, mode="train", batch_size=1024),
    ]
    run_id = _night(3, specs)
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "complete"
        errors = {
            r.model + ":" + r.mode: r.error
            for r in session.scalars(
                select(Result).where(Result.run_id == run_id, Result.error.is_not(None))
            )
        }
        assert "no_such_model" in errors["no_such_model:eval"]
        assert "timed out after 12 s" in errors[f"{MODEL}:train"]
        jobs = {
            j.benchmark: j.status for j in session.scalars(select(Job).where(Job.run_id == run_id))
        }
        assert jobs == {
            f"{MODEL}:eval:cpu": "done",
            "no_such_model:eval:cpu": "error",
            f"{MODEL}:train:cpu": "error",
        }
    out = CliRunner().invoke(app, ["report", "--run", str(run_id)])
    assert out.exit_code == 0
    assert "timed out" in out.output and "no_such_model" in out.output
