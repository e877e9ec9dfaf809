"""Every task that cannot reach Postgres or Redis retries for at least 15 minutes before it is
dropped (issue 40, finding 2: five jittered retries gave up within 37 s of Postgres going down)."""

from __future__ import annotations

import pytest
from celery.utils.time import get_exponential_backoff_interval
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

import workers.tasks  # noqa: F401 - registers the tasks
from workers.app import app

OUTAGE_S = 15 * 60
# Periodic tasks retry less: beat sends them again (tests/workers/test_task_policy.py).
PERIODIC = {"night.sweep_deadlines", "issues.sync", "issues.retry_filing", "night.dispatch"}
TASKS = sorted(n for n in app.tasks if not n.startswith("celery.") and n not in PERIODIC)


def test_every_task_is_covered() -> None:
    assert {"bench.run", "night.finish", "night.triage", "night.file"} <= set(TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_a_task_retries_through_a_store_or_broker_outage(name: str) -> None:
    task = app.tasks[name]
    for error in (OperationalError, PoolTimeout, BrokerError):
        assert issubclass(error, tuple(task.autoretry_for)), (name, error)
    assert not task.retry_jitter, name  # a jittered countdown may be 0: no bound on the sum
    waits = [
        get_exponential_backoff_interval(
            factor=int(task.retry_backoff),
            retries=n,
            maximum=task.retry_backoff_max,
            full_jitter=False,
        )
        for n in range(task.max_retries)
    ]
    assert sum(waits) >= OUTAGE_S, (name, waits)
