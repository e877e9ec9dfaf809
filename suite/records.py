"""The JSON record one benchmark process writes: what was measured, how, and on what.

Shape (``python -m suite run --out FILE``)::

    {"model": str, "mode": "train"|"eval", "device": "cpu"|"cuda", "compiler": "eager"|"inductor",
     "batch_size": int|null, "benchmark_version": str|null, "environment": {...},
     "metrics": [{"metric": "latency", "unit": "ms", "samples": [...], "median": float,
                  "iqr": float}, ...],
     "leak": {"growth_bytes": int, "suspected": bool} | null,
     "error": str|null}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Bumped by hand when the measuring method changes in a way that moves the figures (warm-up,
# timing points, memory baseline). It enters every ``benchmark_version``, so such a change starts
# new series instead of raising false regressions; edits that do not move the figures leave it.
MEASUREMENT_VERSION = "2"

UNITS = {
    "latency": "ms",
    "cpu_time": "ms",
    "cpu_peak_mem": "bytes",
    "cpu_peak_mem_total": "bytes",
    "gpu_peak_mem": "bytes",
    "mem_growth": "bytes",
}


@dataclass
class MetricRecord:
    """One metric of one benchmark: raw samples with their median and interquartile range."""

    metric: str
    unit: str
    samples: list[float]
    median: float | None
    iqr: float | None


@dataclass
class BenchmarkRecord:
    """Everything one benchmark process reports."""

    model: str
    mode: str
    device: str
    compiler: str = "eager"
    batch_size: int | None = None
    benchmark_version: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    metrics: list[MetricRecord] = field(default_factory=list)
    leak: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """This record as a JSON-ready dict (``dataclasses.asdict``)."""
        return asdict(self)

    def metric(self, name: str) -> MetricRecord | None:
        """The metric called ``name`` (``latency``, ``cpu_peak_mem``, ...), or None."""
        return next((m for m in self.metrics if m.metric == name), None)

    def write(self, path: str | Path) -> None:
        """Write the record as JSON to ``path`` ("-" is not accepted here; use stdout yourself)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchmarkRecord:
        """Parse a record written by :meth:`write`.

        Raises:
            ValueError: a required field is missing or has the wrong type.
        """
        try:
            metrics = [MetricRecord(**m) for m in data.get("metrics", [])]
            return cls(
                model=data["model"],
                mode=data["mode"],
                device=data["device"],
                compiler=data.get("compiler", "eager"),
                batch_size=data.get("batch_size"),
                benchmark_version=data.get("benchmark_version"),
                environment=dict(data.get("environment") or {}),
                metrics=metrics,
                leak=data.get("leak"),
                error=data.get("error"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed benchmark record: {exc}") from exc
