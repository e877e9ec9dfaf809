"""A pull request's A/B: its merge base and its head measured side by side, and the report.

One :class:`ABTest` row per A/B asked for (a PR label or command, ``nightbench ab``): what was
asked, where it stands, the judged rows (:class:`workers.ab.verdicts.ABRow` as JSON) and how
its report to the pull request went. The processes themselves are results of two runs of kind
``ab`` (``base_run_id``, ``head_run_id``), which no series reads: an A/B never enters the
nightly history.

Statuses: ``queued`` → ``running`` → ``done`` (judged) | ``failed`` (``error``: a build failed,
the PR could not be read, a fork was refused). Report states: ``none`` (no pull request, or no
GitHub configured) | ``pending`` → ``reported``, or ``failed_retrying`` → ``reported`` (GitHub
refused; retried with backoff, as an issue's filing is) | ``superseded`` (a newer A/B of the
same PR reported first: this one is stored, never posted over it).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, JSONType, UTCDateTime
from service.models.base import TimestampMixin


class ABStatus(StrEnum):
    """Where an A/B stands (stored as its value)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ReportState(StrEnum):
    """Where an A/B's report to its pull request stands (stored as its value)."""

    NONE = "none"
    PENDING = "pending"
    FAILED_RETRYING = "failed_retrying"
    REPORTED = "reported"
    SUPERSEDED = "superseded"


class ABTest(TimestampMixin, Base):
    """One A/B of two commits (a pull request's merge base and head, or any two).

    Attributes:
        status: an :class:`ABStatus` value.
        repository: ``owner/name`` of the pull request (None for a local A/B).
        pr_number: the pull request (None for a local A/B).
        requested_by: who asked (a GitHub login, or ``cli``).
        base_sha: the commit measured as base (the PR's merge base).
        head_sha: the commit measured as head (the PR's head when the A/B started).
        options: benchmarks, commands, metrics, processes, samples and the build provider spec.
        rows: the judged rows (``ABRow.as_dict``), flagged first.
        profiles: per flagged benchmark, the profile diff of base and head
            (:func:`service.profiles.diff_json`) under ``diff``, or why it failed under
            ``reason``.
        error: why the A/B failed (a build, the PR, a fork), in a few lines.
        base_run_id, head_run_id: the two runs of kind ``ab`` holding the processes.
        report_state: a :class:`ReportState` value.
        report_attempts: report attempts that failed.
        report_error: GitHub's last refusal.
        next_report_at: when the report is tried again (``failed_retrying``).
        comment_id, comment_url: the pull request comment (edited in place on re-runs).
        reported_head: the PR's head when the report was posted (differs from ``head_sha`` after
            a push during the run).
    """

    __tablename__ = "ab_tests"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default=ABStatus.QUEUED.value, index=True)
    repository: Mapped[str | None] = mapped_column(String(255))
    pr_number: Mapped[int | None] = mapped_column(Integer, index=True)
    requested_by: Mapped[str | None] = mapped_column(String(255))
    base_sha: Mapped[str] = mapped_column(String(64))
    head_sha: Mapped[str] = mapped_column(String(64))
    options: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    rows: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    profiles: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    base_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    head_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    report_state: Mapped[str] = mapped_column(String(24), default=ReportState.NONE.value)
    report_attempts: Mapped[int] = mapped_column(Integer, default=0)
    report_error: Mapped[str | None] = mapped_column(Text)
    next_report_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    comment_id: Mapped[int | None] = mapped_column(BigInteger)
    comment_url: Mapped[str | None] = mapped_column(String(512))
    reported_head: Mapped[str | None] = mapped_column(String(64))
