"""Engine, sessions and the declarative base.

Sync SQLAlchemy 2 with psycopg 3 on Postgres, or SQLite for the embedded default. The boundary
(route, task, CLI command) owns the transaction through :func:`session_scope`; service functions
only ``flush()``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData, create_engine, event
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator, TypeEngine

from service.config import get_settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on Postgres (indexable, compact), plain JSON elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class FloatList(TypeDecorator[list[float]]):
    """A JSON array of numbers (raw samples) read back as Python floats.

    JSONB prints numbers without an exponent, so a stored ``1e308`` comes back as a 309-digit
    integer, which numpy cannot average; a float list is what every reader expects. A number
    past the float range reads as infinity (analyses then treat it as any outlier).
    """

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """JSONB on Postgres, JSON elsewhere (as :data:`JSONType`)."""
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def process_result_value(self, value: Any, dialect: Dialect) -> list[float] | None:
        """The stored array as floats."""
        if value is None:
            return None
        return [_as_float(x) for x in value]


def _as_float(x: Any) -> float:
    try:
        return float(x)
    except OverflowError:
        return math.copysign(math.inf, x)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is timezone-aware UTC on the way in and on the way out.

    ``TIMESTAMP WITH TIME ZONE`` in SQL (the column type is unchanged); SQLite keeps no zone
    and gives naive values back, which this reads as UTC, so no caller repairs a naive value.
    A naive value written is taken as UTC; an aware one is converted to UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """``value`` as aware UTC (naive: taken as UTC)."""
        return as_utc(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """The stored timestamp as aware UTC."""
        return as_utc(value)


def as_utc(value: datetime | None) -> datetime | None:
    """``value`` as timezone-aware UTC; a naive value is taken as UTC; None stays None."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every table, with the constraint naming convention Alembic relies on."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def normalise_url(url: str) -> str:
    """Use psycopg 3 for ``postgresql://`` URLs (SQLAlchemy's default driver is psycopg2)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> Engine:
    """Create an engine; for SQLite, create the parent folder and enforce foreign keys."""
    url = normalise_url(url)
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, pool_pre_ping=True, future=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


@lru_cache(maxsize=4)
def get_engine(url: str | None = None) -> Engine:
    """The process's engine for ``url`` (default: the settings' database)."""
    return make_engine(url or get_settings().effective_database_url)


def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    """A session factory bound to the engine for ``url`` (default: the configured database)."""
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
