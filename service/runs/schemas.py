"""Wire shapes of the runs endpoints: listing, detail, comparison and ingest."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from service.api import NAME_PATTERN, IsoDate

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Sample = Annotated[float, Field(ge=0, allow_inf_nan=False)]
SignedSample = Annotated[float, Field(allow_inf_nan=False)]

# Metrics that may be negative: a process's memory growth is negative when its RSS shrinks.
# Latency and peak memory stay >= 0.
SIGNED_METRICS = frozenset({"mem_growth"})
# What the stored environment's own columns are made of; other keys are free-form JSON.
ENVIRONMENT_STRINGS = (
    "torch_version",
    "torch_git_version",
    "device_class",
    "cpu_model",
    "gpu_name",
    "driver",
    "hostname",
    "platform",
    "cuda",
    "python",
)
ENVIRONMENT_INTEGERS = ("cpu_count", "threads")
_CONTROL = {chr(c) for c in range(0x20)} - {"\t", "\n", "\r"}


def _no_control_characters(value: str) -> str:
    bad = sorted({f"U+{ord(c):04X}" for c in value if c in _CONTROL})
    if bad:
        raise ValueError(f"contains control characters ({', '.join(bad)}), which cannot be stored")
    return value


Text = Annotated[str, AfterValidator(_no_control_characters)]


def _control_characters_in(value: Any, where: str) -> str | None:
    """The path of the first string inside ``value`` (JSON) holding a control character."""
    if isinstance(value, str):
        return where if any(c in _CONTROL for c in value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _control_characters_in(key, where) or _control_characters_in(
                item, f"{where}.{key}"
            )
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _control_characters_in(item, f"{where}[{i}]")
            if found:
                return found
    return None


class RunSummaryRead(BaseModel):
    """A run in a listing: night, kind, status and the build it measured."""

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
    """One page of runs, newest first; ``next_cursor`` fetches the next."""

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
    """One benchmark's result in a run, with its metrics."""

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
    """A benchmark that failed in a run: from its result or from its job."""

    benchmark: str
    source: Literal["result", "job"]
    status: str
    error: str


class AlertRef(BaseModel):
    """An alert a run raised, by reference."""

    id: int
    kind: str
    status: str
    url: str


class RunRead(RunSummaryRead):
    """A run with its completeness, results, errors and alerts."""

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
    a_median: float = Field(description="median of run a's per-process medians (ms or bytes)")
    b_median: float = Field(description="median of run b's per-process medians (ms or bytes)")
    ratio: float | None = Field(
        description="b median / a median; null when a median is 0, and for mem_growth (a signed "
        "growth in bytes, compared by its difference)"
    )
    difference: float = Field(description="b median - a median, in the metric's unit")
    a_processes: int = Field(description="processes that measured it in run a (with its re-runs)")
    b_processes: int = Field(description="processes that measured it in run b (with its re-runs)")
    a_samples: int = Field(description="iterations over run a's processes")
    b_samples: int = Field(description="iterations over run b's processes")
    p_value: float | None = Field(
        description=(
            "two-sided Mann-Whitney U on the per-process medians; null when too few processes"
        )
    )
    significant: bool = Field(description="p_value < alpha")
    verdict: Literal[
        "regression", "improvement", "unchanged", "not significant", "not enough processes"
    ]


class CompareRead(BaseModel):
    """Two runs compared benchmark by benchmark."""

    a: RunSummaryRead
    b: RunSummaryRead
    alpha: float
    comparisons: list[ComparisonRead]
    only_in_a: list[str]
    only_in_b: list[str]
    errors: list[str] = Field(description="benchmark metrics that failed in either run")


class BenchmarkIn(BaseModel):
    """One benchmark of a run being created: model, mode, device, compiler."""

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
        min_length=1,
        max_length=20000,
        json_schema_extra={"uniqueItems": True},
        description="what the runner will measure, each benchmark once",
    )
    torch_spec: str = Field(default="ingest", min_length=1, max_length=255, pattern=NAME_PATTERN)
    torch_version: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=NAME_PATTERN
    )
    torch_git_commit: str | None = Field(
        default=None, min_length=7, max_length=64, pattern=r"^[0-9a-f]+$"
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=NAME_PATTERN,
        description="idempotency key: posting the same key again returns the run it created",
    )
    note: Text | None = Field(default=None, max_length=2000)


class MetricIn(BaseModel):
    """One metric of an ingested record: its unit and raw samples (>= 0 but for the signed
    metrics, ``SIGNED_METRICS``)."""

    metric: Name
    unit: str = Field(min_length=1, max_length=16, pattern=NAME_PATTERN)
    samples: list[SignedSample] = Field(min_length=1, max_length=100000)
    median: SignedSample | None = None
    iqr: Sample | None = None

    @model_validator(mode="after")
    def _signed_only_where_it_can_be(self) -> MetricIn:
        if self.metric not in SIGNED_METRICS:
            negative = [x for x in (*self.samples, self.median) if x is not None and x < 0]
            if negative:
                raise ValueError(
                    f"{self.metric}: samples must be >= 0 (got {negative[0]}); "
                    f"only {', '.join(sorted(SIGNED_METRICS))} may be negative"
                )
        return self


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
    error: Text | None = Field(default=None, max_length=20000)

    @model_validator(mode="after")
    def _environment_is_storable(self) -> RecordIn:
        env = self.environment
        for key in ENVIRONMENT_STRINGS:
            if env.get(key) is not None and not isinstance(env[key], str):
                raise ValueError(f"environment.{key}: must be a string, got {_json_type(env[key])}")
        for key in ENVIRONMENT_INTEGERS:
            value = env.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"environment.{key}: must be an integer, got {_json_type(value)}")
        found = _control_characters_in(env, "environment") or _control_characters_in(
            self.leak, "leak"
        )
        if found:
            raise ValueError(f"{found}: contains control characters, which cannot be stored")
        return self


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (object, array, string, number, boolean, null)."""
    for kind, name in (
        (bool, "boolean"),
        (dict, "object"),
        (list, "array"),
        (str, "string"),
        (int, "number"),
        (float, "number"),
    ):
        if isinstance(value, kind):
            return name
    return "null"


class IngestRead(BaseModel):
    """What an ingest stored: new records and those the run already had."""

    run_id: int
    stored: int = Field(description="records stored by this request")
    already_stored: int = Field(description="records the run already had (left as they were)")
    results: int = Field(description="result rows of the records in this request")
    status: str
    completeness: CompletenessRead


class ProcessesCreate(BaseModel):
    """How many processes each benchmark of a run should have (its own and its re-runs')."""

    model_config = ConfigDict(extra="forbid")

    processes: int = Field(ge=2, le=50, description="processes per benchmark, 2 to 50")


class BenchmarkProcessesRead(BaseModel):
    """One benchmark of the run: processes measured, queued before, and added by this request."""

    benchmark: str
    measured: int
    queued: int
    added: int


class ProcessesRead(BaseModel):
    """What a request for more processes queued: replicate runs and their jobs."""

    run_id: int
    processes: int
    runs: list[int] = Field(description="replicate runs created (none when nothing was short)")
    jobs: int = Field(description="processes queued by this request, over all benchmarks")
    benchmarks: list[BenchmarkProcessesRead]
    dispatch: str = Field(description="who sends the jobs to the workers")
