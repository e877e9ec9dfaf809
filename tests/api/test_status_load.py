"""``GET /api/status`` under a burst holds at most one database connection at a time and none
across the workers' broadcast; an exhausted pool answers 503, not 500 (issue 40, finding 5).
Real Postgres, real Redis with a queue holding a message no worker listens to (so each status
asks the workers and waits the full 2 s for answers)."""

from __future__ import annotations

import os

import anyio
import httpx
import redis
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from service.config import get_settings
from service.db import normalise_url
from service.main import create_app

CALLERS = 40


def _small_pool_app(database_url: str, *, size: int, timeout_s: float):  # type: ignore[no-untyped-def]
    engine = create_engine(
        normalise_url(database_url), pool_size=size, max_overflow=0, pool_timeout=timeout_s
    )
    return engine, create_app(
        settings=get_settings(), session_factory=sessionmaker(bind=engine, expire_on_commit=False)
    )


def test_a_burst_of_status_calls_holds_one_connection_and_healthz_answers(
    database_url: str, broker_url: str
) -> None:
    prefix = os.environ["NIGHTBENCH_QUEUE_PREFIX"]
    redis.Redis.from_url(broker_url).lpush(f"{prefix}gpu.h100", b"{}")  # nobody consumes it
    # Two connections for the whole API: before, each status call held one through the
    # broadcast and the rest waited for the pool (a 500 once it timed out).
    engine, app = _small_pool_app(database_url, size=2, timeout_s=10)
    answers: list[int] = []
    problems: list[list[str]] = []
    health: list[int] = []

    async def status(client: httpx.AsyncClient) -> None:
        r = await client.get("/api/status")
        answers.append(r.status_code)
        if r.status_code == 200:
            problems.append(r.json()["problems"])

    async def healthz(client: httpx.AsyncClient) -> None:
        await anyio.sleep(0.5)  # while the burst waits on the broadcast
        for _ in range(3):
            health.append((await client.get("/healthz")).status_code)

    async def burst() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client,
            anyio.create_task_group() as tg,
        ):
            for _ in range(CALLERS):
                tg.start_soon(status, client)
            tg.start_soon(healthz, client)

    try:
        anyio.run(burst)
        checked_out = engine.pool.checkedout()
    finally:
        engine.dispose()
    assert answers == [200] * CALLERS
    assert health == [200] * 3
    assert checked_out == 0
    # One answer served them all, naming the queue nobody listens to.
    assert all(p == problems[0] for p in problems)
    assert any("`gpu.h100` holds 1 message(s)" in line for line in problems[0]), problems[0]


def test_an_exhausted_pool_answers_503_with_retry_after(database_url: str) -> None:
    engine, app = _small_pool_app(database_url, size=1, timeout_s=0.2)
    try:
        with engine.connect():  # the only connection, held

            async def get() -> httpx.Response:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                    return await c.get("/healthz")

            r = anyio.run(get)
    finally:
        engine.dispose()
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "2"
    assert "every database connection is busy" in r.json()["detail"]
