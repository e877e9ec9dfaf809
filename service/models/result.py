"""A result: all samples of one metric of one benchmark in one run."""

from __future__ import annotations

from datetime import date
from typing import Any

from sqlalchemy import (
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.benchmarks import benchmark_name
from service.db import Base, FloatList, JSONType
from service.models.base import TimestampMixin


def _count_samples(context: Any) -> int:
    return len(context.get_current_parameters().get("samples") or [])


class Result(TimestampMixin, Base):
    """One metric of one benchmark measured in one run: raw samples, median and IQR, its series."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("run_id", "model", "mode", "device", "compiler", "metric"),
        Index("ix_results_series_key_night", "series_key", "night"),
        # A model's history (GET /api/models/{model}/history) is one index-only scan: rows come
        # in series order with every column the history reads or filters on; no heap access.
        Index(
            "ix_results_history",
            "model",
            "series_key",
            "night",
            "run_id",
            postgresql_include=[
                "id",
                "median",
                "iqr",
                "sample_count",
                "error",
                "mode",
                "device",
                "compiler",
                "metric",
                "machine_id",
            ],
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # No index of its own: the unique constraint's index leads with run_id and serves lookups
    # by run (and the cascade from runs); one index fewer to maintain on every insert.
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    machine_id: Mapped[int | None] = mapped_column(ForeignKey("machines.id", ondelete="SET NULL"))
    night: Mapped[date] = mapped_column(Date)
    model: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))
    device: Mapped[str] = mapped_column(String(8))
    compiler: Mapped[str] = mapped_column(String(16), default="eager")
    batch_size: Mapped[int | None] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(32))
    unit: Mapped[str] = mapped_column(String(16))
    samples: Mapped[list[float]] = mapped_column(FloatList, default=list)
    # Kept beside the samples so the history index covers it (the JSON stays in the heap).
    sample_count: Mapped[int | None] = mapped_column(Integer, default=_count_samples)
    median: Mapped[float | None] = mapped_column(Float)
    iqr: Mapped[float | None] = mapped_column(Float)
    environment: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    benchmark_version: Mapped[str | None] = mapped_column(String(64))
    series_key: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)

    @property
    def benchmark(self) -> str:
        """The benchmark's name, ``model:mode:device[:compiler]``."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)


class SeriesMonth(Base):
    """A series' points of one calendar month, packed: what a history request reads.

    One row per (model, series, month) holding the results of nightly and ingest runs that
    ``ix_results_history`` would return for that month, in (night, run_id) order, as
    ``nights`` records of :data:`POINT_BYTES` bytes each, big-endian: result id (int8), run id
    (int8), night (int4, days since 2000-01-01), median (float8, NaN for none), IQR (float8,
    NaN for none), sample count (int4, 0 for none); see :data:`POINT_FIELDS`.

    Postgres keeps it: triggers on ``results`` (insert, update, delete, truncate) and on a run's
    ``kind`` rebuild every month they touch from the results themselves (migration 0002), so no
    write path can leave it behind. Monthly rows keep a rebuild small (one month of one series)
    and a model's full history a few hundred rows. Other databases (SQLite) leave it empty; the
    history is then read row by row.
    """

    __tablename__ = "series_months"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    series_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    month: Mapped[date] = mapped_column(Date, primary_key=True)  # first day of the month
    mode: Mapped[str] = mapped_column(String(8))
    device: Mapped[str] = mapped_column(String(8))
    compiler: Mapped[str] = mapped_column(String(16))
    metric: Mapped[str] = mapped_column(String(32))
    machine_id: Mapped[int | None] = mapped_column(Integer)
    nights: Mapped[int] = mapped_column(Integer)  # records in points
    points: Mapped[bytes] = mapped_column(LargeBinary)


# Layout of a SeriesMonth.points record (numpy structured dtype, big-endian as Postgres sends).
POINT_FIELDS = (
    ("result_id", ">i8"),
    ("run_id", ">i8"),
    ("night", ">i4"),
    ("median", ">f8"),
    ("iqr", ">f8"),
    ("samples", ">i4"),
)
POINT_BYTES = 40
