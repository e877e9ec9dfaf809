"""The nightly stability re-check replayed on series of night levels: which flags would alert.

A benchmark marked unstable is assessed and shown, never alerted
(``service/regressions/detection.py``), and after every night the re-check
(``workers/night/recheck.py``, ``service/stability/recheck.py``) judges the per-process medians
of its last K nights by TorchBench's spread rule. A detection evaluation on night levels alone
counts every flag as an alert; this module replays the re-check beside the detector's flags, so
that the figures can be given as the nightly would alert. With one process a night (the real
histories: one measurement per commit):

- **window**: the last ``nights`` (K = 10) nights with data up to night t, from the first night of
  the latest step raised by night t on (where the re-check cuts, as the detector restarts its
  baseline);
- **unsettled**: a night among the window's last ``settle_nights`` (7, the detector's
  ``max_run``) whose level stands ``threshold`` (7%) or more from the window's median. It stands
  in for "a candidate the detector has not settled yet" (a candidate is a change that reaches the
  threshold itself), and is left out of a verdict that would darken;
- **verdict** after night t, with at least ``min_processes`` (5) processes: a stable benchmark is
  darkened when its settled processes' spread ((max - min) / min) reaches
  :func:`suite.stability.allowed_spread` for their number (9.26% for 10); a dark one is
  un-darkened when all its processes' spread is below that. Fewer processes: no change;
- a flag raised on night t alerts unless the verdict in force then (after night t - 1) is
  unstable. A benchmark never judged counts as stable;
- a dark benchmark's flag still alerts when its change is beyond the benchmark's noise: at
  least ``beyond`` (3) times the spread of the verdict that darkened it, and the threshold
  (``DetectorParams.unstable_beyond``, the nightly's rule). The flag's change here is the
  median of its nights from its first to the night it was raised against the median of the
  ``window`` (28) nights with data before its first night.

Latency series only: the re-check reads the latency series, so peak-memory flags are kept. The
replay leaves the flags themselves as they are, as the nightly does: an unstable benchmark's
steps are still assessed and restart its baseline, only the alert is withheld.
"""

from __future__ import annotations

import numpy as np

from benchmarks.detection import Flags
from benchmarks.series import SeriesSet
from service.regressions.rules import DEFAULT_PARAMS
from suite.stability import allowed_spread

RECHECK_NIGHTS = 10
SETTLE_NIGHTS = 7
MIN_PROCESSES = 5


def _spread(values: np.ndarray) -> float:
    return float((values.max() - values.min()) / values.min())


def dark_nights(
    s: SeriesSet,
    f: Flags,
    *,
    nights: int = RECHECK_NIGHTS,
    settle_nights: int = SETTLE_NIGHTS,
    min_processes: int = MIN_PROCESSES,
    threshold: float = 0.07,
) -> np.ndarray:
    """Where the verdict in force when a night is assessed is *unstable* (module docstring).

    Args:
        s: the series; ``levels`` (series, nights), NaN where a night has no data.
        f: the detector's flags on ``s`` (``night``: a step's first night; ``raised``: when).
        nights: K, the nights the re-check's window spans at most.
        settle_nights: how recent a night off by ``threshold`` must be to count as unsettled.
        min_processes: fewest processes that change a verdict.
        threshold: the detector's threshold (fraction), for the unsettled nights.

    Returns:
        A bool array shaped like ``s.levels``; memory series are never dark.

    Raises:
        ValueError: ``nights`` or ``min_processes`` below 2, or ``settle_nights`` below 1.
    """
    return np.isfinite(
        dark_spreads(
            s,
            f,
            nights=nights,
            settle_nights=settle_nights,
            min_processes=min_processes,
            threshold=threshold,
        )
    )


def dark_spreads(
    s: SeriesSet,
    f: Flags,
    *,
    nights: int = RECHECK_NIGHTS,
    settle_nights: int = SETTLE_NIGHTS,
    min_processes: int = MIN_PROCESSES,
    threshold: float = 0.07,
) -> np.ndarray:
    """The spread ((max - min) / min, a fraction) of the verdict in force where it is
    *unstable*, NaN where it is stable: the spread that darkened the benchmark, kept while the
    verdict stands (the nightly stores a verdict's figures only when it changes). Arguments
    and errors as :func:`dark_nights`; a float array shaped like ``s.levels``."""
    if nights < 2 or min_processes < 2 or settle_nights < 1:
        raise ValueError(
            f"need nights >= 2, min_processes >= 2, settle_nights >= 1; got "
            f"{nights}, {min_processes}, {settle_nights}"
        )
    out = np.full(s.levels.shape, np.nan)
    for i in np.nonzero(~s.memory)[0]:
        row = s.levels[i]
        have = np.nonzero(np.isfinite(row))[0]
        mine = f.series == i
        raised, first = f.raised[mine], f.night[mine]
        spread = np.nan  # the verdict in force: NaN stable, else the spread that darkened it
        for j, t in enumerate(have):
            out[i, t] = spread
            done = first[raised <= t]
            cut = int(done.max()) if done.size else 0
            idx = have[max(0, j + 1 - nights) : j + 1]
            vals = row[idx[idx >= cut]]
            if vals.size < min_processes:
                continue
            if np.isfinite(spread):
                if _spread(vals) < allowed_spread(vals.size):
                    spread = np.nan
                continue
            recent = np.arange(vals.size) >= vals.size - settle_nights
            off = np.abs(vals / np.median(vals) - 1) >= threshold
            settled = vals[~(recent & off)]
            if settled.size >= min_processes and _spread(settled) >= allowed_spread(settled.size):
                spread = _spread(settled)
    return out


def flag_changes(s: SeriesSet, f: Flags, *, window: int = DEFAULT_PARAMS.window) -> np.ndarray:
    """Each flag's relative change (0.12 = +12%): the median of its nights with data from its
    first night to the night it was raised, against the median of the ``window`` nights with
    data before its first night (0 where there are none). Shape ``(flags,)``."""
    out = np.zeros(f.series.size)
    for k, (i, a, r) in enumerate(zip(f.series, f.night, f.raised, strict=True)):
        row = s.levels[i]
        have = np.nonzero(np.isfinite(row))[0]
        before, after = have[have < a][-window:], have[(have >= a) & (have <= r)]
        if before.size and after.size:
            out[k] = np.median(row[after]) / np.median(row[before]) - 1
    return out


def alerting(
    s: SeriesSet,
    f: Flags,
    spreads: np.ndarray | None = None,
    *,
    beyond: float = DEFAULT_PARAMS.unstable_beyond,
    threshold: float = 0.07,
) -> Flags:
    """The flags of ``f`` the nightly would alert: raised while their benchmark was not dark,
    or, dark, with a change of at least ``beyond`` times the spread in force and
    ``threshold`` (:func:`dark_spreads`, :func:`flag_changes`; ``beyond`` 0 never alerts a
    dark benchmark's flag)."""
    spreads = dark_spreads(s, f) if spreads is None else spreads
    if not f.series.size:
        return f
    spread = spreads[f.series, f.raised]
    dark = np.isfinite(spread)
    loud = (beyond > 0) & (np.abs(flag_changes(s, f)) >= np.maximum(threshold, beyond * spread))
    keep = ~dark | loud
    return Flags(f.series[keep], f.night[keep], f.raised[keep], f.up[keep])


def dark_share(s: SeriesSet, dark: np.ndarray) -> float:
    """The share of the latency series' nights with data assessed while dark (0..1); ``dark``
    is :func:`dark_nights` or :func:`dark_spreads`."""
    dark = np.isfinite(dark) if dark.dtype.kind == "f" else dark
    have = np.isfinite(s.levels) & ~s.memory[:, None]
    return float(dark[have].mean()) if have.any() else 0.0
