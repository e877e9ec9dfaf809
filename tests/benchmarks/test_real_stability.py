"""The stability re-check replayed beside the detector's flags (``benchmarks.real_stability``)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.detection import Flags
from benchmarks.real_stability import alerting, dark_nights, dark_share, dark_spreads, flag_changes
from benchmarks.series import SeriesSet


def _series(*rows: list[float], memory: tuple[bool, ...] = ()) -> SeriesSet:
    levels = np.array(rows, dtype=float)
    n = len(rows)
    return SeriesSet(
        levels=levels,
        memory=np.array(memory or (False,) * n),
        expected=np.zeros(levels.shape, dtype=bool),
        category=np.array(["flat"] * n),
        cv=np.zeros(n),
        samples=np.zeros(n, dtype=int),
        event_night=np.full(n, -1),
        event_end=np.full(n, -1),
        event_size=np.zeros(n),
    )


def _flags(*flags: tuple[int, int, int]) -> Flags:
    """``(series, first night, raised night)`` upward flags."""
    a = np.array(flags, dtype=int).reshape(-1, 3)
    return Flags(a[:, 0], a[:, 1], a[:, 2], np.ones(len(a), dtype=bool))


NOISY = [10.0 * (1.06 if k % 2 else 0.94) for k in range(40)]  # spread 12.8% > 9.26% allowed
QUIET = [10.0 * (1.01 if k % 2 else 0.99) for k in range(40)]  # spread 2%


def test_a_noisy_benchmark_is_dark_and_its_flag_withheld_a_quiet_one_alerts() -> None:
    s = _series(NOISY, QUIET)
    f = _flags((0, 30, 30), (1, 30, 30))
    dark = dark_nights(s, f)
    # The verdict in force when a night is assessed is the one after the night before. After
    # five nights the three low ones put the two high ones 12.8% off the window's median:
    # recent and that far off, they count as unsettled, and three processes judge nothing.
    # After six the median lies between the two levels, and the spread darkens.
    assert not dark[0, :6].any() and dark[0, 6:].all()
    assert not dark[1].any()
    spreads = dark_spreads(s, f)
    assert np.array_equal(np.isfinite(spreads), dark)
    kept = alerting(s, f, spreads)
    assert kept.series.tolist() == [1]
    assert dark_share(s, dark) == pytest.approx(34 / 80) == dark_share(s, spreads)


def test_a_dark_benchmark_alerts_a_change_beyond_three_times_its_spread() -> None:
    # NOISY spreads 12.8% (1.06 / 0.94 - 1): a step of +50% is beyond 3 x 12.8% = 38.3%, +30% is
    # not; with beyond 0 a dark benchmark never alerts.
    s = _series(*(NOISY[:30] + [v * (1 + size) for v in NOISY[30:]] for size in (0.5, 0.3)))
    f = _flags((0, 30, 31), (1, 30, 31))
    spreads = dark_spreads(s, f)
    assert spreads[:, 31] == pytest.approx([1.06 / 0.94 - 1] * 2)
    assert flag_changes(s, f) == pytest.approx([0.5, 0.3])
    assert alerting(s, f, spreads).series.tolist() == [0]
    assert alerting(s, f, spreads, beyond=2.0).series.tolist() == [0, 1]
    assert alerting(s, f, spreads, beyond=0).series.tolist() == []


def test_a_real_step_does_not_darken_its_own_benchmark() -> None:
    # +20% from night 20, raised on night 21: the step's first nights are unsettled (7% off the
    # window's median, recent), so the window does not darken; the raise cuts the window there.
    stepped = [v * (1.2 if k >= 20 else 1.0) for k, v in enumerate(QUIET)]
    s = _series(stepped)
    f = _flags((0, 20, 21))
    dark = dark_nights(s, f)
    assert not dark.any()
    assert alerting(s, f, dark).series.tolist() == [0]
    # Counted as settled (settle_nights 0 is refused; 1 keeps only the newest out), the step's
    # first night would have darkened the window before the raise.
    assert dark_nights(s, _flags(), settle_nights=1)[0, 21:].any()


def test_a_dark_benchmark_is_un_darkened_once_its_window_is_quiet() -> None:
    s = _series(NOISY[:20] + QUIET[20:])
    dark = dark_nights(s, _flags())
    assert dark[0, 10] and not dark[0, 35]
    # Memory series are never dark (the re-check reads latency).
    assert not dark_nights(_series(NOISY, memory=(True,)), _flags()).any()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="nights >= 2"):
        dark_nights(_series(QUIET), _flags(), nights=1)
