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


def test_migrations_run_on_the_embedded_sqlite_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `make nightly` starts from an empty SQLite file: every revision must apply there (SQLite
    # cannot ALTER constraints, so such revisions use batch mode), and go down and up again.
    from alembic import command

    from service.migrate import alembic_config, upgrade

    url = f"sqlite:///{tmp_path / 'nightbench.db'}"
    upgrade(url)
    command.downgrade(alembic_config(url), "0002")
    upgrade(url)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("regressions")}
            keys = inspect(conn).get_foreign_keys("regressions")
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert {"first_result_id", "first_night"} <= columns
    assert any(
        k["constrained_columns"] == ["first_result_id"] and k["referred_table"] == "results"
        for k in keys
    )
    assert set(Base.metadata.tables) <= tables
