"""Regressions (list, triage with a token), alerts, and the health check."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine
from service.main import create_app
from service.models import Alert, Regression, Result
from tests.api.conftest import add_night, flag, latency_series, make_record, night


def _seed(db: Session) -> tuple[list[Regression], Alert]:
    series = latency_series(3, seed=3)
    runs = [
        add_night(
            db,
            night(i),
            [
                make_record("unet", "train", {"latency": series[i]}),
                make_record("vit", "eval", {"latency": series[i]}),
            ],
        )
        for i in range(3)
    ]
    alert = Alert(run_id=runs[2].id, kind="regression", status="open", summary="1 regression(s)")
    db.add(alert)
    db.flush()
    regs = []
    for run, model, direction in (
        (runs[0], "unet", "improvement"),
        (runs[2], "vit", "regression"),
        (runs[2], "unet", "regression"),
    ):
        result = db.scalar(select(Result).where(Result.run_id == run.id, Result.model == model))
        regs.append(
            flag(
                db,
                result,
                direction=direction,
                alert_id=alert.id if run is runs[2] and model == "vit" else None,
                state="improvement" if direction == "improvement" else "untriaged",
            )
        )
    return regs, alert


def test_list_filters_by_state_and_night(client: TestClient, db: Session) -> None:
    regs, _ = _seed(db)
    body = client.get("/api/regressions", params={"since": night(0).isoformat()}).json()
    mine = [r["id"] for r in body["items"] if r["id"] in {g.id for g in regs}]
    assert mine == sorted((g.id for g in regs), reverse=True)
    untriaged = client.get(
        "/api/regressions", params={"state": "untriaged", "since": night(1).isoformat()}
    ).json()["items"]
    assert {r["id"] for r in untriaged} >= {regs[1].id, regs[2].id}
    assert regs[0].id not in {r["id"] for r in untriaged}
    item = next(r for r in untriaged if r["id"] == regs[1].id)
    assert item["benchmark"] == "vit:eval:cpu" and item["night"] == night(2).isoformat()
    assert item["first_night"] == item["night"]  # a step that began the night it was raised
    assert item["chart_url"].startswith("/api/models/vit/history.svg?series=")
    r = client.get("/api/regressions", params={"state": "bogus"})
    assert r.status_code == 422 and r.json()["detail"].startswith("query state:")
    page = client.get("/api/regressions", params={"limit": 1, "model": "unet"}).json()
    assert len(page["items"]) == 1 and page["next_cursor"] == page["items"][0]["id"]


def test_triage_needs_a_token_and_a_known_state(
    client: TestClient, db: Session, auth: dict
) -> None:
    regs, _ = _seed(db)
    url = f"/api/regressions/{regs[1].id}"
    assert client.patch(url, json={"state": "confirmed"}).status_code == 401
    r = client.patch(url, json={"state": "fixed-ish"}, headers=auth)
    assert r.status_code == 422 and r.json()["detail"].startswith("body state:")
    r = client.patch(url, json={"state": "expected"}, headers=auth)
    assert r.status_code == 200 and r.json()["state"] == "expected"
    db.expire_all()
    assert db.get(Regression, regs[1].id).state == "expected"
    assert client.get(url).json()["state"] == "expected"
    r = client.patch("/api/regressions/2147483000", json={"state": "invalid"}, headers=auth)
    assert r.status_code == 404 and r.json() == {"detail": "regression 2147483000 does not exist"}


def test_alert_lists_its_regressions(client: TestClient, db: Session) -> None:
    regs, alert = _seed(db)
    r = client.get(f"/api/alerts/{alert.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "regression" and body["night"] == night(2).isoformat()
    assert [x["id"] for x in body["regressions"]] == [regs[1].id]
    assert client.get("/api/alerts/2147483000").status_code == 404
    assert client.get("/api/alerts/0").status_code == 422


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok"}


def test_healthz_reports_an_unreachable_database() -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")
    app = create_app(session_factory=sessionmaker(bind=engine))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/healthz")
    engine.dispose()
    assert r.status_code == 503 and r.json() == {
        "detail": "the database is unreachable; try again shortly"
    }
