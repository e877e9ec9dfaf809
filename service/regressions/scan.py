"""Detection over many series at once: ``(series, nights)`` matrices in, flags out.

The method (baseline window, noise, grey-zone magnitude rule, persistence, significance,
drift anchor, and the offline two-window change-point scan) is described, with its sources, in
``service.regressions.detection``; this module is its vectorised implementation, shared by one
series (``assess_night``), a document (``detect_document``) and the 100,000-series benchmark.
Pure: numpy and scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import ndimage, stats

from service.regressions.robust import (
    MWU_MAX,
    DetectionInputError,
    envelope,
    gather,
    median_last,
    mwu_p,
    mwu_tail,
    prev_median,
    row_median,
)

MAD_TO_SD = 1.4826  # MAD -> standard deviation for a normal distribution
MEDIAN_VAR = math.pi / 2  # variance of a median relative to a mean (large samples)
_CHUNK = 8192  # series per block of matrix work (bounds memory)


@dataclass(frozen=True)
class DetectorParams:
    """Constants of the detector (see the module docstring for their roles).

    Attributes:
        window: earlier nights in a baseline (and nights per side offline).
        min_baseline: fewest earlier nights that make a baseline.
        max_run: longest run of recent nights (re-runs included) tested for persistence.
        alpha: one-sided significance level of the Mann-Whitney U test.
        z: standard-normal quantile by which a noisy change may fall short of the threshold.
        z_low: standard-normal quantile by which a change must clear the grey zone's lower edge.
        grey_fraction: the lower edge of the grey zone as a fraction of the threshold.
        visited: a new level is not new when this many baseline nights reach it (bimodal).
        noise_floor: least night-to-night noise assumed for latency (log units, 0.001 ~ 0.1%).
        drift: compare with the anchor window as well (slow drift).
        drift_nights: recent nights whose median is compared with the anchor.
    """

    window: int = 28
    min_baseline: int = 4
    max_run: int = 7
    alpha: float = 0.01
    z: float = 1.645
    z_low: float = 2.576
    grey_fraction: float = 0.5
    visited: int = 3
    noise_floor: float = 0.001
    drift: bool = True
    drift_nights: int = 7

    def __post_init__(self) -> None:
        if not (2 <= self.min_baseline <= self.window <= MWU_MAX and 2 <= self.max_run <= 8
                and 2 <= self.drift_nights <= self.window):
            raise DetectionInputError(
                f"params: need 2 <= min_baseline <= window <= {MWU_MAX}, 2 <= max_run <= 8 "
                "and 2 <= drift_nights <= window")


DEFAULT_PARAMS = DetectorParams()


@dataclass(frozen=True)
class Flag:
    """A raised change of one series of a batch (positions are column indices).

    Attributes:
        series: row of the batch.
        night: column of the first night at the new level.
        raised_night: column of the night on which the flag is raised.
        direction: ``regression`` | ``improvement``.
        change: relative change of the new level against the baseline (0.12 = +12%).
        p_value: one-sided Mann-Whitney U p-value (latency), None for peak memory.
        baseline: baseline level, same unit as the input levels.
        kind: ``step`` (recent window or two-window scan) or ``drift`` (anchor comparison).
    """

    series: int
    night: int
    raised_night: int
    direction: str
    change: float
    p_value: float | None
    baseline: float
    kind: str = "step"


# --------------------------------------------------------------------------------------------
# Baselines, noise and runs


def _cutoff(thr: np.ndarray, se: np.ndarray, p: DetectorParams, drift: bool = False):
    """Least log change that counts: ``max(thr - z*se, grey*thr + z_low*se)``.

    A drift is not urgent (it keeps growing), so it must clear the threshold itself by
    ``z * se``: a grey-zone step judged against the anchor night after night would otherwise
    cross it by chance sooner or later.
    """
    high = thr + p.z * se if drift else thr - p.z * se
    return np.maximum(high, p.grey_fraction * thr + p.z_low * se)


def _run_median(y: np.ndarray, m: int) -> np.ndarray:
    """Median of ``y[:, n-m+1 : n+1]`` at column n (NaN for n < m - 1)."""
    rows, cols = y.shape
    med = np.full((rows, cols), np.nan)
    if cols < m:
        return med
    if m == 2:
        med[:, 1:] = 0.5 * (y[:, :-1] + y[:, 1:])
    elif m == 3:
        a, b, c = y[:, :-2], y[:, 1:-1], y[:, 2:]
        med[:, 2:] = np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    else:
        med[:, m - 1 :] = median_last(sliding_window_view(y, m, axis=1))
    return med


def _quartile_nights(post: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The run's lower and upper quartile nights: its lowest and highest for runs of up to 4.

    Args:
        post: (n, width) log levels of n runs, NaN past each run's end.

    Returns:
        Two arrays of shape (n,). From five nights on, one wild night neither lifts a run
        nor breaks it: a run of a week in a noisy series is not undone by one low night.
    """
    m = np.sum(~np.isnan(post), axis=1)
    ordered = np.sort(post, axis=1)  # NaN last
    q = (m - 1) // 4
    low = np.take_along_axis(ordered, q[:, None], axis=1)[:, 0]
    high = np.take_along_axis(ordered, (m - 1 - q)[:, None], axis=1)[:, 0]
    return low, high


def _significant(
    y: np.ndarray, rows: np.ndarray, post_start: np.ndarray, post_size: np.ndarray,
    base_start: np.ndarray, base_size: np.ndarray, up: np.ndarray, memory: np.ndarray,
    noise: np.ndarray, p: DetectorParams, width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Significance of candidate runs: (passes, p-value with NaN for memory).

    Latency: the exact one-sided Mann-Whitney U test of the run's levels against the
    baseline's. While the baseline is too short for any arrangement of ranks to reach
    ``alpha`` (two nights against fewer than 13, three against fewer than 7), a one-sided
    t-test of the change in medians over its standard error from the robust noise, with
    ``k - 1`` degrees of freedom, stands in (Student, Biometrika 1908; the prediction form
    with the baseline's spread), so that a young series or one just reset can be confirmed
    by a re-run. Also requires the new level to be new: fewer than ``p.visited`` baseline
    nights reach to within a quarter of the change of it. A bimodal benchmark's nights at its
    other mode, which the baseline visits regularly, are thereby not a step. A baseline of
    fewer than 12 nights allows fewer such nights (none below 8).
    """
    post = gather(y, rows, post_start, post_size, width)
    base = gather(y, rows, base_start, base_size, p.window)
    pval = np.full(rows.size, np.nan)
    with np.errstate(invalid="ignore"):
        change = row_median(post) - row_median(base)
        quarter = 0.25 * np.abs(change)
        # Against the run's lower quartile night (its lowest night for runs of up to 4), so
        # that one wild night cannot lift the run.
        m = np.sum(~np.isnan(post), axis=1)
        low, high = _quartile_nights(post)
        near = np.where(up[:, None], base >= (low - quarter)[:, None],
                        base <= (high + quarter)[:, None])
    # A short baseline (a young series, just reset) must not reach the new level at all.
    kb = np.sum(~np.isnan(base), axis=1)
    ok = near.sum(axis=1) < np.minimum(p.visited, np.maximum(1, kb // 4))
    new = ok.copy()
    lat = ~memory[rows]
    if lat.any():
        pval[lat] = mwu_p(post[lat], base[lat], up[lat])
        k = np.sum(~np.isnan(base), axis=1)
        short = lat & (mwu_tail(MWU_MAX, MWU_MAX)[m, k, m * k] > p.alpha)
        if short.any():
            se = noise[short] * np.sqrt(MEDIAN_VAR * (1.0 / m[short] + 1.0 / k[short]))
            t = np.where(up[short], change[short], -change[short]) / np.maximum(se, 1e-12)
            pval[short] = stats.t.sf(t, df=np.maximum(k[short] - 1, 1))
        ok[lat] = new[lat] & (pval[lat] <= p.alpha)
    mem = ~lat
    if mem.any():
        tol = np.maximum(3.0 * noise[mem], 1e-12)
        hi = envelope(base[mem], tol, upper=True)
        lo = envelope(base[mem], tol, upper=False)
        ok[mem] = new[mem] & np.where(up[mem], low[mem] > hi, high[mem] < lo)
    return ok, pval


# --------------------------------------------------------------------------------------------
# Online: night by night


@dataclass
class _Found:
    """Flags of a pass; positions relative to each row's segment."""

    rows: np.ndarray
    first: np.ndarray  # first night at the new level (start of the persisting nights)
    raised: np.ndarray
    up: np.ndarray
    pval: np.ndarray
    drift: np.ndarray
    base_start: np.ndarray  # baseline window [base_start, base_start + base_size)
    base_size: np.ndarray
    post_start: np.ndarray  # nights at the new level [post_start, post_start + post_size)
    post_size: np.ndarray


def window_noise(
    y: np.ndarray, rows: np.ndarray, start: np.ndarray, size: np.ndarray, p: DetectorParams,
    memory: np.ndarray,
) -> np.ndarray:
    """Robust night-to-night noise of windows of log levels.

    The median absolute successive difference times 1.4826 / sqrt(2): a standard deviation for
    normal noise that ignores outlier nights, steps and slow drift (von Neumann's successive
    differences made robust; the MAD factor of Rousseeuw & Croux, JASA 1993).

    Args:
        y: (series, nights) log levels.
        rows, start, size: shape (n,) each: the windows ``y[row, start : start + size]``
            (size <= ``p.window``).
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
    noise = np.nan_to_num(0.5 * (lo + hi) * (MAD_TO_SD / math.sqrt(2)), nan=0.0)
    noise = np.where(size >= 3, noise, 0.0)
    return np.maximum(noise, np.where(memory[rows], 0.0, p.noise_floor))


def _judge(y, level, anchor, rows, n, m, kind, thr, memory, p: DetectorParams):
    """The full rule for runs ``y[row, n-m+1 : n+1]``.

    Against the recent window (kind 0) or the anchor (kind 1); returns (passes, upwards,
    p-value).
    """
    s = n - m + 1
    k = np.where(kind == 0, np.minimum(s, p.window), p.window)
    b0 = np.where(kind == 0, s - k, 0)
    ref = np.where(kind == 0, level[rows, np.clip(s, 0, level.shape[1] - 1)], anchor[rows])
    width = max(p.max_run, p.drift_nights)
    post = gather(y, rows, s, m, width)
    with np.errstate(invalid="ignore"):
        est = row_median(post) - ref
        lo, hi = _quartile_nights(post)
    noise = window_noise(y, rows, b0, k, p, memory)
    se = noise * np.sqrt(MEDIAN_VAR * (1.0 / m + 1.0 / k))
    cut = np.where(kind == 1, _cutoff(thr[rows], se, p, drift=True), _cutoff(thr[rows], se, p))
    # Online, a raised step is held to the threshold itself: an alert reading "+6%" under a
    # 7% promise is not believed, and the allowance below it (thr - z*se, kept offline, where
    # a change point is located with both sides known) let 3% steps with heavy-tailed nights
    # through on week-long runs.
    cut = np.where(kind == 0, np.maximum(cut, thr[rows]), cut)
    up = est > 0
    ok = (np.abs(est) >= cut) & np.where(up, lo - ref >= 0.5 * est, hi - ref <= 0.5 * est)
    # A step's first night is itself at the new level: the quartile rule must not let a run
    # start one night early (its first night is where the commit range for bisection starts).
    first = post[:, 0] - ref
    ok &= (kind == 1) | np.where(up, first >= 0.5 * est, first <= 0.5 * est)
    pval = np.full(rows.size, np.nan)
    idx = np.nonzero(ok)[0]
    if idx.size:
        sig, pv = _significant(y, rows[idx], s[idx], m[idx], b0[idx], k[idx], up[idx], memory,
                               noise[idx], p, width)
        ok[idx] = sig
        pval[idx] = pv
    return ok, up, pval


def _online_pass(
    y: np.ndarray, lengths: np.ndarray, n_min: np.ndarray, thr: np.ndarray,
    memory: np.ndarray, p: DetectorParams, level: np.ndarray,
) -> _Found:
    """First flag of every row, each row a segment starting at column 0 (its last reset).

    Only nights ``n > n_min[row]`` may raise; ``level`` is the baseline median before each
    night (``prev_median(y, window)``). Returns positions relative to the segment.
    Whole-matrix work is kept to a screen that no flag can escape (a run's median at least the
    threshold from the baseline; for runs of 4+ nights, half of them that far, counted without
    a sort); the full rule then runs on the screened nights of each row in order, until the
    row's first flag.
    """
    rows_n, cols = y.shape
    w = p.window
    col = np.arange(cols)
    live = (col[None, :] < lengths[:, None]) & (col[None, :] > n_min[:, None])
    anchor = np.full(rows_n, np.nan)
    if cols >= w:
        anchor = median_last(y[:, :w])
    least = thr  # online, a step must reach the threshold itself (``_judge``)
    screen = np.zeros((rows_n, cols), dtype=bool)
    for m in range(2, min(p.max_run, cols) + 1):
        span = cols - m + 1  # runs [s, s + m) for s < span, ending at column s + m - 1
        ref = level[:, :span]
        with np.errstate(invalid="ignore"):
            if m <= 3:
                beyond = np.abs(_run_median(y, m)[:, m - 1 :] - ref) >= least[:, None]
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
        screen[:, m - 1 :] |= beyond & (col[:span] >= p.min_baseline)[None, :]
    if p.drift:
        # A drift needs the median of the last drift_nights nights beyond the threshold.
        med = _run_median(y, p.drift_nights)
        with np.errstate(invalid="ignore"):
            screen |= ((np.abs(med - anchor[:, None]) >= thr[:, None])
                       & (col - p.drift_nights + 1 >= 2 * w))
    screen &= live
    cr, cn = np.nonzero(screen)  # row-major: by row, then night
    e = np.zeros(0, dtype=int)
    if cr.size == 0:
        return _Found(e, e, e, e.astype(bool), np.zeros(0), e.astype(bool), e, e, e, e)
    starts = np.r_[0, np.nonzero(np.diff(cr))[0] + 1]
    rank = np.arange(cr.size) - np.repeat(starts, np.diff(np.r_[starts, cr.size]))
    # At one night: the longest run first (the earliest first night), the recent window before
    # the anchor.
    combos = [(m, 0) for m in range(p.max_run, 1, -1)]
    if p.drift:
        combos.append((p.drift_nights, 1))
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
        best = np.full(sel.size, -1)
        best_up = np.zeros(sel.size, dtype=bool)
        best_pv = np.full(sel.size, np.nan)
        for i, (run_m, run_kind) in enumerate(combos):
            todo = np.nonzero(best < 0)[0]
            if todo.size == 0:
                break
            mm = np.full(todo.size, run_m)
            kk = np.full(todo.size, run_kind)
            valid = n[todo] - run_m + 1 >= (p.min_baseline if run_kind == 0 else 2 * w)
            todo, mm, kk = todo[valid], mm[valid], kk[valid]
            if todo.size == 0:
                continue
            ok, up, pv = _judge(y, level, anchor, r[todo], n[todo], mm, kk, thr, memory, p)
            best[todo[ok]] = i
            best_up[todo[ok]] = up[ok]
            best_pv[todo[ok]] = pv[ok]
        hit = np.nonzero(best >= 0)[0]
        # the first hit of each row (hits are in row, then night order)
        _, first = np.unique(r[hit], return_index=True)
        hit = hit[first]
        done[r[hit]] = True
        found["r"].append(r[hit])
        found["n"].append(n[hit])
        found["m"].append(np.array([combos[b][0] for b in best[hit]], dtype=int))
        found["kind"].append(np.array([combos[b][1] for b in best[hit]], dtype=int))
        found["up"].append(best_up[hit])
        found["pv"].append(best_pv[hit])
    r, n, run, kind, up, pv = (np.concatenate(found[key])
                               for key in ("r", "n", "m", "kind", "up", "pv"))
    s = n - run + 1
    size = np.where(kind == 0, np.minimum(s, w), w)
    b0 = np.where(kind == 0, s - size, 0)
    return _Found(r, s, n, up.astype(bool), pv, np.asarray(kind == 1), b0, size, s, run)


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


def _segment_matrix(y: np.ndarray, rows, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    lengths = ends - starts
    width = max(int(lengths.max(initial=0)), 1)
    return gather(y, rows, starts, lengths, width), lengths


def to_log(levels: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Log levels, shape (series, nights): ``log(ms)`` for latency, ``log1p(bytes)`` for memory
    rows (``memory`` shape (series,)), so that 0 bytes stays finite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(memory[:, None], np.log1p(levels), np.log(levels))


def from_log(x: np.ndarray, memory: np.ndarray | bool) -> np.ndarray:
    """Inverse of ``to_log`` (elementwise; ``memory`` broadcasts against ``x``)."""
    return np.where(memory, np.expm1(x), np.exp(x))


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
            f"levels: series {r} night {j} is {lv[r, j]!r}; latency must be > 0, memory >= 0")
    exp = (np.zeros(lv.shape, dtype=bool) if expected is None
           else np.broadcast_to(np.asarray(expected, dtype=bool), lv.shape))
    return lv, mem, thr, exp


def detect_series(
    levels: np.ndarray, *, memory: bool | np.ndarray, threshold: float | np.ndarray = 0.07,
    expected: np.ndarray | None = None, online: bool, params: DetectorParams = DEFAULT_PARAMS,
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

    Returns:
        Flags sorted by series then night; ``night`` and ``raised_night`` are column indices
        of ``levels``. Offline, ``raised_night`` is the series' last night.

    Raises:
        DetectionInputError: wrong shape, a threshold outside (0, 10), a non-positive latency
            or a negative memory level, or an infinite level.
    """
    lv, mem, thr_lin, exp = _check_batch(levels, memory, threshold, expected)
    if lv.size == 0:
        return []
    y_lin, order, lengths, exp_c = _compact(lv, exp)
    y = to_log(y_lin, mem)
    thr = np.log1p(thr_lin)
    seg_rows, seg_starts, seg_ends = _segments(lengths, exp_c)
    if online:
        raw = _online_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, params)
    else:
        raw = _offline_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, params)
    found = _Found(*(np.concatenate([getattr(f, name) for f in raw]) if raw else np.zeros(0)
                     for name in _Found.__dataclass_fields__))
    # Report the baseline and the new level in the input's unit (exact bytes for memory).
    width = int(max(found.base_size.max(initial=1), found.post_size.max(initial=1)))
    rows = found.rows.astype(int)
    base = row_median(gather(y_lin, rows, found.base_start.astype(int),
                             found.base_size.astype(int), width))
    new = row_median(gather(y_lin, rows, found.post_start.astype(int),
                            found.post_size.astype(int), width))
    flags = []
    for i, row in enumerate(rows):
        raised = int(found.raised[i]) if online else int(lengths[row]) - 1
        b, v = float(base[i]), float(new[i])
        flags.append(Flag(
            series=int(row), night=int(order[row, int(found.first[i])]),
            raised_night=int(order[row, raised]),
            direction="regression" if found.up[i] else "improvement",
            change=v / b - 1 if b > 0 else (v - b) / 1.0,  # 0 bytes counts as 1 byte
            p_value=None if np.isnan(found.pval[i]) else float(found.pval[i]),
            baseline=b, kind="drift" if found.drift[i] else "step"))
    flags.sort(key=lambda f: (f.series, f.night, f.raised_night))
    return flags


def _online_chunked(y, seg_rows, seg_starts, seg_ends, n_min, thr, mem, p, levels, origin,
                    offset) -> _Found:
    """One pass over all segments, in blocks of rows.

    ``levels`` holds the first pass's baselines, (first segments, width) float32; a later
    segment starting ``offset`` nights into first segment ``origin`` reuses them wherever its
    window lies wholly inside it, and computes only its first ``window`` nights afresh.
    """
    parts = []
    w = p.window
    for c0 in range(0, seg_rows.size, _CHUNK):
        sl = slice(c0, c0 + _CHUNK)
        ym, lengths = _segment_matrix(y, seg_rows[sl], seg_starts[sl], seg_ends[sl])
        if origin is None:
            level = prev_median(ym, w)
            levels[c0 : c0 + ym.shape[0], : ym.shape[1]] = level
        else:
            rows_n, cols = ym.shape
            level = np.full((rows_n, cols), np.nan)
            for j in range(1, min(w, cols)):
                level[:, j] = median_last(ym[:, :j])
            if cols > w:
                level[:, w:] = gather(levels, origin[sl], offset[sl] + w,
                                      np.full(rows_n, cols - w), cols - w)
        f = _online_pass(ym, lengths, n_min[sl], thr[seg_rows[sl]], mem[seg_rows[sl]], p, level)
        f.rows = f.rows + c0
        parts.append(f)
    return _Found(*(np.concatenate([getattr(f, name) for f in parts])
                    for name in _Found.__dataclass_fields__))


def _online_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, p):
    out = []
    n_min = np.full(seg_rows.size, -1)
    width = max(int((seg_ends - seg_starts).max(initial=0)), 1)
    levels = np.full((seg_rows.size, width), np.nan, dtype=np.float32)
    origin = offset = None
    while seg_rows.size:
        found = _online_chunked(y, seg_rows, seg_starts, seg_ends, n_min, thr, mem, p, levels,
                                origin, offset)
        rows = seg_rows[found.rows]
        starts = seg_starts[found.rows]
        out.append(_Found(rows, starts + found.first, starts + found.raised, found.up,
                          found.pval, found.drift, starts + found.base_start, found.base_size,
                          starts + found.post_start, found.post_size))
        # The baseline restarts at the first night of a raised step.
        origin = found.rows if origin is None else origin[found.rows]
        offset = found.first if offset is None else offset[found.rows] + found.first
        seg_rows, seg_ends = rows, seg_ends[found.rows]
        seg_starts = starts + found.first
        n_min = found.raised - found.first
    return out


# --------------------------------------------------------------------------------------------
# Offline: change points over the whole series


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
        screen = valid & (np.abs(est) >= least[:, None]) & np.where(
            est > 0, first2_lo >= 0.5 * est, first2_hi <= 0.5 * est)
    # The noise only where the screen lets a change through.
    r, j = np.nonzero(screen)
    noise = np.zeros(y.shape)
    noise[r, j] = window_noise(y, r, j - kb[r, j], kb[r, j], p, memory)
    se = noise[r, j] * np.sqrt(MEDIAN_VAR * (1.0 / kf[r, j] + 1.0 / kb[r, j]))
    passed = np.abs(est[r, j]) >= _cutoff(thr[r], se, p)
    reg = np.zeros(y.shape, dtype=bool)
    imp = np.zeros(y.shape, dtype=bool)
    reg[r[passed], j[passed]] = est[r[passed], j[passed]] > 0
    imp[r[passed], j[passed]] = est[r[passed], j[passed]] < 0
    # Rank by the change itself: it peaks where the two windows are cleanest, whereas est/se
    # would follow the noise estimate's own wobble.
    score = np.where(reg | imp, np.abs(est), -np.inf)
    half = max(w // 2, 1)
    peak = ndimage.maximum_filter1d(score, size=2 * half + 1, axis=1, mode="constant",
                                    cval=-np.inf)
    # Ties on a plateau: keep the earliest night of the plateau.
    left = np.concatenate([np.full((rows_n, 1), -np.inf), score[:, :-1]], axis=1)
    keep = np.isfinite(score) & (score >= peak) & (left < score)
    r, j = np.nonzero(keep)
    up = reg[r, j]
    j = _refine(y, lengths, r, j, level[r, j], fwd[r, j], half, np.where(up[:, None],
                reg[r], imp[r]))
    # Two peaks of one plateau may settle on the same night.
    _, once = np.unique(r * cols + j, return_index=True)
    r, j, up = r[once], j[once], up[once]
    kb_s, kf_s = kb[r, j], kf[r, j]
    ok, pv = _significant(y, r, j, kf_s, j - kb_s, kb_s, up, memory, noise[r, j], p, w)
    r, j, up, pv, kb_s, kf_s = r[ok], j[ok], up[ok], pv[ok], kb_s[ok], kf_s[ok]
    found = [_Found(r, j, j, up, pv, np.zeros(r.size, dtype=bool), j - kb_s, kb_s, j, kf_s)]
    if p.drift:
        found.append(_offline_drift(y, lengths, r, j, fwd, thr, memory, p))
    return _Found(*(np.concatenate([getattr(f, name) for f in found])
                    for name in _Found.__dataclass_fields__))


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
    low_after = np.concatenate([np.cumsum(low[:, ::-1], axis=1)[:, ::-1],
                                np.zeros((rows.size, 1))], axis=1)
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
        e = np.zeros(0, dtype=int)
        return _Found(e, e, e, e.astype(bool), np.zeros(0), e.astype(bool), e, e, e, e)
    head = gather(y, rows, starts, np.full(rows.size, w), w)
    tail = gather(y, rows, ends - w, np.full(rows.size, w), w)
    h, t = median_last(head), median_last(tail)
    est = t - h
    nz = window_noise(y, rows, starts, np.full(rows.size, w), p, memory)
    se = nz * np.sqrt(MEDIAN_VAR * 2.0 / w)
    cut = _cutoff(thr[rows], se, p, drift=True)
    up = est > 0
    cand = np.abs(est) >= cut
    ok, pv = _significant(y, rows, ends - w, np.full(rows.size, w), starts,
                          np.full(rows.size, w), up, memory, nz, p, w)
    sel = cand & ok
    rows, starts, ends, est, pv, h, up = (a[sel] for a in (rows, starts, ends, est, pv, h, up))
    # The drift's night: where the forward level first crosses half of the change.
    col = np.arange(y.shape[1])[None, :]
    inside = (col >= starts[:, None]) & (col <= (ends - w)[:, None])
    crossed = np.where(up[:, None], fwd[rows] - h[:, None] >= 0.5 * est[:, None],
                       fwd[rows] - h[:, None] <= 0.5 * est[:, None])
    first = np.argmax(inside & crossed, axis=1)
    full = np.full(rows.size, w)
    # The new level is the stretch's last window.
    return _Found(rows, first, first, up, pv, np.ones(rows.size, dtype=bool), starts, full,
                  ends - w, full)


def _offline_batch(y, seg_rows, seg_starts, seg_ends, thr, mem, p):
    out = []
    for c0 in range(0, seg_rows.size, _CHUNK):
        rs, st = seg_rows[c0 : c0 + _CHUNK], seg_starts[c0 : c0 + _CHUNK]
        ym, lengths = _segment_matrix(y, rs, st, seg_ends[c0 : c0 + _CHUNK])
        f = _offline_pass(ym, lengths, thr[rs], mem[rs], p)
        out.append(_Found(rs[f.rows], st[f.rows] + f.first, st[f.rows] + f.raised, f.up,
                          f.pval, f.drift, st[f.rows] + f.base_start, f.base_size,
                          st[f.rows] + f.post_start, f.post_size))
    return out


