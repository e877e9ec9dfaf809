"""Offline detection: change points over the whole series (``detect_series(online=False)``).

The moving two-window scan with non-maximum suppression, a robust two-level step fit near
each peak and a drift check per stretch between change points; the method and its sources are
described in docs/detection.md. Pure: numpy and scipy only.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from service.regressions.baseline import window_noise
from service.regressions.robust import gather, median_last, prev_median, row_median
from service.regressions.rules import (
    CHUNK,
    MEDIAN_VAR,
    DetectorParams,
    Found,
    cutoff,
    segment_matrix,
    significant,
)


def _offline_pass(y, lengths, thr, memory, p: DetectorParams):
    rows_n, cols = y.shape
    w = p.window
    # One extra column so that the window ending at a full row's last night has a column.
    padded = prev_median(np.concatenate([y, np.full((rows_n, 1), np.nan)], axis=1), w)
    level = padded[:, :cols]
    col = np.arange(cols)[None, :]
    fwd = _forward_median(y, lengths, padded, w)
    kf = np.clip(lengths[:, None] - col, 0, w)
    kb = np.broadcast_to(np.minimum(col, w), y.shape)
    valid = (col < lengths[:, None]) & (kb >= p.min_baseline) & (kf >= 2)
    least = thr * (1 - p.z * (1 - p.grey_fraction) / (p.z + p.z_low))
    with np.errstate(invalid="ignore", divide="ignore"):
        est = fwd - level
        nxt = np.concatenate([y[:, 1:], np.full((rows_n, 1), np.nan)], axis=1)
        first2_lo = np.fmin(y, nxt) - level
        first2_hi = np.fmax(y, nxt) - level
        screen = (
            valid
            & (np.abs(est) >= least[:, None])
            & np.where(est > 0, first2_lo >= 0.5 * est, first2_hi <= 0.5 * est)
        )
    # The noise only where the screen lets a change through.
    r, j = np.nonzero(screen)
    noise = np.zeros(y.shape)
    noise[r, j] = window_noise(y, r, j - kb[r, j], kb[r, j], p, memory)
    se = noise[r, j] * np.sqrt(MEDIAN_VAR * (1.0 / kf[r, j] + 1.0 / kb[r, j]))
    passed = np.abs(est[r, j]) >= cutoff(thr[r], se, p)
    reg = np.zeros(y.shape, dtype=bool)
    imp = np.zeros(y.shape, dtype=bool)
    reg[r[passed], j[passed]] = est[r[passed], j[passed]] > 0
    imp[r[passed], j[passed]] = est[r[passed], j[passed]] < 0
    # Rank by the change itself: it peaks where the two windows are cleanest, whereas est/se
    # would follow the noise estimate's own wobble.
    score = np.where(reg | imp, np.abs(est), -np.inf)
    half = max(w // 2, 1)
    peak = ndimage.maximum_filter1d(score, size=2 * half + 1, axis=1, mode="constant", cval=-np.inf)
    # Ties on a plateau: keep the earliest night of the plateau.
    left = np.concatenate([np.full((rows_n, 1), -np.inf), score[:, :-1]], axis=1)
    keep = np.isfinite(score) & (score >= peak) & (left < score)
    r, j = np.nonzero(keep)
    up = reg[r, j]
    j = _refine(
        y, lengths, r, j, level[r, j], fwd[r, j], half, np.where(up[:, None], reg[r], imp[r])
    )
    # Two peaks of one plateau may settle on the same night.
    _, once = np.unique(r * cols + j, return_index=True)
    r, j, up = r[once], j[once], up[once]
    kb_s, kf_s = kb[r, j], kf[r, j]
    ok, pv = significant(y, r, j, kf_s, j - kb_s, kb_s, up, memory, noise[r, j], p, w)
    r, j, up, pv, kb_s, kf_s = r[ok], j[ok], up[ok], pv[ok], kb_s[ok], kf_s[ok]
    found = [
        Found(
            rows=r,
            first=j,
            raised=j,
            up=up,
            pval=pv,
            drift=np.zeros(r.size, dtype=bool),
            base_start=j - kb_s,
            base_size=kb_s,
            post_start=j,
            post_size=kf_s,
        )
    ]
    if p.drift:
        found.append(_offline_drift(y, lengths, r, j, fwd, thr, memory, p))
    return Found.concat(found)


def _forward_median(y, lengths, level_padded, w):
    """``fwd[:, j] = median(y[:, j : min(j + w, L)])`` for each row of length L.

    A full forward window is the backward window ending w nights later, so only the last
    w - 1 nights of each row need their own (shorter) medians: the medians of the prefixes of
    the row's tail read backwards.
    """
    rows_n, cols = y.shape
    shift = np.full((rows_n, cols), np.nan)
    if cols + 1 > w:
        shift[:, : cols + 1 - w] = level_padded[:, w:]
    tail = gather(y, np.arange(rows_n), lengths - (w - 1), np.full(rows_n, w - 1), w - 1)
    tail = tail[:, ::-1]  # tail[:, i] is night L - 1 - i (read only for i < L)
    for size in range(1, w):
        j = lengths - size
        ok = j >= 0
        shift[np.nonzero(ok)[0], j[ok]] = row_median(tail[ok, :size])
    return shift


def _refine(y, lengths, rows, cols, before, after, half, allowed):
    """Place each change point where a two-level step fits best near the peak.

    Medians of overlapping windows barely move near a change point, so the peak of their
    difference can sit a few nights off. Each night within ``half`` of the peak is classed as
    nearer the level before or after; the change point is the split with the fewest
    misclassed nights (a robust step fit with a 0-1 loss, cf. asv's ``step_detect``), among
    the nights where a change is ``allowed`` (rows of it, one per change point); ties go to
    the split nearest the peak.
    """
    if rows.size == 0:
        return cols
    offs = np.arange(-half, half + 1)
    idx = cols[:, None] + offs[None, :]
    inside = (idx >= 0) & (idx < lengths[rows][:, None])
    vals = y[rows[:, None], np.clip(idx, 0, y.shape[1] - 1)]
    mid = 0.5 * (before + after)
    high = np.where((after > before)[:, None], vals > mid[:, None], vals < mid[:, None]) & inside
    low = ~high & inside
    # cost(split at offset i) = high nights before i + low nights from i on
    high_before = np.concatenate([np.zeros((rows.size, 1)), np.cumsum(high, axis=1)], axis=1)
    low_after = np.concatenate(
        [np.cumsum(low[:, ::-1], axis=1)[:, ::-1], np.zeros((rows.size, 1))], axis=1
    )
    cost = (high_before + low_after)[:, :-1]
    ok = inside & np.take_along_axis(allowed, np.clip(idx, 0, y.shape[1] - 1), axis=1)
    cost = np.where(ok, cost + np.abs(offs)[None, :] / (4.0 * half + 4.0), np.inf)
    return cols + offs[np.argmin(cost, axis=1)]


def _offline_drift(y, lengths, cp_rows, cp_cols, fwd, thr, memory, p):
    """Drift inside each stretch between change points: first window against last window."""
    w = p.window
    rows = np.r_[np.arange(lengths.size), cp_rows]
    starts = np.r_[np.zeros(lengths.size, dtype=int), cp_cols]
    order = np.lexsort((starts, rows))
    rows, starts = rows[order], starts[order]
    ends = np.r_[starts[1:], 0]
    last = np.r_[rows[1:] != rows[:-1], True]
    ends = np.where(last, lengths[rows], ends)
    long = ends - starts >= 3 * w
    rows, starts, ends = rows[long], starts[long], ends[long]
    if rows.size == 0:
        return Found.empty()
    head = gather(y, rows, starts, np.full(rows.size, w), w)
    tail = gather(y, rows, ends - w, np.full(rows.size, w), w)
    h, t = median_last(head), median_last(tail)
    est = t - h
    nz = window_noise(y, rows, starts, np.full(rows.size, w), p, memory)
    se = nz * np.sqrt(MEDIAN_VAR * 2.0 / w)
    cut = cutoff(thr[rows], se, p, drift=True)
    up = est > 0
    cand = np.abs(est) >= cut
    ok, pv = significant(
        y,
        rows,
        ends - w,
        np.full(rows.size, w),
        starts,
        np.full(rows.size, w),
        up,
        memory,
        nz,
        p,
        w,
    )
    sel = cand & ok
    rows, starts, ends, est, pv, h, up = (a[sel] for a in (rows, starts, ends, est, pv, h, up))
    # The drift's night: where the forward level first crosses half of the change.
    col = np.arange(y.shape[1])[None, :]
    inside = (col >= starts[:, None]) & (col <= (ends - w)[:, None])
    crossed = np.where(
        up[:, None],
        fwd[rows] - h[:, None] >= 0.5 * est[:, None],
        fwd[rows] - h[:, None] <= 0.5 * est[:, None],
    )
    first = np.argmax(inside & crossed, axis=1)
    full = np.full(rows.size, w)
    # The new level is the stretch's last window.
    return Found(
        rows=rows,
        first=first,
        raised=first,
        up=up,
        pval=pv,
        drift=np.ones(rows.size, dtype=bool),
        base_start=starts,
        base_size=full,
        post_start=ends - w,
        post_size=full,
    )


def offline_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, p):
    """Offline change points of segments of ``y`` (series, nights), in chunks of rows; one flag list per segment."""
    out = []
    for c0 in range(0, seg_rows.size, CHUNK):
        rs, st = seg_rows[c0 : c0 + CHUNK], seg_starts[c0 : c0 + CHUNK]
        ym, lengths = segment_matrix(y, rs, st, seg_ends[c0 : c0 + CHUNK])
        f = _offline_pass(ym, lengths, thr[rs], mem[rs], p)
        out.append(f.moved(rs, st))
    return out
