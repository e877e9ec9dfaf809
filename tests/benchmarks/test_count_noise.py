"""The count-noise benchmark's summary on literal figures: the per-process spread, the largest
spread of one process's windows, the suite's median and p90 CV, and a pass's cost."""

from __future__ import annotations

import math
import statistics

from benchmarks.count_noise import cv, spread, summarise


def _row(windows: list[list[float]], cpu_s: float) -> dict[str, list]:
    return {
        "medians": [statistics.median(w) for w in windows],
        "windows": windows,
        "wall_s": [cpu_s + 1] * len(windows),
        "cpu_s": [cpu_s] * len(windows),
        "build_cpu_s": [1.0] * len(windows),
        "warmup_cpu_s": [2.0] * len(windows),
        "errors": [],
    }


def test_summary_of_counts_over_processes() -> None:
    data = {
        # identical in every process, but one process's first window counted 1% more
        "a:eval": _row([[100.0, 100.0, 100.0], [101.0, 100.0, 100.0]], 10.0),
        # 2% apart between the two processes
        "b:train": _row([[200.0, 200.0, 200.0], [204.0, 204.0, 204.0]], 30.0),
        "c:eval": {**_row([], 0.0), "errors": ["timed out after 3600 s"]},
        "_processes": {"wall_s": [12.0, 13.0, 32.0, 33.0], "cpu_s": [11.0, 12.0, 31.0, 32.0]},
    }
    s = summarise(data, processes=2)

    assert set(s["benchmarks"]) == {"a:eval", "b:train"}
    a, b = s["benchmarks"]["a:eval"], s["benchmarks"]["b:train"]
    assert a["spread"] == 0.0 and a["cv"] == 0.0
    assert math.isclose(a["window_spread"], 0.01)
    assert math.isclose(b["spread"], 0.02) and b["window_spread"] == 0.0
    assert math.isclose(b["cv"], cv([200.0, 204.0]))
    assert s["median_cv"] == statistics.median([0.0, b["cv"]])
    assert s["p90_cv"] == b["cv"] and s["max_spread"] == b["spread"]
    assert s["failed"] == {"c:eval": ["timed out after 3600 s"]}
    assert s["pass_cpu_s"] == (11 + 12 + 31 + 32) / 2
    assert s["valgrind_processes"] == 4


def test_spread_and_cv_of_one_value_are_zero() -> None:
    assert spread([5.0]) == 0.0 and cv([5.0]) == 0.0
    assert math.isclose(spread([100.0, 110.0, 105.0]), 0.1)
