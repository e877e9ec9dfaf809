"""The smallest detectable change (``service/regressions/sensitivity.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.regressions.rules import MEDIAN_VAR, DetectorParams
from service.regressions.sensitivity import (
    series_smallest_change,
    smallest_detectable_change,
    window_noise_of,
)
from workers.issues.reports.regression import sensitivity_line


def test_a_quiet_series_sees_its_threshold_and_noise_raises_it() -> None:
    # Peak memory in exact bytes: no noise, the threshold itself.
    assert float(smallest_detectable_change(0.0, 28, 0.07)) == pytest.approx(0.07)
    values = smallest_detectable_change(np.array([0.001, 0.01, 0.02, 0.05]), 28, 0.07)
    assert list(values) == sorted(values) and values[0] < 0.072 < values[1]
    # Fewer baseline nights, a coarser estimate; no baseline, no answer.
    assert float(smallest_detectable_change(0.02, 8, 0.07)) > float(
        smallest_detectable_change(0.02, 28, 0.07)
    )
    assert math.isnan(float(smallest_detectable_change(0.02, 3, 0.07)))


def test_the_step_is_the_magnitude_cut_plus_the_power_margin() -> None:
    # By hand, at 3% noise over 12 nights: se, the online cut, then + 1.645 se.
    p = DetectorParams()
    se = 0.03 * math.sqrt(MEDIAN_VAR * (1 / 3 + 1 / 12))
    cut = max(math.log(1.07), p.grey_fraction * math.log(1.07) + p.z_low * se)
    want = math.expm1(cut + 1.6448536 * se)
    assert float(smallest_detectable_change(0.03, 12, 0.07)) == pytest.approx(want, rel=1e-6)


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="run_nights"):
        smallest_detectable_change(0.01, 28, 0.07, run_nights=1)
    with pytest.raises(ValueError, match="power"):
        smallest_detectable_change(0.01, 28, 0.07, power=1.0)


def test_a_series_noise_is_the_detectors_over_its_latest_window() -> None:
    rng = np.random.default_rng(3)
    levels = 10.0 * np.exp(rng.normal(0, 0.04, 40))
    noise, nights = window_noise_of(levels, memory=False)
    logs = np.log(levels[-28:])
    assert nights == 28
    assert noise == pytest.approx(np.median(np.abs(np.diff(logs))) * 1.4826 / math.sqrt(2))
    assert series_smallest_change(levels, 0.07, memory=False) == pytest.approx(
        float(smallest_detectable_change(noise, 28, 0.07))
    )
    assert series_smallest_change(levels[:3], 0.07, memory=False) is None  # no baseline yet


def test_the_issue_line_says_what_the_series_can_see() -> None:
    noisy = list(10.0 * np.exp(np.random.default_rng(1).normal(0, 0.04, 20)))
    line = sensitivity_line(noisy, 0.07, memory=False)
    assert line is not None and "over 20 nights" in line and "within 3 nights (95%" in line
    assert "may take longer or pass unraised" in line
    flat = sensitivity_line([1000.0] * 10, 0.07, memory=True)
    assert flat is not None and "a step of +7.0% or more" in flat and "unraised" not in flat
    assert sensitivity_line([10.0, 10.1], 0.07, memory=False) is None
