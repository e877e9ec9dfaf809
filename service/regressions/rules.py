"""The detector's rules on ``(series, nights)`` matrices: constants, cut-offs, runs,
significance; shared by the online pass (:mod:`service.regressions.scan`) and the offline
change-point scan (:mod:`service.regressions.offline`). The baseline rule (window, noise,
band) is in :mod:`service.regressions.baseline`.

The method and its sources are described in docs/detection.md. Pure: numpy
and scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import stats

from service.errors import DetectionInputError
from service.mann_whitney import MWU_MAX, exact_tail_rows, mwu_tail
from service.regressions.robust import envelope, gather, median_last, row_median

MEDIAN_VAR = math.pi / 2  # variance of a median relative to a mean (large samples)
CHUNK = 8192  # series per block of matrix work (bounds memory)
MODE_SAME = 0.001  # two memory nights within 0.1% are the same level (log units)
MODE_GAP = 0.01  # recurring memory levels more than 1% apart are distinct modes (log units)


@dataclass(frozen=True)
class DetectorParams:
    """Constants of the detector (see the module docstring for their roles).

    Attributes:
        window: earlier nights in a baseline (and nights per side offline).
        min_baseline: fewest earlier nights that make a baseline.
        min_run_baseline: fewest nights since a raised step's first night before a latency
            run that may raise another step (at most ``min_baseline``). A step landing on
            the fourth night after a raised one has three nights before it: held to
            ``min_baseline``, its own first night entered the baseline and it was never
            raised. Such a run must also reach ``short_run_factor`` times the threshold and
            stand the threshold beyond the level before the raised step (so a series coming
            back from a raised excursion is not a step); at a series' start or after a night
            marked expected, and for peak memory (judged by its envelope, without a p-value),
            runs keep ``min_baseline``. Above ``min_baseline`` it is ``min_baseline``
            (:attr:`run_baseline`).
        short_run_factor: see ``min_run_baseline`` (3: +22.5% for a 7% threshold).
        max_run: longest run of recent nights (re-runs included) tested for persistence.
        alpha: one-sided significance level of the Mann-Whitney U test.
        z: standard-normal quantile by which a noisy change may fall short of the threshold.
        z_low: standard-normal quantile by which a change must clear the grey zone's lower edge.
        grey_fraction: the lower edge of the grey zone as a fraction of the threshold.
        visited: a new level is not new when this many baseline nights reach it (bimodal).
        noise_floor: least night-to-night noise assumed for latency (log units, 0.001 ~ 0.1%).
        drift: compare with the anchor window as well (slow drift).
        drift_nights: recent nights whose median is compared with the anchor.
        excursion_look: nights before an online run searched for the series' excursions
            (:func:`longest_excursion`); 0 turns the excursion rule off.
        excursion_cap: the longest excursion that makes a run wait (a run of 2 nights waits
            for at most ``excursion_cap + 1`` nights; against the excursions they are
            counted by the calendar, a missing night inside the run counting and a re-run
            not: :func:`night_clock`).
        excursion_alpha: chance below which a run of m nights must lie as a chain of the
            series' single outlier nights: with q its rate of nights beyond the same
            distance in the run's direction among the ``excursion_look`` nights before
            (:func:`excursion_rate`), a run of up to ``excursion_cap`` nights needs
            ``q**m <= excursion_alpha`` (0.003: five such nights in 84 make a run of two
            wait for its third); 1 turns this part off.
        improvement_alpha: the same chance for a run downwards (an improvement). An
            improvement is filed to nobody but restarts the baseline, so a false one leaves
            the series without one for ``min_baseline`` nights. At 0.0005, two lone nights
            as far down among the 84 before ((2/85)**2 > 0.0005) hold a run of two for a
            third night; one does not. On real histories most two-night false flags were
            such dips (docs/benchmarks.md).
        unstable_beyond: a benchmark marked unstable (shown, not alerted) still alerts a
            regression whose change is at least this many times the spread of the verdict
            that marked it unstable, and the threshold: a change far beyond the benchmark's
            own noise (3: a +100% step on a benchmark whose processes spread 15%). On the real
            histories it lifts the recall of steps >= 10% within 3 nights from 0.60 to 0.68
            (of +100% steps from 0.62 to 0.92) for precision 0.922 -> 0.919
            (docs/benchmarks.md); 0 never alerts an unstable benchmark.
        return_nights: online, a raised step's series is back when this many nights with
            data right after the night it was raised on each stand within half the step of
            the baseline it was raised against: the step did not persist, and the baseline
            from before it resumes (``persist.came_back``; 3: two nights back are a step's
            low nights as often). 0: a raised step always restarts the baseline.
    """

    window: int = 28
    min_baseline: int = 4
    min_run_baseline: int = 3
    short_run_factor: float = 3.0
    max_run: int = 7
    alpha: float = 0.01
    z: float = 1.645
    z_low: float = 2.576
    grey_fraction: float = 0.5
    visited: int = 3
    noise_floor: float = 0.001
    drift: bool = True
    drift_nights: int = 7
    excursion_look: int = 84
    excursion_cap: int = 2
    excursion_alpha: float = 0.003
    improvement_alpha: float = 0.0005
    unstable_beyond: float = 3.0
    return_nights: int = 3

    def __post_init__(self) -> None:
        if not (
            2 <= self.min_run_baseline
            and 2 <= self.min_baseline <= self.window <= MWU_MAX
            and 2 <= self.max_run <= 16
            and self.short_run_factor >= 1
            and 2 <= self.drift_nights <= self.window
            and self.excursion_look >= 0
            and self.excursion_cap >= 0
            and 0 < self.excursion_alpha <= 1
            and 0 < self.improvement_alpha <= 1
            and self.unstable_beyond >= 0
            and self.return_nights >= 0
        ):
            raise DetectionInputError(
                f"params: need 2 <= min_run_baseline, 2 <= min_baseline <= window <= {MWU_MAX}, "
                "2 <= max_run <= 16, short_run_factor >= 1, "
                "2 <= drift_nights <= window, excursion_look >= 0, excursion_cap >= 0 and "
                "0 < excursion_alpha <= 1, 0 < improvement_alpha <= 1, unstable_beyond >= 0 "
                "and return_nights >= 0"
            )

    @property
    def run_baseline(self) -> int:
        """Fewest nights before a latency run after a raised step (``min_run_baseline``, at
        most ``min_baseline``)."""
        return min(self.min_run_baseline, self.min_baseline)


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
        resumed_night: online, the column of the night the series came back from the step
            before a new baseline stood (``DetectorParams.return_nights``): the baseline from
            before the step resumed there. None: the step stood (or offline).
    """

    series: int
    night: int
    raised_night: int
    direction: str
    change: float
    p_value: float | None
    baseline: float
    kind: str = "step"
    resumed_night: int | None = None


# --------------------------------------------------------------------------------------------
# Baselines, noise and runs


def cutoff(thr: np.ndarray, se: np.ndarray, p: DetectorParams, drift: bool = False):
    """Least log change that counts: ``max(thr - z*se, grey*thr + z_low*se)``.

    A drift is not urgent (it keeps growing), so it must clear the threshold itself by
    ``z * se``: a grey-zone step judged against the anchor night after night would otherwise
    cross it by chance sooner or later.
    """
    high = thr + p.z * se if drift else thr - p.z * se
    return np.maximum(high, p.grey_fraction * thr + p.z_low * se)


def run_median(y: np.ndarray, m: int) -> np.ndarray:
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


def quartile_nights(post: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def new_level(
    base: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    change: np.ndarray,
    up: np.ndarray,
    memory: np.ndarray,
    p: DetectorParams,
) -> np.ndarray:
    """Whether each run's level is new to its baseline (the ``visited`` rule).

    Latency: fewer than ``p.visited`` baseline nights (fewer under 12 baseline nights, none
    under 8) reach to within a quarter of the change of the run's lower quartile night (upper,
    for a drop), so that one wild night cannot lift the run. Peak memory takes discrete levels
    (allocator chunks, pages): a level between the run's quartile nights that the baseline
    took even once is one of its modes, seen again, not a step (a baseline night far beyond the
    run, an outlier, is not that level), when the baseline is :func:`multimodal`; a baseline
    with one recurring level is judged as latency is.

    Args:
        base: (n, k) baseline log levels, NaN-padded.
        low: (n,) the run's lower quartile night (log).
        high: (n,) the run's upper quartile night (log).
        change: (n,) the run's median against the baseline's (log).
        up: (n,) the run is upwards.
        memory: (n,) the row is peak memory.
        p: detector constants.

    Returns:
        Shape (n,), True where the level is new.
    """
    with np.errstate(invalid="ignore"):
        quarter = 0.25 * np.abs(change)
        reach = np.where(
            up[:, None], base >= (low - quarter)[:, None], base <= (high + quarter)[:, None]
        )
        at_level = (base >= (low - quarter)[:, None]) & (base <= (high + quarter)[:, None])
    modes = memory & multimodal(base)
    near = np.where(modes[:, None], at_level, reach)
    kb = np.sum(~np.isnan(base), axis=1)
    allowed = np.where(modes, 1, np.minimum(p.visited, np.maximum(1, kb // 4)))
    return near.sum(axis=1) < allowed


def longest_excursion(dev: np.ndarray, dist: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Longest stretch of consecutive nights that stood ``dist`` beyond their baseline, in the
    run's direction: the series' excursions that came back.

    Real nightly histories on shared hosts (CI runners) stray in excursions of two or three
    nights (consecutive builds measured on one slow or fast host) that come back; two nights
    beyond the threshold are no evidence of a step in a series that has done the same before.
    The online pass asks a run to be longer than the longest such excursion of the nights
    before it (at most one night more than the two it always needs). Evaluated on public asv
    histories in docs/benchmarks.md ("Real performance histories").

    Args:
        dev: (n, width) log level of each night before a run minus its baseline median, in
            night order, NaN where unknown (a NaN ends a stretch).
        dist: (n,) log distance beyond the baseline that makes a night an excursion.
        up: (n,) look upwards (else downwards).

    Returns:
        Shape (n,), the longest excursion in nights (0 when none).
    """
    beyond = _beyond(dev, dist, up)
    cur = np.zeros(dev.shape[0], dtype=int)
    longest = np.zeros(dev.shape[0], dtype=int)
    for j in range(dev.shape[1]):
        cur = (cur + 1) * beyond[:, j]
        longest = np.maximum(longest, cur)
    return longest


def excursion_rate(dev: np.ndarray, dist: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The series' rate of single nights ``dist`` beyond their baseline in the run's
    direction: ``count / (known + 1)`` among the known nights before a run.

    Some real histories on shared hosts throw single outlier nights of the threshold's size
    every few weeks; two of them in a row then come by chance, not as a step. If such nights
    fall independently at rate q, a run of m of them has chance ``q**m``, which the online
    pass holds to ``DetectorParams.excursion_alpha``. The ``+ 1`` (Laplace's rule of
    succession, one unseen night) keeps a short look-back from reading a rate of 0 or 1
    with confidence. Evaluated in docs/benchmarks.md ("Real performance histories").

    Args:
        dev: (n, width) as in :func:`longest_excursion`, NaN where unknown.
        dist: (n,) log distance beyond the baseline.
        up: (n,) look upwards (else downwards).

    Returns:
        Shape (n,), rates in [0, 1).
    """
    count = _beyond(dev, dist, up).sum(axis=1)
    known = np.sum(~np.isnan(dev), axis=1)
    return count / (known + 1.0)


def _beyond(dev: np.ndarray, dist: np.ndarray, up: np.ndarray) -> np.ndarray:
    """(n, width) booleans: the night stood ``dist`` beyond its baseline in the run's
    direction (False where unknown)."""
    with np.errstate(invalid="ignore"):
        return np.where(up[:, None], dev >= dist[:, None], dev <= -dist[:, None])


def multimodal(base: np.ndarray) -> np.ndarray:
    """Whether each baseline takes more than one recurring level (peak memory's modes).

    A level recurs when two nights lie within ``MODE_SAME`` of each other; the baseline is
    multimodal when its highest and lowest recurring levels lie more than ``MODE_GAP`` apart.
    An exact series (CUDA ``max_memory_allocated``) with one outlier night is not: its outlier
    is a glitch, and a later step to that level is a step.

    Args:
        base: (n, k) baseline log levels, NaN-padded.

    Returns:
        Shape (n,).
    """
    tol = np.full(base.shape[0], MODE_SAME)
    return (envelope(base, tol, upper=True) - envelope(base, tol, upper=False)) > MODE_GAP


def significant(
    y: np.ndarray,
    rows: np.ndarray,
    post_start: np.ndarray,
    post_size: np.ndarray,
    base_start: np.ndarray,
    base_size: np.ndarray,
    up: np.ndarray,
    memory: np.ndarray,
    noise: np.ndarray,
    p: DetectorParams,
    width: int,
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
    fewer than 12 nights allows fewer such nights (none below 8). Peak memory allows none: its
    levels are discrete (allocator chunks, pages), and a level the baseline reached even once
    is one of its modes, not a new level.
    """
    post = gather(y, rows, post_start, post_size, width)
    base = gather(y, rows, base_start, base_size, p.window)
    pval = np.full(rows.size, np.nan)
    with np.errstate(invalid="ignore"):
        change = row_median(post) - row_median(base)
    m = np.sum(~np.isnan(post), axis=1)
    low, high = quartile_nights(post)
    ok = new_level(base, low, high, change, up, memory[rows], p)
    new = ok.copy()
    lat = ~memory[rows]
    if lat.any():
        pval[lat] = exact_tail_rows(post[lat], base[lat], up[lat])
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


@dataclass
class Found:
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

    @classmethod
    def empty(cls) -> Found:
        """No flag."""
        e = np.zeros(0, dtype=int)
        return cls(
            rows=e,
            first=e,
            raised=e,
            up=e.astype(bool),
            pval=np.zeros(0),
            drift=e.astype(bool),
            base_start=e,
            base_size=e,
            post_start=e,
            post_size=e,
        )

    @classmethod
    def concat(cls, parts: Sequence[Found]) -> Found:
        """The flags of ``parts``, one after another (no part: :meth:`empty`)."""
        if not parts:
            return cls.empty()
        return cls(
            **{
                name: np.concatenate([getattr(f, name) for f in parts])
                for name in cls.__dataclass_fields__
            }
        )

    def moved(self, rows: np.ndarray, starts: np.ndarray) -> Found:
        """These flags with each row ``i`` renamed ``rows[i]`` and its positions shifted by
        ``starts[i]`` (a segment's flags in its series' columns)."""
        shift = starts[self.rows]
        return Found(
            rows=rows[self.rows],
            first=shift + self.first,
            raised=shift + self.raised,
            up=self.up,
            pval=self.pval,
            drift=self.drift,
            base_start=shift + self.base_start,
            base_size=self.base_size,
            post_start=shift + self.post_start,
            post_size=self.post_size,
        )


def night_clock(
    levels: np.ndarray,
    order: np.ndarray,
    lengths: np.ndarray,
    rerun: np.ndarray | None,
    nights: np.ndarray | None,
) -> np.ndarray:
    """The night each compacted night was measured on: the clock by which a run's length is
    held against the series' excursions (``DetectorParams.excursion_look``).

    An excursion is a stretch of time on a straying host, and a step behind two-night
    excursions waits for its third night; a night the benchmark has no result for (the job
    failed, the runner was down) still passes, so a run of two nights with data around a
    missing one has lasted three nights. A confirmation re-run measured its night's build
    again on the same night: it takes that night's place on the clock.

    Args:
        levels: (series, nights) levels, NaN where missing.
        order: (series, nights) the column of ``levels`` behind each compacted night.
        lengths: (series,) nights with data per series.
        rerun: (series, nights) re-run marks, or None.
        nights: (series, nights) ordinal of each column's night (e.g. days since epoch), or
            None: the column index (a NaN column is a missing night). A re-run column adds
            no night whether it has an ordinal of its own or shares its night's.

    Returns:
        Shape (series, nights), float, compacted as ``order`` (past ``lengths``: arbitrary).

    Raises:
        DetectionInputError: ``nights`` not of the levels' shape, not finite, or decreasing
            along a series' nights with data.
    """
    col = np.broadcast_to(np.arange(levels.shape[1]), levels.shape)
    clock = col.astype(np.float32) if nights is None else np.asarray(nights, dtype=float)
    if clock.shape != levels.shape:
        raise DetectionInputError(f"nights: expected shape {levels.shape}, got {clock.shape}")
    if rerun is not None:
        # A re-run's own step on the clock (a column, an ordinal of its own, or none when it
        # shares its night's) is taken back from it and every column after it.
        marks = np.asarray(rerun, dtype=bool) & ~np.isnan(levels)
        step = np.diff(clock, axis=1, prepend=clock[:, :1])
        clock = clock - np.cumsum(np.where(marks, step, 0), axis=1)
    c = np.take_along_axis(clock, order, axis=1)
    if nights is None:
        return c
    inside = col < lengths[:, None]
    bad = inside & ~np.isfinite(c)
    bad[:, 1:] |= inside[:, 1:] & (np.diff(c, axis=1) < 0)
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise DetectionInputError(
            f"nights: series {r} column {order[r, j]} is {float(c[r, j])!r}; night ordinals must "
            "be finite and must not decrease along a series"
        )
    return c


def segment_matrix(y: np.ndarray, rows, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Cut segments out of ``y`` (series, nights): ``(matrix, lengths)``, each segment a row, NaN-padded."""
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
