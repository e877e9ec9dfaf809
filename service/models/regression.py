"""Regressions and improvements found in a run, and the alert that groups them for triage."""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum

from sqlalchemy import (
    Boolean,
    Date,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.benchmarks import benchmark_name
from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin, utcnow

TRIAGE_STATES = (
    "untriaged",
    "confirmed",
    "invalid",
    "expected",
    "fixed",
    "reverted",
    "improvement",
)


class Confirmation(StrEnum):
    """What a regression's confirmation re-run said (stored as its value)."""

    PENDING = "pending"
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not_reproduced"
    NOT_POSSIBLE = "not_possible"


CONFIRMATIONS = tuple(Confirmation)


class AlertKind(StrEnum):
    """What an alert is about (stored as its value); each kind is one row of the filing table
    (``workers/issues/kinds.py``): its report, its Markdown, its fingerprint."""

    REGRESSION = "regression"
    MISSING_DATA = "missing_data"
    FAILING = "failing"


ALERT_KINDS = tuple(AlertKind)


class AlertStatus(StrEnum):
    """Where an alert stands for triage (stored as its value): ``filed`` once its issue is."""

    OPEN = "open"
    FILED = "filed"


class FilingState(StrEnum):
    """Where filing an alert's issue stands (stored as its value; NULL: nothing to file yet).

    ``pending`` → ``filed``, or ``failed_retrying`` (the last attempt failed; the issue waits
    in the outbox and the retry files it) → ``filed``.
    """

    PENDING = "pending"
    FAILED_RETRYING = "failed_retrying"
    FILED = "filed"


FILING_UNFILED = (FilingState.PENDING, FilingState.FAILED_RETRYING)


class Alert(TimestampMixin, Base):
    """The regressions of one run grouped for triage, or a missing-data notice."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("run_id", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16), default=AlertKind.REGRESSION)
    status: Mapped[str] = mapped_column(String(16), default=AlertStatus.OPEN)
    summary: Mapped[str] = mapped_column(Text, default="")
    # Filing its issue, a state of its own: a failed filing is retried until it is filed.
    filing_state: Mapped[str | None] = mapped_column(String(16), index=True)
    filing_attempts: Mapped[int] = mapped_column(Integer, default=0)
    filing_error: Mapped[str | None] = mapped_column(Text)
    filing_pending_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    filing_next_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    filed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Missing data: benchmarks whose data came later (told once each on the issue).
    arrived: Mapped[list[str] | None] = mapped_column(JSONType)

    regressions: Mapped[list[Regression]] = relationship(
        back_populates="alert", lazy="raise", order_by="Regression.id"
    )


class Regression(TimestampMixin, Base):
    """A change of one series in one run beyond its threshold: a regression or an improvement."""

    __tablename__ = "regressions"
    __table_args__ = (UniqueConstraint("run_id", "series_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    alert_id: Mapped[int | None] = mapped_column(
        ForeignKey("alerts.id", ondelete="SET NULL"), index=True
    )
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    # The series' result on the step's first night at the new level (the night whose build
    # brought it: the commit range ends there); tonight's unless the step persisted from
    # earlier nights before it was raised. None for rows stored before it was recorded.
    first_result_id: Mapped[int | None] = mapped_column(
        ForeignKey("results.id", ondelete="SET NULL")
    )
    first_night: Mapped[date | None] = mapped_column(Date)
    series_key: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))
    device: Mapped[str] = mapped_column(String(8))
    compiler: Mapped[str] = mapped_column(String(16), default="eager")
    metric: Mapped[str] = mapped_column(String(32))
    unit: Mapped[str] = mapped_column(String(16))
    direction: Mapped[str] = mapped_column(String(16))
    baseline: Mapped[float] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)
    change: Mapped[float] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    alertable: Mapped[bool] = mapped_column(Boolean, default=True)
    confirmation: Mapped[str] = mapped_column(String(16), default=Confirmation.PENDING)
    state: Mapped[str] = mapped_column(String(16), default="untriaged", index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    # The night the series was found back at its level from before this regression (the step
    # did not persist, or a later improvement undid it), why, and when its issue was told.
    back_night: Mapped[date | None] = mapped_column(Date)
    back_reason: Mapped[str | None] = mapped_column(Text)
    back_told_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    alert: Mapped[Alert | None] = relationship(back_populates="regressions", lazy="raise")

    @property
    def benchmark(self) -> str:
        """The benchmark's name, ``model:mode:device[:compiler]``."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)
