"""The online rules of persistence: what a run must pass besides its magnitude and
significance (outlasting the series' own excursions; judged on a short baseline after a
raised step, standing beyond the level before it), where a raised step began, and whether
the series came back from it. Method: docs/detection.md, "Persistence".

The callers are in :mod:`service.regressions.scan` (``_judge``, ``_online_pass``,
``_online_batch``), which hand the first two a :class:`History`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.regressions.robust import gather, row_median
from service.regressions.rules import DetectorParams, excursion_rate, longest_excursion


@dataclass(frozen=True)
class History:
    """What the online rules read of a segment's past, across the resets of raised steps.

    Attributes:
        devs: (first segments, nights) float32, the first pass's nights against their
            baseline (log): the excursions a later run must outlast.
        origin: per segment row, the row of ``devs`` (and ``before``) its series started in.
        offset: per segment row, how many nights into that row the segment starts.
        clock: (segment rows, nights), the night each of the segment's nights was measured on
            (:func:`~service.regressions.rules.night_clock`): lengths by the calendar.
        before: (first segments, nights) float32, the first pass's baselines (log): the level
            before a raised step.
    """

    devs: np.ndarray
    origin: np.ndarray
    offset: np.ndarray
    clock: np.ndarray
    before: np.ndarray


def short_baseline_cut(
    cut: np.ndarray,
    rows: np.ndarray,
    ref: np.ndarray,
    est: np.ndarray,
    thr: np.ndarray,
    p: DetectorParams,
    history: History,
) -> np.ndarray:
    """The magnitude cut of runs judged against fewer than ``min_baseline`` nights (down to
    ``min_run_baseline``), whose baseline began at a raised step's first night.

    Such a run must reach ``short_run_factor`` times the threshold, and its level (``ref +
    est``, log) must stand the threshold beyond the level before that step in the run's
    direction (the median of the ``window`` nights before it, from the first pass): a step
    that lands a few nights after a raised one is raised; a series coming back from a raised
    excursion of three nights is not a new step. Runs at the start of a series or after a
    night marked expected (no level known before them) are never raised here (``inf``).
    Shape (runs,).
    """
    origin, offset, before = history.origin, history.offset, history.before
    pre = before[origin[rows], np.clip(offset[rows], 0, before.shape[1] - 1)]
    with np.errstate(invalid="ignore"):
        beyond = np.where(est > 0, ref + est - pre >= thr, pre - ref - est >= thr)
    return np.where((offset[rows] > 0) & beyond, np.maximum(cut, p.short_run_factor * thr), np.inf)


def outlasts(
    rows: np.ndarray,
    s: np.ndarray,
    m: np.ndarray,
    up: np.ndarray,
    dist: np.ndarray,
    p: DetectorParams,
    history: History,
    rerun: np.ndarray | None,
) -> np.ndarray:
    """Whether each run ``[s, s + m)`` of segment row ``rows`` outlasts the series' excursions
    of at least ``dist`` (log) in its direction (``up``). ``rerun``: (segment rows, nights),
    1 at a confirmation re-run of the night before it, or None. Shape (runs,).

    A run of up to ``excursion_cap`` nights must also be unlikely as a chain of the series'
    single outlier nights of that size: ``q**m <= excursion_alpha`` (``improvement_alpha``
    for a run downwards) with q from :func:`excursion_rate`. A run holding a confirmation
    re-run after its first night is not held back by the excursions (consecutive nights on one
    slow host; the re-run measured one of the run's builds again, on another occasion) but is
    by the outlier rate: a re-run is one more draw of the host, and a night and its re-run both
    beyond ``dist`` are a chance pair as two nights are. Neither length counts a re-run as a
    night: a two-night run with a re-run in it has not outlasted anything by a third night.
    An excursion is a stretch of time on a straying host, so the run's length against it is
    counted by the calendar (:func:`night_clock`: a night without a result inside the run
    counts); a chain of outliers is a count of draws, so the outlier rule, and the cap that
    lifts it, count the run's nights with a result.
    """
    inside = np.zeros(rows.size, dtype=int)
    if rerun is not None:
        inside = (gather(rerun, rows, s + 1, m - 1, p.max_run) == 1).sum(axis=1)
    rr = inside > 0
    devs, origin, offset, clock = history.devs, history.origin, history.offset, history.clock
    nights = clock[rows, s + m - 1] - clock[rows, s] + 1  # by the calendar
    with_data = m - inside  # nights with a result, re-runs not counted
    end = offset[rows] + s
    b = np.maximum(end - p.excursion_look, 0)
    dev = gather(devs, origin[rows], b, end - b, p.excursion_look)
    longest = np.where(rr, 0, longest_excursion(dev, dist, up))
    rate = excursion_rate(dev, dist, up)
    # Runs of more than ``excursion_cap`` nights with data (re-runs not counted) always
    # outlast: a step waits one night with data at most.
    alpha = np.where(up, p.excursion_alpha, p.improvement_alpha)
    return (nights > np.minimum(longest, p.excursion_cap)) & (
        (with_data > p.excursion_cap) | (rate**m <= alpha)
    )


def came_back(y, rows, starts, ends, found, p: DetectorParams) -> np.ndarray:
    """The night each raised step's series came back from it, or -1: it stood.

    A step raised on a short run (a two-night excursion on a straying host, reproduced by its
    re-run) restarts the baseline at its first night. When the ``return_nights`` nights with
    data right after the night it was raised on each stand within half the step of the
    baseline it was raised against (on either side: a night beyond the baseline the other way
    is no return), the step did not persist: the baseline from before it resumes. Without
    this, the excursion's nights were the first of every later baseline, a level visited at
    the start of a short one, and the next real step of that size was not new for as long as
    the window held them (online, never raised at all). Drifts (judged against the anchor)
    stand.

    Args:
        y: (series, nights) compacted log levels.
        rows: (n,) the row of ``y`` behind each flag of ``found``.
        starts: (n,) the column of ``y`` each flag's segment starts at (positions in
            ``found`` are relative to it).
        ends: (n,) the column each segment ends before.
        found: the flags (``rules.Found``), one per segment.
        p: detector constants.

    Returns:
        Shape (n,): the night (relative to the segment's start) the series came back on, the
        last of its ``return_nights``; -1 where it did not.
    """
    k = p.return_nights
    if k == 0 or rows.size == 0:
        return np.full(rows.size, -1)
    width = int(max(found.post_size.max(initial=1), 1))
    with np.errstate(invalid="ignore"):
        base = row_median(gather(y, rows, starts + found.base_start, found.base_size, p.window))
        level = row_median(gather(y, rows, starts + found.post_start, found.post_size, width))
        after = gather(y, rows, starts + found.raised + 1, np.full(rows.size, k), k)
        back = np.abs(after - base[:, None]) < 0.5 * np.abs(level - base)[:, None]
    live = starts + found.raised + k < ends
    return np.where(back.all(axis=1) & live & ~found.drift, found.raised + k, -1)


def located_first(y, rows, s, m, up, level, kind, s_min, clock, p: DetectorParams) -> np.ndarray:
    """The first night of each raised run ``[s, s + m)`` of segment row ``rows``: ``s``, or
    two nights earlier when the night before the run came out back at the old level and the
    night before that stood at the new one.

    A run's nights must stand at the new level, so a step whose second night came out low is
    raised from its third night on; its first night is the one before the low night. Located
    at the third, the commit range, which starts two nights before the first night to allow
    for one such night (``service.regressions.service.range_start``), started after the
    culprit. A night at the new level before a low one that was instead an outlier before the
    step only widens the range. Here the low night is at most half the run's change from the
    baseline before it (``level``, log), and the night before it within half the change of
    the run's level (an outlier far beyond it is not that level); the three nights are
    consecutive on ``clock`` (a night without a result between them: not moved); never
    before ``s_min`` or ``min_baseline``, and not for drifts (``kind`` 1).

    Returns:
        Shape (runs,): the first night of each run, relative to its segment.
    """
    ref = level[rows, np.clip(s, 0, level.shape[1] - 1)]
    with np.errstate(invalid="ignore"):
        est = row_median(gather(y, rows, s, m, int(max(m.max(initial=1), 1)))) - ref
        back1, back2 = (y[rows, np.clip(s - k, 0, y.shape[1] - 1)] - ref for k in (1, 2))
        low = np.where(up, back1 < 0.5 * est, back1 > 0.5 * est)
        high = np.abs(back2 - est) <= 0.5 * np.abs(est)  # at the run's level, not far beyond
        nights = clock[rows, s] - clock[rows, np.clip(s - 2, 0, None)]
    ok = (
        (kind == 0)
        & (s - 2 >= np.maximum(s_min[rows], p.min_baseline))
        & low
        & high
        & (nights == 2)
    )
    return np.where(ok, s - 2, s)
