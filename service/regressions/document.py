"""The detection document (``nightbench detect`` JSON): its metrics, reading it with errors
that name what was wrong, and detection over it (:func:`detect_document`).

The document's shape is given in :func:`detect_document`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from service.errors import DetectionInputError
from service.metrics import ALERT_METRICS, exact_levels
from service.regressions.scan import detect_series


def _threshold_for(doc_thr: Any, series: Mapping[str, Any], metric: str, where: str) -> float:
    thr = series.get("threshold", doc_thr)
    field = f"{where}.threshold" if "threshold" in series else "threshold"
    if isinstance(thr, Mapping):
        thr = thr.get(metric, 0.07)
        field = f"{field}.{metric}"
    if isinstance(thr, bool) or not isinstance(thr, int | float) or not 0 < thr < 10:
        raise DetectionInputError(f"{field}: must be a number between 0 and 10 (0.07 = 7%)")
    return float(thr)


def parse_series(
    doc: Mapping[str, Any],
) -> list[tuple[str, bool, float, list[int], list[float], list[bool]]]:
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
        unknown = set(doc_thr) - set(ALERT_METRICS)
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
    if metric not in ALERT_METRICS:
        raise DetectionInputError(f"{where}.metric: must be one of {', '.join(ALERT_METRICS)}")
    memory = exact_levels(metric)
    thr = _threshold_for(doc_thr, s, metric, where)
    nights = s.get("nights")
    if not isinstance(nights, list):
        raise DetectionInputError(f"{where}.nights: expected a list")
    ordinals: list[int] = []
    levels: list[float] = []
    expected: list[bool] = []
    for j, n in enumerate(nights):
        night, level, exp = _parse_night(
            n, f"{where}.nights[{j}]", memory, ordinals[-1] if ordinals else None
        )
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
    if (
        not isinstance(samples, list)
        or not samples
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in samples)
    ):
        raise DetectionInputError(f"{nw}.samples: expected a non-empty list of numbers")
    # Plain Python: per-night numpy calls would dominate on large exports.
    low = min(samples)
    if not all(math.isfinite(x) for x in samples) or (low < 0 if memory else low <= 0):
        raise DetectionInputError(
            f"{nw}.samples: "
            + ("bytes must be finite and >= 0" if memory else "latency must be finite, > 0")
        )
    exp = n.get("expected", False)
    if not isinstance(exp, bool):
        raise DetectionInputError(f"{nw}.expected: expected true or false")
    return night, float(statistics.median(samples)), exp


def detect_document(doc: Mapping[str, Any], *, online: bool) -> dict[str, Any]:
    """Run detection over an exported document (the ``nightbench detect`` JSON).

    Input: ``{"threshold": 0.07, "series": [{"id": str, "metric": "latency" | "gpu_peak_mem" |
    "cpu_peak_mem" | "cpu_instructions" (``service.metrics.ALERT_METRICS``), "nights": [{"night": int, "samples": [float, ...]}, ...]}]}``, nights oldest
    first with increasing ``night`` (a gap between ordinals is a night without a result: online,
    a run's length against the series' excursions counts it); one sample per night is
    allowed. ``threshold`` (default 0.07) may also be a mapping ``{metric: threshold}``
    (metrics left out get 0.07), and a series may carry its own ``"threshold"`` (a number or
    such a mapping), which wins. A night may carry ``"expected": true`` (the baseline resets
    there).

    Output: ``{"flags": [{"id", "night", "raised_night", "direction", "change", "p_value",
    "resumed_night"}]}``
    in input order of series, then by night: ``night`` is the first night at the new level,
    ``raised_night`` the night on which the flag is raised (online: decided from nights up to
    it only, each flag once; offline: the last night of the series), ``direction``
    ``regression`` | ``improvement``, ``change`` relative (0.12 = +12%), ``p_value`` the
    one-sided Mann-Whitney p-value for latency and null for peak memory, ``resumed_night``
    (online) the night the series came back from a step that did not persist, its baseline
    from before the step resuming there (``DetectorParams.return_nights``), else null.

    Args:
        doc: the parsed input document.
        online: decide night by night as the nightly service does.

    Returns:
        The output document.

    Raises:
        DetectionInputError: malformed input; the message names the field
            (e.g. ``series[2].nights[5].samples``).
    """
    parsed = parse_series(doc)
    if not parsed:
        return {"flags": []}
    width = max(1, max(len(p[3]) for p in parsed))
    levels = np.full((len(parsed), width), np.nan)
    expected = np.zeros((len(parsed), width), dtype=bool)
    clock = np.zeros((len(parsed), width))
    for i, (_, _, _, ordinals, lv, ex) in enumerate(parsed):
        levels[i, : len(lv)] = lv
        expected[i, : len(ex)] = ex
        clock[i, : len(ordinals)] = ordinals
    flags = detect_series(
        levels,
        memory=np.array([p[1] for p in parsed]),
        threshold=np.array([p[2] for p in parsed]),
        expected=expected,
        online=online,
        nights=clock,
    )
    out = []
    for f in flags:
        sid, memory, _, ordinals, _, _ = parsed[f.series]
        out.append(
            {
                "id": sid,
                "night": ordinals[f.night],
                "raised_night": ordinals[f.raised_night],
                "direction": f.direction,
                "change": round(f.change, 6),
                "p_value": None if memory or f.p_value is None else float(f"{f.p_value:.6g}"),
                "resumed_night": (None if f.resumed_night is None else ordinals[f.resumed_night]),
            }
        )
    return {"flags": out}
