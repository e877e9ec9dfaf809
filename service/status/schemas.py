"""Wire shape of ``GET /api/status``."""

from __future__ import annotations

from datetime import date, datetime

from pydantic import BaseModel, Field


class MachineClassRead(BaseModel):
    """A machine class (its queue) and the last night it measured."""

    queue: str = Field(description="cpu, gpu.<class>, or ingest for posted results")
    last_night: date
    last_result_at: datetime | None
    nights_behind: int = Field(description="days from last_night to today (UTC)")


class OpenRunRead(BaseModel):
    """A run not finished yet."""

    id: int
    kind: str
    night: date
    status: str
    age_s: float = Field(description="seconds since the run was created")
    deadline_at: datetime | None
    overdue: bool
    jobs_pending: int = Field(description="jobs queued or running")


class WorkerRead(BaseModel):
    """A worker that started a job in the last hour."""

    worker: str
    last_started_at: datetime
    jobs: int


class PendingFilingRead(BaseModel):
    """An alert whose issue is not filed yet."""

    alert_id: int
    run_id: int
    night: date
    state: str = Field(description="pending, or failed_retrying after an error")
    attempts: int
    last_error: str | None
    pending_since: datetime | None
    age_s: float = Field(description="seconds since its filing became pending")
    next_attempt_at: datetime | None
    kind: str = Field(default="regression", description="regression, missing_data or failing")


class StabilityChangeRead(BaseModel):
    """A benchmark darkened (to unstable: shown, alerted only beyond its noise) or un-darkened
    (to stable) by the nightly stability re-check in the last week."""

    benchmark: str
    machine_id: int
    run_id: int
    night: date
    from_verdict: str = Field(description="stable, unstable or unknown")
    to_verdict: str = Field(description="stable or unstable")
    source: str = Field(description="nightly re-check over N processes, nights A..B")


class CoarseSeriesRead(BaseModel):
    """A series whose noise lets the detector see only steps above its threshold."""

    benchmark: str
    metric: str
    machine_id: int | None
    threshold: float = Field(description="its threshold (fraction)")
    smallest_change: float = Field(
        description="the smallest step raised within 3 nights 95% of the time (fraction)"
    )
    noise: float = Field(description="night-to-night noise (fraction)")
    nights: int = Field(description="nights in its baseline window")


class UnstableBenchmarkRead(BaseModel):
    """A benchmark marked unstable on a machine now: shown, alerted only beyond its noise."""

    benchmark: str
    machine_id: int
    spread: float | None = Field(description="(max - min) / min of its processes' medians")
    alerts_from: float | None = Field(
        description="least latency regression it still alerts (fraction); null: never"
    )
    still_alerts_on: list[str] = Field(
        default_factory=list,
        description="metrics the host's speed does not move, alerted as on any benchmark "
        "(cpu_peak_mem, cpu_instructions on CPU)",
    )


class FailingBenchmarkRead(BaseModel):
    """A benchmark that ran on a machine class, then failed on each of its last nights there."""

    benchmark: str
    queue: str
    nights: int = Field(description="nights in a row it failed (nights not measured skipped)")
    since: date = Field(description="the first night of the streak")
    error: str = Field(description="the first line of its last error")


class RunningBisectionRead(BaseModel):
    """A bisection not yet ended, and what waits on it."""

    id: int
    search: str = Field(
        description="latency (a night's regressions) or failure (a failing benchmark)"
    )
    benchmarks: list[str]
    run_id: int | None = Field(description="the night whose issue waits on it, if any")
    queue: str = Field(description="where its probes go")
    age_s: float = Field(description="seconds since it started")
    rounds: int = Field(description="rounds planned so far")
    probes_waiting: int = Field(description="probes queued or running")


class StatusRead(BaseModel):
    """The system's state and the problems to look at (empty when all is well)."""

    now: datetime
    machine_classes: list[MachineClassRead]
    open_runs: list[OpenRunRead]
    workers: list[WorkerRead]
    problems: list[str]
    pending_filings: list[PendingFilingRead]
    queues: dict[str, int] | None = Field(
        description="messages waiting per Celery queue; null without a broker"
    )
    listeners: dict[str, list[str]] | None = Field(
        default=None,
        description="when a queue held messages: the workers (node names) that "
        "answered consuming each queue; null when no queue held any, or without a broker",
    )
    stability_changes: list[StabilityChangeRead] = Field(
        default_factory=list, description="the nightly stability re-check's changes, last week"
    )
    unstable: list[UnstableBenchmarkRead] = Field(
        default_factory=list, description="benchmarks marked unstable now"
    )
    judged: int = Field(0, description="stored stability verdicts (benchmark and machine)")
    coarse: list[CoarseSeriesRead] = Field(
        default_factory=list,
        description="series whose smallest detectable change is above their threshold",
    )
    sensed: int = Field(0, description="series with a baseline, judged for coarse")
    failing: list[FailingBenchmarkRead] = Field(
        default_factory=list, description="benchmarks failing night after night"
    )
    bisections: list[RunningBisectionRead] = Field(
        default_factory=list,
        description="bisections still running (one running over a day is also a problem)",
    )
