"""``UTCDateTime``: what the models store comes back timezone-aware UTC, on SQLite as on
Postgres (the column type in SQL is unchanged: ``TIMESTAMP WITH TIME ZONE``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from service.db import UTCDateTime
from service.models import Run


def test_sqlite_gives_back_aware_utc_for_naive_and_other_zones() -> None:
    table = Table(
        "t", MetaData(), Column("id", Integer, primary_key=True), Column("at", UTCDateTime())
    )
    engine = create_engine("sqlite://")
    table.metadata.create_all(engine)
    paris = timezone(timedelta(hours=1))
    with engine.begin() as db:
        db.execute(insert(table), [{"id": 1, "at": datetime(2026, 11, 20, 6, 0)}])
        db.execute(insert(table), [{"id": 2, "at": datetime(2026, 11, 20, 7, 0, tzinfo=paris)}])
        back = dict(db.execute(select(table.c.id, table.c.at)).all())
    assert back == {1: datetime(2026, 11, 20, 6, 0, tzinfo=UTC), 2: back[1]}
    assert all(v.tzinfo is UTC for v in back.values())


def test_the_models_column_type_is_still_timestamp_with_time_zone(session: Session) -> None:
    column = Run.__table__.c.deadline_at
    assert column.type.compile(dialect=postgresql.dialect()) == "TIMESTAMP WITH TIME ZONE"
    run = Run(night=datetime(2026, 11, 20).date(), deadline_at=datetime(2026, 11, 20, 6, 0))
    session.add(run)
    session.flush()
    session.expire(run)
    assert run.deadline_at == datetime(2026, 11, 20, 6, 0, tzinfo=UTC)
