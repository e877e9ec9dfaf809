"""Every task's retry policy comes from one base class (``workers.tasks.RetriedTask``)."""

from __future__ import annotations

from workers import tasks
from workers.app import app


def test_every_task_retries_by_the_one_policy() -> None:
    ours = {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}
    assert len(ours) >= 14
    for name, task in ours.items():
        assert isinstance(task, tasks.RetriedTask), name
        assert task.autoretry_for == tasks.RETRYABLE, name
        assert hasattr(task, "_orig_run"), f"{name}: not wrapped for automatic retries"
        assert task.retry_backoff == 5 and task.retry_backoff_max == 120, name
        assert not task.retry_jitter, name
        assert task.max_retries in (3, 12), name
        assert task.acks_late is (name != "night.dispatch"), name
    # Where a task differs, it says so: periodic ones retry less, dispatch is acked early.
    assert {n for n, t in ours.items() if t.max_retries == 3} == {
        "night.sweep_deadlines",
        "issues.sync",
        "issues.retry_filing",
        "night.dispatch",
    }
