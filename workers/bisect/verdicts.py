"""Verdicts: is a probe's set of samples like the good endpoint's, the bad one's, or neither?

Pure statistics over raw samples (ms), no state: the bisection (:mod:`workers.bisect.search`) calls
these. The methods and their sources are described in :mod:`workers.bisect.search`'s docstring:
Pinpoint's ``different`` / ``same`` / ``unknown`` verdicts (min of Mann–Whitney U and
Kolmogorov–Smirnov, p ≤ 0.01, with a simulated high threshold), a sign test against the
midpoint between the endpoints, and the slot-by-slot paired comparison of commits measured
back to back.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from service.errors import InvalidInput

DIFFERENT, SAME, UNKNOWN = "different", "same", "unknown"
VERDICTS = (DIFFERENT, SAME, UNKNOWN)
GOOD, BAD, UNDECIDED = "good", "bad", "undecided"

APART_ALPHA = 0.05
"""Sign-test level at which two endpoints' samples stand on their own sides of the midpoint.

Looser than the verdicts' 0.01 on purpose: it checks that the midpoint is trustworthy, and with
ten samples 0.01 would let no sample at all fall on the wrong side."""


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
    mwu = stats.mannwhitneyu(x, y, alternative="two-sided").pvalue
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
    mwu = stats.mannwhitneyu(draws, refs, axis=1, alternative="two-sided").pvalue
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


def side_p_value(samples: Sequence[float], midpoint: float, *, above: bool) -> float:
    """One-sided sign test: p-value that the samples lie above (or below) ``midpoint``.

    The sign test counts samples on each side and nothing else, so a few samples slowed by
    something outside the code (another process on the core) weigh as one sample each,
    however slow. Samples equal to the midpoint are dropped.

    Args:
        samples: raw samples (ms).
        midpoint: the value to test against (ms).
        above: test for "above" (True) or "below" (False).

    Returns:
        P(X >= k) for X ~ Binomial(n, 1/2), k the samples on the tested side; 1.0 when n = 0.
    """
    x = np.asarray(samples, dtype=float)
    hits = int(np.sum(x > midpoint) if above else np.sum(x < midpoint))
    n = int(np.sum(x != midpoint))
    if n == 0:
        return 1.0
    return float(stats.binom.sf(hits - 1, n, 0.5))


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


def midpoint(good: Sequence[float], bad: Sequence[float]) -> float:
    """Halfway between the endpoints' medians (ms)."""
    return (median_of(good) + median_of(bad)) / 2


def nearer_side(
    samples: Sequence[float], good: Sequence[float], bad: Sequence[float], *, alpha: float = 0.01
) -> str:
    """Which endpoint the probe is significantly nearer to: a sign test against the midpoint.

    The probe is ``good`` when a one-sided sign test puts its samples on the good endpoint's
    side of the midpoint between the endpoints' medians at ``alpha``, ``bad`` on the other
    side, else ``undecided``. It tolerates a drift of the machine's speed of up to half the
    regression between the endpoints' measurement and the probe's, which the two-sided
    verdicts (rightly) call ``different`` from both endpoints, and a minority of samples slowed
    by other work.

    Args:
        samples: the probe's samples (ms).
        good: the good endpoint's samples.
        bad: the bad endpoint's samples.
        alpha: significance of the one-sided test.

    Returns:
        ``good`` | ``bad`` | ``undecided``.
    """
    mid = midpoint(good, bad)
    slower_is_bad = median_of(bad) > median_of(good)
    if side_p_value(samples, mid, above=not slower_is_bad) <= alpha:
        return GOOD
    if side_p_value(samples, mid, above=slower_is_bad) <= alpha:
        return BAD
    return UNDECIDED


def endpoints_apart(
    good: Sequence[float], bad: Sequence[float], *, alpha: float = APART_ALPHA
) -> bool:
    """True when each endpoint's samples lie, by the sign test, on its own side of the midpoint.

    Endpoints measured while the machine was busy can straddle the midpoint (a bad endpoint
    with half its samples at twice the speed of the rest); every probe is placed against them,
    so they get more samples until they stand apart.
    """
    mid = midpoint(good, bad)
    slower_is_bad = median_of(bad) > median_of(good)
    return (
        side_p_value(good, mid, above=not slower_is_bad) <= alpha
        and side_p_value(bad, mid, above=slower_is_bad) <= alpha
    )


def classify(
    samples: Sequence[float],
    good: Sequence[float],
    bad: Sequence[float],
    *,
    alpha: float = 0.01,
    power: float = 0.99,
    resamples: int = 200,
) -> Classification:
    """Place a probe on the good or bad side from its samples.

    A probe is ``good`` when it is ``different`` from the bad endpoint and significantly nearer
    the good one than the midpoint (:func:`nearer_side`), ``bad`` in the mirror case, and
    ``undecided`` otherwise (it then gets more samples). The verdict against its own side is
    reported but not required to be ``same``: a machine that drifted since the endpoints were
    measured makes a probe ``different`` from both, and a probe whose samples are a mixture of
    two speeds (a busy machine) can pass as ``same`` as one side while sitting on neither.

    Args:
        samples: the probe's samples (ms).
        good: the good endpoint's samples.
        bad: the bad endpoint's samples.
        alpha: the low threshold of :func:`compare`.
        power: the high threshold's quantile (:func:`compare`).
        resamples: redraws for the high threshold (:func:`compare`).

    Returns:
        The verdicts against each endpoint and the side: ``good`` | ``bad`` | ``undecided``.
    """
    vs_good = compare(samples, good, alternative=bad, alpha=alpha, power=power, resamples=resamples)
    vs_bad = compare(samples, bad, alternative=good, alpha=alpha, power=power, resamples=resamples)
    near = nearer_side(samples, good, bad, alpha=alpha)
    if not endpoints_apart(good, bad):
        side = UNDECIDED  # the endpoints beside it straddle their midpoint: no yardstick
    elif near == GOOD and vs_bad.verdict == DIFFERENT:
        side = GOOD
    elif near == BAD and vs_good.verdict == DIFFERENT:
        side = BAD
    else:
        side = UNDECIDED
    return Classification(side=side, vs_good=vs_good, vs_bad=vs_bad)
