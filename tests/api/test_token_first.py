"""A write's token is checked before its body is read, and a body of many unknown keys costs
one error (issue 40, finding 7)."""

from __future__ import annotations

import json
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.testclient import TestClient


def _post(app: FastAPI, path: str, chunks: list[bytes], headers: dict[str, str]) -> dict:
    """POST ``chunks`` straight to the ASGI app; what it answered and how many chunks it read."""
    read = 0
    sent: list[Any] = []

    async def receive() -> dict:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {
                "type": "http.request",
                "body": chunks[read - 1],
                "more_body": read < len(chunks),
            }
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": start["status"], "detail": json.loads(body)["detail"], "read": read}


def test_a_write_without_a_valid_token_is_refused_before_its_body_is_read(
    app: FastAPI, client: TestClient, auth: dict
) -> None:
    # 8 MiB of records, under the 32 MiB limit, in 1 MiB chunks.
    chunks = [b"[" + b" " * 2**20] + [b" " * 2**20] * 6 + [b"]"]
    for headers, says in (
        ({}, "needs an API token"),
        ({"authorization": "Bearer nb_wrong"}, "not valid"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "needs an API token"),
    ):
        for path in (
            "/api/runs",
            "/api/runs/1/results",
            "/api/runs/1/skipped",
            "/api/runs/1/processes",
        ):
            answer = _post(app, path, chunks, {"content-type": "application/json", **headers})
            assert answer["status"] == 401 and says in answer["detail"], answer
            assert answer["read"] == 0  # not one chunk of the body was read
    # With a valid token the body is read and judged as before.
    answer = _post(
        app,
        "/api/runs",
        [b'{"night": "2026-03-01", "benchmarks": []}'],
        {"content-type": "application/json", **{k.lower(): v for k, v in auth.items()}},
    )
    assert answer["status"] == 422 and answer["read"] == 1
    # Routes without a token are untouched.
    assert client.get("/healthz").status_code == 200


def test_a_body_of_many_unknown_keys_is_one_error(client: TestClient, auth: dict) -> None:
    body = {"night": "2026-03-01", "benchmarks": [{"model": "dcgan", "mode": "eval"}]}
    body.update({f"k{i}": 0 for i in range(200_000)})
    r = client.post("/api/runs", json=body, headers=auth)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "unknown fields 'k0', 'k1', 'k2', 'k3', 'k4' and 199995 more" in detail, detail
    assert len(detail) < 500
    r = client.post(
        "/api/runs",
        json={**body, "k0": None, "benchmarks": [{"model": "dcgan", "mode": "eval", "x": 1}]},
        headers=auth,
    )
    assert r.status_code == 422


def test_a_run_body_far_over_what_a_run_needs_is_refused_unread(
    client: TestClient, auth: dict
) -> None:
    body = b'{"night": "2026-03-01", "note": "' + b"x" * (5 * 2**20) + b'"}'
    r = client.post("/api/runs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == "request body over 4194304 bytes (the most this route needs)"
