"""Bisections: probes, verdicts, culprit; culprits reach regressions, history and charts."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Result
from service.models.bisection import Bisection, Probe
from tests.api.conftest import add_night, flag, latency_series, make_record, night, rows

GOOD, MID, BAD = "a" * 40, "b" * 40, "c" * 40
CULPRIT = "d" * 40


def _seed(db: Session) -> tuple[Bisection, int]:
    series = latency_series(12, step_at=9, seed=4)
    runs = [
        add_night(db, night(i), [make_record("vit", "eval", {"latency": series[i]})])
        for i in range(12)
    ]
    step = db.scalar(select(Result).where(Result.run_id == runs[9].id))
    reg = flag(db, step)
    bench = "vit:eval:cpu"
    b = Bisection(
        run_id=runs[9].id,
        status="done",
        outcome="culprit",
        good=GOOD,
        bad=BAD,
        commits=[{"sha": s} for s in (GOOD, MID, CULPRIT, BAD)],
        benchmarks=[bench],
        regression_ids=[reg.id],
        builds=4,
        rounds=3,
        result={
            "outcome": "culprit",
            "culprits": [
                {
                    "sha": CULPRIT,
                    "title": "Slow down attention",
                    "author": "Dev",
                    "pr_number": 123,
                    "benchmarks": [bench],
                    "change": {bench: 0.2},
                }
            ],
            "benchmarks": [
                {
                    "benchmark": bench,
                    "status": "culprit",
                    "culprit": CULPRIT,
                    "range": [CULPRIT],
                    "change": 0.2,
                    "reason": "",
                }
            ],
            "probes": [
                {
                    "round": 0,
                    "sha": GOOD,
                    "results": [
                        {
                            "benchmark": bench,
                            "samples": [10.0, 10.1],
                            "vs_good": None,
                            "vs_bad": "different",
                            "side": "good",
                            "error": None,
                            "reference_rounds": [0],
                        }
                    ],
                }
            ],
        },
    )
    db.add(b)
    db.flush()
    db.add_all(
        [
            Probe(
                bisection_id=b.id,
                round=0,
                sha=GOOD,
                index=0,
                purpose="endpoint",
                benchmarks=[bench],
                samples_wanted=2,
                status="done",
                samples={bench: [10.0, 10.1]},
            ),
            Probe(
                bisection_id=b.id,
                round=1,
                sha=CULPRIT,
                index=2,
                purpose="search",
                benchmarks=[bench],
                samples_wanted=2,
                status="done",
                samples={bench: [12.0, 12.1]},
            ),
            Probe(
                bisection_id=b.id,
                round=1,
                sha=MID,
                index=1,
                purpose="search",
                benchmarks=[bench],
                samples_wanted=2,
                status="skipped",
                reason="build failed",
            ),
        ]
    )
    db.flush()
    return b, reg.id


def test_bisection_shows_probes_verdicts_and_culprit(client: TestClient, db: Session) -> None:
    b, reg_id = _seed(db)
    r = client.get(f"/api/bisections/{b.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["outcome"] == "culprit" and body["commits"] == 3 and body["search"] == "latency"
    assert [c["sha"] for c in body["culprits"]] == [CULPRIT]
    assert body["culprits"][0]["pr_number"] == 123
    assert [(p["round"], p["index"], p["status"]) for p in body["probes"]] == [
        (0, 0, "done"),
        (1, 1, "skipped"),
        (1, 2, "done"),
    ]
    assert body["probes"][0]["verdicts"][0]["vs_bad"] == "different"
    assert body["probes"][0]["verdicts"][0]["reference_rounds"] == [0]
    assert body["probes"][1]["reason"] == "build failed"
    assert body["answers"][0]["culprit"] == CULPRIT
    assert client.get("/api/bisections/2147483000").json() == {
        "detail": "bisection 2147483000 does not exist"
    }


def test_culprit_reaches_regression_history_and_chart(client: TestClient, db: Session) -> None:
    b, reg_id = _seed(db)
    reg = client.get(f"/api/regressions/{reg_id}").json()
    assert reg["culprit"] == CULPRIT and reg["bisection_ids"] == [b.id]
    pts = rows(client.get("/api/models/vit/history").json()["series"][0]["points"])
    assert [p["culprit"] for p in pts if p["regression"]] == [CULPRIT]
    assert all(p["culprit"] is None for p in pts if not p["regression"])
    svg = client.get("/api/models/vit/history.svg").text
    assert f"culprit {CULPRIT[:10]}" in svg
