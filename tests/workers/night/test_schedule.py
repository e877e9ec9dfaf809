"""Beat dispatches a night without GitHub when a crontab is configured."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date

import pytest
from celery import Celery
from sqlalchemy import select

from service.config import Settings
from service.db import session_scope
from service.models import Job, Run
from workers.app import configure
from workers.night import plan as nightly


def test_crontab_entry_only_when_configured() -> None:
    plain = configure(Celery("t1"), Settings())
    assert "dispatch-night" not in plain.conf.beat_schedule
    scheduled = configure(Celery("t2"), Settings(schedule_cron="30 11 * * *"))
    entry = scheduled.conf.beat_schedule["dispatch-night"]
    assert entry["task"] == "night.dispatch"
    assert entry["schedule"].hour == {11} and entry["schedule"].minute == {30}
    with pytest.raises(ValueError, match="5 fields"):
        configure(Celery("t3"), Settings(schedule_cron="30 11 *"))


def test_scheduled_dispatch_runs_the_configured_night(configure: Callable[..., None]) -> None:
    configure(schedule_models='["dqn"]', schedule_modes='["eval"]')
    run_ids = nightly.dispatch_scheduled(night=date(2026, 11, 9))
    assert len(run_ids) == 1
    with session_scope() as session:
        run = session.get(Run, run_ids[0])
        assert run is not None and run.status == "complete"  # embedded: measured in-process
        jobs = list(session.scalars(select(Job).where(Job.run_id == run.id)))
        assert [(j.benchmark, j.status) for j in jobs] == [("dqn:eval:cpu", "done")]


def test_a_worker_runs_the_periodic_tasks_where_no_beat_is_deployed(
    celery_workers,
    tmp_path,
    configure: Callable[..., None],  # type: ignore[no-untyped-def]
) -> None:
    configure(data_dir=tmp_path / "data")
    celery_workers.start("cpu", log_dir=tmp_path, name="solo", extra=["--beat"])
    log = (tmp_path / "solo.log").read_text()
    deadline = time.monotonic() + 30
    while "beat: Starting" not in log and time.monotonic() < deadline:
        time.sleep(0.5)
        log = (tmp_path / "solo.log").read_text()
    assert "beat: Starting" in log, log[-2000:]
    # Its schedule is kept in the data directory, not the working directory.
    assert any(p.name.startswith("beat-schedule") for p in (tmp_path / "data").iterdir())
