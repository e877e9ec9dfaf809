"""A run (one night, confirmation or probe on one build) and its benchmark jobs."""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Date, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.benchmarks import benchmark_name
from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin


class RunKind(StrEnum):
    """What a run is: a night, its confirmation re-run, a bisection's probe, posted results,
    or more processes of a night (``replicate``: a child run on the night's build, like a
    confirmation; asked for to compare it, which neither detection nor confirmation reads, or
    one of the night's own rounds of ``NIGHTBENCH_NIGHT_PROCESSES``, ``options["origin"] =
    "night"``, whose processes are part of the night's level), or one side of a pull request's
    A/B (``ab``: its results carry no series key, so no series reads them)."""

    NIGHTLY = "nightly"
    CONFIRM = "confirm"
    PROBE = "probe"
    INGEST = "ingest"
    REPLICATE = "replicate"
    AB = "ab"


class RunStatus(StrEnum):
    """Where a run stands (stored as its value)."""

    QUEUED = "queued"
    RUNNING = "running"
    DETECTING = "detecting"
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class JobStatus(StrEnum):
    """Where one benchmark of a run stands (stored as its value).

    ``skipped``: withdrawn by the runner of a posted run before it held a result (a model not
    available on that runner, a mode not offered on its device), the reason in ``Job.error``;
    it has ended, and is neither missing data nor a failure.
    """

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"
    MISSING = "missing"
    SKIPPED = "skipped"


RUN_KINDS = tuple(RunKind)
RUN_STATUSES = tuple(RunStatus)
RUN_OPEN = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DETECTING)
JOB_STATUSES = tuple(JobStatus)
JOB_ENDED = (JobStatus.DONE, JobStatus.ERROR, JobStatus.MISSING, JobStatus.SKIPPED)


class Run(TimestampMixin, Base):
    """A night's run (or its confirmation re-run, or posted results): its jobs and results."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    night: Mapped[date] = mapped_column(Date, index=True)
    kind: Mapped[str] = mapped_column(String(16), default=RunKind.NIGHTLY)
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    torch_spec: Mapped[str] = mapped_column(String(255), default="current")
    torch_version: Mapped[str | None] = mapped_column(String(64))
    torch_git_commit: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED, index=True)
    expected_jobs: Mapped[int] = mapped_column(Integer, default=0)
    previous_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    commit_range: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    options: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    # An ingest run's idempotency key: unique, so two requests racing with one key make one run.
    ingest_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set when the run's last job ended (it went ``detecting``) and cleared once ``night.finish``
    # has sent its next steps: a run it stays set on lost that message (the sweep re-sends it).
    finish_owed_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    note: Mapped[str | None] = mapped_column(Text)

    jobs: Mapped[list[Job]] = relationship(
        back_populates="run", cascade="all, delete-orphan", lazy="raise", order_by="Job.id"
    )


class Job(Base):
    """One benchmark of a run: the unit a worker task measures."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("run_id", "model", "mode", "device", "compiler"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))
    device: Mapped[str] = mapped_column(String(8))
    compiler: Mapped[str] = mapped_column(String(16), default="eager")
    batch_size: Mapped[int | None] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(64), default="cpu")
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    # Why it did not end ``done``: its error, the deadline it missed, or why it was skipped.
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Written by the worker measuring it every ``job_heartbeat_s``: a running job silent for
    # ``job_lost_after_s`` lost its worker and is requeued by the deadline sweep.
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    run: Mapped[Run] = relationship(back_populates="jobs", lazy="raise")

    @property
    def benchmark(self) -> str:
        """``model:mode:device`` plus ``:compiler`` when not eager."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)
