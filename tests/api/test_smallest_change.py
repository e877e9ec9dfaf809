"""The smallest detectable change where a person reads it: the status (coarse series), the
night's report beside each verdict, and the history API."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Run
from service.regressions.sensitivity import series_smallest_change
from service.runs.report import run_report
from service.status.service import coarse_series
from tests.api.conftest import add_night, make_record, night
from workers.cli.status import coarse_line


def test_a_noisy_series_is_listed_a_quiet_one_is_not(db: Session) -> None:
    rng = np.random.default_rng(7)
    levels = []
    for i in range(20):
        noisy = 10.0 * float(np.exp(rng.normal(0, 0.05)))
        levels.append(noisy)
        quiet = 20.0 * float(np.exp(rng.normal(0, 0.002)))
        add_night(
            db,
            night(i),
            [
                make_record("vit", "eval", {"latency": [noisy] * 3}),
                make_record("unet", "eval", {"latency": [quiet] * 3}),
            ],
        )
    # A confirmation re-run of unet far off its level each night: not one of its nights.
    for i in range(20):
        wild = 20.0 * (1.5 if i % 2 else 0.7)
        add_night(
            db, night(i), [make_record("unet", "eval", {"latency": [wild] * 3})], kind="confirm"
        )
    coarse, sensed = coarse_series(db, today=night(20))
    assert sensed >= 2
    assert [(c.benchmark, c.metric) for c in coarse] == [("vit:eval:cpu", "latency")]
    [c] = coarse
    assert c.smallest_change == pytest.approx(series_smallest_change(levels, 0.07, memory=False))
    assert c.smallest_change > 0.1 and c.threshold == 0.07 and c.nights == 20
    assert 0.02 < c.noise < 0.1

    class State:
        pass

    state = State()
    state.coarse, state.sensed = coarse, sensed  # type: ignore[attr-defined]
    line = coarse_line(state)
    assert line.startswith(f"1 of {sensed} series see only steps above their threshold")
    assert "vit:eval:cpu latency from +" in line and "(7%)" in line
    # A far looser threshold: nothing is coarse.
    loose, _ = coarse_series(db, today=night(20), threshold_for=lambda m, b: 1.0)
    assert loose == []


def _nights(db: Session, n: int) -> tuple[list[float], list[Run]]:
    rng = np.random.default_rng(11)
    levels = [10.0 * float(np.exp(rng.normal(0, 0.03))) for _ in range(n)]
    runs = [
        add_night(db, night(i), [make_record("vit", "eval", {"latency": [v] * 3})])
        for i, v in enumerate(levels)
    ]
    return levels, runs


def test_the_report_gives_each_verdict_its_smallest_detectable_change(db: Session) -> None:
    levels, runs = _nights(db, 16)
    report = run_report(db, run_id=runs[-1].id, settings=Settings(count_instructions=False))
    [row] = [r for r in report["results"] if r["metric"] == "latency"]
    want = series_smallest_change(levels[:-1], 0.07, memory=False)  # the nights before tonight
    assert row["smallest_change"] == pytest.approx(want) and want > 0.07
    first = run_report(db, run_id=runs[1].id, settings=Settings(count_instructions=False))
    assert [r["smallest_change"] for r in first["results"] if r["metric"] == "latency"] == [None]


def test_the_history_api_gives_each_series_its_smallest_detectable_change(
    client: TestClient, db: Session
) -> None:
    levels, _ = _nights(db, 16)
    body = client.get("/api/models/vit/history", params={"metric": "latency"}).json()
    [series] = body["series"]
    want = series_smallest_change(levels, 0.07, memory=False)  # judged against every night
    assert series["smallest_change"] == pytest.approx(want)
    page = client.get("/models/vit").text
    assert f"sees {want * 100:+.1f}% or more" in page


def test_nightbench_report_prints_what_each_verdict_could_see(db: Session) -> None:
    from typer.testing import CliRunner

    import workers.cli as cli

    _, runs = _nights(db, 16)
    report = run_report(db, run_id=runs[-1].id, settings=Settings(count_instructions=False))
    [row] = [r for r in report["results"] if r["metric"] == "latency"]
    assert cli.sees_cell(row) == f"[yellow]{row['smallest_change'] * 100:+.1f}%[/]"
    assert cli.sees_cell({**row, "smallest_change": 0.072}) == "+7.2%"
    assert cli.sees_cell({**row, "smallest_change": None}) == "—"
    # The command is registered (a decorator above a helper once hid it).
    assert "report" in CliRunner().invoke(cli.app, ["--help"]).output
