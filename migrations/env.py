"""Alembic environment: the URL comes from nightbench's settings unless the caller set one."""

from __future__ import annotations

from alembic import context

import service.models  # noqa: F401  (registers every table on Base.metadata)
from service.config import get_settings
from service.db import Base, make_engine, normalise_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return normalise_url(
        config.get_main_option("sqlalchemy.url") or get_settings().effective_database_url
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            context.configure(
                connection=conn,
                target_metadata=target_metadata,
                render_as_batch=True,
                compare_type=True,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()  # one-shot: leave no pooled connections behind


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
