"""Verdicts: is a probe's set of samples like the good endpoint's, the bad one's, or neither?

Pure statistics over raw samples (ms), no state: the bisection (:mod:`workers.bisect.search`) calls
these. The methods and their sources are described in :mod:`workers.bisect.search`'s docstring:
Pinpoint's ``different`` / ``same`` / ``unknown`` verdicts (min of Mann–Whitney U and
Kolmogorov–Smirnov, p ≤ 0.01, with a simulated high threshold), reported beside each probe; and
what decides: the Hodges–Lehmann shift of log latencies with its Mann–Whitney confidence
interval for samples measured apart (:func:`shift_interval`, :func:`side_by_shift`), and for
commits measured slot by slot, back to back, the sign test over slots with its interval of the
median per-slot ratio (:func:`paired_sides`, :func:`paired_shift_interval`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from service.errors import InvalidInput
from service.mann_whitney import Ties, mann_whitney_p, mann_whitney_rows

DIFFERENT, SAME, UNKNOWN = "different", "same", "unknown"
VERDICTS = (DIFFERENT, SAME, UNKNOWN)
GOOD, BAD, UNDECIDED = "good", "bad", "undecided"


def median_of(values: Sequence[float]) -> float:
    """The median of ``values`` as a float."""
    return float(statistics.median(values))


@dataclass(frozen=True)
class Batch:
    """Samples of one benchmark at one commit, taken in one round.

    Attributes:
        round: the round they were taken in.
        purpose: the probe's purpose (see :class:`workers.bisect.state.ProbeRequest`).
        values: the samples (ms).
        slots: the measuring slot of each sample, or None (see
            :attr:`workers.bisect.state.ProbeResult.slots`).
    """

    round: int
    purpose: str
    values: tuple[float, ...]
    slots: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Comparison:
    """The verdict of one set of samples against a reference set.

    Attributes:
        verdict: ``different`` | ``same`` | ``unknown``.
        p_value: min(Mann–Whitney U, Kolmogorov–Smirnov), both two-sided.
        low_threshold: p at or below which the verdict is ``different``.
        high_threshold: p above which the verdict is ``same`` (1.0: ``same`` is never given).
    """

    verdict: str
    p_value: float
    low_threshold: float
    high_threshold: float


def p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """min(Mann–Whitney U, Kolmogorov–Smirnov) two-sided p-value of two samples, as Pinpoint.

    Args:
        a: samples (e.g. latency in ms), at least 1.
        b: samples in the same unit, at least 1.

    Returns:
        The p-value in [0, 1]; 1.0 when both sets are constant and equal.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if np.ptp(np.concatenate([x, y])) == 0:
        return 1.0
    mwu = mann_whitney_p(x, y, ties=Ties.NORMAL)
    ks = stats.ks_2samp(x, y, alternative="two-sided").pvalue
    return float(min(mwu, ks))


@lru_cache(maxsize=4096)
def _high_threshold(
    reference: tuple[float, ...],
    alternative: tuple[float, ...],
    n: int,
    power: float,
    resamples: int,
    seed: int,
) -> float:
    rng = np.random.default_rng(seed)
    alt = np.asarray(alternative, dtype=float)
    ref = np.asarray(reference, dtype=float)
    draws = alt[rng.integers(0, len(alt), size=(resamples, n))]
    refs = np.broadcast_to(ref, (resamples, len(ref)))
    mwu = mann_whitney_rows(draws, refs)
    ks = stats.ks_2samp(draws, refs, axis=1, alternative="two-sided").pvalue
    pvals = np.nan_to_num(np.minimum(mwu, ks), nan=1.0)
    return float(np.quantile(pvals, power))


def compare(
    samples: Sequence[float],
    reference: Sequence[float],
    *,
    alternative: Sequence[float] | None = None,
    alpha: float = 0.01,
    power: float = 0.99,
    resamples: int = 200,
    seed: int = 0,
) -> Comparison:
    """Whether ``samples`` come from the distribution of ``reference`` (Pinpoint's compare).

    Args:
        samples: the probe's raw samples (e.g. ms), length n ≥ 1.
        reference: the endpoint's raw samples, same unit.
        alternative: samples of the other endpoint; when given, the high threshold is the
            ``power`` quantile of p-values of n samples redrawn from ``alternative`` against
            ``reference`` (so ``same`` means "almost surely not from ``alternative``"). When
            None, ``same`` is never answered.
        alpha: the low threshold (Pinpoint: 0.01).
        power: quantile for the high threshold (0.99: a probe from the other side passes as
            ``same`` at most 1% of the time).
        resamples: redraws for the high threshold.
        seed: seed of the redraws (the verdict is a pure function of its arguments).

    Returns:
        The :class:`Comparison`.

    Raises:
        InvalidInput: a sample set is empty.
    """
    if len(samples) == 0 or len(reference) == 0:
        raise InvalidInput("compare: both sample sets need at least one sample")
    p = p_value(samples, reference)
    high = 1.0
    if alternative is not None and len(alternative) > 0:
        high = _high_threshold(
            tuple(float(v) for v in reference),
            tuple(float(v) for v in alternative),
            len(samples),
            power,
            resamples,
            seed,
        )
    if p <= alpha:
        verdict = DIFFERENT
    elif p > high:
        verdict = SAME
    else:
        verdict = UNKNOWN
    return Comparison(verdict=verdict, p_value=p, low_threshold=alpha, high_threshold=high)


@dataclass(frozen=True)
class Classification:
    """Which side of the regression a probe's samples are on, for one benchmark.

    Attributes:
        side: ``good`` | ``bad`` | ``undecided``.
        vs_good: the probe against the good endpoint.
        vs_bad: the probe against the bad endpoint.
    """

    side: str
    vs_good: Comparison
    vs_bad: Comparison


PAIRED_MIN_SLOTS = 7
"""Fewest slots a paired sign test needs to reach p <= 0.01 (all seven on one side: 1/128)."""


def sign_test(hits: int, misses: int) -> float:
    """One-sided sign test: P(X >= hits) for X ~ Binomial(hits + misses, 1/2) (1.0 if none)."""
    n = hits + misses
    return float(stats.binom.sf(hits - 1, n, 0.5)) if n else 1.0


def slot_levels(batches: Iterable[Batch]) -> dict[tuple[int, int], float]:
    """The median sample of each ``(round, slot)`` of the batches that carry slots (ms)."""
    groups: dict[tuple[int, int], list[float]] = {}
    for batch in batches:
        if batch.slots is None:
            continue
        for value, slot in zip(batch.values, batch.slots, strict=True):
            groups.setdefault((batch.round, slot), []).append(value)
    return {key: float(np.median(values)) for key, values in groups.items()}


def paired_sides(
    probe: Mapping[tuple[int, int], float],
    good: Mapping[tuple[int, int], float],
    bad: Mapping[tuple[int, int], float],
    *,
    slower_is_bad: bool,
) -> tuple[int, int]:
    """Slot by slot, is the probe nearer the good or the bad endpoint measured beside it?

    In each slot the three commits ran back to back, so a machine that runs at two speeds
    (another tenant on the core, a clock that steps down) slows them alike; comparing within the
    slot cancels it. Slots whose endpoints do not show the regression (the speed changed within
    the slot) are left out.

    Args:
        probe: the probe's ``(round, slot) -> level`` (ms), see :func:`slot_levels`.
        good: the good endpoint's levels, same keys.
        bad: the bad endpoint's levels, same keys.
        slower_is_bad: the regression's direction.

    Returns:
        ``(slots on the good side of the slot's midpoint, slots on the bad side)``.
    """
    near_good = near_bad = 0
    for key in probe.keys() & good.keys() & bad.keys():
        g, b, x = good[key], bad[key], probe[key]
        if (b - g) * (1 if slower_is_bad else -1) <= 0:
            continue
        mid = (g + b) / 2
        if x == mid:
            continue
        if (x < mid) == slower_is_bad:
            near_good += 1
        else:
            near_bad += 1
    return near_good, near_bad


def paired_shift(
    good: Mapping[tuple[int, int], float], bad: Mapping[tuple[int, int], float]
) -> tuple[int, int, float]:
    """Slots where ``bad`` is slower, slots where it is faster, and the median ratio - 1."""
    keys = sorted(good.keys() & bad.keys())
    slower = sum(bad[k] > good[k] for k in keys)
    faster = sum(bad[k] < good[k] for k in keys)
    change = float(np.median([bad[k] / good[k] for k in keys])) - 1 if keys else 0.0
    return slower, faster, change


@dataclass(frozen=True)
class Shift:
    """A relative change and its confidence interval (fractions: 0.08 is 8% slower).

    Attributes:
        estimate: the change's point estimate.
        low: the interval's lower bound (``-1`` when too few samples bound it).
        high: the interval's upper bound (``inf`` when too few samples bound it).
        alpha: each bound's one-sided error rate (the interval covers with 1 - 2 alpha).
    """

    estimate: float
    low: float
    high: float
    alpha: float

    def toward(self, sign: int) -> tuple[float, float, float]:
        """``(estimate, low, high)`` in log units, read in the direction ``sign`` (+1: slower)."""
        est, low, high = (
            math.log1p(v) if v > -1 else -math.inf for v in (self.estimate, self.low, self.high)
        )
        return (est, low, high) if sign > 0 else (-est, -high, -low)


def _bounds(ordered: np.ndarray, k: int) -> tuple[float, float]:
    """The k-th smallest and k-th largest of ``ordered`` (1-based), unbounded when k < 1."""
    if k < 1:
        return -math.inf, math.inf
    return float(ordered[k - 1]), float(ordered[len(ordered) - k])


def shift_interval(
    reference: Sequence[float], samples: Sequence[float], *, alpha: float = 0.01
) -> Shift:
    """The change of ``samples`` against ``reference`` with a distribution-free interval.

    Method: the Hodges–Lehmann estimate of the shift between the log samples (the median of the
    m·n pairwise differences) and its confidence interval from the Mann–Whitney distribution
    (the k-th smallest and largest pairwise difference, k from the normal approximation of U,
    good from about 8 samples a side); Hollander, Wolfe & Chicken, *Nonparametric Statistical
    Methods* (3rd ed., 2014), §4.3. Ranks make it robust to heavy tails: a sample descheduled to
    ten times its level moves the interval no more than one at twice it.

    Args:
        reference: samples (ms) of the reference, e.g. the good endpoint; all positive.
        samples: samples (ms) of the commit compared, same unit.
        alpha: each bound's one-sided error rate.

    Returns:
        The :class:`Shift` of ``samples`` relative to ``reference``.

    Raises:
        InvalidInput: a sample set is empty.
    """
    if len(reference) == 0 or len(samples) == 0:
        raise InvalidInput("shift_interval: both sample sets need at least one sample")
    x = np.log(np.asarray(reference, dtype=float))
    y = np.log(np.asarray(samples, dtype=float))
    d = np.sort((y[:, None] - x[None, :]).ravel())
    m, n = len(x), len(y)
    z = float(stats.norm.isf(alpha))
    k = math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))
    low, high = _bounds(d, k)
    return Shift(math.expm1(float(np.median(d))), math.expm1(low), math.expm1(high), alpha)


def paired_shift_interval(ratios: Sequence[float], *, alpha: float = 0.01) -> Shift:
    """The median of per-slot ratios (commit over reference, measured back to back) and its
    sign-test interval.

    Method: the order-statistic interval of the median from the binomial distribution, the
    interval that inverts the sign test (Hollander, Wolfe & Chicken 2014, §3.6): exact, and as
    blind to how far a disturbed slot strays as the sign test itself.

    Args:
        ratios: per slot, the commit's level over the reference's (positive).
        alpha: each bound's one-sided error rate.

    Returns:
        The :class:`Shift` (estimate: the median ratio - 1).

    Raises:
        InvalidInput: no ratio.
    """
    if len(ratios) == 0:
        raise InvalidInput("paired_shift_interval: no slot to compare")
    r = np.sort(np.asarray(ratios, dtype=float))
    n = len(r)
    k = 0  # the largest k with P(Binomial(n, 1/2) <= k - 1) <= alpha
    while stats.binom.cdf(k, n, 0.5) <= alpha:
        k += 1
    low, high = _bounds(r, k)
    return Shift(float(np.median(r)) - 1, low - 1, high - 1, alpha)


def side_by_shift(
    samples: Sequence[float],
    good: Sequence[float],
    bad: Sequence[float],
    *,
    alpha: float = 0.01,
) -> str:
    """Which side of the midpoint between the endpoints a probe lies on, by two intervals.

    The endpoints' Hodges–Lehmann shift (:func:`shift_interval`) puts the midpoint halfway
    between them in log units. The probe is ``good`` when the upper bound of its shift against
    the good endpoint lies below that midpoint and so does the upper bound of its shift against
    the bad endpoint (measured from the bad side), ``bad`` in the mirror case: each claim is a
    one-sided test at ``alpha`` that the probe lies on its side, made from both yardsticks so an
    error in the midpoint's estimate does not decide alone. ``undecided`` otherwise (also when
    the endpoints do not differ at ``alpha``: there is no yardstick). A drift of the host of
    less than half the step between the endpoints' rounds and the probe's is tolerated.

    Args:
        samples: the probe's samples (ms).
        good: the good endpoint's samples, measured beside it.
        bad: the bad endpoint's samples, measured beside it.
        alpha: each test's one-sided error rate.

    Returns:
        ``good`` | ``bad`` | ``undecided``.
    """
    ends = shift_interval(good, bad, alpha=alpha)
    sign = 1 if ends.estimate >= 0 else -1
    step, step_low, _ = ends.toward(sign)
    if step_low <= 0:
        return UNDECIDED
    half = step / 2
    _, vs_good_low, vs_good_high = shift_interval(good, samples, alpha=alpha).toward(sign)
    _, vs_bad_low, vs_bad_high = shift_interval(bad, samples, alpha=alpha).toward(sign)
    if vs_good_high < half and vs_bad_high < -half:
        return GOOD
    if vs_good_low > half and vs_bad_low > -half:
        return BAD
    return UNDECIDED


def classify(
    samples: Sequence[float],
    good: Sequence[float],
    bad: Sequence[float],
    *,
    alpha: float = 0.01,
    power: float = 0.99,
    resamples: int = 200,
    side_alpha: float | None = None,
) -> Classification:
    """Place a probe on the good or bad side from its samples.

    The side is :func:`side_by_shift`'s (intervals of the shift against each endpoint, read
    against the midpoint between them), and it must also be ``different`` (:func:`compare`)
    from the other endpoint. ``same`` is not required: a machine that drifted since the
    endpoints were measured makes a probe ``different`` from both, and a probe whose samples
    are a mixture of two speeds can pass as ``same`` as one side while sitting on neither.

    Args:
        samples: the probe's samples (ms).
        good: the good endpoint's samples.
        bad: the bad endpoint's samples.
        alpha: the low threshold of :func:`compare`.
        power: the high threshold's quantile (:func:`compare`).
        resamples: redraws for the high threshold (:func:`compare`).
        side_alpha: the side's one-sided error rate (default ``alpha``).

    Returns:
        The verdicts against each endpoint and the side: ``good`` | ``bad`` | ``undecided``.
    """
    vs_good = compare(samples, good, alternative=bad, alpha=alpha, power=power, resamples=resamples)
    vs_bad = compare(samples, bad, alternative=good, alpha=alpha, power=power, resamples=resamples)
    side = side_by_shift(samples, good, bad, alpha=alpha if side_alpha is None else side_alpha)
    # And Pinpoint's verdict against the other side: a probe measured apart carries its own
    # moment of the host, which no interval of its samples sees.
    if (side == GOOD and vs_bad.verdict != DIFFERENT) or (
        side == BAD and vs_good.verdict != DIFFERENT
    ):
        side = UNDECIDED
    return Classification(side=side, vs_good=vs_good, vs_bad=vs_bad)
