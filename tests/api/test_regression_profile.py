"""``GET /api/regressions/{id}/profile`` and its traces: the profile probe's stored answer."""

from __future__ import annotations

import gzip
import json

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import BisectionProfile, Result
from service.models.bisection import Bisection
from service.profiles import Profile, ProfileRow, diff_json, diff_profiles
from tests.api.conftest import add_night, flag, latency_series, make_record, night

GOOD, PARENT, CULPRIT, BAD = "a" * 40, "b" * 40, "d" * 40, "c" * 40
TRACE = {"traceEvents": [{"name": "aten::clone", "ph": "X", "ts": 1, "dur": 900}]}


def _ops(rows: dict[str, float]) -> Profile:
    return Profile(
        metric="latency",
        unit="us",
        rows={n: ProfileRow(name=n, values=(v,), calls=1.0) for n, v in rows.items()},
    )


DIFF = diff_json(
    diff_profiles(
        _ops({"aten::addmm": 600.0, "aten::relu": 40.0}),
        _ops({"aten::addmm": 601.0, "aten::relu": 40.0, "aten::clone": 900.0}),
    )
)


def _seed(db: Session, *, profiled: bool = True) -> tuple[int, int, Bisection]:
    """Two regressed benchmarks with one culprit; only the first one profiled."""
    series = latency_series(12, step_at=9, seed=4)
    runs = [
        add_night(
            db,
            night(i),
            [
                make_record("vit", "eval", {"latency": series[i]}),
                make_record("unet", "eval", {"latency": series[i]}),
            ],
        )
        for i in range(12)
    ]
    regs = [
        flag(
            db,
            db.scalar(select(Result).where(Result.run_id == runs[9].id, Result.model == model)),
        )
        for model in ("vit", "unet")
    ]
    benches = ["vit:eval:cpu", "unet:eval:cpu"]
    b = Bisection(
        run_id=runs[9].id,
        status="done",
        outcome="culprit",
        good=GOOD,
        bad=BAD,
        commits=[{"sha": s} for s in (GOOD, PARENT, CULPRIT, BAD)],
        benchmarks=benches,
        regression_ids=[r.id for r in regs],
        result={
            "outcome": "culprit",
            "benchmarks": [
                {"benchmark": n, "status": "culprit", "culprit": CULPRIT, "range": [CULPRIT]}
                for n in benches
            ],
        },
    )
    db.add(b)
    db.flush()
    if profiled:
        db.add(
            BisectionProfile(
                bisection_id=b.id,
                benchmark="vit:eval:cpu",
                metric="latency",
                before=PARENT,
                after=CULPRIT,
                culprit=True,
                status="done",
                diff=DIFF,
                trace_before=gzip.compress(json.dumps(TRACE).encode()),
                trace_after=gzip.compress(json.dumps(TRACE).encode()),
            )
        )
        db.flush()
    return regs[0].id, regs[1].id, b


def test_the_profile_of_a_regression_and_of_another_with_the_same_culprit(
    client: TestClient, db: Session
) -> None:
    vit, unet, bisection = _seed(db)
    body = client.get(f"/api/regressions/{vit}/profile").json()
    assert body["bisection_id"] == bisection.id
    assert (body["benchmark"], body["before"], body["after"]) == ("vit:eval:cpu", PARENT, CULPRIT)
    assert body["culprit"] is True and body["status"] == "done"
    assert [(r["name"], r["status"]) for r in body["diff"]["rows"]] == [("aten::clone", "new")]
    assert body["diff"]["rows"][0]["change"] == 900.0
    assert body["traces"] == [
        f"/api/regressions/{vit}/profile/trace/before",
        f"/api/regressions/{vit}/profile/trace/after",
    ]
    # unet was not profiled itself: its culprit's profile is vit's.
    other = client.get(f"/api/regressions/{unet}/profile").json()
    assert other["benchmark"] == "vit:eval:cpu" and other["regression_id"] == unet


def test_a_count_profile_serves_its_python_functions(client: TestClient, db: Session) -> None:
    vit, _, bisection = _seed(db, profiled=False)

    def functions(rows: dict[str, float], unit: str) -> Profile:
        return Profile(
            metric="cpu_instructions",
            unit=unit,
            rows={n: ProfileRow(name=n, values=(v,)) for n, v in rows.items()},
        )

    c_diff = diff_profiles(
        functions({"Python/ceval.c:_PyEval_EvalFrameDefault": 4e6}, "instructions"),
        functions({"Python/ceval.c:_PyEval_EvalFrameDefault": 9e6}, "instructions"),
    )
    py_diff = diff_profiles(
        functions({"m/a.py: f": 100.0}, "bytecodes"),
        functions({"m/a.py: f": 100.0, "m/a.py: check": 5000.0}, "bytecodes"),
    )
    db.add(
        BisectionProfile(
            bisection_id=bisection.id,
            benchmark="vit:eval:cpu",
            metric="cpu_instructions",
            before=PARENT,
            after=CULPRIT,
            culprit=True,
            status="done",
            diff=diff_json(c_diff, python=py_diff),
        )
    )
    db.flush()
    body = client.get(f"/api/regressions/{vit}/profile").json()
    python = body["diff"]["python"]
    assert python["unit"] == "bytecodes"
    assert [(r["name"], r["change"], r["status"]) for r in python["rows"]] == [
        ("m/a.py: check", 5000.0, "new")
    ]
    assert body["diff"]["rows"][0]["name"] == "Python/ceval.c:_PyEval_EvalFrameDefault"
    assert body["traces"] == []  # callgrind keeps no Chrome trace


def test_a_trace_downloads_as_gzip_json(client: TestClient, db: Session) -> None:
    vit, _, _ = _seed(db)
    response = client.get(f"/api/regressions/{vit}/profile/trace/after")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    assert "regression-" in response.headers["content-disposition"]
    assert json.loads(gzip.decompress(response.content)) == TRACE
    assert client.get(f"/api/regressions/{vit}/profile/trace/sideways").status_code == 422


def test_what_is_missing_is_named(client: TestClient, db: Session) -> None:
    vit, _, bisection = _seed(db, profiled=False)
    response = client.get(f"/api/regressions/{vit}/profile")
    assert response.status_code == 404
    assert f"bisection {bisection.id}" in response.json()["detail"]
    assert "profile_regressions was off" in response.json()["detail"]
    missing = client.get("/api/regressions/999999999/profile")
    assert missing.status_code == 404 and "does not exist" in missing.json()["detail"]


def test_a_failed_probe_is_served_with_its_reason_and_no_trace(
    client: TestClient, db: Session
) -> None:
    vit, _, bisection = _seed(db, profiled=False)
    db.add(
        BisectionProfile(
            bisection_id=bisection.id,
            benchmark="vit:eval:cpu",
            metric="latency",
            before=PARENT,
            after=CULPRIT,
            culprit=True,
            status="failed",
            reason="vit:eval:cpu on dddddddddddd: out of memory",
        )
    )
    db.flush()
    body = client.get(f"/api/regressions/{vit}/profile").json()
    assert body["status"] == "failed" and body["diff"] is None and body["traces"] == []
    assert body["reason"].endswith("out of memory")
    trace = client.get(f"/api/regressions/{vit}/profile/trace/before")
    assert trace.status_code == 404 and "out of memory" in trace.json()["detail"]
