"""Issues filed for alerts, and the regressions each one speaks for.

One row per issue in a tracker (GitHub or the local outbox). The fingerprint is the one written
as a hidden marker in the issue body; filing looks here first, then in the tracker, so the same
culprit (or commit range) gets one issue and a comment on each recurrence. Sync-back keeps
``state`` and ``labels`` as last seen and moves the linked regressions' triage state.
"""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import Date, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin, utcnow

TRACKERS = ("github", "outbox")
ISSUE_STATES = ("open", "closed")


class IssueRecord(TimestampMixin, Base):
    """An issue filed in a tracker.

    ``location`` names the tracker's place: ``owner/name@api-url`` on GitHub, the folder for the
    outbox; ``(tracker, location, number)`` identifies the issue.
    """

    __tablename__ = "issue_records"
    __table_args__ = (UniqueConstraint("tracker", "location", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    tracker: Mapped[str] = mapped_column(String(16))
    location: Mapped[str] = mapped_column(String(512))
    number: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)
    title: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="open", index=True)
    state_reason: Mapped[str | None] = mapped_column(String(32))
    labels: Mapped[list[str]] = mapped_column(JSONType, default=list)
    alert_id: Mapped[int | None] = mapped_column(
        ForeignKey("alerts.id", ondelete="SET NULL"), index=True
    )
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    first_night: Mapped[date] = mapped_column(Date)
    last_night: Mapped[date] = mapped_column(Date)
    remote_updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class IssueRegression(TimestampMixin, Base):
    """A regression reported in an issue (when it was filed, or in a recurrence comment)."""

    __tablename__ = "issue_regressions"
    __table_args__ = (UniqueConstraint("issue_id", "regression_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    issue_id: Mapped[int] = mapped_column(
        ForeignKey("issue_records.id", ondelete="CASCADE"), index=True
    )
    regression_id: Mapped[int] = mapped_column(
        ForeignKey("regressions.id", ondelete="CASCADE"), index=True
    )
