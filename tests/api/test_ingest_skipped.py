"""Benchmarks a runner withdraws from its ingest run (``POST /api/runs/{id}/skipped``): ended,
shown with their reasons, never missing and never a failure; refused, naming them, where they
hold a result, are not in the run or went missing; a later record still counts."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Alert, Job, Result, Run
from service.models.base import utcnow
from service.regressions.failing import failing_benchmarks, newly_failing
from service.runs import ingest
from service.runs.service import finish_run, list_jobs, mark_missing
from tests.api.conftest import make_record, night

SCHNET = "schnet"  # a model its runner cannot import
BENCHES = [
    {"model": "dcgan", "mode": "eval"},
    {"model": "dcgan", "mode": "train"},
    {"model": SCHNET, "mode": "eval"},
    {"model": SCHNET, "mode": "train"},
]
NO_IMPORT = "No module named 'torchvision' (missing framework library)"
NOT_OFFERED = "not offered: train:cpu: TorchBench's metadata.yaml marks train on cpu"


def _record(model: str, mode: str, **kw) -> dict:
    return make_record(model, mode, {"latency": [3.0, 3.1, 2.9]}, **kw)


def _create(client: TestClient, auth: dict, benches: list[dict] = BENCHES, **extra) -> int:
    body = {"night": "2026-03-01", "benchmarks": benches, **extra}
    r = client.post("/api/runs", json=body, headers=auth)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _skip(model: str, mode: str, reason: str, **extra) -> dict:
    return {"model": model, "mode": mode, "device": "cpu", "reason": reason, **extra}


def _statuses(db: Session, run_id: int) -> dict[str, str]:
    db.expire_all()
    return {j.benchmark: j.status for j in list_jobs(db, run_id=run_id)}


def test_skipping_needs_a_valid_token(client: TestClient, db: Session, auth: dict) -> None:
    run_id = _create(client, auth)
    url = f"/api/runs/{run_id}/skipped"
    body = [_skip(SCHNET, "eval", NO_IMPORT)]
    r = client.post(url, json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post(url, json=body, headers={"Authorization": "Bearer nb_wrong"})
    assert r.status_code == 401
    assert set(_statuses(db, run_id).values()) == {"queued"}


def test_skipped_benchmarks_end_the_run_and_show_with_their_reasons(
    client: TestClient, db: Session, auth: dict
) -> None:
    run_id = _create(client, auth)
    url = f"/api/runs/{run_id}/skipped"
    r = client.post(
        url,
        json=[
            _skip(SCHNET, "eval", f"  {NO_IMPORT}\n"),
            _skip(SCHNET, "train", NO_IMPORT, compiler="eager"),
        ],
        headers=auth,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["skipped"], body["already_skipped"], body["status"]) == (2, 0, "running")
    done = body["completeness"]
    assert (done["skipped"], done["queued"], done["complete"]) == (2, 2, False)
    assert done["ended_fraction"] == 0.5
    assert done["pending"] == ["dcgan:eval:cpu", "dcgan:train:cpu"]
    # Stored stripped, in the job's reason column.
    assert done["skipped_benchmarks"] == [
        {"benchmark": f"{SCHNET}:eval:cpu", "reason": NO_IMPORT},
        {"benchmark": f"{SCHNET}:train:cpu", "reason": NO_IMPORT},
    ]

    # A retried request changes nothing, its first reason kept.
    r = client.post(url, json=[_skip(SCHNET, "eval", "another reason")], headers=auth)
    assert (r.json()["skipped"], r.json()["already_skipped"]) == (0, 1)
    assert r.json()["completeness"]["skipped_benchmarks"][0]["reason"] == NO_IMPORT

    # The shard's own models report; with the last one the run goes on to detection, complete.
    results = f"/api/runs/{run_id}/results"
    client.post(results, json=[_record("dcgan", "eval")], headers=auth)
    r = client.post(
        results, json=[_record("dcgan", "train", error="RuntimeError: boom")], headers=auth
    )
    assert r.json()["status"] == "detecting"
    assert r.json()["completeness"]["complete"] is True
    assert r.json()["completeness"]["ended_fraction"] == 1.0

    detail = client.get(f"/api/runs/{run_id}").json()
    assert detail["completeness"]["skipped"] == 2
    assert detail["completeness"]["missing_benchmarks"] == []
    # Skipped benchmarks are not errors: only the failed one is listed there.
    assert [e["benchmark"] for e in detail["errors"]] == ["dcgan:train:cpu"]
    finish_run(db, run=db.get(Run, run_id))
    assert db.get(Run, run_id).status == "complete"


def test_skipping_the_last_pending_benchmarks_moves_the_run_on(
    client: TestClient, db: Session, auth: dict
) -> None:
    run_id = _create(client, auth, benches=BENCHES[:2])
    client.post(f"/api/runs/{run_id}/results", json=[_record("dcgan", "eval")], headers=auth)
    r = client.post(
        f"/api/runs/{run_id}/skipped", json=[_skip("dcgan", "train", NOT_OFFERED)], headers=auth
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "detecting" and r.json()["completeness"]["complete"]
    # A run whose every benchmark was skipped moves on too (detection finds nothing to judge).
    only = _create(client, auth, benches=BENCHES[2:], key="all-skipped")
    r = client.post(
        f"/api/runs/{only}/skipped",
        json=[_skip(SCHNET, "eval", NO_IMPORT), _skip(SCHNET, "train", NO_IMPORT)],
        headers=auth,
    )
    assert r.json()["status"] == "detecting"


def test_skip_refuses_by_name_and_changes_nothing(
    client: TestClient, db: Session, auth: dict
) -> None:
    run_id = _create(client, auth)
    url = f"/api/runs/{run_id}/skipped"
    results = f"/api/runs/{run_id}/results"
    client.post(
        results,
        json=[_record("dcgan", "eval"), _record("dcgan", "train", error="Killed")],
        headers=auth,
    )
    before = _statuses(db, run_id)
    stored = db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run_id))

    def refused(status: int, body: list[dict], *names: str) -> str:
        r = client.post(url, json=body, headers=auth)
        assert r.status_code == status, r.text
        for name in names:
            assert name in r.json()["detail"], r.json()["detail"]
        assert _statuses(db, run_id) == before
        return r.json()["detail"]

    # A benchmark holding a result (done or error) is not skipped; the request is all or nothing.
    detail = refused(
        409,
        [
            _skip(SCHNET, "eval", NO_IMPORT),
            _skip("dcgan", "eval", NO_IMPORT),
            _skip("dcgan", "train", NO_IMPORT),
        ],
        "dcgan:eval:cpu",
        "dcgan:train:cpu",
        "holds results",
    )
    assert SCHNET not in detail
    refused(422, [_skip("vit", "eval", NO_IMPORT)], f"run {run_id} does not expect vit:eval:cpu")
    refused(422, [_skip(SCHNET, "eval", NO_IMPORT, device="cuda")], f"{SCHNET}:eval:cuda")
    refused(
        422,
        [_skip(SCHNET, "eval", NO_IMPORT), _skip(SCHNET, "eval", NOT_OFFERED)],
        f"listed twice: {SCHNET}:eval:cpu",
    )
    refused(422, [_skip(SCHNET, "eval", " \n\t ")], "reason", "blank")
    refused(422, [_skip(SCHNET, "eval", "")], "reason")
    refused(422, [_skip(SCHNET, "eval", "x" * 2001)], "reason")
    refused(422, [_skip(SCHNET, "eval", "bad\x00byte")], "reason", "U+0000")
    refused(422, [{"model": SCHNET, "mode": "eval"}], "reason")
    refused(422, [_skip(SCHNET, "eval", NO_IMPORT, extra="x")], "unknown fields")
    refused(422, [], "")
    r = client.post("/api/runs/2147483000/skipped", json=[_skip("a", "eval", "x")], headers=auth)
    assert r.status_code == 404
    # What was stored is still there.
    db.expire_all()
    assert (
        db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run_id)) == stored
    )


def test_nightly_runs_take_no_skips(client: TestClient, db: Session, auth: dict) -> None:
    from tests.api.conftest import add_night

    nightly = add_night(db, night(0), [_record("dcgan", "eval")])
    r = client.post(
        f"/api/runs/{nightly.id}/skipped", json=[_skip("dcgan", "eval", "x")], headers=auth
    )
    assert r.status_code == 409 and "is a nightly run" in r.json()["detail"]


def test_a_record_for_a_skipped_benchmark_is_still_stored(
    client: TestClient, db: Session, auth: dict
) -> None:
    """A shard re-run whose model imports after all: the record counts, the job ends done, in an
    open run and in one that has finished."""
    run_id = _create(client, auth)
    url = f"/api/runs/{run_id}/skipped"
    results = f"/api/runs/{run_id}/results"
    client.post(url, json=[_skip(SCHNET, "eval", NO_IMPORT)], headers=auth)
    r = client.post(results, json=[_record(SCHNET, "eval")], headers=auth)
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    assert _statuses(db, run_id)[f"{SCHNET}:eval:cpu"] == "done"
    assert (
        db.scalar(
            select(Job.error).where(Job.run_id == run_id, Job.mode == "eval", Job.model == SCHNET)
        )
        is None
    )
    # Skipping it now is refused: it holds its result.
    r = client.post(url, json=[_skip(SCHNET, "eval", NO_IMPORT)], headers=auth)
    assert r.status_code == 409

    client.post(url, json=[_skip(SCHNET, "train", NO_IMPORT)], headers=auth)
    client.post(results, json=[_record("dcgan", "eval"), _record("dcgan", "train")], headers=auth)
    finish_run(db, run=db.get(Run, run_id))
    db.flush()
    assert db.get(Run, run_id).status == "complete"
    r = client.post(results, json=[_record(SCHNET, "train")], headers=auth)
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    assert r.json()["status"] == "complete"
    assert set(_statuses(db, run_id).values()) == {"done"}
    # A benchmark that was never skipped is still refused by a finished run.
    assert (
        client.post(results, json=[_record(SCHNET, "train")], headers=auth).json()["already_stored"]
        == 1
    )


def test_a_skipped_benchmark_is_never_missing_data(
    client: TestClient, db: Session, auth: dict
) -> None:
    run_id = _create(client, auth)
    url = f"/api/runs/{run_id}/skipped"
    client.post(url, json=[_skip(SCHNET, "eval", NO_IMPORT)], headers=auth)
    client.post(f"/api/runs/{run_id}/results", json=[_record("dcgan", "eval")], headers=auth)
    db.get(Run, run_id).deadline_at = utcnow()
    db.flush()
    marked = mark_missing(db, run_id=run_id, now=utcnow() + timedelta(seconds=1))
    assert sorted(j.benchmark for j in marked) == ["dcgan:train:cpu", f"{SCHNET}:train:cpu"]
    (alert,) = db.scalars(select(Alert).where(Alert.run_id == run_id))
    assert alert.kind == "missing_data" and f"{SCHNET}:eval:cpu" not in alert.summary
    assert _statuses(db, run_id)[f"{SCHNET}:eval:cpu"] == "skipped"
    # A benchmark the deadline marked missing is not skipped afterwards: its alert stands.
    r = client.post(url, json=[_skip(SCHNET, "train", NO_IMPORT)], headers=auth)
    assert r.status_code == 409 and f"{SCHNET}:train:cpu missing" in r.json()["detail"]
    done = ingest.completeness(db, run_id=run_id)
    assert done.missing == ["dcgan:train:cpu", f"{SCHNET}:train:cpu"]  # in job order
    assert [s.benchmark for s in done.skipped] == [f"{SCHNET}:eval:cpu"]


def test_a_skipped_benchmark_is_no_failing_streak(
    client: TestClient, db: Session, auth: dict
) -> None:
    """Nights it was skipped on neither fail it nor end a streak: only done and error count."""
    bench = [{"model": SCHNET, "mode": "eval"}]

    def night_with(day: int, *, error: str | None = None, skip: bool = False) -> Run:
        body = {"night": night(day).isoformat(), "benchmarks": bench, "key": f"n{day}"}
        run_id = client.post("/api/runs", json=body, headers=auth).json()["id"]
        if skip:
            r = client.post(
                f"/api/runs/{run_id}/skipped",
                json=[_skip(SCHNET, "eval", NO_IMPORT)],
                headers=auth,
            )
        else:
            r = client.post(
                f"/api/runs/{run_id}/results",
                json=[_record(SCHNET, "eval", error=error)],
                headers=auth,
            )
        assert r.status_code == 200, r.text
        run = db.get(Run, run_id)
        finish_run(db, run=run)
        db.flush()
        return run

    night_with(0)
    for day in (1, 2, 3):
        last = night_with(day, skip=True)
    assert failing_benchmarks(db, today=night(3)) == []
    assert newly_failing(db, run=last) == []
    # Failing on the nights around the skipped ones is one streak of two nights.
    night_with(4, error="RuntimeError: boom")
    night_with(5, skip=True)
    fifth = night_with(6, error="RuntimeError: boom")
    (streak,) = failing_benchmarks(db, today=night(6))
    assert (streak.benchmark, streak.nights) == (f"{SCHNET}:eval:cpu", 2)
    assert [f.benchmark for f in newly_failing(db, run=fifth)] == [f"{SCHNET}:eval:cpu"]


def test_the_night_s_report_lists_skipped_benchmarks_with_their_reasons(
    client: TestClient, db: Session, auth: dict
) -> None:
    from service.config import Settings
    from service.runs.report import run_report

    run_id = _create(client, auth)
    client.post(
        f"/api/runs/{run_id}/skipped",
        json=[_skip(SCHNET, "train", NOT_OFFERED), _skip(SCHNET, "eval", NO_IMPORT)],
        headers=auth,
    )
    client.post(
        f"/api/runs/{run_id}/results",
        json=[_record("dcgan", "eval"), _record("dcgan", "train")],
        headers=auth,
    )
    report = run_report(db, run_id=run_id, settings=Settings(count_instructions=False))
    assert report["run"]["jobs"] == {
        "total": 4,
        "done": 2,
        "error": 0,
        "missing": 0,
        "skipped": 2,
    }
    assert report["skipped"] == [
        {"benchmark": f"{SCHNET}:eval:cpu", "reason": NO_IMPORT},
        {"benchmark": f"{SCHNET}:train:cpu", "reason": NOT_OFFERED},
    ]
    assert all(r["error"] is None for r in report["results"])
