"""Stability verdicts stored for the detector, and ``nightbench suite stability`` end to end."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from service.db import normalise_url
from service.errors import InvalidInput
from service.regressions.service import unstable_spreads
from service.stability.service import list_stability, record_stability
from suite.stability import d2
from tests.suite.helpers import FIXTURE_MODELS

ENV_A = {"cpu_model": "AMD EPYC", "threads": 1, "torch_version": "2.13.0+cpu", "gpu_name": None}
ENV_B = {**ENV_A, "cpu_model": "Intel Xeon"}


def _verdict(model: str, *, unstable: bool | None, env: dict | None = None, **extra) -> dict:
    medians = [10.0, 10.2, 11.5] if unstable else [10.0, 10.1, 10.2]
    return {
        "model": model,
        "mode": "eval",
        "device": "cpu",
        "compiler": "eager",
        "repeats": 3,
        "medians_ms": medians if unstable is not None else [],
        "cv": 0.05,
        "spread": 0.15,
        "unstable": unstable,
        "threshold": 0.07,
        "errors": [],
        "benchmark_version": "v1",
        "environment": ENV_A if env is None else env,
        **extra,
    }


def test_verdicts_are_stored_replaced_and_queried(session: Session) -> None:
    rows = record_stability(
        session,
        results=[
            _verdict("ppo", unstable=True),
            _verdict("dqn", unstable=False),
            _verdict("ppo", unstable=False, env=ENV_B),
        ],
    )
    assert len(rows) == 3 and rows[0].machine_id != rows[2].machine_id
    assert set(unstable_spreads(session)) == {("ppo", "eval", "cpu", "eager")}
    assert [r.unstable for r in list_stability(session, machine_id=rows[2].machine_id)] == [False]
    assert unstable_spreads(session) == {("ppo", "eval", "cpu", "eager"): pytest.approx(0.15)}
    # Machine by machine: the verdict is ENV's machine's only.
    assert unstable_spreads(session, by_machine=True) == {
        ("ppo", "eval", "cpu", "eager", rows[0].machine_id): pytest.approx(0.15)
    }
    # A new measurement replaces the verdict of the same benchmark on the same machine.
    [again] = record_stability(session, results=[_verdict("ppo", unstable=False)])
    assert again.id == rows[0].id and again.unstable is False
    assert set(unstable_spreads(session)) == set()
    assert len(list_stability(session)) == 3
    assert rows[1].torch_version == "2.13.0+cpu" and rows[1].medians_ms == [10.0, 10.1, 10.2]


def test_verdict_without_environment_is_not_stored(session: Session) -> None:
    assert record_stability(session, results=[_verdict("ppo", unstable=None, env={})]) == []


def test_malformed_verdict_is_refused_by_name(session: Session) -> None:
    bad = _verdict("ppo", unstable=True)
    del bad["repeats"]
    with pytest.raises(InvalidInput, match="lacks repeats"):
        record_stability(session, results=[bad])
    with pytest.raises(InvalidInput, match="malformed stability verdict for 'ppo'"):
        record_stability(session, results=[_verdict("ppo", unstable=True, cv="high")])


def test_cli_measures_stores_and_prints(
    database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from workers.cli import app

    engine = create_engine(normalise_url(database_url))
    monkeypatch.setenv("NIGHTBENCH_SUITE_EXTRA_MODELS", str(FIXTURE_MODELS))
    monkeypatch.setenv("NIGHTBENCH_TEST_COUNTER", str(tmp_path / "count"))
    result = CliRunner().invoke(
        app,
        [
            "suite",
            "stability",
            "--repeats",
            "3",
            "--models",
            "variable_latency",
            "--modes",
            "eval",
            "--iterations",
            "5",
            "--min-seconds",
            "0.05",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [verdict] = doc["results"]
    assert verdict["model"] == "variable_latency" and verdict["unstable"] is True
    assert doc["stored"] == 1 and doc["noise_floor"] == pytest.approx(verdict["cv"])
    assert verdict["source"] == "measured" and verdict["setups"]
    # --json shows the spread allowed for the 3 processes beside the 5-process rule.
    assert verdict["threshold"] == 0.07
    assert verdict["allowed_spread"] == pytest.approx(0.07 * d2(3) / d2(5))
    with Session(engine) as check:
        assert set(unstable_spreads(check)) == {("variable_latency", "eval", "cpu", "eager")}
    assert "benchmark_stability" in inspect(engine).get_table_names()
    engine.dispose()


def test_cli_names_unknown_models(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.cli import app

    result = CliRunner().invoke(app, ["suite", "stability", "--models", "nope", "--no-store"])
    assert result.exit_code == 2
    assert "unknown model(s) nope" in result.output


def test_cli_table_shows_the_measurement_setup_of_each_benchmark(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from workers.cli import app

    monkeypatch.setenv("NIGHTBENCH_SUITE_EXTRA_MODELS", str(FIXTURE_MODELS))
    monkeypatch.setenv("NIGHTBENCH_TEST_COUNTER", str(tmp_path / "count"))
    monkeypatch.setenv("NIGHTBENCH_SUITE_ALLOCATOR", "glibc")  # the same label on every machine
    result = CliRunner().invoke(
        app,
        [
            "suite",
            "stability",
            "--repeats",
            "2",
            "--models",
            "variable_latency",
            "--modes",
            "eval",
            "--iterations",
            "5",
            "--min-seconds",
            "0.05",
            "--no-store",
        ],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "benchmark" in line)
    assert "setup" in header
    assert "glibc+tunables" in result.output
    # Two processes: the 7% rule scaled by d2(2) / d2(5), in the title and a column.
    assert f"spread >= {0.07 * d2(2) / d2(5):.1%}, 7% for 5 processes scaled for 2" in result.output
    assert "allowed %" in header
