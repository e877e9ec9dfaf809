"""Ingest takes every record the suite writes: real ``python -m suite run`` records, unchanged.

One model of every domain of the embedded suite, every mode it has, measured for real (a few
iterations each) by the same command a runner uses, then posted as written. Nothing is edited
on the way: a record the API refused here is one a runner would lose.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Result, Run
from suite.registry import list_models

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _one_model_per_domain() -> list[tuple[str, str]]:
    """``(model, mode)`` for the first model of each domain, each of its modes."""
    chosen: dict[str, object] = {}
    for info in list_models():
        chosen.setdefault(info.domain, info)
    return [(info.name, mode) for info in chosen.values() for mode in info.modes]  # type: ignore[attr-defined]


def _measure(model: str, mode: str, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "run",
        "--model",
        model,
        "--mode",
        mode,
        "--iterations",
        "3",
        "--max-iterations",
        "3",
        "--warmup",
        "1",
        "--warmup-seconds",
        "0",
        "--min-seconds",
        "0",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{model} {mode}: {done.stderr[-2000:]}"
    return json.loads(out.read_text())


def test_every_domain_s_records_are_accepted_unchanged(
    client: TestClient,
    db: Session,
    auth: dict,
    tmp_path: Path,
) -> None:
    pairs = _one_model_per_domain()
    domains = {info.domain for info in list_models()}
    assert len(pairs) >= len(domains) >= 5
    # Nothing here is timed: two suite processes at once, one per core.
    with ThreadPoolExecutor(max_workers=2) as pool:
        records = list(pool.map(lambda p: _measure(*p, tmp_path / f"{p[0]}-{p[1]}.json"), pairs))
    assert all(r["error"] is None for r in records), [r["error"] for r in records if r["error"]]

    body = {
        "night": "2026-03-01",
        "key": "every-domain",
        "benchmarks": [{"model": m, "mode": mode} for m, mode in pairs],
        "torch_version": records[0]["environment"].get("torch_version"),
    }
    r = client.post("/api/runs", json=body, headers=auth)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    for record in records:
        r = client.post(f"/api/runs/{run_id}/results", json=[record], headers=auth)
        assert r.status_code == 200, f"{record['model']} {record['mode']}: {r.text}"
        assert r.json()["stored"] == 1, r.json()

    db.expire_all()
    run = db.get(Run, run_id)
    assert run is not None and run.status != "running", run.status
    # Every metric of every record is stored, with its raw samples' median.
    expected = sum(len(r["metrics"]) for r in records)
    stored = db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run_id))
    assert stored == expected
    for record in records:
        latency = next(m for m in record["metrics"] if m["metric"] == "latency")
        kept = db.scalar(
            select(Result.median).where(
                Result.run_id == run_id,
                Result.model == record["model"],
                Result.mode == record["mode"],
                Result.metric == "latency",
            )
        )
        assert kept == pytest.approx(statistics.median(latency["samples"])), record["model"]
    # What each model is comes from its records (the catalogue), not from the suite's files.
    domains = {m["name"]: m["domain"] for m in client.get("/api/models").json()["models"]}
    assert domains == {
        info.name: info.domain
        for info in list_models()
        if info.name in {model for model, _ in pairs}
    }
