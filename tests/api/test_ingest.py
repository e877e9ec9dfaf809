"""Ingest for runners that post results: token, idempotency, validation, completion."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.auth import hash_token
from service.config import Settings
from service.main import create_app
from service.models import ApiToken, Result, Run
from service.models.base import utcnow
from service.results.service import store_record
from service.runs import ingest
from service.runs.service import BenchmarkSpec, create_run, finish_run, list_jobs, mark_missing
from tests.api.conftest import add_night, make_record, night

BENCHES = [{"model": "dcgan", "mode": "eval"}, {"model": "dcgan", "mode": "train"}]


def _record(mode: str, level: float = 3.0, **kw) -> dict:
    return make_record(
        "dcgan",
        mode,
        {"latency": [level, level * 1.01, level * 0.99], "cpu_peak_mem": [2.0**28]},
        **kw,
    )


def _create(client: TestClient, auth: dict, **extra) -> dict:
    body = {
        "night": "2026-03-01",
        "benchmarks": BENCHES,
        "torch_version": "2.13.0.dev20260301",
        "torch_git_commit": "f" * 40,
        **extra,
    }
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
    r = client.post(
        "/api/runs",
        headers=auth,
        json={"night": "2026-03-02", "benchmarks": BENCHES, "key": "ci-run-77"},
    )
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
    kept = db.scalar(
        select(Result.median).where(Result.run_id == run["id"], Result.metric == "latency")
    )
    assert kept == 3.0
    r = client.post(
        url, json=[_record("train", error="CUDA error: illegal memory access")], headers=auth
    )
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
    r = client.post(
        url,
        content=b'[{"model": "dcgan", "mode": "eval", "device": "cpu", '
        b'"metrics": [{"metric": "latency", "unit": "ms", "samples": [NaN]}]}]',
        headers={**auth, "Content-Type": "application/json"},
    )
    assert r.status_code == 422
    assert client.post(url, json=[], headers=auth).status_code == 422
    assert (
        client.post(
            "/api/runs/2147483000/results", json=[_record("eval")], headers=auth
        ).status_code
        == 404
    )
    r = client.post(
        "/api/runs",
        headers=auth,
        json={"night": "2026-03-01", "benchmarks": [BENCHES[0], BENCHES[0]]},
    )
    assert r.status_code == 422 and "listed twice: dcgan:eval:cpu" in r.json()["detail"]
    # Nothing was stored by the refused requests.
    assert (
        db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run["id"])) == 0
    )


def test_nightly_runs_take_no_posted_results(client: TestClient, db: Session, auth: dict) -> None:
    nightly = add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0]})])
    r = client.post(f"/api/runs/{nightly.id}/results", json=[_record("eval")], headers=auth)
    assert r.status_code == 409 and "is a nightly run" in r.json()["detail"]


def test_an_incomplete_ingest_run_takes_only_its_missing_benchmarks_late(
    client: TestClient, db: Session, auth: dict
) -> None:
    r = client.post(
        "/api/runs",
        headers=auth,
        json={"night": "2026-03-01", "benchmarks": BENCHES, "key": "late"},
    )
    run_id = r.json()["id"]
    url = f"/api/runs/{run_id}/results"
    client.post(url, json=[_record("eval")], headers=auth)
    # The train benchmark never reports; past the deadline the run closes without it.
    db.get(Run, run_id).deadline_at = utcnow()
    db.flush()
    assert [
        j.benchmark for j in mark_missing(db, run_id=run_id, now=utcnow() + timedelta(seconds=1))
    ] == ["dcgan:train:cpu"]
    finish_run(db, run=db.get(Run, run_id))
    db.flush()
    # Its shard's post comes late: stored for its series, the run stays incomplete.
    r = client.post(url, json=[_record("train")], headers=auth)
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    assert r.json()["status"] == "incomplete"
    db.expire_all()
    assert {j.benchmark: j.status for j in list_jobs(db, run_id=run_id)} == {
        "dcgan:eval:cpu": "done",
        "dcgan:train:cpu": "done",
    }
    # A repeat of what it holds is still answered as stored, never stored twice.
    for mode in ("eval", "train"):
        again = client.post(url, json=[_record(mode, level=50.0)], headers=auth).json()
        assert (again["stored"], again["already_stored"]) == (0, 1)


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
    written = ingest.store_records(
        db, run=bulk, job_ids={k: j.id for k, j in jobs_bulk.items()}, records=records
    )
    db.expire_all()

    def rows(run_id: int) -> list[tuple]:
        return [
            (
                r.model,
                r.mode,
                r.metric,
                r.unit,
                r.samples,
                r.sample_count,
                r.median,
                r.iqr,
                r.series_key,
                r.machine_id,
                r.environment,
                r.batch_size,
                r.benchmark_version,
                r.error,
                r.night,
            )
            for r in db.scalars(
                select(Result).where(Result.run_id == run_id).order_by(Result.mode, Result.metric)
            )
        ]

    assert written == 3
    assert rows(bulk.id) == rows(one.id)
    assert db.get(type(bulk), bulk.id).torch_version == "2.13.0.dev20260301"


def test_ingest_takes_signed_growth_and_refuses_what_it_cannot_store_by_name(
    client: TestClient, db: Session, auth: dict
) -> None:
    run = _create(client, auth)
    url = f"/api/runs/{run['id']}/results"

    def refused(record: dict, *names: str) -> None:
        r = client.post(url, json=[record], headers=auth)
        assert r.status_code == 422, r.text
        for name in names:
            assert name in r.json()["detail"], r.json()["detail"]

    for field, value, names in (
        ("error", "Segmentation fault\x00 in aten", ("error", "U+0000")),
        ("environment", {"hostname": "gpu-07\x00"}, ("environment.hostname", "control")),
        ("environment", {"torch_version": {"major": 2}}, ("environment.torch_version", "object")),
        ("environment", {"threads": "four"}, ("environment.threads", "string")),
    ):
        record = _record("eval")
        record[field] = {**record[field], **value} if isinstance(value, dict) else value
        refused(record, *names)
    shrank = _record("eval")
    shrank["metrics"].append({"metric": "cpu_peak_mem_total", "unit": "bytes", "samples": [-1.0]})
    refused(shrank, "cpu_peak_mem_total", ">= 0")
    assert (
        db.scalar(select(func.count()).select_from(Result).where(Result.run_id == run["id"])) == 0
    )

    # Memory growth is negative when the process's RSS shrank: stored as the suite wrote it.
    grew_less = _record("eval")
    grew_less["metrics"].append({"metric": "mem_growth", "unit": "bytes", "samples": [-4096.0]})
    r = client.post(url, json=[grew_less], headers=auth)
    assert r.status_code == 200, r.text
    stored = db.scalar(
        select(Result.samples).where(Result.run_id == run["id"], Result.metric == "mem_growth")
    )
    assert stored == [-4096.0]


def test_malformed_json_is_a_bad_request(client: TestClient, auth: dict) -> None:
    r = client.post(
        "/api/runs",
        content=b'{"night": "2026-03-01", "benchmarks": [',
        headers={**auth, "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["detail"].startswith("request body: malformed JSON")


def test_a_body_over_the_limit_is_refused_before_any_token_or_parse(
    db: Session, auth: dict
) -> None:
    conn = db.connection()
    app = create_app(
        settings=Settings(api_max_request_bytes=4096),
        session_factory=lambda: Session(
            bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
        ),
    )
    big = b'{"night": "2026-03-01", "note": "' + b"x" * 100_000 + b'"}'
    with TestClient(app, raise_server_exceptions=False) as c:
        # No token at all: the size answers first, the body is never parsed.
        r = c.post("/api/runs", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "4096 bytes" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        # Without a token it is refused unread (401, tests/api/test_token_first.py).
        r = c.post(
            "/api/runs", content=chunks(), headers={**auth, "Content-Type": "application/json"}
        )
        assert r.status_code == 413
        # Under the limit the request goes on to the token check as before.
        r = c.post("/api/runs", json={"night": "2026-03-01", "benchmarks": BENCHES})
        assert r.status_code == 401


def test_a_key_reused_for_another_request_is_a_conflict_and_runs_have_a_deadline(
    client: TestClient, db: Session, auth: dict
) -> None:
    run = _create(client, auth, key="ci-run-9")
    stored = db.get(Run, run["id"])
    assert stored.deadline_at is not None  # swept like a night if results never come
    assert timedelta(hours=5) < stored.deadline_at - utcnow() <= timedelta(hours=6)
    assert _create(client, auth, key="ci-run-9")["id"] == run["id"]  # the same request: fine
    for change, says in (
        ({"benchmarks": BENCHES[:1]}, "with other benchmarks"),
        ({"torch_version": "2.14.0"}, "with torch_version '2.13.0.dev20260301'"),
    ):
        body = {
            "night": "2026-03-01",
            "benchmarks": BENCHES,
            "torch_version": "2.13.0.dev20260301",
            "torch_git_commit": "f" * 40,
            "key": "ci-run-9",
            **change,
        }
        r = client.post("/api/runs", json=body, headers=auth)
        assert r.status_code == 409 and says in r.json()["detail"], r.text
    assert db.scalar(select(func.count()).select_from(Run).where(Run.kind == "ingest")) == 1
