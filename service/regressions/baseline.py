"""The detector's baseline rule, in one place for detection and for the history charts.

At night ``j`` of a series, ``k = min(nights since the last reset, window)`` earlier nights make
the baseline window; fewer than ``min_baseline`` make none. The baseline is the median of the
window's levels (exact bytes for memory), taken on the log scale for comparisons; the noise is
the median absolute successive difference of the window's log levels times 1.4826 / sqrt(2)
(0 from fewer than 3 nights, at least ``noise_floor`` for latency); the band is the baseline
± 2 noise on the log scale. The method and its sources are described in
``service.regressions.detection``.

Detection applies the rule to the windows it judges (:func:`window_noise` in the online and
offline passes, :func:`window_nights`, :func:`has_baseline` and :func:`band` for one night in
``assess_night``); the history charts apply it to every night of every series at once
(:func:`baseline_tracks`). Pure: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from service.regressions.robust import gather
from service.regressions.rules import DEFAULT_PARAMS, DetectorParams, from_log

MAD_TO_SD = 1.4826  # MAD -> standard deviation for normal noise (Rousseeuw & Croux, JASA 1993)
BAND = 2  # the band's half-width, in noise
MIN_NOISE_NIGHTS = 3  # fewer nights in the window: no noise estimate (0)


def window_nights(since_reset: int, p: DetectorParams) -> int:
    """Nights in the baseline window of a night ``since_reset`` nights after the last reset."""
    return min(since_reset, p.window)


def has_baseline(nights: int | np.ndarray, p: DetectorParams) -> bool | np.ndarray:
    """Whether a window of ``nights`` nights makes a baseline (elementwise for an array)."""
    return nights >= p.min_baseline


def scaled_noise(
    mid: np.ndarray,
    nights: np.ndarray,
    memory: np.ndarray,
    p: DetectorParams,
) -> np.ndarray:
    """The noise from the median absolute successive difference of windows of log levels.

    Args:
        mid: the median absolute successive difference of each window (NaN counts as 0).
        nights: the nights in each window.
        memory: True where the window is peak memory (no noise floor).
        p: detector constants (the noise floor).

    Returns:
        ``mid`` times 1.4826 / sqrt(2) in log units: 0 from fewer than 3 nights, at least
        ``p.noise_floor`` for latency.
    """
    noise = np.where(
        nights >= MIN_NOISE_NIGHTS, np.nan_to_num(mid * (MAD_TO_SD / math.sqrt(2)), nan=0.0), 0.0
    )
    return np.maximum(noise, np.where(memory, 0.0, p.noise_floor))


def window_noise(
    y: np.ndarray,
    rows: np.ndarray,
    start: np.ndarray,
    size: np.ndarray,
    p: DetectorParams,
    memory: np.ndarray,
) -> np.ndarray:
    """Robust night-to-night noise of windows of log levels.

    The median absolute successive difference times 1.4826 / sqrt(2): a standard deviation for
    normal noise that ignores outlier nights, steps and slow drift (von Neumann's successive
    differences made robust; the MAD factor of Rousseeuw & Croux, JASA 1993).

    Args:
        y: (series, nights) log levels.
        rows: (n,) series index of each window.
        start: (n,) first night of each window.
        size: (n,) nights in each window (<= ``p.window``): the windows are
            ``y[row, start : start + size]``.
        p: detector constants (window, noise floor).
        memory: (series,) True for peak memory.

    Returns:
        Shape (n,): the noise in log units (0.01 ~ 1%), at least ``p.noise_floor`` for
        latency, 0 from fewer than 3 nights.
    """
    win = gather(y, rows, start, size, p.window)
    diffs = np.abs(np.diff(win, axis=1))  # NaN past the window's end
    ordered = np.sort(diffs, axis=1)
    cnt = np.maximum(size - 1, 1)
    lo = np.take_along_axis(ordered, ((cnt - 1) // 2)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (cnt // 2)[:, None], axis=1)[:, 0]
    return scaled_noise(0.5 * (lo + hi), size, memory[rows], p)


def pooled_noise(
    y: np.ndarray,
    rows: np.ndarray,
    base_start: np.ndarray,
    base_size: np.ndarray,
    run_start: np.ndarray,
    run_size: np.ndarray,
    p: DetectorParams,
    memory: np.ndarray,
) -> np.ndarray:
    """Night-to-night noise pooled from a baseline window and the run judged against it.

    The same estimator as :func:`window_noise` (median absolute successive difference times
    1.4826 / sqrt(2)), over the successive differences inside the baseline and inside the run,
    never across the step between them: the pooled variance of the two-sample t-test made
    robust. A baseline of 8 nights alone gives a noise that strays by about 30% from the
    truth; the run's nights halve that, so a step of +20% on a host whose nights stray by 5%
    is not held below the grey zone's margin for ever by one high estimate (issue 17).

    Args:
        y: (series, nights) log levels.
        rows: (n,) series index of each pair of windows.
        base_start: (n,) first night of each baseline window.
        base_size: (n,) nights in each baseline window (<= ``p.window``).
        run_start: (n,) first night of each run.
        run_size: (n,) nights in each run (<= ``max(p.max_run, p.drift_nights)``).
        p: detector constants (window, run lengths, noise floor).
        memory: (series,) True for peak memory.

    Returns:
        Shape (n,): the noise in log units, at least ``p.noise_floor`` for latency, 0 from
        fewer than 3 nights in all.
    """
    base = gather(y, rows, base_start, base_size, p.window)
    run = gather(y, rows, run_start, run_size, max(p.max_run, p.drift_nights))
    diffs = np.concatenate([np.abs(np.diff(base, axis=1)), np.abs(np.diff(run, axis=1))], axis=1)
    ordered = np.sort(diffs, axis=1)  # NaN last
    cnt = np.maximum(np.maximum(base_size - 1, 0) + np.maximum(run_size - 1, 0), 1)
    lo = np.take_along_axis(ordered, ((cnt - 1) // 2)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (cnt // 2)[:, None], axis=1)[:, 0]
    return scaled_noise(0.5 * (lo + hi), base_size + run_size - 1, memory[rows], p)


def band(
    base_log: np.ndarray | float,
    noise: np.ndarray | float,
    memory: np.ndarray | bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The band's ``(lower, upper)`` edges in the levels' unit: the baseline ± 2 noise on the
    log scale (``base_log`` and ``noise`` in log units; ``memory`` broadcasts)."""
    return (
        from_log(np.asarray(base_log - BAND * noise), memory),
        from_log(np.asarray(base_log + BAND * noise), memory),
    )


# --------------------------------------------------------------------------------------------
# Every night of many series at once (the history charts)


@dataclass(frozen=True)
class BaselineTrack:
    """Per night of one series: baseline and band (NaN where there is none). Shapes (n,).

    ``baseline`` is in the series' unit (the median of the window's levels, exact bytes for
    memory); ``lower``/``upper`` are the baseline ± 2 noise on the detector's log scale;
    ``noise`` is in log units.
    """

    baseline: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    noise: np.ndarray


@dataclass(frozen=True)
class SeriesLevels:
    """Input of :func:`baseline_tracks` for one series.

    Attributes:
        levels: night levels (median of each night's samples), oldest first, shape (n,);
            ms (> 0) or bytes (>= 0).
        memory: peak memory (log1p scale, no noise floor) rather than latency (log scale).
        resets: ``(index, effective_from)`` pairs: the baseline restarts at night ``index``
            for every night ``j >= effective_from``. A night ``i`` marked ``expected`` is
            ``(i, i)``; a step first seen at ``i`` and raised that night is ``(i, i + 1)``.
    """

    levels: Sequence[float] | np.ndarray
    memory: bool
    resets: Sequence[tuple[int, int]] = ()


def _log(v: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Log levels of a flat array: ``log1p`` where ``memory``, else ``log``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(memory, np.log1p(v), np.log(v))


def _segment_starts(n: int, resets: Sequence[tuple[int, int]]) -> np.ndarray:
    start = np.zeros(n, dtype=int)
    for index, effective in resets:
        if 0 <= effective < n:
            start[effective:] = np.maximum(start[effective:], index)
    return start


def _stretches(
    series: Sequence[SeriesLevels],
) -> tuple[list[np.ndarray], list[tuple[int, int, int, int]]]:
    """The levels of every series, and the pieces of its nights that share a baseline start:
    ``(series, lo, hi, stretch start)``, nights ``lo:hi`` with the baseline since ``start``."""
    linear: list[np.ndarray] = []
    pieces: list[tuple[int, int, int, int]] = []
    for i, s in enumerate(series):
        lv = np.asarray(s.levels, dtype=float)
        linear.append(lv)
        start = _segment_starts(lv.size, s.resets)
        cuts = np.flatnonzero(np.diff(start)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, lv.size], strict=True):
            if hi > lo:
                pieces.append((i, int(lo), int(hi), int(start[lo])))
    return linear, pieces


def _prev_window_mids(
    segments: Sequence[np.ndarray],
    w: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every position j of every segment: the two middle order statistics of the window
    ``segment[max(0, j - w):j]`` and its size ``k = min(j, w)``.

    Their mean is the window's median (equal to ``np.median``; for ``k = 0`` they are NaN).
    All windows of all segments are gathered into one (positions, w) array and sorted at once:
    each segment is preceded by ``w`` NaNs, which sort last, so the first ``k`` entries of a
    sorted window are its values. Medians of log levels and of levels share their order
    statistics, so one pass serves both.

    Returns:
        ``(lo, hi, k)`` for the segments' positions one after the other, shape (sum of lengths,).
    """
    lengths = np.array([len(seg) for seg in segments], dtype=np.int64)
    gap = np.full(w, np.nan, dtype=segments[0].dtype if segments else float)
    padded = np.concatenate([gap] + [part for seg in segments for part in (seg, gap)])
    # Position j of segment i sits at padded index starts[i] + w + j; its window starts at
    # starts[i] + j.
    starts = np.concatenate([[0], np.cumsum(lengths + w)[:-1]]) if len(lengths) else lengths
    j = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    windows = np.sort(sliding_window_view(padded, w)[np.repeat(starts, lengths) + j], axis=-1)
    k = np.minimum(j, w)
    lo = np.take_along_axis(windows, np.maximum((k - 1) // 2, 0)[:, None], axis=-1)[:, 0]
    hi = np.take_along_axis(windows, np.minimum(k // 2, w - 1)[:, None], axis=-1)[:, 0]
    return lo, hi, k


def _stretch_noise(
    segments: Sequence[np.ndarray],
    nights: np.ndarray,
    memory: np.ndarray,
    p: DetectorParams,
) -> np.ndarray:
    """The noise at every night of every stretch (one after the other), from the successive
    differences inside its window: the differences' window (of size ``window - 1``) before
    difference ``j - 1``. In float32: the noise only sets the band's width (relative error
    ~1e-7), and the sort moves half the bytes."""
    lengths = np.array([len(seg) for seg in segments])
    flat = np.concatenate(segments)
    seg_start = np.cumsum(lengths) - lengths
    diff_ok = np.ones(flat.size, dtype=bool)
    diff_ok[seg_start] = False  # the first night of a stretch has no difference before it
    diffs_all = np.abs(np.diff(_log(flat, memory), prepend=np.nan)).astype(np.float32)
    d_segments = np.split(diffs_all[diff_ok], np.cumsum(np.maximum(lengths - 1, 0))[:-1])
    d_lo, d_hi, _ = _prev_window_mids(d_segments, p.window - 1)
    # Night j of stretch i sits at flat position q; the window before its difference j - 1
    # sits at q - i - 1 among the differences (each stretch drops its first night's).
    d_index = np.clip(
        np.arange(flat.size) - np.repeat(np.arange(len(segments)) + 1, lengths), 0, None
    )
    mid = 0.5 * (d_lo[d_index] + d_hi[d_index]) if d_lo.size else np.zeros(flat.size)
    return scaled_noise(mid, nights, memory, p)


def baseline_tracks(
    series: Sequence[SeriesLevels],
    params: DetectorParams = DEFAULT_PARAMS,
) -> list[BaselineTrack]:
    """The baseline the detector holds at each night of each series.

    The rule of this module, computed for every night at once: the baseline is the median of
    the levels of the ``k = min(nights since the last reset, window)`` earlier nights, none
    when ``k < min_baseline``; the band is the median of their log levels ± 2 noise. The
    stretches between resets of every series are sorted window by window in two vectorised
    passes (levels, then successive differences), so a whole model costs two sorts.

    Returns:
        One track per series, in order; NaN where there is no baseline. Equal to
        ``assess_night``'s ``baseline`` night by night (and to its band for latency; for peak
        memory ``assess_night`` puts the upper edge at the window's recurring envelope, the
        detector's test for memory, which the charts leave out).
    """
    linear, pieces = _stretches(series)
    out = [
        BaselineTrack(
            baseline=np.full(lv.size, np.nan),
            lower=np.full(lv.size, np.nan),
            upper=np.full(lv.size, np.nan),
            noise=np.zeros(lv.size),
        )
        for lv in linear
    ]
    if not pieces:
        return out
    segments = [linear[i][st:hi] for i, _, hi, st in pieces]
    lengths = np.array([len(seg) for seg in segments])
    mem = np.repeat([series[i].memory for i, *_ in pieces], lengths)
    lo, hi, k = _prev_window_mids(segments, params.window)  # k: nights in each window
    have = has_baseline(k, params)
    base = np.where(have, 0.5 * (lo + hi), np.nan)
    noise = _stretch_noise(segments, k, mem, params)
    lower, upper = band(0.5 * (_log(lo, mem) + _log(hi, mem)), noise, mem)
    lower, upper = np.where(have, lower, np.nan), np.where(have, upper, np.nan)
    seg_start = np.cumsum(lengths) - lengths
    for (i, a, b, st), s0 in zip(pieces, seg_start.tolist(), strict=True):
        rows = slice(s0 + a - st, s0 + b - st)
        track = out[i]
        track.baseline[a:b] = base[rows]
        track.lower[a:b] = lower[rows]
        track.upper[a:b] = upper[rows]
        track.noise[a:b] = noise[rows]
    return out


def baseline_track(
    levels: Sequence[float] | np.ndarray,
    *,
    memory: bool,
    resets: Sequence[tuple[int, int]] = (),
    params: DetectorParams = DEFAULT_PARAMS,
) -> BaselineTrack:
    """:func:`baseline_tracks` for one series (see :class:`SeriesLevels` for the arguments)."""
    return baseline_tracks([SeriesLevels(levels, memory, resets)], params)[0]
