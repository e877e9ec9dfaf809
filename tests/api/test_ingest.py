"""Ingest for runners that post results: token, idempotency, validation, completion."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.auth import hash_token
from service.models import ApiToken, Result, Run
from service.models.base import utcnow
from service.results.service import store_record
from service.runs import ingest
from service.runs.service import BenchmarkSpec, create_run, finish_run, list_jobs, mark_missing
from tests.api.conftest import add_night, make_record, night

BENCHES = [{"model": "dcgan", "mode": "eval"}, {"model": "dcgan", "mode": "train"}]


def _record(mode: str, level: float = 3.0, **kw) -> dict:
    return make_record("dcgan", mode, {"latency": [level, level * 1.01, level * 0.99],
                                       "cpu_peak_mem": [2.0**28]}, **kw)


def _create(client: TestClient, auth: dict, **extra) -> dict:
    body = {"night": "2026-03-01", "benchmarks": BENCHES, "torch_version": "2.13.0.dev20260301",
            "torch_git_commit": "f" * 40, **extra}
    r = client.post("/api/runs", json=body, headers=auth)
    assert r.status_code in (200, 201), r.text
    return {**r.json(), "http": r.status_code}


def test_writes_need_a_valid_token(client: TestClient, db: Session, token: str) -> None:
    body = {"night": "2026-03-01", "benchmarks": BENCHES}
    r = client.post("/api/runs", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in r.json()["detail"]
    r = client.post("/api/runs", json=body, headers={"Authorization": "Bearer nb_wrong"})
    assert r.status_code == 401 and r.json()["detail"].startswith("the API token is not valid")
    # Stored hashed: the row holds the digest, never the token.
    row = db.scalar(select(ApiToken).where(ApiToken.name == "test-runner"))
    assert row.token_hash == hash_token(token) and token not in row.token_hash
    assert row.last_used_at is None
    r = client.post("/api/runs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201
    db.expire_all()
    assert db.get(ApiToken, row.id).last_used_at is not None


def test_ingest_round_trip_is_idempotent(client: TestClient, db: Session, auth: dict) -> None:
    run = _create(client, auth, key="ci-run-77")
    assert run["http"] == 201 and run["kind"] == "ingest" and run["status"] == "running"
    assert run["completeness"]["pending"] == ["dcgan:eval:cpu", "dcgan:train:cpu"]
    again = _create(client, auth, key="ci-run-77")
    assert again["http"] == 200 and again["id"] == run["id"]
    r = client.post("/api/runs", headers=auth, json={"night": "2026-03-02", "benchmarks": BENCHES,
                                                     "key": "ci-run-77"})
    assert r.status_code == 409 and f"already names run {run['id']}" in r.json()["detail"]

    url = f"/api/runs/{run['id']}/results"
    r = client.post(url, json=[_record("eval")], headers=auth)
    assert r.status_code == 200, r.text
    assert (r.json()["stored"], r.json()["already_stored"], r.json()["results"]) == (1, 0, 2)
    assert r.json()["status"] == "running"
    # A retried request stores nothing twice.
    r = client.post(url, json=[_record("eval", level=99.0)], headers=auth)
    assert (r.json()["stored"], r.json()["already_stored"]) == (0, 1)
    count = db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run["id"]))
    assert count == 2
    kept = db.scalar(select(Result.median).where(Result.run_id == run["id"],
                                                 Result.metric == "latency"))
    assert kept == 3.0
    r = client.post(url, json=[_record("train", error="CUDA error: illegal memory access")],
                    headers=auth)
    body = r.json()
    assert body["status"] == "detecting" and body["completeness"]["complete"]
    detail = client.get(f"/api/runs/{run['id']}").json()
    assert detail["torch_version"] == "2.13.0.dev20260301"
    assert detail["errors"][0]["error"] == "CUDA error: illegal memory access"
    # Finished: a repeat is still fine, a new benchmark is not accepted.
    assert client.post(url, json=[_record("eval")], headers=auth).json()["already_stored"] == 1


def test_ingest_rejects_what_it_cannot_store(client: TestClient, db: Session, auth: dict) -> None:
    run = _create(client, auth)
    url = f"/api/runs/{run['id']}/results"
    r = client.post(url, json=[make_record("vit", "eval", {"latency": [1.0]})], headers=auth)
    assert r.status_code == 422
    assert r.json()["detail"].startswith(f"run {run['id']} does not expect vit:eval:cpu")
    bad = _record("eval")
    bad["metrics"][0]["samples"] = []
    r = client.post(url, json=[bad], headers=auth)
    assert r.status_code == 422 and "samples" in r.json()["detail"]
    bad["metrics"][0]["samples"] = [1.0, -2.0]
    assert client.post(url, json=[bad], headers=auth).status_code == 422
    r = client.post(url, content=b'[{"model": "dcgan", "mode": "eval", "device": "cpu", '
                    b'"metrics": [{"metric": "latency", "unit": "ms", "samples": [NaN]}]}]',
                    headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 422
    assert client.post(url, json=[], headers=auth).status_code == 422
    assert client.post("/api/runs/2147483000/results", json=[_record("eval")],
                       headers=auth).status_code == 404
    r = client.post("/api/runs", headers=auth, json={"night": "2026-03-01", "benchmarks": [
        BENCHES[0], BENCHES[0]]})
    assert r.status_code == 422 and "listed twice: dcgan:eval:cpu" in r.json()["detail"]
    # Nothing was stored by the refused requests.
    assert db.scalar(select(func.count()).select_from(Result).where(
        Result.run_id == run["id"])) == 0


def test_nightly_runs_take_no_posted_results(client: TestClient, db: Session, auth: dict) -> None:
    nightly = add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0]})])
    r = client.post(f"/api/runs/{nightly.id}/results", json=[_record("eval")], headers=auth)
    assert r.status_code == 409 and "is a nightly run" in r.json()["detail"]


def test_finished_ingest_run_refuses_new_benchmarks(client: TestClient, db: Session,
                                                    auth: dict) -> None:
    r = client.post("/api/runs", headers=auth, json={
        "night": "2026-03-01", "benchmarks": BENCHES, "key": "late"})
    run_id = r.json()["id"]
    url = f"/api/runs/{run_id}/results"
    client.post(url, json=[_record("eval")], headers=auth)
    # The train benchmark never reports; past the deadline the run closes without it.
    db.get(Run, run_id).deadline_at = utcnow()
    db.flush()
    assert [j.benchmark for j in mark_missing(db, run_id=run_id,
                                              now=utcnow() + timedelta(seconds=1))] == [
        "dcgan:train:cpu"]
    finish_run(db, run=db.get(Run, run_id))
    db.flush()
    r = client.post(url, json=[_record("train")], headers=auth)
    assert r.status_code == 409
    assert r.json()["detail"] == (f"run {run_id} is incomplete; it takes no new results "
                                  "(dcgan:train:cpu was never reported)")
    # A repeat of what it holds is still answered as stored.
    assert client.post(url, json=[_record("eval")], headers=auth).json()["already_stored"] == 1


def test_bulk_store_writes_the_rows_store_record_writes(db: Session) -> None:
    """The ingest path stores in bulk; its rows must be those of ``store_record``."""
    records = [_record("eval"), _record("train", error="Killed (out of memory)")]
    records[0]["environment"]["torch_version"] = "2.13.0.dev20260301"
    specs = [BenchmarkSpec(model="dcgan", mode="eval"), BenchmarkSpec(model="dcgan", mode="train")]
    one = create_run(db, night=night(3), benchmarks=specs, kind="ingest")
    jobs_one = {j.benchmark: j for j in list_jobs(db, run_id=one.id)}
    for r in records:
        store_record(db, run=one, job=jobs_one[f"dcgan:{r['mode']}:cpu"], record=r)
    bulk = create_run(db, night=night(3), benchmarks=specs, kind="ingest")
    jobs_bulk = {(j.model, j.mode, j.device, j.compiler): j for j in list_jobs(db, run_id=bulk.id)}
    written = ingest.store_records(db, run=bulk, job_ids={k: j.id for k, j in jobs_bulk.items()},
                                   records=records)
    db.expire_all()

    def rows(run_id: int) -> list[tuple]:
        return [(r.model, r.mode, r.metric, r.unit, r.samples, r.sample_count, r.median, r.iqr,
                 r.series_key, r.machine_id, r.environment, r.batch_size, r.benchmark_version,
                 r.error, r.night)
                for r in db.scalars(select(Result).where(Result.run_id == run_id)
                                    .order_by(Result.mode, Result.metric))]

    assert written == 3
    assert rows(bulk.id) == rows(one.id)
    assert db.get(type(bulk), bulk.id).torch_version == "2.13.0.dev20260301"
