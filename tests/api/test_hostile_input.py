"""Hand-made hostile requests against the real app and Postgres: each answers 4xx naming the
field it refuses (never a 500), and a model whose history holds an extreme value stored before
ingest refused such values still answers (issue 40, finding 6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Result, Run
from tests.api.conftest import add_night, latency_series, make_record, night

BENCHES = [{"model": "dcgan", "mode": "eval"}]
SURROGATE = "\\ud800"  # a lone surrogate as JSON spells it: valid JSON, not storable text


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def _record(**changes: Any) -> dict[str, Any]:
    record = make_record("dcgan", "eval", {"latency": [3.0, 3.1, 2.9]})
    record.update(changes)
    return record


def _body(records: list[dict[str, Any]], raw: dict[str, str] | None = None) -> bytes:
    """The records as JSON; ``raw`` splices JSON text verbatim in place of placeholder strings."""
    text = json.dumps(records)
    for placeholder, spliced in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), spliced)
    return text.encode()


@pytest.fixture
def run_url(client: TestClient, auth: dict) -> str:
    r = client.post("/api/runs", json={"night": "2026-03-01", "benchmarks": BENCHES}, headers=auth)
    assert r.status_code == 201, r.text
    return f"/api/runs/{r.json()['id']}/results"


def _metric(name: str = "latency", samples: list[float] | None = None) -> dict[str, Any]:
    return {"metric": name, "unit": "ms", "samples": samples or [3.0, 3.1]}


RECORD_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    (
        "surrogate in error",
        _body([_record(error="@E@")], {"@E@": f'"boom {SURROGATE}"'}),
        ("error", "surrogate"),
    ),
    (
        "surrogate in an environment value",
        _body([_record(environment={"hostname": "@H@"})], {"@H@": f'"gpu-{SURROGATE}"'}),
        ("environment.hostname", "surrogate"),
    ),
    (
        "surrogate in an environment key",
        _body([_record(environment={"@K@": 1})], {"@K@": f'"k{SURROGATE}"'}),
        ("environment", "surrogate"),
    ),
    (
        "surrogate in leak",
        _body([_record(leak={"note": "@L@"})], {"@L@": f'"{SURROGATE}"'}),
        ("leak.note", "surrogate"),
    ),
    (
        "environment nested 300 deep",
        _body([_record(environment={"x": "@D@"})], {"@D@": _deep(300)}),
        ("environment", "nested"),
    ),
    (
        "leak nested 300 deep",
        _body([_record(leak={"x": "@D@"})], {"@D@": _deep(300)}),
        ("leak", "nested"),
    ),
    (
        "environment nested 100000 deep",
        _body([_record(environment={"x": "@D@"})], {"@D@": _deep(100_000)}),
        (),
    ),
    (
        "an integer of 2**64 in environment",
        _body([_record(environment={"seed": "@I@"})], {"@I@": str(2**64)}),
        ("environment.seed", "integer"),
    ),
    (
        "an integer of -2**63 - 1 in leak",
        _body([_record(leak={"bytes": "@I@"})], {"@I@": str(-(2**63) - 1)}),
        ("leak.bytes", "integer"),
    ),
    (
        "an integer of 10**400 in environment",
        _body([_record(environment={"seed": "@I@"})], {"@I@": "1" + "0" * 400}),
        ("environment.seed",),
    ),
    (
        "an integer of 5000 digits in environment",
        _body([_record(environment={"seed": "@I@"})], {"@I@": "9" * 5000}),
        (),
    ),
    (
        "a metric name of 33 characters",
        _body([_record(metrics=[_metric("m" * 33)])]),
        ("metric", "32"),
    ),
    (
        "a metric name of 128 characters",
        _body([_record(metrics=[_metric("m" * 128)])]),
        ("metric", "32"),
    ),
    (
        "the same metric twice in one record",
        _body([_record(metrics=[_metric(), _metric()])]),
        ("metrics", "latency", "twice"),
    ),
    (
        "samples of 1e308",
        _body([_record(metrics=[_metric(samples=[1e308, 1e308])])]),
        ("samples.0", "less than or equal to 1000000000000000"),
    ),
    (
        "a median of 1e300",
        _body([_record(metrics=[{**_metric(), "median": 1e300}])]),
        ("median",),
    ),
    (
        "samples of 1e400 (infinite once parsed)",
        _body([_record(metrics=[_metric(samples=[1.0])])]).replace(b"[1.0]", b"[1e400]"),
        ("samples",),
    ),
    (
        "an iqr of -1e308",
        _body([_record(metrics=[{**_metric(), "iqr": -1e308}])]),
        ("iqr",),
    ),
]


@pytest.mark.parametrize(("case", "body", "names"), RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_a_hostile_record_is_refused_naming_its_field(
    client: TestClient, db: Session, auth: dict, run_url: str, case: str, body: bytes, names: tuple
) -> None:
    r = client.post(run_url, content=body, headers={**auth, "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    detail = r.json()["detail"]
    for name in names:
        assert name in detail, (case, detail)
    assert db.scalar(select(func.count()).select_from(Result)) == 0
    # The run still takes the good record afterwards.
    r = client.post(run_url, json=[_record()], headers=auth)
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text


RUN_CASES: list[tuple[str, bytes, tuple[str, ...]]] = [
    (
        "surrogate in note",
        _body(
            [{"night": "2026-03-02", "benchmarks": BENCHES, "note": "@N@"}],
            {"@N@": f'"night {SURROGATE}"'},
        )[1:-1],
        ("note", "surrogate"),
    ),
    (
        "surrogate in key",
        _body(
            [{"night": "2026-03-02", "benchmarks": BENCHES, "key": "@N@"}],
            {"@N@": f'"k{SURROGATE}"'},
        )[1:-1],
        ("key",),
    ),
    (
        "surrogate in a model name",
        _body(
            [{"night": "2026-03-02", "benchmarks": [{"model": "@M@", "mode": "eval"}]}],
            {"@M@": f'"m{SURROGATE}"'},
        )[1:-1],
        ("model",),
    ),
    (
        "a batch size of 2**64",
        _body(
            [{"night": "2026-03-02", "benchmarks": [{**BENCHES[0], "batch_size": "@I@"}]}],
            {"@I@": str(2**64)},
        )[1:-1],
        ("batch_size",),
    ),
]


@pytest.mark.parametrize(("case", "body", "names"), RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_hostile_run_is_refused_naming_its_field(
    client: TestClient, db: Session, auth: dict, case: str, body: bytes, names: tuple
) -> None:
    before = db.scalar(select(func.count()).select_from(Run))
    r = client.post("/api/runs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    detail = r.json()["detail"]
    for name in names:
        assert name in detail, (case, detail)
    assert db.scalar(select(func.count()).select_from(Run)) == before


@pytest.mark.parametrize(
    "path",
    [
        "/api/models/%ED%A0%80/history",
        "/api/models/dcgan/history?metric=%ED%A0%80",
        "/api/models/dcgan/history?since=2026-02-30",
        "/api/models/dcgan/history?machine=18446744073709551616",
        "/api/models/" + "m" * 129 + "/history",
        "/api/runs/18446744073709551616",
        "/api/runs?cursor=-1",
        "/models/%ED%A0%80",
    ],
)
def test_hostile_reads_answer_4xx(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text)


def test_a_history_holding_an_extreme_value_stored_earlier_still_answers(
    client: TestClient, db: Session
) -> None:
    # Stored the way workers store (no API check): a value from before ingest refused them.
    for i, samples in enumerate(latency_series(8)):
        record = make_record("dcgan", "eval", {"latency": samples})
        if i == 5:  # as a runner posted it: no median or IQR of its own
            record["metrics"][0].update(samples=[1e308, 1e308], median=None, iqr=None)
        add_night(db, night(i), [record])
    for path in (
        "/api/models/dcgan/history",
        "/api/models/dcgan/history?format=csv",
        "/api/models/dcgan/history.svg",
        "/models/dcgan",
    ):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
    points = client.get("/api/models/dcgan/history").json()["series"][0]["points"]
    assert len(points["night"]) == 8 and points["median"][5] is None  # infinite: no level
