"""Model history: JSON and CSV points, baselines, flags, charts, the models list."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import BenchmarkStability, Result
from service.regressions.baseline import baseline_track
from service.regressions.detection import DEFAULT_PARAMS, Night, assess_night
from service.regressions.sensitivity import series_smallest_change
from tests.api.conftest import add_night, flag, latency_series, make_record, night, rows

N = 24
STEP = 16


@pytest.fixture
def seeded(db: Session) -> dict[str, object]:
    """resnet18 train latency over 24 nights with a +20% step at night 16 (flagged), eval
    latency flat, and an error on night 5 of eval."""
    train = latency_series(N, step_at=STEP, seed=1)
    evals = latency_series(N, level=4.0, seed=2)
    mem = [[float(2**30 + (i % 3) * 2**20)] * 3 for i in range(N)]
    runs = []
    for i in range(N):
        records = [
            make_record("resnet18", "train", {"latency": train[i], "cpu_peak_mem": mem[i]}),
            make_record(
                "resnet18",
                "eval",
                {"latency": evals[i]},
                error="RuntimeError: out of memory" if i == 5 else None,
            ),
        ]
        runs.append(
            add_night(
                db,
                night(i),
                records,
                torch_version=f"2.13.0.dev{i:02d}",
                commit=f"{i:02d}" + "c" * 38,
            )
        )
    step_result = db.scalar(
        select(Result).where(
            Result.run_id == runs[STEP].id, Result.mode == "train", Result.metric == "latency"
        )
    )
    reg = flag(db, step_result, baseline=float(np.median([np.median(s) for s in train[:STEP]])))
    return {"train": train, "evals": evals, "runs": runs, "regression": reg}


def _series(body: dict, mode: str, metric: str) -> dict:
    [s] = [s for s in body["series"] if s["mode"] == mode and s["metric"] == metric]
    return s


def test_history_points_carry_build_median_spread_and_baseline(client: TestClient, seeded) -> None:
    r = client.get("/api/models/resnet18/history")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "resnet18"
    assert {(s["mode"], s["metric"]) for s in body["series"]} == {
        ("train", "latency"),
        ("train", "cpu_peak_mem"),
        ("eval", "latency"),
    }
    train = _series(body, "train", "latency")
    pts = rows(train["points"])
    assert len(pts) == N
    assert [p["night"] for p in pts] == [night(i).isoformat() for i in range(N)]
    assert pts[3]["torch_version"] == "2.13.0.dev03" and pts[3]["torch_git_commit"].startswith("03")
    assert pts[3]["median"] == pytest.approx(float(np.median(seeded["train"][3])))
    assert pts[3]["samples"] == 9 and pts[3]["iqr"] > 0
    # No baseline before min_baseline earlier nights; then the median of the earlier nights.
    k = DEFAULT_PARAMS.min_baseline
    assert all(p["baseline"] is None for p in pts[:k])
    levels = [float(np.median(s)) for s in seeded["train"]]
    assert pts[k]["baseline"] == pytest.approx(math.exp(np.median(np.log(levels[:k]))))
    assert pts[k]["baseline_lower"] < pts[k]["baseline"] < pts[k]["baseline_upper"]
    # The flagged step: a regression at its night, linked to its stored row.
    assert [i for i, p in enumerate(pts) if p["regression"]] == [STEP]
    assert pts[STEP]["regression_id"] == seeded["regression"].id
    assert pts[STEP]["change"] == pytest.approx(levels[STEP] / pts[STEP]["baseline"] - 1)
    # After the raised step the baseline restarts at the new level.
    assert all(p["baseline"] is None for p in pts[STEP + 1 : STEP + k])
    assert not any(p["outlier"] for p in pts)
    assert train["chart_url"].startswith("/api/models/resnet18/history.svg?series=")
    # The failed night appears among the errors, not as a point.
    assert body["errors"] == [
        {
            "night": night(5).isoformat(),
            "run_id": seeded["runs"][5].id,
            "result_id": body["errors"][0]["result_id"],
            "benchmark": "resnet18:eval:cpu",
            "error": "RuntimeError: out of memory",
        }
    ]
    assert len(_series(body, "eval", "latency")["points"]["night"]) == N - 1


def test_history_filters(client: TestClient, seeded) -> None:
    body = client.get(
        "/api/models/resnet18/history", params={"metric": "latency", "mode": "train"}
    ).json()
    assert [(s["mode"], s["metric"]) for s in body["series"]] == [("train", "latency")]
    key = body["series"][0]["series_key"]
    full = rows(body["series"][0]["points"])
    part = client.get(
        "/api/models/resnet18/history",
        params={"series": key, "since": night(10).isoformat(), "until": night(19).isoformat()},
    ).json()
    pts = rows(part["series"][0]["points"])
    assert [p["night"] for p in pts] == [night(i).isoformat() for i in range(10, 20)]
    # Baselines in a window are those of the full history: earlier nights still count.
    assert [p["baseline"] for p in pts] == [p["baseline"] for p in full[10:20]]
    assert (
        client.get("/api/models/resnet18/history", params={"machine": 999999}).json()["series"]
        == []
    )


def test_history_csv_matches_json(client: TestClient, seeded) -> None:
    r = client.get("/api/models/resnet18/history", params={"format": "csv", "metric": "latency"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    frame = pd.read_csv(io.StringIO(r.text))
    body = client.get("/api/models/resnet18/history", params={"metric": "latency"}).json()
    assert len(frame) == sum(len(s["points"]["night"]) for s in body["series"])
    train = frame[frame["benchmark"] == "resnet18:train:cpu"].reset_index(drop=True)
    pts = rows(_series(body, "train", "latency")["points"])
    assert train["median"].tolist() == pytest.approx([p["median"] for p in pts])
    assert train["regression"].tolist() == [p["regression"] for p in pts]
    assert train["torch_git_commit"].tolist() == [p["torch_git_commit"] for p in pts]


def test_history_errors(client: TestClient, seeded) -> None:
    r = client.get("/api/models/nosuchmodel/history")
    assert r.status_code == 404 and r.json() == {"detail": "model 'nosuchmodel' has no results"}
    # An empty period is not an error: it holds no nights.
    r = client.get(
        "/api/models/resnet18/history", params={"since": "2026-02-01", "until": "2026-01-01"}
    )
    assert r.status_code == 200 and r.json()["series"] == []
    r = client.get("/api/models/resnet18/history", params={"format": "xml"})
    assert r.status_code == 422 and r.json()["detail"].startswith("query format:")
    for bad in ("yesterday", "0", "2026-1-5"):
        r = client.get("/api/models/resnet18/history", params={"since": bad})
        assert r.status_code == 422 and r.json()["detail"].startswith("query since:"), bad


def test_chart_svg(client: TestClient, seeded) -> None:
    r = client.get("/api/models/resnet18/history.svg", params={"mode": "train"})
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    svg = r.text
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    # matplotlib keeps each text as a comment next to its glyph paths.
    assert "resnet18:train:cpu · latency" in svg and "resnet18:train:cpu · cpu_peak_mem" in svg
    assert "regression" in svg and "baseline band" in svg
    assert client.get("/api/models/resnet18/history.svg", params={"mode": "train"}).text == svg
    assert client.get("/api/models/nosuchmodel/history.svg").status_code == 404


def test_models_list(client: TestClient, seeded) -> None:
    r = client.get("/api/models")
    assert r.status_code == 200, r.text
    body = r.json()
    [m] = [m for m in body["models"] if m["name"] == "resnet18"]
    assert m["domain"] == "computer_vision"
    configs = {(c["mode"], c["metric"]): c for c in m["configurations"]}
    assert set(configs) == {("train", "latency"), ("train", "cpu_peak_mem"), ("eval", "latency")}
    assert configs[("train", "latency")]["last_night"] == night(N - 1).isoformat()
    # The default period: the latest night and the 7 before it.
    assert {c["results"] for c in m["configurations"]} == {8}
    assert body["since"] == night(N - 8).isoformat()
    every = client.get("/api/models", params={"days": 40}).json()
    [m] = [m for m in every["models"] if m["name"] == "resnet18"]
    configs = {(c["mode"], c["metric"]): c for c in m["configurations"]}
    assert configs[("train", "latency")]["results"] == N
    assert configs[("eval", "latency")]["results"] == N - 1  # the failed night is no result
    assert configs[("train", "latency")]["first_night"] == night(0).isoformat()
    short = client.get("/api/models", params={"days": 3}).json()
    [m] = [m for m in short["models"] if m["name"] == "resnet18"]
    assert {c["results"] for c in m["configurations"]} == {4}


def test_model_page_lists_one_chart_per_series(client: TestClient, seeded) -> None:
    r = client.get("/models/resnet18")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text.count('<img class="chart"') == 3
    assert "resnet18:train:cpu" in r.text and "regression +" in r.text
    assert client.get("/models/nosuchmodel").status_code == 404


def test_history_and_page_say_which_series_alert_only_beyond_their_noise(
    client: TestClient,
    db: Session,
    seeded,
) -> None:
    machine = db.scalar(select(Result.machine_id).where(Result.mode == "train"))
    db.add(
        BenchmarkStability(
            model="resnet18",
            mode="train",
            device="cpu",
            compiler="eager",
            machine_id=machine,
            repeats=5,
            medians_ms=[1.0] * 5,
            cv=0.04,
            spread=0.1,
            unstable=True,
            threshold=0.07,
        )
    )
    db.flush()
    body = client.get("/api/models/resnet18/history").json()
    latency, memory = _series(body, "train", "latency"), _series(body, "train", "cpu_peak_mem")
    assert (latency["unstable"], latency["alerts_from"]) == (True, pytest.approx(0.3))
    assert (memory["unstable"], memory["alerts_from"]) == (False, None)  # the verdict is latency's
    assert _series(body, "eval", "latency")["unstable"] is False
    page = client.get("/models/resnet18").text
    assert page.count("unstable: alerts from +30.0%") == 1


# ---------------------------------------------------------------------------------------------
# The baseline track agrees with the detector, night by night


def _nights(levels: list[list[float]], expected: set[int] = frozenset()) -> list[Night]:
    return [Night(i, tuple(s), expected=i in expected) for i, s in enumerate(levels)]


@pytest.mark.parametrize("expected", [set(), {20}])
def test_baseline_track_matches_assess_night_latency(expected: set[int]) -> None:
    rng = np.random.default_rng(7)
    samples = [list(rng.normal(10, 0.3, 5)) for _ in range(45)]
    nights = _nights(samples, expected)
    levels = [float(np.median(s)) for s in samples]
    track = baseline_track(levels, memory=False, resets=[(i, i) for i in expected])
    checked = 0
    for j in range(len(nights)):
        a = assess_night(nights[:j], nights[j], metric="latency")
        assert a.verdict in ("unchanged", "no_baseline")  # no step: no reset of the detector's own
        if a.baseline is None:
            assert math.isnan(track.baseline[j]), j
            continue
        assert track.baseline[j] == pytest.approx(a.baseline, rel=1e-12), j
        # The band's noise is computed in float32 (its width only): agreement to 1e-7.
        assert track.lower[j] == pytest.approx(a.baseline_lower, rel=1e-7), j
        assert track.upper[j] == pytest.approx(a.baseline_upper, rel=1e-7), j
        checked += 1
    assert checked >= 30


def test_baseline_track_matches_assess_night_memory() -> None:
    samples = [[float(2**30 + (i % 4) * 4096)] for i in range(36)]
    levels = [s[0] for s in samples]
    track = baseline_track(levels, memory=True)
    for j in range(len(samples)):
        a = assess_night(_nights(samples)[:j], _nights(samples)[j], metric="cpu_peak_mem")
        if a.baseline is None:
            assert math.isnan(track.baseline[j])
        else:
            assert track.baseline[j] == pytest.approx(a.baseline, rel=1e-12)


def test_baseline_track_restarts_after_a_step() -> None:
    k = DEFAULT_PARAMS.min_baseline
    levels = [10.0] * 20 + [12.0] * 20
    track = baseline_track(levels, memory=False, resets=[(20, 21)])
    assert track.baseline[20] == pytest.approx(10.0)  # the step night against the old level
    assert np.isnan(track.baseline[21 : 20 + k]).all()  # too few nights at the new level
    assert track.baseline[20 + k] == pytest.approx(12.0)


def test_a_step_raised_after_it_persisted_restarts_the_baseline_at_its_first_night(
    client: TestClient,
    db: Session,
) -> None:
    # +20% from night 16, raised on night 17 (it persisted): the detector's baseline restarts
    # at night 16, so night 16 + k has a baseline of the new level's k nights.
    train = latency_series(N, step_at=STEP, seed=3)
    runs = [
        add_night(db, night(i), [make_record("vit", "train", {"latency": train[i]})])
        for i in range(N)
    ]
    results = [
        db.scalar(select(Result).where(Result.run_id == r.id, Result.metric == "latency"))
        for r in runs
    ]
    reg = flag(db, results[STEP + 1])
    reg.first_result_id, reg.first_night = results[STEP].id, night(STEP)
    db.flush()
    pts = rows(_series(client.get("/api/models/vit/history").json(), "train", "latency")["points"])
    k = DEFAULT_PARAMS.min_baseline
    levels = [float(np.median(s)) for s in train]
    assert [i for i, p in enumerate(pts) if p["regression"]] == [STEP + 1]
    assert pts[STEP + 1]["baseline"] == pytest.approx(float(np.median(levels[: STEP + 1])))
    assert all(p["baseline"] is None for p in pts[STEP + 2 : STEP + k])
    assert pts[STEP + k]["baseline"] == pytest.approx(float(np.median(levels[STEP : STEP + k])))
    # The detector, replayed over the same nights, holds the same baseline.
    nights = [Night(i, tuple(s)) for i, s in enumerate(train)]
    a = assess_night(nights[: STEP + k], nights[STEP + k], metric="latency")
    assert a.baseline == pytest.approx(pts[STEP + k]["baseline"], rel=1e-9)
    # The smallest change the next night could see is judged on the same segment: its noise
    # over the nights from the step's first night, not from the night after it was raised.
    series = _series(client.get("/api/models/vit/history").json(), "train", "latency")
    since_step = series_smallest_change(levels[STEP:], 0.07, memory=False)
    assert since_step is not None
    assert series["smallest_change"] == pytest.approx(since_step)
    assert since_step != pytest.approx(
        series_smallest_change(levels[STEP + 2 :], 0.07, memory=False)
    )
