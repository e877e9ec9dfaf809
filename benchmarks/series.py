"""Seeded generator of labelled series for evaluating regression detection.

Every series is one metric of one benchmark over ``nights`` nights and carries at most one
labelled event. What is drawn (all from one ``numpy.random.Generator`` seed):

Latency (ms), raw samples then the night level (median of the night's samples):
    * base level log-uniform in [0.5, 2000] ms;
    * per-sample noise: coefficient of variation (CV) log-uniform in [0.5%, 5%]; 2% of samples
      are slow outliers (+0% to +200%, exponential);
    * samples per night from {15, 20, 30, 50} (the harness takes at least 15 and keeps going
      for 2 s);
    * night-to-night jitter: Student-t (4 d.o.f.) with scale CV / 4 (machine state of the
      night);
    * heavy-tailed outlier nights: 1% of nights, x(1 + 0.1 |Cauchy|) capped at x3 (a fifth of
      them downwards, x(1 - U(0.03, 0.2)));
    * bimodal benchmarks: the whole night lands in an upper mode (+5% to +20%) with
      probability 0.2 to 0.5.
Peak memory (bytes), one sample per night: base log-uniform in [50 MB, 40 GB] rounded to 512
    bytes; exact (70%), jittering by up to +-8 allocator blocks of 512 B (20%), or bimodal
    between two exact values 2% to 15% apart (10%).
Missing nights: 3% at random, plus an outage of 3 to 14 nights in 10% of series.

Categories (weights): ``flat`` (latency, no change), ``bimodal`` (latency, no change),
``step`` (persistent step at night e of size from ``STEP_SIZES``: +3% to +100%, and
improvements), ``expected_step`` (a step of +10% to +50% marked ``expected`` at its night:
the baseline resets, no flag wanted), ``blip`` (one night x(1 + b), b in ``BLIP_SIZES``),
``drift`` (a linear ramp of +10% to +30% over 30 to 120 nights), ``benign_drift`` (a ramp of
+-1% to +-2.5%), and the memory counterparts ``mem_flat``, ``mem_bimodal``, ``mem_step``
(exact byte steps), ``mem_blip``. Outlier nights and missing nights come on top of every
category. Events start in [60, nights - 30).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STEP_SIZES = (
    0.03,
    0.05,
    0.075,
    0.10,
    0.15,
    0.20,
    0.30,
    0.50,
    1.00,
    -0.03,
    -0.075,
    -0.10,
    -0.20,
    -0.50,
)
BLIP_SIZES = (0.10, 0.20, 0.50, 1.00)
SAMPLES_PER_NIGHT = (15, 20, 30, 50)
CATEGORIES = {
    "flat": 0.16,
    "bimodal": 0.05,
    "step": 0.32,
    "expected_step": 0.03,
    "blip": 0.07,
    "drift": 0.04,
    "benign_drift": 0.03,
    "mem_flat": 0.10,
    "mem_bimodal": 0.02,
    "mem_step": 0.13,
    "mem_blip": 0.05,
}
NO_CHANGE = ("flat", "bimodal", "mem_flat", "mem_bimodal")


@dataclass
class SeriesSet:
    """A batch of labelled series.

    Attributes:
        levels: (series, nights) night levels (median of the night's samples; ms or bytes),
            NaN where the night is missing.
        memory: (series,) True for peak memory.
        expected: (series, nights) True where the step starting that night is marked expected.
        category: (series,) category name (see the module docstring).
        cv: (series,) per-sample coefficient of variation (0 for exact memory).
        samples: (series,) samples per night.
        event_night: (series,) first night of the event, -1 when none.
        event_end: (series,) last night of a drift's ramp (= event_night otherwise).
        event_size: (series,) relative size of the event (0.1 = +10%), 0 when none.
    """

    levels: np.ndarray
    memory: np.ndarray
    expected: np.ndarray
    category: np.ndarray
    cv: np.ndarray
    samples: np.ndarray
    event_night: np.ndarray
    event_end: np.ndarray
    event_size: np.ndarray


def _profile(cat: np.ndarray, rng: np.random.Generator, nights: int):
    """Multiplicative event profile (series, nights) and the event labels."""
    n = cat.size
    t = np.arange(nights)[None, :]
    e = rng.integers(60, nights - 30, size=n)
    size = np.zeros(n)
    end = e.copy()
    factor = np.ones((n, nights))
    is_step = np.isin(cat, ("step", "mem_step"))
    size[is_step] = rng.choice(STEP_SIZES, size=is_step.sum())
    is_exp = cat == "expected_step"
    size[is_exp] = rng.uniform(0.10, 0.50, size=is_exp.sum())
    steps = is_step | is_exp
    factor[steps] = np.where(t >= e[steps, None], 1 + size[steps, None], 1.0)
    blips = np.isin(cat, ("blip", "mem_blip"))
    size[blips] = rng.choice(BLIP_SIZES, size=blips.sum())
    factor[blips] = np.where(t == e[blips, None], 1 + size[blips, None], 1.0)
    for name, lo, hi in (("drift", 0.10, 0.30), ("benign_drift", 0.01, 0.025)):
        d = cat == name
        k = int(d.sum())
        size[d] = rng.uniform(lo, hi, size=k) * (1 if name == "drift" else rng.choice([-1, 1], k))
        length = rng.integers(30, 121, size=k)
        end[d] = np.minimum(e[d] + length, nights - 1)
        frac = np.clip((t - e[d, None]) / np.maximum(end[d] - e[d], 1)[:, None], 0, 1)
        factor[d] = np.exp(np.log1p(size[d])[:, None] * frac)
    night = np.where(np.isin(cat, NO_CHANGE), -1, e)
    end = np.where(night < 0, -1, end)
    return factor, night, end, size


def _latency_levels(base, cv, ns, factor, bimodal, rng):
    """Night levels (median of raw samples) for latency series, shape (series, nights)."""
    n, nights = factor.shape
    jitter = np.exp(rng.standard_t(4, size=(n, nights)) * (cv / 4)[:, None])
    outlier = rng.random((n, nights)) < 0.01
    up = rng.random((n, nights)) < 0.8
    spike = np.where(
        up,
        np.minimum(1 + 0.1 * np.abs(rng.standard_cauchy((n, nights))), 3.0),
        1 - rng.uniform(0.03, 0.2, (n, nights)),
    )
    gap = rng.uniform(0.05, 0.20, n)
    q = rng.uniform(0.2, 0.5, n)
    mode = np.where(
        bimodal[:, None] & (rng.random((n, nights)) < q[:, None]), 1 + gap[:, None], 1.0
    )
    night_level = base[:, None] * factor * jitter * np.where(outlier, spike, 1.0) * mode
    levels = np.empty((n, nights))
    for k in np.unique(ns):
        group = np.nonzero(ns == k)[0]
        for b0 in range(0, group.size, 1000):  # bounded memory: 1000 x nights x k samples
            rows = group[b0 : b0 + 1000]
            eps = rng.standard_normal((rows.size, nights, k)) * cv[rows, None, None]
            slow = rng.random((rows.size, nights, k)) < 0.02
            eps += np.where(slow, np.log1p(rng.exponential(0.4, (rows.size, nights, k))), 0.0)
            levels[rows] = night_level[rows] * np.median(np.exp(eps), axis=2)
    return levels


def _memory_levels(base, factor, cat, rng):
    n, nights = factor.shape
    kind = rng.choice(3, size=n, p=[0.7, 0.2, 0.1])
    kind = np.where(cat == "mem_bimodal", 2, np.where(kind == 2, 0, kind))
    jitter = np.where(kind[:, None] == 1, rng.integers(-8, 9, (n, nights)) * 512, 0)
    gap = rng.uniform(0.02, 0.15, n)
    q = rng.uniform(0.2, 0.5, n)
    upper = (kind[:, None] == 2) & (rng.random((n, nights)) < q[:, None])
    level = np.round(base[:, None] * factor * np.where(upper, 1 + gap[:, None], 1.0) / 512) * 512
    outlier = rng.random((n, nights)) < 0.01
    level = np.where(
        outlier, level * np.minimum(1 + 0.1 * np.abs(rng.standard_cauchy((n, nights))), 3.0), level
    )
    return np.round(level + jitter)


def generate(
    n_series: int, nights: int = 365, seed: int = 0, categories: dict[str, float] | None = None
) -> SeriesSet:
    """Draw ``n_series`` labelled series of ``nights`` nights.

    Args:
        n_series: number of series.
        nights: nights per series (>= 120).
        seed: seed of the random generator; the same seed gives the same series.
        categories: category weights (defaults to ``CATEGORIES``).

    Returns:
        The SeriesSet.

    Raises:
        ValueError: fewer than 120 nights or an unknown category.
    """
    if nights < 120:
        raise ValueError("nights: need at least 120 nights")
    weights = categories or CATEGORIES
    unknown = set(weights) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"categories: unknown {sorted(unknown)}")
    rng = np.random.default_rng(seed)
    names = np.array(list(weights))
    w = np.array([weights[k] for k in names], dtype=float)
    cat = rng.choice(names, size=n_series, p=w / w.sum())
    memory = np.char.startswith(cat.astype(str), "mem_")
    factor, night, end, size = _profile(cat, rng, nights)
    levels = np.empty((n_series, nights))
    cv = np.where(memory, 0.0, np.exp(rng.uniform(np.log(0.005), np.log(0.05), n_series)))
    ns = np.where(memory, 1, rng.choice(SAMPLES_PER_NIGHT, size=n_series))
    lat = ~memory
    base = np.exp(rng.uniform(np.log(0.5), np.log(2000), n_series))
    levels[lat] = _latency_levels(
        base[lat], cv[lat], ns[lat], factor[lat], cat[lat] == "bimodal", rng
    )
    mem_base = np.round(np.exp(rng.uniform(np.log(50e6), np.log(40e9), n_series)) / 512) * 512
    levels[memory] = _memory_levels(mem_base[memory], factor[memory], cat[memory], rng)
    missing = rng.random((n_series, nights)) < 0.03
    outage = rng.random(n_series) < 0.10
    o_start = rng.integers(30, nights - 20, n_series)
    o_len = rng.integers(3, 15, n_series)
    t = np.arange(nights)[None, :]
    missing |= outage[:, None] & (t >= o_start[:, None]) & (t < (o_start + o_len)[:, None])
    expected = np.zeros((n_series, nights), dtype=bool)
    ex = np.nonzero(cat == "expected_step")[0]
    expected[ex, night[ex]] = True
    # The event night itself is kept, so that its label stays exact.
    has_event = night >= 0
    missing[np.nonzero(has_event)[0], night[has_event]] = False
    levels[missing] = np.nan
    return SeriesSet(
        levels=levels,
        memory=memory,
        expected=expected,
        category=cat,
        cv=cv,
        samples=ns,
        event_night=night,
        event_end=end,
        event_size=size,
    )
