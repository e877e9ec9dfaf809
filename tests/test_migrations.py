"""The migrations and the models agree: ``alembic upgrade head`` yields the declared schema."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

import service.models  # noqa: F401
from service.db import Base, normalise_url


def test_upgrade_head_matches_models(pg_main: str) -> None:
    engine = create_engine(normalise_url(pg_main))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"
    assert set(Base.metadata.tables) <= tables
