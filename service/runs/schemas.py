"""Wire shapes of the runs endpoints: listing, detail, comparison and ingest."""

from __future__ import annotations

import math
from collections import Counter
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from service.api import NAME_PATTERN, IsoDate, StrictBody

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
# results.metric is String(32).
MetricName = Annotated[str, Field(min_length=1, max_length=32, pattern=NAME_PATTERN)]
# No metric comes near: an hour is 3.6e6 ms, a terabyte 1e12 bytes, a step of a large model
# ~1e12 instructions. The bound keeps sums and squares of samples finite in every analysis.
MAX_SAMPLE = 1e15
Sample = Annotated[float, Field(ge=0, le=MAX_SAMPLE, allow_inf_nan=False)]
SignedSample = Annotated[float, Field(ge=-MAX_SAMPLE, le=MAX_SAMPLE, allow_inf_nan=False)]
# Free-form JSON (a record's environment and leak) is stored as JSONB through orjson: both
# refuse integers outside 64 bits, orjson refuses nesting past 254 levels, and neither stores
# a lone surrogate. The depth here is far below what Python's parser and validator can take.
MAX_JSON_DEPTH = 32
INT64 = (-(2**63), 2**63 - 1)

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


def _text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (control characters, lone surrogates), or None."""
    bad = sorted({f"U+{ord(c):04X}" for c in value if c in _CONTROL})
    if bad:
        return f"contains control characters ({', '.join(bad)}), which cannot be stored"
    surrogates = sorted({f"U+{ord(c):04X}" for c in value if "\ud800" <= c <= "\udfff"})
    if surrogates:
        return (
            f"contains a lone surrogate ({', '.join(surrogates[:3])}), which is not text "
            "and cannot be stored"
        )
    return None


def _storable_text(value: str) -> str:
    problem = _text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_storable_text)]


def _json_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """Why decoded JSON ``value`` cannot be stored, prefixed by the path of the first bad part
    (``environment.a[2]``), or None. Refused: text that :func:`_text_problem` refuses (in keys
    too), integers outside 64 bits, non-finite numbers, nesting deeper than MAX_JSON_DEPTH."""
    if depth > MAX_JSON_DEPTH:
        return f"{where}: nested deeper than {MAX_JSON_DEPTH} levels, which cannot be stored"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _text_problem(key)
            found = (f"{where}: a key {problem}" if problem else None) or _json_problem(
                item, f"{where}.{key}", depth + 1
            )
            if found:
                return found
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _json_problem(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
        return None
    problem = _scalar_problem(value)
    return f"{where}: {problem}" if problem else None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return f"an integer outside 64 bits ({len(str(abs(value)))} digits) cannot be stored"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} cannot be stored"
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


class SkippedRead(BaseModel):
    """A benchmark its runner withdrew from the run (``POST /api/runs/{id}/skipped``), and why."""

    benchmark: str
    reason: str


class CompletenessRead(BaseModel):
    """How far the run got: job counts by status."""

    total: int
    queued: int
    running: int
    done: int
    error: int
    missing: int
    skipped: int = Field(description="benchmarks the runner withdrew (ended, not missing)")
    ended_fraction: float = Field(description="jobs ended (skipped ones too) / total (0..1)")
    complete: bool = Field(description="every job ended and none went missing")
    pending: list[str] = Field(description="benchmarks not reported yet")
    missing_benchmarks: list[str]
    skipped_benchmarks: list[SkippedRead] = Field(
        description="benchmarks withdrawn, with the runner's reason (the first 200)"
    )


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


class BenchmarkIn(StrictBody):
    """One benchmark of a run being created: model, mode, device, compiler."""

    model: Name
    mode: Literal["train", "eval"]
    device: Literal["cpu", "cuda"] = "cpu"
    compiler: Literal["eager", "inductor"] = "eager"
    batch_size: int | None = Field(default=None, ge=1, le=2**31 - 1)


class RunCreate(StrictBody):
    """A run whose results a runner will post (``kind`` = ``ingest``)."""

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

    metric: MetricName
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
        problem = _json_problem(env, "environment") or _json_problem(self.leak, "leak")
        if problem:
            raise ValueError(problem)
        twice = sorted(m for m, n in Counter(m.metric for m in self.metrics).items() if n > 1)
        if twice:
            raise ValueError(f"metrics: {', '.join(twice)} listed twice; one entry per metric")
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


# A skip's reason (stored in ``Job.error``, as a job's error or missed deadline is).
SKIP_REASON_MAX = 2000


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank: say why the benchmark is not measured")
    return value.strip()


class SkipIn(StrictBody):
    """A benchmark the runner withdraws from its ingest run, with the reason it cannot run it."""

    model: Name
    mode: Literal["train", "eval"]
    device: Literal["cpu", "cuda"] = "cpu"
    compiler: Literal["eager", "inductor"] = "eager"
    reason: Annotated[Text, AfterValidator(_not_blank)] = Field(
        min_length=1,
        max_length=SKIP_REASON_MAX,
        description="why it is not measured, e.g. the model's import failure (1 to 2000 "
        "characters, not blank; stored stripped)",
    )


class SkippedOut(BaseModel):
    """What a skip request changed: benchmarks skipped now and those skipped before."""

    run_id: int
    skipped: int = Field(description="benchmarks skipped by this request")
    already_skipped: int = Field(description="benchmarks skipped before (their reason kept)")
    status: str
    completeness: CompletenessRead


class ProcessesCreate(StrictBody):
    """How many processes each benchmark of a run should have (its own and its re-runs')."""

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
