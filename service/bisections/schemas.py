"""Wire shapes of the bisections endpoint."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class VerdictRead(BaseModel):
    """One benchmark at one probe: verdicts against the good and the bad endpoint."""

    benchmark: str
    samples: list[float] = Field(description="samples taken at this probe (ms)")
    vs_good: str | None = Field(description="different | same | unknown; null at the good end")
    vs_bad: str | None = Field(description="different | same | unknown; null at the bad end")
    side: str | None = Field(description="good | bad | undecided on all samples so far")
    error: str | None
    reference_rounds: list[int] = Field(
        default_factory=list,
        description="rounds of the endpoint samples the verdicts were judged against: the "
        "probe's own round, or (a count bisection, each build counted once) the earlier round "
        "whose stored counts were reused; empty when nothing was compared",
    )


class ProbeRead(BaseModel):
    """One probe: a commit of the range measured in one round, with its samples and verdicts."""

    id: int
    round: int
    sha: str
    index: int = Field(description="position in the commit range (0 = good endpoint)")
    purpose: str
    status: str
    attempts: int
    worker: str | None
    build_seconds: float | None
    benchmarks: list[str]
    samples: dict[str, list[float]] | None = Field(description="benchmark -> samples (ms)")
    errors: dict[str, str] | None
    reason: str | None
    verdicts: list[VerdictRead] = Field(description="filled in when the bisection has ended")


class CulpritRead(BaseModel):
    """A commit named as a culprit, with its title, author and pull request where known."""

    sha: str
    title: str | None = None
    author: str | None = None
    pr_number: int | None = None
    benchmarks: list[str] = Field(default_factory=list)
    change: dict[str, float | None] = Field(
        default_factory=dict, description="benchmark -> relative change"
    )


class BenchmarkAnswerRead(BaseModel):
    """What a bisection found for one benchmark: its culprit, or the range it narrowed to."""

    benchmark: str
    status: str = Field(description="culprit | inconclusive | not_reproduced")
    culprit: str | None
    range: list[str] = Field(description="commits that may hold the culprit")
    change: float | None
    reason: str


class BisectionRead(BaseModel):
    """A bisection of a commit range: its state, probes, and answers per benchmark."""

    id: int
    run_id: int | None
    alert_id: int | None
    status: str
    search: str = Field(
        description="latency: the commit that slowed the benchmarks; failure: "
        "the first commit at which the benchmark fails"
    )
    outcome: str | None
    good: str
    bad: str
    commits: int = Field(description="commits in the range after the good endpoint")
    benchmarks: list[str]
    regression_ids: list[int]
    builds: int | None
    rounds: int | None
    error: str | None
    created_at: datetime | None
    finished_at: datetime | None
    culprits: list[CulpritRead]
    answers: list[BenchmarkAnswerRead]
    probes: list[ProbeRead]
    commit_range: list[dict[str, Any]] = Field(description="the range, good endpoint first")


class ProfileRowRead(BaseModel):
    """One operator or function whose change is above the noise."""

    name: str = Field(description="aten operator, Python function (file: name) or C function")
    before: float = Field(
        description="per step on the first build (µs, instructions, or bytecodes)"
    )
    after: float = Field(description="per step on the second build")
    change: float = Field(description="after − before")
    share: float | None = Field(description="change over the step's change (null: step unmoved)")
    status: str = Field(description="changed | new | gone")
    calls_before: float | None = Field(description="calls per step (operators)")
    calls_after: float | None = None


class ProfileDiffRead(BaseModel):
    """The diff of two builds' profiles (docs/profile.md for the noise rule)."""

    metric: str
    unit: str = Field(
        description="us (self CPU time), instructions, or bytecodes (Python functions)"
    )
    total_before: float = Field(description="the step's total on the first build")
    total_after: float
    total_change: float
    explained: float | None = Field(description="fraction of the step's change the rows add up to")
    summary: str
    compared: int = Field(description="distinct rows in the two profiles")
    noise: float = Field(
        description="largest change of one row between two profiles of the first build, over the step"
    )
    threshold: float = Field(description="the change a row had to exceed (the unit)")
    rule: dict[str, float]
    appeared: list[str]
    vanished: list[str]
    rows: list[ProfileRowRead]
    python: ProfileDiffRead | None = Field(
        default=None,
        description="a cpu_instructions profile's Python functions, by bytecodes each ran "
        "itself per step (callgrind sees only the interpreter's C functions)",
    )


class ProfileRead(BaseModel):
    """What changed between the builds either side of a regression's culprit (or range)."""

    regression_id: int
    bisection_id: int
    benchmark: str = Field(description="the benchmark profiled (one per cause)")
    metric: str
    before: str = Field(description="the first build's commit (culprit's parent, or good end)")
    after: str = Field(description="the second build's commit (culprit, or range's bad end)")
    culprit: bool = Field(description="after is the named culprit")
    status: str = Field(description="done | failed")
    reason: str | None = Field(description="why the profile probe failed")
    diff: ProfileDiffRead | None
    traces: list[str] = Field(description="API paths of the two builds' Chrome traces (gzip)")
