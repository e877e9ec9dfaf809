"""Beat dispatches a night without GitHub when a crontab is configured."""

from __future__ import annotations

from datetime import date

import pytest
from celery import Celery
from sqlalchemy import select

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Job, Run
from workers import nightly
from workers.app import configure


def test_crontab_entry_only_when_configured() -> None:
    plain = configure(Celery("t1"), Settings())
    assert "dispatch-night" not in plain.conf.beat_schedule
    scheduled = configure(Celery("t2"), Settings(schedule_cron="30 11 * * *"))
    entry = scheduled.conf.beat_schedule["dispatch-night"]
    assert entry["task"] == "night.dispatch"
    assert entry["schedule"].hour == {11} and entry["schedule"].minute == {30}
    with pytest.raises(ValueError, match="5 fields"):
        configure(Celery("t3"), Settings(schedule_cron="30 11 *"))


def test_scheduled_dispatch_runs_the_configured_night(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTBENCH_SCHEDULE_MODELS", '["dqn"]')
    monkeypatch.setenv("NIGHTBENCH_SCHEDULE_MODES", '["eval"]')
    get_settings.cache_clear()
    run_ids = nightly.dispatch_scheduled(night=date(2026, 11, 9))
    assert len(run_ids) == 1
    with session_scope() as session:
        run = session.get(Run, run_ids[0])
        assert run is not None and run.status == "complete"  # embedded: measured in-process
        jobs = list(session.scalars(select(Job).where(Job.run_id == run.id)))
        assert [(j.benchmark, j.status) for j in jobs] == [("dqn:eval:cpu", "done")]
