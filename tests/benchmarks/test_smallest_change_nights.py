"""The smallest detectable change of a store's CPU latency series against the nightly flow
(``benchmarks.smallest_change_nights``), on a small SQLite store written the way workers write."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from benchmarks.smallest_change_nights import (
    crossing,
    crossing_se,
    flow_step,
    main,
    noise_group,
    summary,
)
from service.config import get_settings
from service.db import make_engine
from service.migrate import upgrade
from service.models import Result, Run
from service.regressions.sensitivity import series_smallest_change, window_noise_of
from tests.api.conftest import add_night, flag, make_record, night

VIT = [10.0, 10.3, 9.8, 10.1, 10.5, 9.9]  # ~2% night to night
UNET = [20.0, 20.04, 19.98, 20.02, 20.0, 19.97]  # quiet; its own threshold of 10%
# A step first seen at night 2, raised (and reproduced) at night 3: the detector's baseline
# restarts at night 2, so the two nights before it must not count.
RESNET = [5.0, 15.0, 30.0, 30.6, 29.7, 30.3, 29.9, 30.5]
# A step marked expected at night 4 of alexnet: its baseline restarts there (4 nights).
ALEXNET = [8.0, 8.2, 7.9, 8.1, 16.0, 16.3, 15.8, 16.1]


def _latency(session: Session, run: Run, model: str) -> Result:
    return session.scalars(
        select(Result).where(
            Result.run_id == run.id, Result.model == model, Result.metric == "latency"
        )
    ).one()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir whose SQLite store holds 6 nights of vit and unet on the CPU, 8 of resnet18
    (a raised step from its third) and of alexnet (a step marked expected at its fifth), and series the script must leave out: vit on CUDA, a CPU series of
    3 nights, and the CPU series' peak memory."""
    data_dir = tmp_path / "nightbench"
    url = f"sqlite:///{data_dir / 'nightbench.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        runs = []
        for i in range(8):
            records = [
                make_record("resnet18", "eval", {"latency": [RESNET[i]] * 3}),
                make_record("alexnet", "eval", {"latency": [ALEXNET[i]] * 3}),
            ]
            if i < 6:
                records += [
                    make_record(
                        "vit", "eval", {"latency": [VIT[i]] * 3, "cpu_peak_mem": [1e6 + i]}
                    ),
                    make_record("unet", "eval", {"latency": [UNET[i]] * 3}),
                    make_record("vit", "eval", {"latency": [1.0 + i] * 3}, device="cuda"),
                ]
            if i < 3:
                records.append(make_record("unet", "train", {"latency": [40.0 + i] * 3}))
            runs.append(add_night(session, night(i), records))
        step_first = _latency(session, runs[2], "resnet18")
        raised = flag(session, _latency(session, runs[3], "resnet18"), baseline=10.0)
        raised.first_result_id = step_first.id
        flag(
            session,
            _latency(session, runs[4], "alexnet"),
            confirmation="pending",
            state="expected",
            baseline=8.0,
        )
        session.commit()
    engine.dispose()
    monkeypatch.delenv("NIGHTBENCH_DATABASE_URL", raising=False)
    monkeypatch.setenv("NIGHTBENCH_THRESHOLDS", '{"unet:eval": 0.1}')
    get_settings.cache_clear()
    yield data_dir
    get_settings.cache_clear()


def test_each_cpu_latency_series_gets_the_formula_on_its_levels_since_its_reset(
    store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rows.json"
    rows = main(["--data-dir", str(store), "--trials", "30", "--json", str(out)])
    by = {r["benchmark"]: r for r in rows}
    # CUDA, peak memory and a 3-night series are not compared.
    # alexnet has 4 nights since its reset: left out.
    assert sorted(by) == ["resnet18:eval:cpu", "unet:eval:cpu", "vit:eval:cpu"]
    for name, levels, thr in (
        ("vit:eval:cpu", VIT, 0.07),
        ("unet:eval:cpu", UNET, 0.1),
        ("resnet18:eval:cpu", RESNET[2:], 0.07),
    ):
        r = by[name]
        noise, k = window_noise_of(levels, memory=False)
        want = series_smallest_change(levels, thr, memory=False)
        assert want is not None
        assert r["threshold"] == thr
        assert (r["since_reset"], r["window"]) == (len(levels), k)
        assert r["noise"] == pytest.approx(noise)
        assert r["formula"] == pytest.approx(want)
        if name != "resnet18:eval:cpu":  # the history API cuts a raised step a night later
            assert r["api_smallest"] == pytest.approx(want)
        # The flow's crossing lies between two steps it tried, one on each side of 95%.
        assert r["flow_step"] is not None
        steps = [c[1] for c in r["cells"]]
        assert min(steps) <= r["flow_step"] <= max(steps)
        assert r["diff_pp"] == pytest.approx(100 * (r["flow_step"] - r["formula"]))
        assert [c[2] for c in r["cells"] if c[0] == 1.0] == [r["by3_at_formula"]]
    # The reset matters: over all 8 nights (or from the night after the raise) it reads otherwise.
    for other in (RESNET, RESNET[4:]):
        value = series_smallest_change(other, 0.07, memory=False)
        assert value != pytest.approx(by["resnet18:eval:cpu"]["formula"], rel=1e-3)
    # The quiet series sees about its own 10% threshold; vit's 2% noise lifts its floor.
    assert 0.1 < by["unet:eval:cpu"]["formula"] < 0.11
    assert by["vit:eval:cpu"]["formula"] > 0.1
    saved = json.loads(out.read_text())
    assert saved["summary"]["series"] == 3
    assert [r["benchmark"] for r in saved["rows"]] == [r["benchmark"] for r in rows]


def test_fewer_nights_than_asked_leave_a_series_out(store: Path) -> None:
    assert main(["--data-dir", str(store), "--nights", "7", "--trials", "5"]) == []
    rows = main(["--data-dir", str(store), "--nights", "4", "--trials", "5"])
    [alexnet] = [r for r in rows if r["benchmark"] == "alexnet:eval:cpu"]
    assert alexnet["since_reset"] == 4 and alexnet["nights"] == 8
    want = series_smallest_change(ALEXNET[4:], 0.07, memory=False)
    assert alexnet["formula"] == pytest.approx(want) and alexnet["api_smallest"] == pytest.approx(
        want
    )


def test_the_flow_step_is_the_crossing_of_the_steps_either_side() -> None:
    f = flow_step(0.02, 5, 0.07, trials=40, seed=3)
    assert f.step is not None
    shares = dict((c[1], c[2]) for c in f.cells)
    below = max(s for s, b in shares.items() if s < f.step)
    above = min(s for s, b in shares.items() if s >= f.step)
    assert shares[below] < 0.95 <= shares[above]
    assert f.step == pytest.approx(
        crossing((below, shares[below]), (above, shares[above])), abs=1e-12
    )
    assert crossing((0.08, 0.85), (0.10, 0.97)) == pytest.approx(0.08 + 0.02 * 10 / 12)
    # Where by3 climbs slowly, the same binomial error moves the crossing further.
    steep = crossing_se((0.08, 0.85), (0.10, 0.99), 400)
    flat = crossing_se((0.08, 0.94), (0.10, 0.96), 400)
    assert 0 < steep < 0.002 < flat
    assert f.step_se is not None and f.step_se > 0


def test_noise_groups_and_the_summary() -> None:
    assert noise_group(0.0123, 5, 0.07, 0.0005) == (0.0125, 5, 0.07)
    assert noise_group(0.0001, 5, 0.07, 0.0005) == (0.0005, 5, 0.07)  # never 0
    rows = [
        {"diff_pp": d, "formula": f, "by3_at_formula": b}
        for d, f, b in ((0.5, 0.1, 0.96), (-1.5, 0.1, 0.97), (3.0, 0.1, 0.93), (20.0, 1.5, 0.94))
    ]
    rows.append({"diff_pp": None, "formula": 0.2, "by3_at_formula": None})
    s = summary(rows, 2.0)
    assert (s["series"], s["compared"], s["agree"]) == (5, 4, 2)
    assert s["median_abs_diff_pp"] == 2.25 and s["max_abs_diff_pp"] == 20.0
    assert s["by3_at_formula"] == pytest.approx((0.93, 0.95, 0.97))
    assert summary(rows, 3.0)["agree"] == 3
    # 10% of a +150% step is 15 points: 20 points is beyond it, 15% (22.5 points) is not.
    assert summary(rows, 2.0, 0.10)["agree"] == 2
    assert summary(rows, 2.0, 0.15)["agree"] == 3
    assert np.isclose(s["median_abs_rel_diff"], statistics.median([0.05, 0.15, 0.3, 20 / 150]))
