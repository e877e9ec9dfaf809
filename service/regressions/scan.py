"""Detection over many series at once: ``(series, nights)`` matrices in, flags out.

The method (baseline window, noise, grey-zone magnitude rule, persistence, significance,
drift anchor, and the offline two-window change-point scan) is described, with its sources, in
docs/detection.md. This module holds the online pass (night by night) and the
batch driver shared by one series (``assess_night``), a document (``detect_document``) and the
100,000-series benchmark; the rules both passes share are in :mod:`service.regressions.rules`
and :mod:`service.regressions.baseline`, the offline scan in :mod:`service.regressions.offline`.
Pure: numpy and scipy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import DetectionInputError
from service.regressions.baseline import pooled_noise, window_noise
from service.regressions.offline import offline_batch
from service.regressions.persist import (
    History,
    came_back,
    located_first,
    outlasts,
    short_baseline_cut,
)
from service.regressions.robust import gather, median_last, prev_median, row_median
from service.regressions.rules import (
    CHUNK,
    DEFAULT_PARAMS,
    MEDIAN_VAR,
    MODE_SAME,
    DetectorParams,
    Flag,
    Found,
    cutoff,
    from_log,
    multimodal,
    night_clock,
    quartile_nights,
    run_median,
    segment_matrix,
    significant,
    to_log,
)

__all__ = [
    "DEFAULT_PARAMS",
    "MEDIAN_VAR",
    "DetectorParams",
    "Flag",
    "detect_series",
    "from_log",
    "to_log",
]


# --------------------------------------------------------------------------------------------
# Online: night by night


RECENT, ANCHOR = 0, 1  # a run judged against the recent window, or against the anchor (drift)


@dataclass(frozen=True)
class Batch:
    """The segments one online pass judges, and what every run of them is judged against.

    Attributes:
        y: (segments, nights) levels, log (:func:`~service.regressions.rules.to_log`), each
            row a segment starting at its last reset; NaN past its end.
        level: (segments, nights) the baseline median before each night.
        anchor: (segments,) the median of a segment's first ``window`` nights (the drift's
            reference).
        thr: (segments,) the threshold, log (``log1p(0.07)``).
        memory: (segments,) True for peak memory (judged by its envelope, no p-value).
        history: the segments' past across resets (:class:`~service.regressions.persist.History`).
        rerun: (segments, nights) 1 at a confirmation re-run of the night before it (0 or NaN
            elsewhere), or None without re-runs.
    """

    y: np.ndarray
    level: np.ndarray
    anchor: np.ndarray
    thr: np.ndarray
    memory: np.ndarray
    history: History
    rerun: np.ndarray | None


@dataclass(frozen=True)
class Runs:
    """Runs to judge, one per entry: nights ``last - length + 1 .. last`` of segment ``rows``.

    Attributes:
        rows: the segment row of each run.
        last: its last night (tonight, online).
        length: its number of nights.
        kind: ``RECENT`` (a step, against the recent window) or ``ANCHOR`` (a drift, against
            the anchor).
    """

    rows: np.ndarray
    last: np.ndarray
    length: np.ndarray
    kind: np.ndarray


@dataclass(frozen=True)
class Verdicts:
    """The rule's answer per run (or per night, for :func:`_judge_first`).

    Attributes:
        raised: the run passes every rule (magnitude, quartiles, first night, excursions,
            significance).
        up: its direction: True for a rise (a latency regression).
        p_value: the significance test's p-value where it ran, NaN elsewhere.
        combo: for :func:`_judge_first`, the index into its ``combos`` that raised, -1 if none.
    """

    raised: np.ndarray
    up: np.ndarray
    p_value: np.ndarray
    combo: np.ndarray | None = None


def _judge(batch: Batch, runs: Runs, p: DetectorParams) -> Verdicts:
    """The full online rule for each of ``runs`` (method: docs/detection.md, "Online")."""
    y, level, anchor, memory = batch.y, batch.level, batch.anchor, batch.memory
    rows, n, m, kind = runs.rows, runs.last, runs.length, runs.kind
    thr = batch.thr
    s = n - m + 1
    k = np.where(kind == RECENT, np.minimum(s, p.window), p.window)
    b0 = np.where(kind == RECENT, s - k, 0)
    ref = np.where(kind == RECENT, level[rows, np.clip(s, 0, level.shape[1] - 1)], anchor[rows])
    width = max(p.max_run, p.drift_nights)
    post = gather(y, rows, s, m, width)
    with np.errstate(invalid="ignore"):
        est = row_median(post) - ref
        lo, hi = quartile_nights(post)
    # A step's noise is pooled from its baseline and its run; a drift's run is a ramp, whose
    # successive differences are the drift itself: its noise is the anchor window's.
    noise = np.where(
        kind == RECENT,
        pooled_noise(y, rows, b0, k, s, m, p, memory),
        window_noise(y, rows, b0, k, p, memory),
    )
    # Multimodal peak memory: the jumps between its modes are not noise (the envelope and new
    # level rules judge them); its noise is the jitter inside a level.
    noise = np.where(memory[rows] & multimodal(gather(y, rows, b0, k, p.window)), MODE_SAME, noise)
    se = noise * np.sqrt(MEDIAN_VAR * (1.0 / m + 1.0 / k))
    cut = np.where(kind == ANCHOR, cutoff(thr[rows], se, p, drift=True), cutoff(thr[rows], se, p))
    # Online, a raised step is held to the threshold itself (docs/detection.md, "Magnitude").
    cut = np.where(kind == RECENT, np.maximum(cut, thr[rows]), cut)
    cut = np.where(
        (kind == RECENT) & (k < p.min_baseline),
        short_baseline_cut(cut, rows, ref, est, thr[rows], p, batch.history),
        cut,
    )
    up = est > 0
    ok = (np.abs(est) >= cut) & np.where(up, lo - ref >= 0.5 * est, hi - ref <= 0.5 * est)
    # A step's first night is itself at the new level: the quartile rule must not let a run
    # start one night early (its first night is where the commit range for bisection starts).
    first = post[:, 0] - ref
    ok &= (kind == ANCHOR) | np.where(up, first >= 0.5 * est, first <= 0.5 * est)
    # A step must outlast the series' recent excursions of its size (half way to the run's
    # nearest night, and at least the threshold and 3 noise).
    step = np.nonzero(ok & (kind == RECENT) & ~memory[rows])[0]
    if step.size and p.excursion_look:
        dist = np.fmax(
            np.maximum(thr[rows[step]], 3.0 * noise[step]),
            0.5 * np.where(up[step], lo[step] - ref[step], ref[step] - hi[step]),
        )
        ok[step] &= outlasts(
            rows[step], s[step], m[step], up[step], dist, p, batch.history, batch.rerun
        )
    pval = np.full(rows.size, np.nan)
    idx = np.nonzero(ok)[0]
    if idx.size:
        sig, pv = significant(
            y, rows[idx], s[idx], m[idx], b0[idx], k[idx], up[idx], memory, noise[idx], p, width
        )
        ok[idx] = sig
        pval[idx] = pv
    return Verdicts(raised=ok, up=up, p_value=pval)


def _screen(
    y: np.ndarray,
    lengths: np.ndarray,
    n_min: np.ndarray,
    thr: np.ndarray,
    p: DetectorParams,
    level: np.ndarray,
    anchor: np.ndarray,
) -> np.ndarray:
    """(series, nights) mask of the nights that may raise: a superset of the flags, cheap.

    A run of 2 to ``max_run`` nights ending there has its median at least the threshold from
    the baseline (for runs of 4+ nights, half of them that far, counted without a sort), or
    the drift window's median is that far from the anchor; and the night is live (inside the
    row, after ``n_min``).
    """
    rows_n, cols = y.shape
    col = np.arange(cols)
    least = thr  # online, a step must reach the threshold itself (:func:`_judge`)
    screen = np.zeros((rows_n, cols), dtype=bool)
    for m in range(2, min(p.max_run, cols) + 1):
        span = cols - m + 1  # runs [s, s + m) for s < span, ending at column s + m - 1
        ref = level[:, :span]
        with np.errstate(invalid="ignore"):
            if m <= 3:
                beyond = np.abs(run_median(y, m)[:, m - 1 :] - ref) >= least[:, None]
            else:
                # The median of m nights is beyond ref +- least only if (m + 1) // 2 of them
                # are: counting is a superset of the median's test, without a sort.
                up = np.zeros((rows_n, span), dtype=np.int8)
                down = np.zeros((rows_n, span), dtype=np.int8)
                for o in range(m):
                    d = y[:, o : o + span] - ref
                    up += d >= least[:, None]
                    down += d <= -least[:, None]
                beyond = np.maximum(up, down) >= (m + 1) // 2
        screen[:, m - 1 :] |= beyond & (col[:span] >= p.run_baseline)[None, :]
    if p.drift:
        # A drift needs the median of the last drift_nights nights beyond the threshold.
        med = run_median(y, p.drift_nights)
        with np.errstate(invalid="ignore"):
            screen |= (np.abs(med - anchor[:, None]) >= thr[:, None]) & (
                col - p.drift_nights + 1 >= 2 * p.window
            )
    live = (col[None, :] < lengths[:, None]) & (col[None, :] > n_min[:, None])
    return screen & live


@dataclass(frozen=True)
class RunShape:
    """A run to try at a night: its number of nights and its kind (``RECENT`` | ``ANCHOR``)."""

    length: int
    kind: int


def _judge_first(
    batch: Batch,
    rows: np.ndarray,
    nights: np.ndarray,
    combos: list[RunShape],
    p: DetectorParams,
    s_min: np.ndarray,
) -> Verdicts:
    """The first of ``combos`` that raises at each night ``(rows, nights)``, its run starting
    at night ``s_min[row]`` or later; ``Verdicts.combo`` is its index into ``combos`` (-1 if
    none raised), ``up`` and ``p_value`` its answer."""
    r, n, memory = rows, nights, batch.memory
    best = np.full(r.size, -1)
    best_up = np.zeros(r.size, dtype=bool)
    best_pv = np.full(r.size, np.nan)
    for i, shape in enumerate(combos):
        todo = np.nonzero(best < 0)[0]
        if todo.size == 0:
            break
        # A latency step may stand on three nights since a reset, peak memory (judged by its
        # envelope, with no p-value to hold a short baseline back) on ``min_baseline``.
        least = np.where(memory[r[todo]], p.min_baseline, p.run_baseline)
        valid = (
            n[todo] - shape.length + 1 >= (least if shape.kind == RECENT else 2 * p.window)
        ) & (n[todo] - shape.length + 1 >= s_min[r[todo]])
        todo = todo[valid]
        if todo.size == 0:
            continue
        runs = Runs(
            rows=r[todo],
            last=n[todo],
            length=np.full(todo.size, shape.length),
            kind=np.full(todo.size, shape.kind),
        )
        verdicts = _judge(batch, runs, p)
        ok = verdicts.raised
        best[todo[ok]] = i
        best_up[todo[ok]] = verdicts.up[ok]
        best_pv[todo[ok]] = verdicts.p_value[ok]
    return Verdicts(raised=best >= 0, up=best_up, p_value=best_pv, combo=best)


def _online_pass(
    y: np.ndarray,
    *,
    lengths: np.ndarray,
    n_min: np.ndarray,
    s_min: np.ndarray,
    thr: np.ndarray,
    memory: np.ndarray,
    level: np.ndarray,
    history: History,
    rerun: np.ndarray | None,
    p: DetectorParams,
) -> Found:
    """First flag of every row, each row a segment starting at column 0 (its last reset).

    Only nights ``n > n_min[row]`` raise, on runs from ``s_min[row]`` on (a resumed segment:
    after the night it came back on); ``level``: the baseline median before each night;
    ``history``, ``rerun``: as :class:`Batch` holds them. Positions are relative to the segment. Whole-matrix
    work is kept to a screen no flag escapes (a run's median at least the threshold from the
    baseline; for runs of 4+ nights, half of them that far, counted without a sort); the full
    rule then runs on each row's screened nights in order, until its first flag (whose first
    night is :func:`persist.located_first`).
    """
    rows_n, cols = y.shape
    w = p.window
    anchor = np.full(rows_n, np.nan)
    if cols >= w:
        anchor = median_last(y[:, :w])
    screen = _screen(y, lengths, n_min, thr, p, level, anchor)
    cr, cn = np.nonzero(screen)  # row-major: by row, then night
    if cr.size == 0:
        return Found.empty()
    starts = np.r_[0, np.nonzero(np.diff(cr))[0] + 1]
    rank = np.arange(cr.size) - np.repeat(starts, np.diff(np.r_[starts, cr.size]))
    # At one night: the longest run first (the earliest first night), the recent window before
    # the anchor.
    combos = [RunShape(m, RECENT) for m in range(p.max_run, 1, -1)]
    combos += [RunShape(p.drift_nights, ANCHOR)] * p.drift
    judged = Batch(
        y=y, level=level, anchor=anchor, thr=thr, memory=memory, history=history, rerun=rerun
    )
    done = np.zeros(rows_n, dtype=bool)
    found: dict[str, list[np.ndarray]] = {k: [] for k in ("r", "n", "m", "kind", "up", "pv")}
    lo_rank, batch, top = 0, 2, int(rank.max())
    while lo_rank <= top:
        # Growing batches: most rows flag at their first screened night, a few never do.
        sel = np.nonzero((rank >= lo_rank) & (rank < lo_rank + batch) & ~done[cr])[0]
        lo_rank, batch = lo_rank + batch, batch * 2
        if sel.size == 0:
            break
        r, n = cr[sel], cn[sel]
        verdicts = _judge_first(judged, r, n, combos, p, s_min)
        assert verdicts.combo is not None
        best, best_up, best_pv = verdicts.combo, verdicts.up, verdicts.p_value
        hit = np.nonzero(best >= 0)[0]
        # the first hit of each row (hits are in row, then night order)
        _, first = np.unique(r[hit], return_index=True)
        hit = hit[first]
        done[r[hit]] = True
        found["r"].append(r[hit])
        found["n"].append(n[hit])
        found["m"].append(np.array([combos[b].length for b in best[hit]], dtype=int))
        found["kind"].append(np.array([combos[b].kind for b in best[hit]], dtype=int))
        found["up"].append(best_up[hit])
        found["pv"].append(best_pv[hit])
    r, n, run, kind, up, pv = (
        np.concatenate(found[key]) for key in ("r", "n", "m", "kind", "up", "pv")
    )
    s = n - run + 1
    size = np.where(kind == RECENT, np.minimum(s, w), w)
    b0 = np.where(kind == RECENT, s - size, 0)
    return Found(
        rows=r,
        first=located_first(y, r, s, run, up, level, kind, s_min, history.clock, p),
        raised=n,
        up=up.astype(bool),
        pval=pv,
        drift=np.asarray(kind == ANCHOR),
        base_start=b0,
        base_size=size,
        post_start=s,
        post_size=run,
    )


# --------------------------------------------------------------------------------------------
# Batch driver shared by every entry point


def _compact(levels: np.ndarray, expected: np.ndarray):
    """Move each row's nights left (missing nights dropped).

    Returns the compacted levels, the original column of each compacted one, the number of
    nights of each row and the compacted ``expected`` marks.
    """
    present = ~np.isnan(levels)
    order = np.argsort(~present, axis=1, kind="stable")
    y = np.take_along_axis(levels, order, axis=1)
    lengths = present.sum(axis=1)
    # An `expected` mark on a missing night applies to the next night with data.
    exp_carry = expected.copy()
    if (expected & ~present).any():
        carried = np.zeros(levels.shape[0], dtype=bool)
        for j in range(levels.shape[1]):
            cur = exp_carry[:, j] | carried
            exp_carry[:, j] = cur & present[:, j]
            carried = cur & ~present[:, j]
    exp_c = np.take_along_axis(exp_carry, order, axis=1)
    return y, order, lengths, exp_c


def _segments(lengths: np.ndarray, exp_c: np.ndarray):
    """Segments (row, start, end) between resets at `expected` nights."""
    r, j = np.nonzero(exp_c)
    keep = j > 0
    r, j = r[keep], j[keep]
    rows = np.r_[np.arange(lengths.size), r]
    starts = np.r_[np.zeros(lengths.size, dtype=int), j]
    order = np.lexsort((starts, rows))
    rows, starts = rows[order], starts[order]
    ends = np.r_[starts[1:], 0]
    last = np.r_[rows[1:] != rows[:-1], True]
    ends = np.where(last, lengths[rows], ends)
    return rows, starts, ends


def _check_batch(levels, memory, threshold, expected):
    lv = np.asarray(levels, dtype=float)
    if lv.ndim != 2:
        raise DetectionInputError("levels: expected a (series, nights) matrix")
    mem = np.broadcast_to(np.asarray(memory, dtype=bool), (lv.shape[0],))
    thr = np.broadcast_to(np.asarray(threshold, dtype=float), (lv.shape[0],)).astype(float)
    if not np.all((thr > 0) & (thr < 10)):
        raise DetectionInputError("threshold: must be between 0 and 10 (0.07 = 7%)")
    bad = np.where(mem[:, None], lv < 0, lv <= 0) & ~np.isnan(lv)
    if bad.any() or np.isinf(lv).any():
        r, j = np.argwhere(bad | np.isinf(lv))[0]
        raise DetectionInputError(
            f"levels: series {r} night {j} is {lv[r, j]!r}; latency must be > 0, memory >= 0"
        )
    exp = (
        np.zeros(lv.shape, dtype=bool)
        if expected is None
        else np.broadcast_to(np.asarray(expected, dtype=bool), lv.shape)
    )
    return lv, mem, thr, exp


def _compact_marks(marks, lv: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Re-run marks (series, nights) moved as ``_compact`` moved the levels (a missing night
    is no re-run). Raises DetectionInputError when their shape is not the levels'."""
    rr = np.asarray(marks, dtype=bool)
    if rr.shape != lv.shape:
        raise DetectionInputError(f"rerun: expected shape {lv.shape}, got {rr.shape}")
    return np.take_along_axis(rr & ~np.isnan(lv), order, axis=1)


def _flags(
    found: Found,
    y_lin: np.ndarray,
    order: np.ndarray,
    lengths: np.ndarray,
    online: bool,
    back: np.ndarray | None = None,
) -> list[Flag]:
    """``Found`` positions (compacted) as Flags in the input's columns, sorted by series and
    night; offline, ``raised_night`` is each series' last night. ``back``: per flag, the
    compacted night its series came back on (-1: none), or None."""
    # Report the baseline and the new level in the input's unit (exact bytes for memory).
    width = int(max(found.base_size.max(initial=1), found.post_size.max(initial=1)))
    rows = found.rows.astype(int)
    base = row_median(
        gather(y_lin, rows, found.base_start.astype(int), found.base_size.astype(int), width)
    )
    new = row_median(
        gather(y_lin, rows, found.post_start.astype(int), found.post_size.astype(int), width)
    )
    flags = []
    for i, row in enumerate(rows):
        raised = int(found.raised[i]) if online else int(lengths[row]) - 1
        b, v = float(base[i]), float(new[i])
        flags.append(
            Flag(
                series=int(row),
                night=int(order[row, int(found.first[i])]),
                raised_night=int(order[row, raised]),
                direction="regression" if found.up[i] else "improvement",
                change=v / b - 1 if b > 0 else (v - b) / 1.0,  # 0 bytes counts as 1 byte
                p_value=None if np.isnan(found.pval[i]) else float(found.pval[i]),
                baseline=b,
                kind="drift" if found.drift[i] else "step",
                resumed_night=(
                    int(order[row, back[i]]) if back is not None and back[i] >= 0 else None
                ),
            )
        )
    flags.sort(key=lambda f: (f.series, f.night, f.raised_night))
    return flags


def detect_series(
    levels: np.ndarray,
    *,
    memory: bool | np.ndarray,
    threshold: float | np.ndarray = 0.07,
    expected: np.ndarray | None = None,
    online: bool,
    params: DetectorParams = DEFAULT_PARAMS,
    rerun: np.ndarray | None = None,
    nights: np.ndarray | None = None,
) -> list[Flag]:
    """Detect regressions and improvements in a batch of series.

    Args:
        levels: (series, nights) matrix of night levels (median of each night's samples; ms or
            bytes); NaN for a missing night. Rows may be padded with NaN.
        memory: per series (or for all), True for peak memory (exact bytes, no p-value),
            False for latency.
        threshold: relative threshold per series (or for all); 0.07 = 7%.
        expected: (series, nights) booleans, True where a maintainer marked the step starting
            at that night ``expected`` (the baseline resets there).
        online: decide each night from the nights up to it (a flag is raised once, on the
            night it is decided) instead of seeing the whole series.
        params: detector constants.
        rerun: (series, nights) booleans, True where the night is a confirmation re-run of the
            night before it (the same build measured again). Online, a run holding a re-run
            after its first night is not held back by the series' excursions
            (``DetectorParams.excursion_look``); offline it changes nothing. None: no re-runs.
        nights: (series, nights) ordinal of the night each column was measured on (e.g. days
            since epoch), non-decreasing along a series; None: the column index. Online, a
            run's length is counted by it (``DetectorParams.excursion_cap``): a gap of ordinals
            is a missing night, and a re-run takes its night's ordinal whatever is given.

    Returns:
        Flags sorted by series then night; ``night`` and ``raised_night`` are column indices
        of ``levels``. Offline, ``raised_night`` is the series' last night.

    Raises:
        DetectionInputError: wrong shape (of ``levels``, ``rerun`` or ``nights``), a threshold
            outside (0, 10), a non-positive latency or a negative memory level, an infinite
            level, or night ordinals that decrease.
    """
    lv, mem, thr_lin, exp = _check_batch(levels, memory, threshold, expected)
    if lv.size == 0:
        return []
    y_lin, order, lengths, exp_c = _compact(lv, exp)
    rr = None if rerun is None else _compact_marks(rerun, lv, order)
    y = to_log(y_lin, mem)
    thr = np.log1p(thr_lin)
    seg_rows, seg_starts, seg_ends = _segments(lengths, exp_c)
    back = None
    if online:
        clock = night_clock(lv, order, lengths, rerun, nights)
        raw, resumed = _online_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, params, rr, clock)
        back = np.concatenate(resumed) if resumed else np.zeros(0, dtype=int)
    else:
        raw = offline_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, params)
    return _flags(Found.concat(raw), y_lin, order, lengths, online, back)


def _online_chunked(
    y,
    seg_rows,
    seg_starts,
    seg_ends,
    n_min,
    s_min,
    thr,
    mem,
    p,
    levels,
    devs,
    origin,
    offset,
    rerun,
    clock,
) -> Found:
    """One pass over all segments, in blocks of rows.

    ``levels`` holds the first pass's baselines, (first segments, width) float32; a later
    segment starting ``offset`` nights into first segment ``origin`` reuses them wherever its
    window lies wholly inside it, and computes only its first ``window`` nights afresh.
    ``devs`` (same shape) holds the first pass's nights against those baselines: a later
    segment's excursion rule reads the nights before its start there. ``rerun``: the re-run
    marks of ``y`` (same shape, bool), or None; ``clock``: the night of each of ``y``'s
    nights (same shape, :func:`night_clock`).
    """
    parts = []
    w = p.window
    for c0 in range(0, seg_rows.size, CHUNK):
        sl = slice(c0, c0 + CHUNK)
        ym, lengths = segment_matrix(y, seg_rows[sl], seg_starts[sl], seg_ends[sl])
        if origin is None:
            level = prev_median(ym, w)
            levels[c0 : c0 + ym.shape[0], : ym.shape[1]] = level
        else:
            rows_n, cols = ym.shape
            level = np.full((rows_n, cols), np.nan)
            for j in range(1, min(w, cols)):
                level[:, j] = median_last(ym[:, :j])
            if cols > w:
                level[:, w:] = gather(
                    levels, origin[sl], offset[sl] + w, np.full(rows_n, cols - w), cols - w
                )
        if origin is None:
            with np.errstate(invalid="ignore"):
                devs[c0 : c0 + ym.shape[0], : ym.shape[1]] = ym - level
            start = (np.arange(c0, c0 + ym.shape[0]), np.zeros(ym.shape[0], dtype=int))
        else:
            start = (origin[sl], offset[sl])
        history = History(
            devs=devs,
            origin=start[0],
            offset=start[1],
            clock=segment_matrix(clock, seg_rows[sl], seg_starts[sl], seg_ends[sl])[0],
            before=levels,
        )
        again = (
            None
            if rerun is None
            else segment_matrix(rerun, seg_rows[sl], seg_starts[sl], seg_ends[sl])[0]
        )
        f = _online_pass(
            ym,
            lengths=lengths,
            n_min=n_min[sl],
            s_min=s_min[sl],
            thr=thr[seg_rows[sl]],
            memory=mem[seg_rows[sl]],
            level=level,
            history=history,
            rerun=again,
            p=p,
        )
        f.rows = f.rows + c0
        parts.append(f)
    return Found.concat(parts)


def _online_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, p, rerun, clock):
    """Online passes until no segment raises again: each raised step starts the next
    segment (or, when the series came back from it, resumes the one it was raised in).
    Returns the ``Found`` of each pass (positions in ``y``'s columns) and, per pass, the
    column each flag's series came back on (-1: the step stood)."""
    out, resumed = [], []
    n_min = np.full(seg_rows.size, -1)
    s_min = np.zeros(seg_rows.size, dtype=int)
    width = max(int((seg_ends - seg_starts).max(initial=0)), 1)
    levels = np.full((seg_rows.size, width), np.nan, dtype=np.float32)
    devs = np.full((seg_rows.size, width), np.nan, dtype=np.float32)
    origin = offset = None
    while seg_rows.size:
        found = _online_chunked(
            y,
            seg_rows,
            seg_starts,
            seg_ends,
            n_min,
            s_min,
            thr,
            mem,
            p,
            levels,
            devs,
            origin,
            offset,
            rerun,
            clock,
        )
        rows = seg_rows[found.rows]
        starts = seg_starts[found.rows]
        ends = seg_ends[found.rows]
        out.append(found.moved(seg_rows, seg_starts))
        # The baseline restarts at the first night of a raised step, unless the series came
        # back from it before a new baseline stood: the baseline before it resumes there.
        back = came_back(y, rows, starts, ends, found, p)
        resumed.append(np.where(back >= 0, starts + back, -1))
        stood = back < 0
        origin = found.rows if origin is None else origin[found.rows]
        offset = (0 if offset is None else offset[found.rows]) + np.where(stood, found.first, 0)
        seg_rows, seg_ends = rows, ends
        seg_starts = starts + np.where(stood, found.first, 0)
        n_min = np.where(stood, found.raised - found.first, back)
        s_min = np.where(stood, 0, back + 1)
    return out, resumed
