"""The detection document (``nightbench detect`` JSON): its metrics, and reading it with errors
that name what was wrong.

The document's shape is given in :func:`service.regressions.detection.detect_document`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from service.regressions.robust import DetectionInputError

METRICS = ("latency", "gpu_peak_mem", "cpu_peak_mem")
"""The metrics detection judges: latency (ms), peak memory on GPU and CPU (bytes)."""
MEMORY_METRICS = ("gpu_peak_mem", "cpu_peak_mem")


def _threshold_for(doc_thr: Any, series: Mapping[str, Any], metric: str, where: str) -> float:
    thr = series.get("threshold", doc_thr)
    field = f"{where}.threshold" if "threshold" in series else "threshold"
    if isinstance(thr, Mapping):
        thr = thr.get(metric, 0.07)
        field = f"{field}.{metric}"
    if isinstance(thr, bool) or not isinstance(thr, int | float) or not 0 < thr < 10:
        raise DetectionInputError(f"{field}: must be a number between 0 and 10 (0.07 = 7%)")
    return float(thr)


def parse_series(doc: Mapping[str, Any]) -> list[tuple[str, bool, float, list[int], list[float], list[bool]]]:
    """Check and read a detection document (``detect_document``'s input).

    Returns:
        Per series: ``(id, memory, threshold, night ordinals, night levels, expected flags)``,
        each level the median of the night's samples (ms or bytes).

    Raises:
        DetectionInputError: the first thing wrong, named by its path (``series[3].nights[0]``).
    """
    if not isinstance(doc, Mapping):
        raise DetectionInputError("document: expected a JSON object with a 'series' list")
    doc_thr = doc.get("threshold", 0.07)
    if isinstance(doc_thr, Mapping):
        unknown = set(doc_thr) - set(METRICS)
        if unknown:
            raise DetectionInputError(f"threshold: unknown metric {sorted(unknown)[0]!r}")
    series = doc.get("series")
    if not isinstance(series, list):
        raise DetectionInputError("series: expected a list")
    return [_parse_one_series(s, f"series[{i}]", doc_thr) for i, s in enumerate(series)]


def _parse_one_series(s: Any, where: str, doc_thr: Any):
    if not isinstance(s, Mapping):
        raise DetectionInputError(f"{where}: expected an object")
    sid = s.get("id")
    if not isinstance(sid, str):
        raise DetectionInputError(f"{where}.id: expected a string")
    metric = s.get("metric")
    if metric not in METRICS:
        raise DetectionInputError(f"{where}.metric: must be one of {', '.join(METRICS)}")
    memory = metric in MEMORY_METRICS
    thr = _threshold_for(doc_thr, s, metric, where)
    nights = s.get("nights")
    if not isinstance(nights, list):
        raise DetectionInputError(f"{where}.nights: expected a list")
    ordinals: list[int] = []
    levels: list[float] = []
    expected: list[bool] = []
    for j, n in enumerate(nights):
        night, level, exp = _parse_night(n, f"{where}.nights[{j}]", memory,
                                         ordinals[-1] if ordinals else None)
        ordinals.append(night)
        levels.append(level)
        expected.append(exp)
    return sid, memory, thr, ordinals, levels, expected


def _parse_night(n: Any, nw: str, memory: bool, previous: int | None) -> tuple[int, float, bool]:
    """One night of an exported series: ``(night, level, expected)``, its level the median."""
    if not isinstance(n, Mapping):
        raise DetectionInputError(f"{nw}: expected an object")
    night = n.get("night")
    if isinstance(night, bool) or not isinstance(night, int):
        raise DetectionInputError(f"{nw}.night: expected an integer")
    if previous is not None and night <= previous:
        raise DetectionInputError(f"{nw}.night: nights must be increasing (oldest first)")
    samples = n.get("samples")
    if not isinstance(samples, list) or not samples or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in samples
    ):
        raise DetectionInputError(f"{nw}.samples: expected a non-empty list of numbers")
    # Plain Python: per-night numpy calls would dominate on large exports.
    low = min(samples)
    if not all(math.isfinite(x) for x in samples) or (low < 0 if memory else low <= 0):
        raise DetectionInputError(f"{nw}.samples: " + (
            "bytes must be finite and >= 0" if memory else "latency must be finite, > 0"))
    exp = n.get("expected", False)
    if not isinstance(exp, bool):
        raise DetectionInputError(f"{nw}.expected: expected true or false")
    return night, float(statistics.median(samples)), exp
