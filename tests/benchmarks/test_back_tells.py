"""The count of regression flags whose issue is told the series is back (benchmarks.back_tells)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.back_tells import KINDS, classify, main
from benchmarks.series import SeriesSet
from service.regressions.scan import detect_series
from tests.service.test_detection import levels, quiet


def _set(
    rows: list[list[float]], category: list[str], e: list[int], size: list[float]
) -> SeriesSet:
    n = len(rows)
    lv = np.array(rows)
    return SeriesSet(
        levels=lv,
        memory=np.zeros(n, dtype=bool),
        expected=np.zeros(lv.shape, dtype=bool),
        category=np.array(category),
        cv=np.full(n, 0.01),
        samples=np.full(n, 20),
        event_night=np.array(e),
        event_end=np.array(e),
        event_size=np.array(size),
    )


def test_an_excursion_that_came_back_is_told_and_a_persisting_step_is_not() -> None:
    # A flat series with a two-night excursion (raised, then back for three nights), and one
    # with a planted +30% step that persists.
    excursion = levels(quiet(20) + [18.0, 12.5] + quiet(18))
    step = levels(quiet(25) + quiet(15, shift=30))
    s = _set([excursion, step], ["flat", "step"], [-1, 25], [0.0, 0.3])
    found = detect_series(s.levels, memory=s.memory, threshold=0.07, online=True)
    night = np.broadcast_to(np.arange(s.levels.shape[1]), s.levels.shape)
    table = classify(s, found, night)
    assert table[KINDS[1]] == {"raised": 1, "told_back": 1}, table
    assert table[KINDS[0]] == {"raised": 1, "told_back": 0}, table
    assert table["true_by_size"] == {"+30.0%": [0, 1]}


def test_unknown_draws_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--draws", "segment,sideways"])
    assert "sideways" in capsys.readouterr().err
