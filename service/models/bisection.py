"""Bisections of a commit range and their probes: the search's state, kept in the database.

A :class:`Bisection` holds what the pure search (``workers/bisect/search.py``) starts from: the
commit range in first-parent order, the benchmarks, the search settings and the build provider.
Each :class:`Probe` is one commit measured in one round, with its samples once measured. The
search's state is a pure function of these rows (replay the rounds in order), so a bisection
survives a worker restart: any worker can read the rows and plan the next round.

Probe statuses: ``queued`` → ``running`` → ``done`` (measured) | ``skipped`` (did not build).
A probe whose worker died stays ``running`` until its task is redelivered and runs it again.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin, utcnow


class BisectionStatus(StrEnum):
    """Where a bisection stands (stored as its value)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class BisectionOutcome(StrEnum):
    """What a finished bisection found (stored as its value)."""

    CULPRIT = "culprit"
    CULPRITS = "culprits"
    INCONCLUSIVE = "inconclusive"
    NOT_REPRODUCED = "not_reproduced"


class ProbeStatus(StrEnum):
    """Where one probe (a build measured for the bisection) stands (stored as its value)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"


BISECTION_STATUSES = tuple(BisectionStatus)
BISECTION_OUTCOMES = tuple(BisectionOutcome)
PROBE_STATUSES = tuple(ProbeStatus)
PROBE_ENDED = (ProbeStatus.DONE, ProbeStatus.SKIPPED)


class Bisection(TimestampMixin, Base):
    """One bisection of a commit range for a set of regressed benchmarks.

    Attributes:
        run_id: the night whose confirmed regressions are bisected (None for a manual one).
        alert_id: the alert the regressions belong to.
        status: ``running`` | ``done`` | ``failed``.
        good, bad: the range's endpoints (full shas).
        commits: ``[good, ..., bad]`` in first-parent order, ``CommitInfo.as_json()`` dicts.
        benchmarks: the benchmarks searched (``model:mode:device``).
        regression_ids: the regressions the bisection is for.
        config: the search settings (``SearchConfig`` fields).
        provider: the build provider and its options (``{"kind": "checkout", ...}``).
        queue: the Celery queue the probes go to.
        outcome: ``culprit`` | ``culprits`` | ``inconclusive`` | ``not_reproduced`` when done.
        result: the outcome's JSON (culprits, per-benchmark answers, skipped commits).
        builds: distinct commits built, endpoints included.
        rounds: rounds of probes.
        error: why the bisection failed (an error outside the search itself).
    """

    __tablename__ = "bisections"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default=BisectionStatus.RUNNING, index=True)
    repo: Mapped[str | None] = mapped_column(Text)
    good: Mapped[str] = mapped_column(String(64))
    bad: Mapped[str] = mapped_column(String(64))
    commits: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    benchmarks: Mapped[list[str]] = mapped_column(JSONType, default=list)
    regression_ids: Mapped[list[int]] = mapped_column(JSONType, default=list)
    config: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    provider: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    queue: Mapped[str] = mapped_column(String(64), default="cpu")
    outcome: Mapped[str | None] = mapped_column(String(16))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    builds: Mapped[int | None] = mapped_column(Integer)
    rounds: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    probes: Mapped[list[Probe]] = relationship(
        back_populates="bisection",
        cascade="all, delete-orphan",
        lazy="raise",
        order_by="(Probe.round, Probe.index)",
    )


class Probe(TimestampMixin, Base):
    """One commit measured in one round of a bisection.

    Attributes:
        round: the round (0 = endpoints).
        sha, index: the commit and its position in the range (0 = good endpoint).
        purpose: ``endpoint`` | ``search`` | ``refine`` | ``verify``.
        benchmarks: what to measure there; ``samples_wanted``: new samples of each.
        status: ``queued`` | ``running`` | ``done`` | ``skipped``.
        attempts: how many times a task started it (above 1: redelivered).
        worker: the worker that last ran it.
        build_seconds: the build's wall time (s).
        samples: ``{benchmark: [ms, ...]}`` measured.
        errors: ``{benchmark: reason}`` for benchmarks that failed to measure.
        reason: why the commit was skipped (did not build).
    """

    __tablename__ = "probes"
    __table_args__ = (UniqueConstraint("bisection_id", "round", "sha"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    bisection_id: Mapped[int] = mapped_column(
        ForeignKey("bisections.id", ondelete="CASCADE"), index=True
    )
    round: Mapped[int] = mapped_column(Integer)
    sha: Mapped[str] = mapped_column(String(64))
    index: Mapped[int] = mapped_column(Integer)
    purpose: Mapped[str] = mapped_column(String(16))
    benchmarks: Mapped[list[str]] = mapped_column(JSONType, default=list)
    samples_wanted: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=ProbeStatus.QUEUED, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    build_seconds: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[dict[str, list[float]] | None] = mapped_column(JSONType)
    errors: Mapped[dict[str, str] | None] = mapped_column(JSONType)
    reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    bisection: Mapped[Bisection] = relationship(back_populates="probes", lazy="raise")


class ProfileStatus(StrEnum):
    """How a profile probe of one benchmark ended (stored as its value)."""

    DONE = "done"
    FAILED = "failed"


class BisectionProfile(TimestampMixin, Base):
    """The profile probe of one benchmark of a finished bisection: what changed between two
    builds, row by row (``workers/bisect/profile_probe.py``; docs/profile.md).

    Attributes:
        bisection_id: the bisection whose builds were profiled.
        benchmark: ``model:mode:device``.
        metric: the metric profiled (``latency``: operators and Python functions;
            ``cpu_instructions``: functions under callgrind).
        before: the sha of the first build (the culprit's parent, or the range's good end).
        after: the sha of the second build (the culprit, or the range's bad end).
        culprit: True when ``after`` is the named culprit, False for a range's endpoints.
        status: ``done`` (``diff`` holds the diff) | ``failed`` (``reason`` says why).
        reason: why the probe failed, in one line.
        diff: :func:`service.profiles.diff_json` of the two builds' profiles.
        trace_before: the first build's Chrome trace, gzip-compressed JSON (operator tables).
        trace_after: the second build's, the same.
    """

    __tablename__ = "bisection_profiles"
    __table_args__ = (UniqueConstraint("bisection_id", "benchmark"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    bisection_id: Mapped[int] = mapped_column(
        ForeignKey("bisections.id", ondelete="CASCADE"), index=True
    )
    benchmark: Mapped[str] = mapped_column(String(256))
    metric: Mapped[str] = mapped_column(String(64))
    before: Mapped[str] = mapped_column(String(64))
    after: Mapped[str] = mapped_column(String(64))
    culprit: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    diff: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    trace_before: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    trace_after: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
