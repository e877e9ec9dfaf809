"""The baseline rule, one code for detection and the history charts (pure: no database)."""

from __future__ import annotations

import numpy as np
import pytest

from service.regressions.baseline import (
    band,
    baseline_track,
    has_baseline,
    window_nights,
    window_noise,
)
from service.regressions.detection import DetectorParams, Night, assess_night
from service.regressions.rules import to_log


@pytest.mark.parametrize("memory", [False, True])
@pytest.mark.parametrize("window", [2, 5, 28])
def test_the_charts_noise_is_the_detectors_window_noise(memory: bool, window: int) -> None:
    p = DetectorParams(window=window, min_baseline=2, drift_nights=2)
    rng = np.random.default_rng(window)
    levels = (
        2.0**20 + rng.integers(0, 6, 60) * 4096.0 if memory else np.exp(rng.normal(0, 0.05, 60))
    )
    levels[40:] *= 1.3
    track = baseline_track(levels, memory=memory, resets=[(40, 41)], params=p)
    y = to_log(levels[None, :], np.array([memory]))
    for j in range(1, levels.size):
        start = 40 if j >= 41 else 0
        k = window_nights(j - start, p)
        noise = window_noise(
            y, np.array([0]), np.array([j - k]), np.array([k]), p, np.array([memory])
        )[0]
        # The charts sort the differences in float32.
        assert track.noise[j] == pytest.approx(noise, rel=1e-6, abs=1e-12), j
        assert np.isnan(track.baseline[j]) == (not has_baseline(k, p)), j


def test_band_is_two_noise_on_the_log_scale() -> None:
    lower, upper = band(np.log(100.0), 0.01, False)
    assert float(lower) == pytest.approx(100 * np.exp(-0.02))
    assert float(upper) == pytest.approx(100 * np.exp(0.02))
    lower, upper = band(np.log1p(2.0**20), 0.0, True)
    assert float(lower) == float(upper) == pytest.approx(2.0**20)


def test_a_window_of_two_nights_has_no_noise_in_the_charts_either() -> None:
    p = DetectorParams(window=2, min_baseline=2, drift_nights=2)
    rng = np.random.default_rng(1)
    samples = [tuple(rng.normal(10, 0.5, 3)) for _ in range(12)]
    track = baseline_track([float(np.median(s)) for s in samples], memory=False, params=p)
    nights = [Night(i, s) for i, s in enumerate(samples)]
    a = assess_night(nights[:8], nights[8], metric="latency", params=p)
    assert track.noise[8] == p.noise_floor
    assert (track.lower[8], track.upper[8]) == pytest.approx((a.baseline_lower, a.baseline_upper))
