"""Wire shapes of the models and history endpoints."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, Field


class MachineRead(BaseModel):
    """A machine results were measured on: its device class and fingerprint parts."""

    id: int
    device_class: str
    cpu_model: str | None
    gpu_name: str | None
    driver: str | None
    hostname: str | None


class ConfigurationRead(BaseModel):
    """One configuration of a model measured in the period: a benchmark's metric on a machine."""

    mode: str
    device: str
    compiler: str
    metric: str
    unit: str
    machine_id: int | None
    first_night: date
    last_night: date
    results: int = Field(description="results in the period")


class ModelRead(BaseModel):
    """A model and the configurations (mode, device, compiler) it was measured in."""

    name: str
    domain: str | None = Field(
        description="as its records report it (the suite's metadata); null when none did"
    )
    configurations: list[ConfigurationRead]
    history_url: str
    page_url: str


class ModelsRead(BaseModel):
    """Every model with stored results."""

    since: date | None = Field(description="configurations measured on or after this night")
    models: list[ModelRead]


class PointsRead(BaseModel):
    """The nights of a series as parallel lists, one entry per night, oldest first.

    Values in the series' unit (ms or bytes). Column lists keep a three-year history of every
    series of a model small and fast to encode; ``pandas.DataFrame(points)`` gives one row per
    night, and ``format=csv`` does the same on the server.
    """

    night: list[date]
    run_id: list[int]
    result_id: list[int]
    torch_version: list[str | None]
    torch_git_commit: list[str | None]
    median: list[float] = Field(description="median of the night's samples")
    iqr: list[float | None] = Field(description="interquartile range of the samples")
    samples: list[int] = Field(description="number of samples")
    baseline: list[float | None] = Field(
        description="the baseline held at that night (null: none yet)"
    )
    baseline_lower: list[float | None]
    baseline_upper: list[float | None]
    change: list[float | None] = Field(description="median / baseline - 1 (0.12 = +12%)")
    regression: list[bool]
    improvement: list[bool]
    outlier: list[bool] = Field(
        description="beyond the threshold and the noise band for one night only"
    )
    expected: list[bool] = Field(
        description="a maintainer marked the change at this night expected"
    )
    regression_id: list[int | None]
    culprit: list[str | None] = Field(
        description="culprit commit named by a bisection of the change at this night"
    )


class SeriesRead(BaseModel):
    """One series of a model: a metric of one benchmark on one machine and environment."""

    series_key: str
    benchmark: str = Field(description="model:mode:device[:compiler]")
    mode: str
    device: str
    compiler: str
    metric: str
    unit: str
    batch_size: int | None
    benchmark_version: str | None
    machine: MachineRead | None
    threshold: float
    unstable: bool = Field(
        False,
        description="a latency series of a benchmark marked unstable: shown, alerted "
        "only beyond its noise",
    )
    alerts_from: float | None = Field(
        None,
        description="for an unstable one, the least regression it still alerts "
        "(fraction; null: never, or not unstable)",
    )
    smallest_change: float | None = Field(
        None,
        description="the smallest step the detector raises within 3 nights 95% of the time at "
        "the series' noise (fraction; null: no baseline yet)",
    )
    chart_url: str
    points: PointsRead


class ErrorPointRead(BaseModel):
    """A night the benchmark failed: its run, result and error text."""

    night: date
    run_id: int
    result_id: int
    benchmark: str
    error: str


class HistoryRead(BaseModel):
    """A model's history: its series and failed nights."""

    model: str
    series: list[SeriesRead]
    errors: list[ErrorPointRead]
