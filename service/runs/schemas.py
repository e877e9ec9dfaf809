"""Wire shapes of the runs endpoints: listing, detail, comparison and ingest."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api import NAME_PATTERN, IsoDate

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Sample = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class RunSummaryRead(BaseModel):
    id: int
    night: date
    kind: str
    status: str
    torch_spec: str
    torch_version: str | None
    torch_git_commit: str | None
    expected_jobs: int
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    url: str


class RunsPage(BaseModel):
    items: list[RunSummaryRead]
    next_cursor: int | None = Field(description="pass as cursor for the next page; null at the end")


class CompletenessRead(BaseModel):
    """How far the run got: job counts by status."""

    total: int
    queued: int
    running: int
    done: int
    error: int
    missing: int
    ended_fraction: float = Field(description="jobs ended / total (0..1)")
    complete: bool = Field(description="every job ended and none went missing")
    pending: list[str] = Field(description="benchmarks not reported yet")
    missing_benchmarks: list[str]


class ResultRead(BaseModel):
    id: int
    benchmark: str
    model: str
    mode: str
    device: str
    compiler: str
    metric: str
    unit: str
    median: float | None
    iqr: float | None
    samples: int
    series_key: str | None
    machine_id: int | None
    error: str | None


class RunErrorRead(BaseModel):
    benchmark: str
    source: Literal["result", "job"]
    status: str
    error: str


class AlertRef(BaseModel):
    id: int
    kind: str
    status: str
    url: str


class RunRead(RunSummaryRead):
    note: str | None
    completeness: CompletenessRead
    results: list[ResultRead]
    errors: list[RunErrorRead]
    alerts: list[AlertRef]


class ComparisonRead(BaseModel):
    """One benchmark metric in both runs; ratio = b / a of the medians."""

    benchmark: str
    metric: str
    unit: str
    a_median: float
    b_median: float
    ratio: float | None = Field(description="b median / a median; null when a median is 0")
    a_samples: int
    b_samples: int
    p_value: float = Field(description="two-sided Mann-Whitney U on the raw samples")
    significant: bool = Field(description="p_value < alpha")
    verdict: Literal["regression", "improvement", "unchanged", "not significant"]


class CompareRead(BaseModel):
    a: RunSummaryRead
    b: RunSummaryRead
    alpha: float
    comparisons: list[ComparisonRead]
    only_in_a: list[str]
    only_in_b: list[str]
    errors: list[str] = Field(description="benchmark metrics that failed in either run")


class BenchmarkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Name
    mode: Literal["train", "eval"]
    device: Literal["cpu", "cuda"] = "cpu"
    compiler: Literal["eager", "inductor"] = "eager"
    batch_size: int | None = Field(default=None, ge=1, le=2**31 - 1)


class RunCreate(BaseModel):
    """A run whose results a runner will post (``kind`` = ``ingest``)."""

    model_config = ConfigDict(extra="forbid")

    night: IsoDate
    benchmarks: list[BenchmarkIn] = Field(
        min_length=1, max_length=20000, json_schema_extra={"uniqueItems": True},
        description="what the runner will measure, each benchmark once")
    torch_spec: str = Field(default="ingest", min_length=1, max_length=255, pattern=NAME_PATTERN)
    torch_version: str | None = Field(default=None, min_length=1, max_length=64,
                                      pattern=NAME_PATTERN)
    torch_git_commit: str | None = Field(default=None, min_length=7, max_length=64,
                                         pattern=r"^[0-9a-f]+$")
    key: str | None = Field(default=None, min_length=1, max_length=128, pattern=NAME_PATTERN,
                            description="idempotency key: posting the same key again returns "
                                        "the run it created")
    note: str | None = Field(default=None, max_length=2000)


class MetricIn(BaseModel):
    metric: Name
    unit: str = Field(min_length=1, max_length=16, pattern=NAME_PATTERN)
    samples: list[Sample] = Field(min_length=1, max_length=100000)
    median: Sample | None = None
    iqr: Sample | None = None


class RecordIn(BaseModel):
    """One benchmark record as ``python -m suite run --out FILE`` writes it."""

    model: Name
    mode: Literal["train", "eval"]
    device: Literal["cpu", "cuda"]
    compiler: Literal["eager", "inductor"] = "eager"
    batch_size: int | None = Field(default=None, ge=1, le=2**31 - 1)
    benchmark_version: str | None = Field(default=None, max_length=64, pattern=NAME_PATTERN)
    environment: dict[str, Any] = Field(default_factory=dict)
    metrics: list[MetricIn] = Field(default_factory=list, max_length=64)
    leak: dict[str, Any] | None = None
    error: str | None = Field(default=None, max_length=20000)


class IngestRead(BaseModel):
    run_id: int
    stored: int = Field(description="records stored by this request")
    already_stored: int = Field(description="records the run already had (left as they were)")
    results: int = Field(description="result rows of the records in this request")
    status: str
    completeness: CompletenessRead
