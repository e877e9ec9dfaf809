"""Robust statistics for series of night levels (pure numpy; no I/O).

Rolling medians over ``(series, nights)`` matrices and the *recurring envelope* of a baseline
window (its highest level seen on at least two nights). Used by ``service.regressions.scan``;
the exact Mann-Whitney table the scan reads is :mod:`service.mann_whitney`'s.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# --------------------------------------------------------------------------------------------
# Rolling statistics on (series, nights) matrices; NaN only after a row's last night


def median_last(v: np.ndarray) -> np.ndarray:
    """Median over the last axis by one partition (much faster than np.median on window views).

    NaN sorts last, so a row holding NaN yields garbage; callers only read complete windows.
    """
    w = v.shape[-1]
    part = np.partition(v, w // 2, axis=-1)
    if w % 2:
        return part[..., w // 2]
    # The lower middle is the largest element left of the partition point.
    return 0.5 * (part[..., : w // 2].max(axis=-1) + part[..., w // 2])


def prev_median(x: np.ndarray, w: int, chunk: int = 1024) -> np.ndarray:
    """``out[:, j] = median(x[:, max(0, j - w):j])``; NaN for j = 0.

    Full windows are computed in float32 (log levels: a relative error below 1e-6, far under
    any threshold) for speed; the result is float64.
    """
    rows, cols = x.shape
    out = np.full((rows, cols), np.nan)
    for j in range(1, min(w, cols)):
        out[:, j] = median_last(x[:, :j])
    if cols > w:
        x32 = x.astype(np.float32)
        for r0 in range(0, rows, chunk):
            view = sliding_window_view(x32[r0 : r0 + chunk, : cols - 1], w, axis=1)
            out[r0 : r0 + chunk, w:] = median_last(view)
    return out


# --------------------------------------------------------------------------------------------
# Candidate evaluation (significance / envelope) for gathered windows


def row_median(x: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN for an all-NaN row); faster than np.nanmedian."""
    ordered = np.sort(x, axis=1)  # NaN last
    cnt = np.sum(~np.isnan(x), axis=1)
    c = np.maximum(cnt, 1)
    lo = np.take_along_axis(ordered, ((c - 1) // 2)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (c // 2)[:, None], axis=1)[:, 0]
    return np.where(cnt > 0, 0.5 * (lo + hi), np.nan)


def gather(y: np.ndarray, rows: np.ndarray, start: np.ndarray, size: np.ndarray, width: int):
    """Values ``y[rows, start : start + size]`` padded with NaN to ``width`` columns."""
    offs = np.arange(width)
    idx = start[:, None] + offs[None, :]
    ok = offs[None, :] < size[:, None]
    vals = y[rows[:, None], np.clip(idx, 0, y.shape[1] - 1)]
    return np.where(ok, vals, np.nan)


def envelope(base: np.ndarray, tol: np.ndarray, upper: bool) -> np.ndarray:
    """Highest (or lowest) level seen on at least two nights of each row, within ``tol``.

    A level seen once (an outlier night) is left out; when no level recurs, the plain maximum
    (minimum) is used.

    Args:
        base: (n, k) levels, NaN-padded.
        tol: (n,) how close two nights must be to count as the same level.
        upper: the highest recurring level, else the lowest.

    Returns:
        Shape (n,).
    """
    s = np.sort(base, axis=1)  # NaN last; a NaN gap is never close
    gap = np.abs(np.diff(s, axis=1))
    close = gap <= tol[:, None]
    rec = np.zeros(s.shape, dtype=bool)
    rec[:, 1:] |= close
    rec[:, :-1] |= close
    fill = -np.inf if upper else np.inf
    cand = np.where(rec & ~np.isnan(s), s, fill)
    env = cand.max(axis=1) if upper else cand.min(axis=1)
    plain = np.nanmax(base, axis=1) if upper else np.nanmin(base, axis=1)
    return np.where(np.isfinite(env), env, plain)
