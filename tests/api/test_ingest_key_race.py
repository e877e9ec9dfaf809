"""Two requests racing with one ingest key make one run (issue 40, finding 8): the second waits
at the unique index for the first to commit, then answers with its run. Real Postgres, two
connections, the race forced by holding the first transaction open."""

from __future__ import annotations

import threading
import time
from datetime import date

import psycopg
import pytest
from sqlalchemy import func, select

from service.db import get_sessionmaker, normalise_url, session_scope
from service.errors import Conflict
from service.models import Run
from service.runs.ingest import create_ingest_run
from service.runs.service import BenchmarkSpec

SPECS = [BenchmarkSpec(model="dcgan", mode="eval", queue="ingest")]


def _create(session, key: str, torch_version: str = "2.13.0"):  # type: ignore[no-untyped-def]
    return create_ingest_run(
        session,
        night=date(2026, 3, 1),
        benchmarks=SPECS,
        torch_spec="ingest",
        torch_version=torch_version,
        torch_git_commit=None,
        key=key,
    )


def _waiting_on_a_lock(url: str) -> int:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


@pytest.mark.parametrize("second_asks", ["the same", "another build"])
def test_a_key_raced_by_two_requests_makes_one_run(database_url: str, second_asks: str) -> None:
    url = normalise_url(database_url)
    first = get_sessionmaker()()
    run, created = _create(first, "raced-key")  # made, not committed yet
    assert created
    answer: dict = {}

    def second() -> None:
        try:
            with session_scope() as session:
                other, made = _create(
                    session, "raced-key", "2.13.0" if second_asks == "the same" else "2.14.0"
                )
                answer.update(id=other.id, created=made)
        except Conflict as exc:
            answer.update(conflict=exc.message)

    thread = threading.Thread(target=second)
    thread.start()
    deadline = time.monotonic() + 30
    while not _waiting_on_a_lock(url):  # the second request waits at the unique index
        assert time.monotonic() < deadline and thread.is_alive(), answer
        time.sleep(0.05)
    first.commit()
    first.close()
    thread.join(timeout=30)
    if second_asks == "the same":
        assert answer == {"id": run.id, "created": False}
    else:
        assert "already names run" in answer["conflict"] and "2.14.0" in answer["conflict"]
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1
