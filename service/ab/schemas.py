"""The A/B's API shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class ABRowRead(BaseModel):
    """One benchmark metric judged, base against head (values in ``unit``)."""

    benchmark: str
    metric: str
    unit: str
    base: float | None = Field(description="median of the base's per-process values")
    head: float | None = Field(description="median of the head's per-process values")
    ratio: float | None = Field(description="head / base (1.10: 10% more)")
    low: float | None = Field(description="the ratio's 95% interval, lower bound")
    high: float | None = Field(description="the ratio's 95% interval, upper bound")
    p_value: float | None = Field(description="two-sided Mann-Whitney U over the processes")
    verdict: str = Field(
        description="regression | improvement | unchanged | not significant | not enough "
        "processes | fails on head | fails on base | fails on both"
    )
    threshold: float
    base_replicates: int
    head_replicates: int
    error: str | None = None
    flagged: bool = Field(description="fails the check: a regression, or broken by the head")


class ProcessRead(BaseModel):
    """One benchmark metric on one side: its replicates."""

    side: str = Field(description="base | head")
    benchmark: str
    metric: str
    values: list[float] = Field(
        description="per process the median of its iterations (or its peak); per counted "
        "step the instructions"
    )
    error: str | None


class ABRead(BaseModel):
    """An A/B: what was asked, where it stands, its rows, and how its report went."""

    id: int
    status: str = Field(description="queued | running | done | failed")
    repository: str | None
    pr_number: int | None
    requested_by: str | None
    base_sha: str
    head_sha: str
    options: dict[str, Any]
    error: str | None
    flagged: int = Field(description="rows that fail the check")
    rows: list[ABRowRead]
    profiles: dict[str, Any] = Field(
        description="per profiled benchmark: the profile diff of base and head, or the reason"
    )
    base_run_id: int | None
    head_run_id: int | None
    processes: list[ProcessRead]
    report_state: str = Field(
        description="none | pending | failed_retrying | reported | superseded"
    )
    report_error: str | None
    report_attempts: int
    next_report_at: datetime | None
    comment_url: str | None
    reported_head: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


class ABSummary(BaseModel):
    """One A/B in a list."""

    id: int
    status: str
    pr_number: int | None
    base_sha: str
    head_sha: str
    flagged: int
    report_state: str
    created_at: datetime | None
