"""The smallest detectable change of a series: how large a step the detector raises within
three nights, with 95% probability, at the series' own noise.

A "no regression" verdict on a series whose nights stray by 6% says nothing true about a +8%
change; this number says what it does cover. It is the detector's online magnitude rule
(docs/detection.md, "Magnitude"; :func:`service.regressions.rules.cutoff`) solved for the step:

- a run of ``m`` nights at the new level (3: the step's first night, its confirmation re-run
  and the next night) against a baseline of ``k`` nights (``min(nights since the last reset,
  window)``) estimates the step on the log scale with standard error
  ``se = noise * sqrt(pi/2 * (1/m + 1/k))`` (medians: the pi/2 variance factor), ``noise``
  being the series' night-to-night noise as the detector measures it (the scaled median
  absolute successive difference of the baseline's log levels,
  :func:`service.regressions.baseline.scaled_noise`);
- the step counts when its estimate clears ``cut = max(thr, grey * thr + z_low * se)``
  (online, a step is held to the threshold itself);
- the estimate is normal around the true step ``s``, so it clears ``cut`` with probability
  ``power`` when ``s >= cut + z_power * se`` (``z_power`` = 1.645 for 95%): the power
  calculation of a one-sided test (Cohen, *Statistical Power Analysis*, 1988, ch. 2).

The smallest detectable change is ``exp(s) - 1``. Peak memory (exact levels, noise 0) sees
exactly its threshold. Not modelled: the rank test (with three run nights above a baseline of
eight or more nights it passes whenever the magnitude does) and the series' own excursions (a
series that strayed by the step's size for two nights lately waits a night longer). How close
the formula comes to the detector run night by night on simulated series is measured in
docs/benchmarks.md ("Smallest detectable change").

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm

from service.regressions.baseline import MIN_NOISE_NIGHTS, has_baseline, scaled_noise
from service.regressions.rules import DEFAULT_PARAMS, MEDIAN_VAR, DetectorParams

RUN_NIGHTS = 3
"""Nights at the new level the smallest detectable change is judged on: the step's first
night, its confirmation re-run, and the next night."""
POWER = 0.95
"""The probability with which a step of the smallest detectable change is raised."""
COARSE_FACTOR = 1.1
"""A series is *coarse* when its smallest detectable change exceeds its threshold by more than
this factor (+7.7% for a 7% threshold): any noise puts the smallest detectable change a little
above the threshold (the power margin), and a 0.2% quiet series at +7.2% is not worth a line."""


def is_coarse(smallest: float | None, threshold: float) -> bool:
    """Whether a series whose smallest detectable change is ``smallest`` misses steps well
    above its ``threshold`` (:data:`COARSE_FACTOR`); False without a baseline (None)."""
    return smallest is not None and smallest > threshold * COARSE_FACTOR


def smallest_detectable_change(
    noise: float | np.ndarray,
    nights: int | np.ndarray,
    threshold: float | np.ndarray,
    *,
    params: DetectorParams = DEFAULT_PARAMS,
    run_nights: int = RUN_NIGHTS,
    power: float = POWER,
) -> np.ndarray:
    """The smallest relative step the detector raises within ``run_nights`` nights with
    probability ``power`` (module docstring for the method).

    Args:
        noise: the night-to-night noise on the log scale (0.02 ≈ 2%), scalar or shape (n,).
        nights: nights in the baseline window, same shape (fewer than ``min_baseline``: none).
        threshold: the relative threshold (0.07 = 7%), scalar or the same shape.
        params: the detector's constants.
        run_nights: nights at the new level (at least 2: a run of one night is never raised).
        power: the probability wanted, in (0.5, 1).

    Returns:
        The smallest detectable change, relative (0.081 = +8.1%), shape of the broadcast
        inputs; NaN where the window holds no baseline.

    Raises:
        ValueError: ``run_nights`` below 2 or ``power`` outside (0.5, 1).
    """
    if run_nights < 2:
        raise ValueError(f"run_nights must be at least 2, got {run_nights}")
    if not 0.5 < power < 1:
        raise ValueError(f"power must lie in (0.5, 1), got {power}")
    noise_a = np.asarray(noise, dtype=float)
    nights_a = np.asarray(nights, dtype=float)
    thr = np.log1p(np.asarray(threshold, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        se = noise_a * np.sqrt(MEDIAN_VAR * (1.0 / run_nights + 1.0 / nights_a))
    cut = np.maximum(thr, params.grey_fraction * thr + params.z_low * se)
    step = cut + float(norm.ppf(power)) * se
    return np.where(has_baseline(nights_a, params), np.expm1(step), np.nan)


def window_noise_of(
    levels: Sequence[float] | np.ndarray, *, memory: bool, params: DetectorParams = DEFAULT_PARAMS
) -> tuple[float, int]:
    """The detector's noise and window size over the latest baseline window of ``levels``.

    Args:
        levels: night levels since the series' last reset, oldest first (ms > 0, or bytes).
        memory: exact levels (peak memory: ``log1p`` scale, no noise floor).
        params: the detector's constants (``window``, the noise floor).

    Returns:
        ``(noise on the log scale, nights in the window)``: the scaled median absolute
        successive difference of the last ``window`` levels (0 from fewer than three).
    """
    window = np.asarray(levels, dtype=float)[-params.window :]
    window = window[~np.isnan(window)]
    k = int(window.size)
    if k < MIN_NOISE_NIGHTS:
        mid = np.array([np.nan])
    else:
        logs = np.log1p(window) if memory else np.log(window)
        mid = np.array([float(np.median(np.abs(np.diff(logs))))])
    noise = scaled_noise(mid, np.array([k]), np.array([memory]), params)
    return float(noise[0]), k


def series_smallest_change(
    levels: Sequence[float] | np.ndarray,
    threshold: float,
    *,
    memory: bool,
    params: DetectorParams = DEFAULT_PARAMS,
) -> float | None:
    """The smallest detectable change of a series whose levels since its last reset are
    ``levels`` (the next night's, judged against all of them).

    Returns:
        The relative change (0.081 = +8.1%), or None while the series has no baseline.
    """
    noise, k = window_noise_of(levels, memory=memory, params=params)
    value = float(smallest_detectable_change(noise, k, threshold, params=params))
    return None if math.isnan(value) else value
