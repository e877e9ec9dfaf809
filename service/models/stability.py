"""Stability verdicts: which benchmarks are too noisy on a machine to alert on.

Written by ``nightbench suite stability`` (K processes per benchmark, TorchBench's 7% spread
rule; see ``suite/stability.py``). One row per benchmark and machine, replaced by each new
measurement. The detector does not alert on a benchmark whose latest row says ``unstable``, but
still shows it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin, utcnow


class BenchmarkStability(TimestampMixin, Base):
    """A benchmark's measured stability on a machine: its spread, CV and verdict."""

    __tablename__ = "benchmark_stability"
    __table_args__ = (UniqueConstraint("model", "mode", "device", "compiler", "machine_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))
    device: Mapped[str] = mapped_column(String(8))
    compiler: Mapped[str] = mapped_column(String(16), default="eager")
    machine_id: Mapped[int] = mapped_column(
        ForeignKey("machines.id", ondelete="CASCADE"), index=True
    )
    benchmark_version: Mapped[str | None] = mapped_column(String(64))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    repeats: Mapped[int] = mapped_column(Integer)
    medians_ms: Mapped[list[float]] = mapped_column(JSONType, default=list)
    cv: Mapped[float | None] = mapped_column(Float)
    spread: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    unstable: Mapped[bool | None] = mapped_column(Boolean)
    errors: Mapped[list[str]] = mapped_column(JSONType, default=list)
    details: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
