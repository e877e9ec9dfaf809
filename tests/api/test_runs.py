"""Runs: cursor pages, detail with completeness and errors, comparison of two runs."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.models.base import utcnow
from service.results.service import store_record
from service.runs.compare import compare_samples
from service.runs.service import (
    BenchmarkSpec,
    create_run,
    end_job,
    list_jobs,
    mark_missing,
)
from tests.api.conftest import add_night, make_record, night


def _lat(level: float, seed: int, n: int = 15) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).normal(level, level * 0.01, n)]


def test_runs_pages_follow_the_cursor(client: TestClient, db: Session) -> None:
    ids = [add_night(db, night(i), [make_record("dcgan", "eval", {"latency": _lat(3, i)})]).id
           for i in range(7)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        r = client.get("/api/runs", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    mine = [i for i in seen if i in ids]
    assert mine == sorted(ids, reverse=True) and pages >= 3
    assert len(seen) == len(set(seen))
    r = client.get("/api/runs", params={"since": night(5).isoformat(), "until": night(6).isoformat(),
                                        "kind": "nightly"})
    assert {item["id"] for item in r.json()["items"]} == set(ids[5:])


def test_run_detail_reports_results_errors_and_completeness(client: TestClient, db: Session) -> None:
    specs = [BenchmarkSpec(model="dcgan", mode="eval"), BenchmarkSpec(model="dcgan", mode="train"),
             BenchmarkSpec(model="unet", mode="eval")]
    run = create_run(db, night=night(0), benchmarks=specs, deadline_s=1)
    jobs = {j.benchmark: j for j in list_jobs(db, run_id=run.id)}
    store_record(db, run=run, job=jobs["dcgan:eval:cpu"],
                 record=make_record("dcgan", "eval", {"latency": _lat(3, 1)}))
    end_job(db, job=jobs["dcgan:eval:cpu"], error=None)
    store_record(db, run=run, job=jobs["dcgan:train:cpu"],
                 record=make_record("dcgan", "train", {}, error="Timeout after 900 s"))
    end_job(db, job=jobs["dcgan:train:cpu"], error="Timeout after 900 s")
    db.flush()
    r = client.get(f"/api/runs/{run.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    c = body["completeness"]
    assert (c["total"], c["done"], c["error"], c["queued"]) == (3, 1, 1, 1)
    assert c["pending"] == ["unet:eval:cpu"] and not c["complete"]
    assert c["ended_fraction"] == pytest.approx(2 / 3)
    assert {(x["benchmark"], x["metric"]) for x in body["results"]} == {
        ("dcgan:eval:cpu", "latency"), ("dcgan:train:cpu", "latency")}
    assert body["errors"] == [{"benchmark": "dcgan:train:cpu", "source": "result",
                               "status": "error", "error": "Timeout after 900 s"}]
    # Past the deadline the silent benchmark is missing, and says so.
    mark_missing(db, run_id=run.id, now=utcnow() + timedelta(seconds=5))
    db.flush()
    body = client.get(f"/api/runs/{run.id}").json()
    assert body["completeness"]["missing_benchmarks"] == ["unet:eval:cpu"]
    assert [e["benchmark"] for e in body["errors"] if e["source"] == "job"] == ["unet:eval:cpu"]
    assert [a["kind"] for a in body["alerts"]] == ["missing_data"]
    assert client.get("/api/runs/2147483000").json() == {"detail": "run 2147483000 does not exist"}


def test_compare_flags_a_real_slowdown_only(client: TestClient, db: Session) -> None:
    a = add_night(db, night(0), [make_record("dcgan", "eval", {"latency": _lat(3.0, 1)}),
                                 make_record("unet", "eval", {"latency": _lat(8.0, 2)}),
                                 make_record("vit", "eval", {"latency": _lat(5.0, 3)})])
    b = add_night(db, night(1), [make_record("dcgan", "eval", {"latency": _lat(3.6, 4)}),
                                 make_record("unet", "eval", {"latency": _lat(8.0, 5)}),
                                 make_record("centernet", "eval", {"latency": _lat(5.0, 6)})])
    r = client.get(f"/api/runs/{a.id}/compare/{b.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {c["benchmark"]: c for c in body["comparisons"]}
    assert set(rows) == {"dcgan:eval:cpu", "unet:eval:cpu"}
    slow = rows["dcgan:eval:cpu"]
    assert slow["ratio"] == pytest.approx(slow["b_median"] / slow["a_median"])
    assert slow["ratio"] == pytest.approx(1.2, abs=0.02)
    assert slow["significant"] and slow["p_value"] < 1e-4 and slow["verdict"] == "regression"
    same = rows["unet:eval:cpu"]
    assert not same["significant"] and same["verdict"] == "not significant"
    assert body["only_in_a"] == ["vit:eval:cpu latency"]
    assert body["only_in_b"] == ["centernet:eval:cpu latency"]
    assert client.get(f"/api/runs/{a.id}/compare/2147483000").status_code == 404
    assert client.get(f"/api/runs/{a.id}/compare/{b.id}", params={"alpha": 2}).status_code == 422


def test_compare_samples_edge_cases() -> None:
    assert compare_samples([5.0, 5.0], [5.0, 5.0], alpha=0.01, threshold=0.07) == (
        1.0, 1.0, False, "not significant")
    ratio, p, significant, verdict = compare_samples(
        [10.0 + i * 0.01 for i in range(20)], [8.0 + i * 0.01 for i in range(20)],
        alpha=0.01, threshold=0.07)
    assert ratio == pytest.approx(0.8, abs=0.01) and significant and verdict == "improvement"
