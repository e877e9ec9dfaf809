"""Regression detection on literal series: every case of issue 5's "Handle" list.

Pure tests: no database. Levels are written as literal per-night offsets (percent) around a
base, so each series can be read off the test.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics

import numpy as np
import pytest

from service.regressions.detection import (
    Assessment,
    DetectionInputError,
    DetectorParams,
    Night,
    assess_night,
    confirm,
    detect_document,
    detect_series,
)

# Night-to-night noise of a quiet latency benchmark, in percent (about 0.5% CV).
NOISE = [
    0.3,
    -0.5,
    0.1,
    0.8,
    -0.2,
    -0.7,
    0.4,
    0.0,
    -0.3,
    0.6,
    -0.9,
    0.2,
    0.5,
    -0.1,
    -0.4,
    0.7,
    -0.6,
    0.1,
    0.3,
    -0.8,
    0.2,
    -0.2,
    0.9,
    -0.5,
    0.0,
    0.4,
    -0.3,
    0.6,
]


def levels(offsets: list[float], base: float = 100.0) -> list[float]:
    """Night levels from percent offsets."""
    return [base * (1 + o / 100) for o in offsets]


def quiet(n: int, shift: float = 0.0) -> list[float]:
    """n quiet nights, offsets from NOISE, shifted by ``shift`` percent."""
    return [NOISE[i % len(NOISE)] + shift for i in range(n)]


def nights(
    values: list[float], start: int = 0, samples: int = 1, ordinals: list[int] | None = None
) -> list[Night]:
    """Nights with ``samples`` identical samples each (the median is the value)."""
    days = ordinals or list(range(start, start + len(values)))
    return [Night(night=d, samples=(v,) * samples) for d, v in zip(days, values, strict=True)]


def doc(
    *series: tuple[str, str, list[float]],
    threshold: object = 0.07,
    ordinals: dict[str, list[int]] | None = None,
) -> dict:
    out = []
    for sid, metric, vals in series:
        days = (ordinals or {}).get(sid) or list(range(len(vals)))
        out.append(
            {
                "id": sid,
                "metric": metric,
                "nights": [{"night": d, "samples": [v]} for d, v in zip(days, vals, strict=True)],
            }
        )
    return {"threshold": threshold, "series": out}


def online_flags(values: list[float], metric: str = "latency", **kw) -> list[dict]:
    return detect_document(doc(("s", metric, values), **kw), online=True)["flags"]


def offline_flags(values: list[float], metric: str = "latency", **kw) -> list[dict]:
    return detect_document(doc(("s", metric, values), **kw), online=False)["flags"]


# --------------------------------------------------------------------------------------------
# The rule: a persistent step beyond the threshold, and nothing else


def test_step_above_threshold_is_flagged_on_its_second_night():
    series = levels(quiet(30) + quiet(10, shift=10))
    flags = online_flags(series)
    assert len(flags) == 1
    f = flags[0]
    assert (f["night"], f["raised_night"], f["direction"]) == (30, 31, "regression")
    assert f["change"] == pytest.approx(0.10, abs=0.01)
    assert 0 < f["p_value"] <= 0.01


@pytest.mark.parametrize("shift", [3.0, -3.0, 2.0])
def test_steps_of_3_percent_or_less_are_never_flagged(shift):
    assert online_flags(levels(quiet(30) + quiet(40, shift=shift))) == []
    assert offline_flags(levels(quiet(30) + quiet(40, shift=shift))) == []


def test_step_just_above_threshold_is_flagged_below_is_not_on_a_quiet_series():
    # With 0.5% noise the cut-off sits about a point under 7%: 7.5% is in, 4.5% is out (the grey
    # zone between half the threshold and the threshold narrows as the noise falls).
    flags = online_flags(levels(quiet(30) + quiet(10, shift=7.5)))
    assert len(flags) == 1 and flags[0]["change"] == pytest.approx(0.075, abs=0.006)
    assert online_flags(levels(quiet(30) + quiet(10, shift=4.5))) == []


def test_one_night_blip_is_not_a_regression():
    series = levels(quiet(30) + [60.0] + quiet(20))
    assert online_flags(series) == []
    assert offline_flags(series) == []


def test_two_night_blip_is_flagged_online_but_not_offline():
    # Online cannot know the future: two nights at +20% persist. Offline sees the return.
    series = levels(quiet(30) + [20.0, 20.5] + quiet(30))
    flags = online_flags(series)
    assert [f["night"] for f in flags if f["direction"] == "regression"] == [30]
    assert [f["direction"] for f in offline_flags(series)] == []


def _pair(offset: float) -> list[float]:
    return [offset, offset + 0.5]


# Excursions: a quiet series that strayed +20% for two nights at night 10 and again at 30
# (consecutive builds on one slow host, as on shared CI runners), back each time.
EXCURSIONS = quiet(10) + _pair(20) + quiet(18) + _pair(21) + quiet(20)


def test_a_two_night_excursion_is_flagged_once_then_counts_as_the_series_habit():
    # The first excursion cannot be told from a step (it is flagged, as a two-night blip on a
    # quiet series is); the next ones, no longer than it, are not.
    flags = online_flags(levels(EXCURSIONS + _pair(20) + quiet(10)))
    assert [(f["night"], f["direction"]) for f in flags] == [(10, "regression")]


def test_a_step_waits_one_night_more_on_a_series_with_two_night_excursions():
    series = levels(EXCURSIONS + quiet(10, shift=20))
    flags = online_flags(series)
    assert [(f["night"], f["raised_night"]) for f in flags][1:] == [(52, 54)]
    # With the excursion rule off, every excursion is flagged.
    off = detect_series(
        np.array([series]), memory=False, online=True, params=DetectorParams(excursion_look=0)
    )
    assert [f.night for f in off] == [10, 30, 52]
    # Without that history the same step is raised on its second night.
    flags = online_flags(levels(quiet(52) + quiet(10, shift=20)))
    assert [(f["night"], f["raised_night"]) for f in flags] == [(52, 53)]


def test_small_excursions_do_not_hold_up_a_big_step():
    # +20% excursions are not half way to a +60% step: raised on its second night.
    flags = online_flags(levels(EXCURSIONS + quiet(10, shift=60)))
    assert [(f["night"], f["raised_night"]) for f in flags][1:] == [(52, 53)]
    assert flags[1]["change"] == pytest.approx(0.6, abs=0.02)


def test_excursions_before_a_big_improvement_still_count_after_it():
    # A -40% improvement is raised and restarts the baseline; a +20% excursion of two nights
    # after it (at -28% of the old level) is the series' habit, not a regression.
    series = EXCURSIONS + quiet(20, shift=-40) + _pair(-28) + quiet(10, shift=-40)
    flags = online_flags(levels(series))
    assert [(f["night"], f["direction"]) for f in flags] == [
        (10, "regression"),
        (52, "improvement"),
    ]


# A busy host (nights stray by up to 9%) that made one two-night excursion of +35% (night 22,
# raised then as a step: the first excursion cannot be told from one), back after it.
BUSY = [0.0, 6.1, -4.8, 8.7, -2.9, 3.8, -7.2, 1.6, 7.9, -4.1, 2.7, -9.0, 5.2, -1.3, 4.4, -6.0]
BUSY_EXCURSION = BUSY + BUSY[:6] + [35.0, 37.0] + BUSY + BUSY


def _online(
    values: list[float], rerun_at: tuple[int, ...] = (), direction: str = "regression", **params
) -> list[tuple]:
    """(first night, raised night) of the online regressions (or ``direction``);
    ``rerun_at``: re-run nights."""
    again = np.zeros((1, len(values)), dtype=bool)
    again[0, list(rerun_at)] = True
    flags = detect_series(
        np.array([levels(values)]),
        memory=False,
        online=True,
        params=DetectorParams(**params),
        rerun=again,
    )
    return [(f.night, f.raised_night) for f in flags if f.direction == direction]


@pytest.mark.parametrize(
    "step, rerun_pct", [(40.0, 32.0), (40.0, 38.0), (40.0, 45.0), (44.0, 35.0)]
)
def test_a_rerun_confirms_a_step_on_its_first_night_despite_a_two_night_excursion(
    step: float, rerun_pct: float
) -> None:
    # The end-to-end failure of the withdrawn rule: the step's night is a candidate and its
    # re-run of the same build reproduces it; a re-run measures the build again, the host's
    # excursions do not hold it back.
    assert _online(BUSY_EXCURSION) == [(22, 23)]
    seen, raised = nightly_flow(BUSY_EXCURSION, [(step, rerun_pct)])
    assert seen == ["regression?", "rerun:regression"]
    assert raised is not None and raised.confirmed and raised.alertable
    assert raised.first_night == len(BUSY_EXCURSION)
    assert 0.3 <= raised.step_change <= 0.45
    # The same two levels as two nights of the host (no re-run) are held back by its
    # excursion: a candidate again, not raised.
    history = nights(levels(BUSY_EXCURSION + [step]))
    night2 = assess_night(
        history, Night(len(history), (100 * (1 + rerun_pct / 100),)), metric="latency"
    )
    assert night2.verdict == "regression" and not night2.confirmed
    # In the batch API the re-run mark is the only difference.
    n = len(BUSY_EXCURSION)
    series = BUSY_EXCURSION + [step, rerun_pct]
    assert _online(series, rerun_at=(n + 1,)) == [(22, 23), (n, n + 1)]
    assert _online(series) == [(22, 23)]


def test_runs_of_nights_at_the_excursions_size_wait_for_their_third_night() -> None:
    n = len(BUSY_EXCURSION)
    # Two nights at the excursion's size, back after: the host's habit, not raised...
    again = BUSY_EXCURSION + [36.0, 35.0] + BUSY[:8]
    assert _online(again) == [(22, 23)]
    assert _online(again, excursion_look=0) == [(22, 23), (n, n + 1)]  # (rule off: raised)
    # ...and a step of that size is raised on its third night.
    step = BUSY_EXCURSION + [40.0, 41.0, 39.0, 42.0]
    assert _online(step) == [(22, 23), (n, n + 2)]
    assert _online(step, excursion_look=0) == [(22, 23), (n, n + 1)]


def test_a_series_without_excursions_is_judged_as_before() -> None:
    plain = BUSY * 2 + BUSY[:12]
    n = len(plain)
    step = plain + [40.0, 41.0, 39.0, 42.0]
    assert _online(step) == _online(step, excursion_look=0) == [(n, n + 1)]
    assert _online(plain + [40.0, 38.0], rerun_at=(n + 1,)) == [(n, n + 1)]
    seen, raised = nightly_flow(plain, [(40.0, 38.0)])
    assert seen == ["regression?", "rerun:regression"] and raised is not None


# A quiet series whose host throws a lone +10% night every 12 nights (never two in a row): five
# in its 60 nights, two of them in the last 28.
OUTLIERS = [10.0 + o if i % 12 == 5 else o for i, o in enumerate(quiet(60))]


def test_two_nights_on_a_series_with_frequent_outlier_nights_wait_for_a_third() -> None:
    n = len(OUTLIERS)
    # Two nights of the outliers' size come by chance there ((5/61)**2 > 0.003): not raised...
    pair = OUTLIERS + [10.5, 11.0] + quiet(10)
    assert _online(pair) == []
    assert _online(pair, excursion_alpha=1.0) == [(n, n + 1)]  # (rate off: raised)
    # ...and a step of that size is raised on its third night.
    step = OUTLIERS + quiet(6, shift=10.8)
    assert _online(step) == [(n, n + 2)]
    assert _online(step, excursion_alpha=1.0) == [(n, n + 1)]


def test_a_series_without_outlier_nights_still_raises_on_two_nights() -> None:
    plain = quiet(60)
    n = len(plain)
    assert _online(plain + [10.5, 11.0] + quiet(10)) == [(n, n + 1)]
    assert _online(plain + quiet(6, shift=10.8)) == [(n, n + 1)]


# The same quiet series with two lone -10% nights in its 60 (nights 5 and 35), or two +10%.
DIPS = [o - 10.0 if i % 30 == 5 else o for i, o in enumerate(quiet(60))]
PEAKS = [o + 10.0 if i % 30 == 5 else o for i, o in enumerate(quiet(60))]


def test_two_nights_down_after_two_lone_dips_wait_for_a_third() -> None:
    n = len(DIPS)
    # (2/61)**2 = 0.0011: over improvement_alpha (0.0005), under excursion_alpha (0.003).
    pair = DIPS + [-10.5, -11.0] + quiet(10)
    assert _online(pair, direction="improvement") == []
    assert _online(pair, direction="improvement", improvement_alpha=0.003) == [(n, n + 1)]
    step = DIPS + quiet(6, shift=-10.8)
    assert _online(step, direction="improvement") == [(n, n + 2)]
    # Upwards the same pair after two lone peaks is raised on its second night, as before.
    assert _online(PEAKS + [10.5, 11.0] + quiet(10)) == [(n, n + 1)]


def test_an_improvement_on_a_series_without_dips_is_raised_on_its_second_night() -> None:
    plain = quiet(60)
    n = len(plain)
    assert _online(plain + quiet(6, shift=-10.8), direction="improvement") == [(n, n + 1)]
    # One lone dip ((1/61)**2 = 0.0003) does not hold it back either.
    one = [o - 10.0 if i == 35 else o for i, o in enumerate(plain)]
    assert _online(one + quiet(6, shift=-10.8), direction="improvement") == [(n, n + 1)]


def test_a_night_and_its_rerun_are_a_chance_pair_on_a_series_with_frequent_outlier_nights() -> None:
    # A re-run is another draw of the same host: a candidate and its re-run both at the
    # outliers' size are as likely a chance pair as two nights ((5/61)**2 > 0.003)...
    n = len(OUTLIERS)
    assert _online(OUTLIERS + [10.5, 11.0], rerun_at=(n + 1,)) == []
    assert _online(OUTLIERS + [10.5, 11.0], rerun_at=(n + 1,), excursion_alpha=1.0) == [
        (n, n + 1)
    ]  # (rate off: raised)
    # ...so the step is raised on its second night, from its first...
    seen, raised = nightly_flow(OUTLIERS, [(10.5, 11.0), (10.8, 10.6)])
    assert seen == ["regression?", "rerun:unchanged", "regression"]
    assert raised is not None and raised.confirmed and raised.first_night == n
    # ...and a step far beyond the outliers is confirmed by its re-run at once.
    seen, raised = nightly_flow(OUTLIERS, [(40.0, 38.0)])
    assert seen == ["regression?", "rerun:regression"] and raised is not None


def test_a_missing_night_inside_a_run_counts_toward_its_wait() -> None:
    # A step behind the host's two-night excursions waits for its third night by the
    # calendar: the job that failed on its second night does not make it wait for a third
    # night with data.
    n = len(BUSY_EXCURSION)
    assert _online(BUSY_EXCURSION + [40.0, 41.0, 39.0, 42.0]) == [(22, 23), (n, n + 2)]
    gappy = np.array([levels(BUSY_EXCURSION + [40.0, math.nan, 41.0, 39.0])])
    flags = detect_series(gappy, memory=False, online=True)
    assert [(f.night, f.raised_night) for f in flags] == [(22, 23), (n, n + 2)]
    # The same gap given as night ordinals instead of a missing column.
    days = np.array([list(range(n + 1)) + [n + 2, n + 3]], dtype=float)
    compact = np.array([levels(BUSY_EXCURSION + [40.0, 41.0, 39.0])])
    flags = detect_series(compact, memory=False, online=True, nights=days)
    assert [(f.night, f.raised_night) for f in flags] == [(22, 23), (n, n + 1)]
    assert [
        (f.night, f.raised_night) for f in detect_series(compact, memory=False, online=True)
    ] == [(22, 23), (n, n + 2)]
    # A gap before the step is no part of its run: it still waits for its third night.
    early = np.array(
        [levels(BUSY_EXCURSION[:-1] + [math.nan, BUSY_EXCURSION[-1], 40.0, 41.0, 39.0])]
    )
    flags = detect_series(early, memory=False, online=True)
    assert [(f.night, f.raised_night) for f in flags] == [(22, 23), (n + 1, n + 3)]


def test_the_outlier_rule_counts_nights_with_data() -> None:
    # Lone +14% nights at a rate of 10 in 61: two of them in a row come by chance
    # ((10/61)**2 > 0.003), and a missing night between two is no third draw.
    n = len(HEAVY)
    assert _online(HEAVY + [25.0, 24.7, 25.2, 25.0]) == [(n, n + 2)]
    gappy = np.array([levels(HEAVY + [25.0, math.nan, 24.7, 25.2, 25.0])])
    flags = detect_series(gappy, memory=False, online=True)
    assert [(f.night, f.raised_night) for f in flags if f.direction == "regression"] == [(n, n + 3)]


def test_the_nightly_counts_a_runs_nights_by_their_dates() -> None:
    # assess_night: history with dates; the step's second result comes two days after its
    # first (the night between failed), so it is raised, not held for another night.
    day0 = datetime.date(2026, 9, 1)
    history = [
        Night(i, (v,), date=day0 + datetime.timedelta(days=i))
        for i, v in enumerate(levels(BUSY_EXCURSION + [40.0]))
    ]
    n = len(BUSY_EXCURSION)
    second = Night(n + 1, (141.0,), date=day0 + datetime.timedelta(days=n + 2))
    raised = assess_night(history, second, metric="latency")
    assert raised.verdict == "regression" and raised.confirmed
    assert raised.first_night == n and "since 2026-10-27" in raised.reason
    # The reason counts the calendar too, and says how many results stand behind it.
    assert "persisting 3 nights (2 results)" in raised.reason
    # The next calendar night instead: a candidate held back by the host's excursion.
    held = assess_night(
        history,
        dataclasses.replace(second, date=day0 + datetime.timedelta(days=n + 1)),
        metric="latency",
    )
    assert held.verdict == "regression" and not held.confirmed
    # Without dates the ordinals count: a gap between them is the missing night.
    undated = [dataclasses.replace(night, date=None) for night in history]
    assert assess_night(
        undated, dataclasses.replace(second, date=None, night=n + 2), metric="latency"
    ).confirmed
    assert not assess_night(
        undated, dataclasses.replace(second, date=None), metric="latency"
    ).confirmed
    assert (
        "persisting 3 nights (2 results)"
        in assess_night(
            undated, dataclasses.replace(second, date=None, night=n + 2), metric="latency"
        ).reason
    )


def test_a_reason_counts_a_rerun_as_a_result_not_a_night() -> None:
    # A +40% step behind no excursion, confirmed by the re-run of its first night: raised on
    # that night, one night long with two results, dated or not.
    day0 = datetime.date(2026, 9, 1)
    values = levels(quiet(30) + [40.0])
    for dated in (True, False):
        history = [
            Night(i, (v,), date=day0 + datetime.timedelta(days=i) if dated else None)
            for i, v in enumerate(values)
        ]
        rerun = Night(
            30 if dated else 31,
            (141.0,),
            rerun=True,
            date=day0 + datetime.timedelta(days=30) if dated else None,
        )
        raised = assess_night(history, rerun, metric="latency")
        assert raised.confirmed and raised.first_night == 30, raised.reason
        assert "persisting 1 night (2 results)" in raised.reason, raised.reason


def test_night_ordinals_are_checked() -> None:
    series = np.array([levels(quiet(20))])
    days = np.arange(20, dtype=float)[None, :]
    with pytest.raises(DetectionInputError, match="nights: expected shape"):
        detect_series(series, memory=False, online=True, nights=days[:, 1:])
    days[0, 12] = 3.0
    with pytest.raises(DetectionInputError, match=r"nights: series 0 column 12 is 3\.0"):
        detect_series(series, memory=False, online=True, nights=days)
    # A decreasing ordinal on a missing night is no night at all.
    series[0, 12] = math.nan
    assert detect_series(series, memory=False, online=True, nights=days) == []
    with pytest.raises(DetectionInputError, match="series\\[0\\].nights\\[3\\].night"):
        detect_document(
            doc(("s", "latency", levels(quiet(5))), ordinals={"s": [0, 1, 2, 2, 3]}), online=True
        )


def test_a_rerun_adds_no_night_whatever_its_ordinal() -> None:
    # A re-run with an ordinal of its own (the Night API's positions) or its night's (the
    # nightly's dates) is the same draw on the same night: the step waits alike.
    n = len(HEAVY)
    run = np.array([levels(HEAVY + [25.0, 25.5, 24.7, 25.2, 25.0])])
    again = np.zeros(run.shape, dtype=bool)
    again[0, n + 1] = True
    own = np.array([list(range(n + 5))], dtype=float)
    shared = np.array([list(range(n + 1)) + [n, n + 1, n + 2, n + 3]], dtype=float)
    for days in (own, shared, None):
        flags = detect_series(run, memory=False, online=True, rerun=again, nights=days)
        assert [(f.night, f.raised_night) for f in flags] == [(n, n + 3)]


def test_a_documents_night_ordinals_count_a_missing_night() -> None:
    n = len(BUSY_EXCURSION)
    values = levels(BUSY_EXCURSION + [40.0, 41.0, 39.0])
    days = list(range(n + 1)) + [n + 2, n + 3]
    flags = online_flags(values, ordinals={"s": days})
    assert [(f["night"], f["raised_night"]) for f in flags] == [(22, 23), (n, n + 2)]
    flags = online_flags(values)
    assert [(f["night"], f["raised_night"]) for f in flags] == [(22, 23), (n, n + 2)]


HEAVY = [14.0 + o if i % 6 == 2 else o for i, o in enumerate(quiet(60))]  # 10 lone outliers


def test_a_rerun_inside_a_two_night_run_is_not_its_third_night() -> None:
    # Lone +14% nights come so often here that three draws beyond half a +25% step by chance
    # are no rarer than 0.003 ((10/61)**3): two nights and a re-run of the first are not three
    # nights, so the step waits for its third night as it does without the re-run.
    n = len(HEAVY)
    run = HEAVY + [25.0, 25.5, 24.7, 25.2, 25.0]  # night, its re-run, then three more nights
    assert _online(run, rerun_at=(n + 1,)) == [(n, n + 3)]
    assert _online(HEAVY + [25.0, 24.7, 25.2, 25.0]) == [(n, n + 2)]
    # The rate is what holds it: with it off, the night and its re-run are raised at once.
    assert _online(run, rerun_at=(n + 1,), excursion_alpha=1.0) == [(n, n + 1)]
    # A step far beyond the outliers is still confirmed by its re-run at once.
    assert _online(HEAVY + [60.0, 58.0, 61.0], rerun_at=(n + 1,)) == [(n, n + 1)]


def test_rerun_marks_change_nothing_offline_and_are_checked() -> None:
    series = np.array([levels(BUSY_EXCURSION + [40.0, 38.0, 41.0])])
    again = np.zeros(series.shape, dtype=bool)
    again[0, -2] = True
    assert detect_series(series, memory=False, online=False, rerun=again) == detect_series(
        series, memory=False, online=False
    )
    with pytest.raises(DetectionInputError, match="rerun"):
        detect_series(series, memory=False, online=True, rerun=again[:, 1:])
    # Marks follow their nights past missing nights (columns of the input).
    n = len(BUSY_EXCURSION)
    gappy = np.insert(np.array([levels(BUSY_EXCURSION + [40.0, 38.0])]), [5, 30], np.nan, axis=1)
    marks = np.zeros(gappy.shape, dtype=bool)
    marks[0, -1] = True
    flags = detect_series(gappy, memory=False, online=True, rerun=marks)
    assert [(f.night, f.raised_night) for f in flags] == [(23, 24), (n + 2, n + 3)]


def test_improvement_is_reported_not_alerted():
    history = nights(levels(quiet(30) + [-12.0]))
    a = assess_night(history, Night(31, (levels([-12.3])[0],)), metric="latency")
    assert a.verdict == "improvement" and a.confirmed
    assert a.alertable is False
    assert a.change == pytest.approx(-0.123, abs=0.005)
    flags = online_flags(levels(quiet(30) + quiet(10, shift=-12)))
    assert [(f["night"], f["direction"]) for f in flags] == [(30, "improvement")]


def test_a_lone_fast_night_is_not_an_improvement_yet():
    a = assess_night(nights(levels(quiet(30))), Night(30, (88.0,)), metric="latency")
    assert a.verdict == "unchanged"
    assert a.change == pytest.approx(-0.12, abs=0.01)


# --------------------------------------------------------------------------------------------
# Persistence: the confirmation re-run and the next night


def test_tonight_alone_is_a_candidate_that_needs_confirmation():
    a = assess_night(nights(levels(quiet(30))), Night(30, (112.0,)), metric="latency")
    assert a.verdict == "regression"
    assert a.confirmed is False and a.alertable is True
    assert a.baseline == pytest.approx(100.1, abs=0.3)
    assert a.value == 112.0
    assert a.change == pytest.approx(112.0 / a.baseline - 1)
    assert a.baseline_lower < a.baseline < a.baseline_upper


@pytest.mark.parametrize("scale", [0.0, 1.0, 4.0, 10.0])
@pytest.mark.parametrize("step", [3.5, 5.0, 5.5, 6.9])
def test_a_night_under_the_threshold_is_never_a_candidate(step: float, scale: float) -> None:
    # Quiet (scale 0: exact levels) to a noisy shared host (scale 10: ~5% night to night):
    # a night that does not reach +7% is no candidate, so it gets no confirmation re-run.
    history = nights(levels([o * scale for o in NOISE]))
    base = statistics.median(h.samples[0] for h in history)
    a = assess_night(history, Night(len(NOISE), (base * (1 + step / 100),)), metric="latency")
    assert a.verdict == "unchanged", a.reason
    assert not a.alertable and a.change == pytest.approx(step / 100, abs=1e-9)
    reached = assess_night(history, Night(len(NOISE), (base * 1.0701,)), metric="latency")
    assert reached.verdict == "regression" and reached.confirmed is False, reached.reason


def test_a_run_that_reaches_the_threshold_is_a_candidate() -> None:
    # On a noisy host (~3% night to night), a +12% step whose second night came out at +5%:
    # the run's median (+8.5%) reaches the threshold, so tonight is a candidate and gets its
    # re-run. The same +5% after an ordinary night is not, nor a series wandering under +7%.
    noisy = [o * 6 for o in NOISE[:20]]
    history = nights(levels(noisy + [12.0]))
    a = assess_night(history, Night(21, (105.0,)), metric="latency")
    assert a.verdict == "regression" and a.confirmed is False, a.reason
    history = nights(levels(noisy + [1.0]))
    assert assess_night(history, Night(21, (105.0,)), metric="latency").verdict == "unchanged"
    wandering = nights(levels(noisy + [5.5, 6.0, 6.5]))
    assert assess_night(wandering, Night(23, (106.8,)), metric="latency").verdict == "unchanged"


def test_confirmation_rerun_that_reproduces_confirms():
    history = nights(levels(quiet(30)))
    a = confirm(history, Night(30, (112.0,)), Night(30, (111.5,)), metric="latency")
    assert a.verdict == "regression" and a.confirmed and a.alertable
    assert a.first_night == 30
    assert a.step_change == pytest.approx(0.117, abs=0.005)
    assert a.value == 111.5
    assert a.p_value is not None and a.p_value <= 0.01


def test_confirmation_rerun_back_at_baseline_drops_the_blip():
    history = nights(levels(quiet(30)))
    a = confirm(history, Night(30, (112.0,)), Night(30, (100.2,)), metric="latency")
    assert a.verdict == "unchanged" and not a.alertable
    assert a.reason.startswith("Not reproduced")


def test_next_night_confirms_when_no_rerun_was_possible():
    history = nights(levels(quiet(30) + [11.0]))
    a = assess_night(history, Night(31, (111.4,)), metric="latency")
    assert a.verdict == "regression" and a.confirmed and a.alertable
    assert a.first_night == 30


# A noisy host (a shared CPU: ~4% night-to-night) and a step of about +15% whose first
# confirmation re-run came out low. Pairs are (night, its re-run) in percent.
NOISY_HOST = [0.0, 2.5, -2.2, 3.0, -1.0, 1.6, -3.0, 0.8]
LOW_FIRST_RERUN = [(21.0, 8.0), (10.5, 13.0), (16.5, 12.0), (18.0, 15.0), (17.0, 18.0)]


def nightly_flow(
    baseline: list[float],
    stepped: list[tuple[float, float]],
    params: DetectorParams = DetectorParams(),
) -> tuple[list[str], Assessment | None]:
    """Drive the nightly service's flow: assess tonight; a candidate gets its re-run; a re-run
    that does not reproduce stays in the history beside its night. Returns the verdicts in
    order and the first raised regression."""
    history = nights(levels(baseline))
    seen: list[str] = []
    for tonight_pct, rerun_pct in stepped:
        n = len(history)
        tonight = Night(n, (100 * (1 + tonight_pct / 100),))
        a = assess_night(history, tonight, metric="latency", params=params)
        seen.append(a.verdict + ("" if a.confirmed else "?"))
        if a.verdict == "regression" and a.confirmed:
            return seen, a
        history.append(tonight)
        if a.verdict == "regression":
            rerun = Night(n, (100 * (1 + rerun_pct / 100),), rerun=True)
            c = confirm(history[:-1], tonight, rerun, metric="latency", params=params)
            seen.append("rerun:" + c.verdict)
            if c.verdict == "regression":
                return seen, c
            history.append(rerun)
    return seen, None


def test_noisy_step_whose_first_rerun_is_low_is_still_raised_from_its_first_night():
    seen, raised = nightly_flow(NOISY_HOST, LOW_FIRST_RERUN)
    assert seen[:2] == ["regression?", "rerun:unchanged"]  # not reproduced on its first night
    assert raised is not None and raised.verdict == "regression" and raised.alertable
    assert raised.first_night == len(NOISY_HOST)  # the step's own first night, not later
    assert 0.10 <= raised.step_change <= 0.20
    assert raised.p_value is not None and raised.p_value <= 0.01
    # Judged against the baseline from before the step: its unconfirmed nights and their
    # re-runs did not lift it.
    assert raised.baseline == pytest.approx(statistics.median(levels(NOISY_HOST)))


def test_runs_of_three_nights_lose_that_step_to_their_own_baseline():
    # What a week-long run fixes: with runs of at most three nights (re-runs included), the
    # step's first nights fall into the baseline of every later run, and it is never raised.
    seen, raised = nightly_flow(NOISY_HOST, LOW_FIRST_RERUN, DetectorParams(max_run=3))
    assert raised is None
    assert seen.count("rerun:unchanged") == len(LOW_FIRST_RERUN)


def test_a_week_long_run_does_not_start_before_the_step():
    # One low night inside a long run is tolerated, but a run may not start on a baseline
    # night: the first night named is the step's own (bisection starts from it). Here the
    # run of seven nights ending on the step's fourth night would start on the last baseline
    # night (+0.8%), its lowest, which the quartile rule alone would let through.
    stepped = [(21.0, 8.0), (9.5, 16.0), (12.0, 17.5), (15.0, 13.0), (17.0, 16.0)]
    seen, raised = nightly_flow(NOISY_HOST, stepped)
    assert raised is not None and raised.first_night == len(NOISY_HOST), seen


# A host whose nights stray by ~5%, and a +20% step whose every night and re-run stands above
# every baseline night. The baseline's own successive differences put its noise at ~9%; judged
# on that estimate alone, the grey zone's margin stayed above the step's estimate for all
# seven nights and the step was never raised. The run's nights share the estimate (pooled).
HIGH_NOISE_ESTIMATE = [0.6, 6.2, 1.5, 2.3, -6.0, 5.9, -7.4, 1.9]
CLEAR_STEP = [
    (22.1, 18.0),
    (10.8, 15.3),
    (15.8, 14.3),
    (23.7, 18.4),
    (26.0, 20.8),
    (19.2, 22.6),
    (15.8, 16.1),
]


def test_a_step_above_every_baseline_night_is_raised_despite_a_high_noise_estimate():
    assert min(min(pair) for pair in CLEAR_STEP) > max(HIGH_NOISE_ESTIMATE)
    seen, raised = nightly_flow(HIGH_NOISE_ESTIMATE, CLEAR_STEP)
    assert raised is not None, seen
    assert raised.first_night == len(HIGH_NOISE_ESTIMATE)
    assert raised.step_change is not None and 0.12 <= raised.step_change <= 0.22
    # Within its first three nights (three nights and their re-runs).
    assert len(seen) <= 6, seen


def test_a_noisy_series_without_a_step_raises_nothing_in_the_nightly_flow():
    rng = np.random.default_rng(11)
    noise = list(100 * (np.exp(rng.normal(0, 0.04, 60)) - 1))
    seen, raised = nightly_flow(noise[:8], list(zip(noise[8:34], noise[34:60], strict=True)))
    assert raised is None, seen


def test_a_raised_step_is_raised_once_then_the_baseline_restarts():
    values = levels(quiet(30) + quiet(20, shift=15))
    ns = nights(values)
    verdicts = [assess_night(ns[:i], ns[i], metric="latency") for i in range(30, 50)]
    raised = [a for a in verdicts if a.confirmed]
    assert len(raised) == 1 and raised[0].first_night == 30
    assert verdicts[2].verdict == "no_baseline"  # the baseline restarted at night 30
    assert "restarted at night 30" in verdicts[2].reason
    assert verdicts[-1].verdict == "unchanged"  # 7+ nights at the new level: the new normal


def test_reasons_name_the_night_by_its_date_when_known():
    from dataclasses import replace
    from datetime import date, timedelta

    values = levels(quiet(30) + quiet(20, shift=15))
    ns = [replace(n, date=date(2026, 10, 1) + timedelta(days=n.night)) for n in nights(values)]
    verdicts = [assess_night(ns[:i], ns[i], metric="latency") for i in range(30, 33)]
    raised = next(a for a in verdicts if a.confirmed)
    assert "since 2026-10-31, persisting" in raised.reason  # night 30 is Oct 31
    assert "restarted at 2026-10-31, after a raised step" in verdicts[2].reason
    assert "night 30" not in raised.reason + verdicts[2].reason


def test_rerun_in_history_counts_as_a_night():
    # A candidate confirmed by its re-run is raised on that night; the next night is not a
    # second regression.
    history = nights(levels(quiet(30) + [12.0])) + [Night(30, (111.8,), rerun=True)]
    a = assess_night(history, Night(31, (112.1,)), metric="latency")
    assert a.verdict == "no_baseline"


def test_online_document_agrees_with_night_by_night_assessment():
    rng = np.random.default_rng(7)
    values = list(100 * np.exp(rng.normal(0, 0.01, 120)))
    for i in range(50, 120):
        values[i] *= 1.12
    values[80] *= 1.6  # an outlier night
    flags = online_flags(values)
    ns = nights(values)
    raised = []
    for i in range(1, len(ns)):
        a = assess_night(ns[:i], ns[i], metric="latency")
        if a.confirmed:
            raised.append((a.first_night, i, a.verdict))
    assert raised == [(f["night"], f["raised_night"], f["direction"]) for f in flags]
    assert raised[0][:1] == (50,)


# --------------------------------------------------------------------------------------------
# The "Handle" list


def test_outlier_night_in_the_baseline_neither_moves_it_nor_hides_a_step():
    offsets = quiet(30)
    offsets[20] = 250.0  # one wild night
    history = nights(levels(offsets))
    a = assess_night(history, Night(30, (100.4,)), metric="latency")
    assert a.verdict == "unchanged"
    assert a.baseline == pytest.approx(100.1, abs=0.3)
    flags = online_flags(levels(offsets + quiet(10, shift=9)))
    assert [(f["night"], f["direction"]) for f in flags] == [(30, "regression")]


def test_outlier_night_in_memory_baseline_does_not_hide_a_step():
    mem = [4_000_000_000] * 30
    mem[12] = 9_000_000_000
    flags = online_flags(mem + [4_400_000_000] * 5, metric="gpu_peak_mem")
    assert [(f["night"], f["change"], f["p_value"]) for f in flags] == [(30, 0.1, None)]


def test_bimodal_latency_flipping_between_modes_is_not_a_regression():
    # Nights land in a lower (100) or an upper (~110) mode, as some kernels pick one of two
    # algorithms; two or three upper nights in a row are this benchmark's normal.
    pattern = "LLULLUULLLULULLUUULLLUL" * 5
    offsets = [(10.0 if c == "U" else 0.0) + NOISE[i % 28] for i, c in enumerate(pattern)]
    assert online_flags(levels(offsets)) == []
    assert offline_flags(levels(offsets)) == []


def test_bimodal_memory_is_not_a_regression_and_its_step_is():
    pattern = "AABABBAAABAABBBAABAAABAB" * 4
    values = [1_000_000_000 if c == "A" else 1_080_000_000 for c in pattern]
    assert online_flags(values, metric="cpu_peak_mem") == []
    moved = values + [1_300_000_000] * 6
    flags = online_flags(moved, metric="cpu_peak_mem")
    assert [(f["night"], f["direction"]) for f in flags] == [(96, "regression")]


def test_a_memory_mode_the_baseline_took_once_is_not_a_step():
    # cpu_peak_mem of one build, process to process (lstm_lm eval on 2.13.0 took 41, 63 or
    # 84 MiB): its upper mode came once in the baseline, then on a night and its re-run.
    mib = 2**20
    pattern = "AABAAAACAABAAABA"
    level = {"A": 41 * mib, "B": 63 * mib, "C": 84 * mib}
    history = [Night(i, (level[c],)) for i, c in enumerate(pattern)]
    tonight = Night(len(history), (84 * mib,))
    a = assess_night(history, tonight, metric="cpu_peak_mem")
    assert a.verdict == "unchanged", a.reason  # not even a candidate: no re-run spent on it
    rerun = Night(len(history), (84 * mib,), rerun=True)
    again = confirm(history, tonight, rerun, metric="cpu_peak_mem")
    assert not (again.verdict == "regression" and again.confirmed), again.reason
    # A level it never took is a step, raised on the night and its re-run.
    stepped = Night(len(history), (110 * mib,))
    b = assess_night(history, stepped, metric="cpu_peak_mem")
    assert b.verdict == "regression" and not b.confirmed, b.reason
    c = confirm(
        history, stepped, Night(len(history), (110 * mib,), rerun=True), metric="cpu_peak_mem"
    )
    assert c.verdict == "regression" and c.confirmed, c.reason


def test_a_false_memory_improvement_keeps_the_baseline_for_the_real_step_after_it():
    # bert eval cpu_peak_mem on one build: 60 and 70 MiB recur, 52 MiB came once. Two nights
    # at 52 MiB (an A/A night and its neighbour) are that mode again, not an improvement; had
    # they been raised, the baseline would have restarted there and the real step to 77 MiB
    # a night later would have met "no baseline".
    mib = 2**20
    level = {"A": 60 * mib, "B": 70 * mib, "C": 52 * mib}
    history = [Night(i, (level[c],)) for i, c in enumerate("ABAABBABAAACABAB")]
    verdicts = []
    for value in (52, 52, 60):
        a = assess_night(history, Night(len(history), (value * mib,)), metric="cpu_peak_mem")
        verdicts.append(a.verdict)
        history.append(Night(len(history), (value * mib,)))
    assert verdicts == ["unchanged"] * 3
    step = Night(len(history), (77 * mib,))
    a = assess_night(history, step, metric="cpu_peak_mem")
    assert a.verdict == "regression" and not a.confirmed, a.reason
    c = confirm(history, step, Night(step.night, (77 * mib,), rerun=True), metric="cpu_peak_mem")
    assert c.verdict == "regression" and c.confirmed and c.first_night == step.night, c.reason
    assert c.baseline == 60 * mib


def test_slow_drift_is_flagged_while_the_naive_rule_sees_nothing():
    # +0.25% a night for 80 nights: never 7% between two nights, +20% in all.
    offsets = quiet(40) + [NOISE[i % 28] + 0.25 * (i + 1) for i in range(80)]
    values = levels(offsets)
    naive = [v / u - 1 for u, v in zip(values, values[1:], strict=False)]
    assert max(naive) < 0.07
    flags = online_flags(values)
    assert flags and all(f["direction"] == "regression" for f in flags)
    first = flags[0]
    assert 40 < first["raised_night"] < 40 + 50
    assert first["change"] >= 0.05
    off = offline_flags(values)
    assert off and off[0]["direction"] == "regression" and 40 <= off[0]["night"] < 120


def test_very_slow_drift_is_caught_against_the_anchor():
    # +0.1% a night: the neighbouring windows never differ by 7%; the level accepted at the
    # start (the anchor) does, after about 70 nights.
    offsets = quiet(60) + [NOISE[i % 28] + 0.1 * (i + 1) for i in range(150)]
    flags = online_flags(levels(offsets))
    assert flags and flags[0]["direction"] == "regression"
    assert flags[0]["raised_night"] >= 60 + 60
    batch = detect_series(np.array([levels(offsets)]), memory=False, online=True)
    assert batch[0].kind == "drift"


def test_step_marked_expected_resets_the_baseline():
    values = levels(quiet(30) + quiet(20, shift=25))
    d = doc(("s", "latency", values))
    d["series"][0]["nights"][30]["expected"] = True
    assert detect_document(d, online=True)["flags"] == []
    assert detect_document(d, online=False)["flags"] == []
    ns = nights(values)
    ns[30] = Night(30, ns[30].samples, expected=True)
    a = assess_night(ns[:30], ns[30], metric="latency")
    assert a.verdict == "no_baseline" and "expected" in a.reason
    later = assess_night(ns[:45], ns[45], metric="latency")
    assert later.verdict == "unchanged"
    assert later.baseline == pytest.approx(125.0, rel=0.01)


def test_unstable_benchmark_is_shown_not_alerted():
    history = nights(levels(quiet(30) + [15.0]))
    a = assess_night(history, Night(31, (115.2,)), metric="latency", unstable=True)
    assert a.verdict == "regression" and a.confirmed
    assert a.alertable is False
    assert "unstable" in a.reason


def test_unstable_benchmark_alerts_a_change_beyond_three_times_its_spread():
    # A +15% step raised on its second night: beyond 3 x a 4% spread (12%), not beyond 3 x 8%.
    history = nights(levels(quiet(30) + [15.0]))
    loud = assess_night(
        history, Night(31, (115.2,)), metric="latency", unstable=True, unstable_spread=0.04
    )
    assert loud.confirmed and loud.alertable is True
    assert "alerted: the change is beyond 3 times the 4.0% spread" in loud.reason
    shown = assess_night(
        history, Night(31, (115.2,)), metric="latency", unstable=True, unstable_spread=0.08
    )
    assert shown.confirmed and shown.alertable is False
    assert "shown, not alerted (it alerts from +24.0%" in shown.reason
    # The bar is never under the threshold: a 1% spread still needs 7%.
    small = assess_night(
        nights(levels(quiet(30))),
        Night(30, (105.0,)),
        metric="latency",
        unstable=True,
        unstable_spread=0.01,
    )
    assert small.verdict == "unchanged"
    # A candidate (tonight alone, +60%) against a 15% spread: beyond 45%, alertable, so it gets
    # its confirmation re-run; with the rule off (unstable_beyond 0) it is only shown.
    ns = nights(levels(quiet(30)))
    cand = assess_night(
        ns, Night(30, (160.0,)), metric="latency", unstable=True, unstable_spread=0.15
    )
    assert cand.verdict == "regression" and not cand.confirmed and cand.alertable
    off = assess_night(
        ns,
        Night(30, (160.0,)),
        metric="latency",
        unstable=True,
        unstable_spread=0.15,
        params=DetectorParams(unstable_beyond=0),
    )
    assert off.verdict == "regression" and not off.alertable
    assert off.reason.endswith("Benchmark marked unstable: shown, not alerted.")
    with pytest.raises(DetectionInputError, match="unstable_beyond >= 0"):
        DetectorParams(unstable_beyond=-1)


def test_missing_nights_are_skipped_and_ordinals_kept():
    values = levels(quiet(30) + quiet(8, shift=12))
    days = [d for d in range(60) if d % 3 != 1][: len(values)]
    flags = online_flags(values, ordinals={"s": days})
    assert len(flags) == 1
    assert flags[0]["night"] == days[30] and flags[0]["raised_night"] == days[31]
    ns = nights(values, ordinals=days)
    a = assess_night(ns[:31], ns[31], metric="latency")
    assert a.confirmed and a.first_night == days[30]


def test_new_benchmark_has_no_baseline_and_no_alert():
    a = assess_night([], Night(0, (5.0, 5.1)), metric="latency")
    assert a == Assessment(
        verdict="no_baseline",
        metric="latency",
        baseline=None,
        value=5.05,
        change=None,
        p_value=None,
        alertable=False,
        reason=a.reason,
    )
    assert "new" in a.reason
    few = assess_night(nights(levels(quiet(3))), Night(3, (200.0,)), metric="latency")
    assert few.verdict == "no_baseline" and not few.alertable
    assert "3 of 4" in few.reason
    # A series settling after its first nights raises nothing: the short baseline already
    # holds the level it settles at.
    assert online_flags(levels([50.0] * 2 + quiet(12))) == []
    assert online_flags(levels(quiet(2) + quiet(12, shift=50))) == []


def test_a_step_on_the_fourth_night_after_a_reset_is_raised() -> None:
    # An improvement raised at night 10 restarts the baseline; the slowdown that lands three
    # nights later has three nights before it. Held to the four nights a candidate needs, its
    # own first night entered the baseline and it was a "not reproduced" candidate every night
    # after, never raised (a +126% step lost this way on a straying CI host).
    before = quiet(10, shift=25) + quiet(3)
    flags = online_flags(levels(before + quiet(10, shift=100)))
    assert [(f["night"], f["direction"]) for f in flags] == [
        (10, "improvement"),
        (13, "regression"),
    ]
    seen, raised = nightly_flow(before, [(100.0, 101.0), (99.0, 100.5), (101.0, 99.5)])
    assert seen[0] == "no_baseline?", seen  # three nights: no verdict on the step's first night
    assert raised is not None and raised.confirmed and raised.alertable, seen
    assert raised.first_night == 13 and 0.9 <= raised.step_change <= 1.1, raised.reason
    # A step under three times the threshold keeps waiting for four nights before it.
    small = online_flags(levels(before + quiet(10, shift=15)))
    assert [(f["night"], f["direction"]) for f in small] == [(10, "improvement")]
    # With no level known before them (a new series settling after its first nights, or
    # after a night marked expected), and for peak memory (judged without a p-value), runs
    # keep the four nights before them.
    assert online_flags(levels(quiet(3) + quiet(10, 60))) == []
    shape = [80e6] * 10 + [50e6] * 3 + [130e6] * 10
    assert [(f["night"], f["direction"]) for f in online_flags(shape)] == [
        (10, "improvement"),
        (13, "regression"),
    ]
    assert [(f["night"], f["direction"]) for f in online_flags(shape, metric="cpu_peak_mem")] == [
        (10, "improvement")
    ]


def test_a_series_back_from_a_raised_excursion_is_not_a_step() -> None:
    # Three nights at -25% are raised as an improvement and restart the baseline; the series
    # coming back to its level three nights later is not a +33% regression: it stands where
    # it stood before the raised step. (Held to four nights, it was absorbed as well.)
    flags = online_flags(levels(quiet(20) + [-25.0, -24.6, -25.2] + quiet(12)))
    assert [(f["night"], f["direction"]) for f in flags] == [(20, "improvement")]
    # The same three nights followed by a real slowdown beyond the old level is raised.
    flags = online_flags(levels(quiet(20) + [-25.0, -24.6, -25.2] + quiet(12, shift=30)))
    assert [(f["night"], f["direction"]) for f in flags] == [
        (20, "improvement"),
        (23, "regression"),
    ]


def test_a_series_back_from_a_raised_excursion_resumes_its_baseline() -> None:
    # Two nights at +18% and +12.5% are raised (a straying host a re-run reproduced) and
    # restart the baseline; the series is back the three nights after. Held to the restarted
    # baseline, the excursion's two nights opened every later baseline (a short one, which
    # allows no such night) and the +10% step nine nights on was a level already visited:
    # never raised. The baseline from before the excursion resumes instead.
    excursion = quiet(20) + [18.0, 12.5] + quiet(9)
    flags = online_flags(levels(excursion + quiet(8, shift=10)))
    assert [(f["night"], f["raised_night"], f["direction"], f["resumed_night"]) for f in flags] == [
        (20, 21, "regression", 24),
        (31, 33, "regression", None),
    ]
    # The nightly's flow: the step is raised on its second night, from its own first night.
    seen, raised = nightly_flow(excursion, [(10.0, 10.5), (9.8, 10.2), (10.3, 9.9)])
    assert raised is not None and raised.confirmed and raised.alertable, seen
    assert raised.first_night == 31 and 0.08 <= raised.step_change <= 0.12, raised.reason
    # The third night back says so, and tonight's verdict is judged against the resumed
    # baseline, not the nights since the excursion.
    back = assess_night(
        nights(levels(quiet(20) + [18.0, 12.5] + quiet(2))), Night(24, (100.2,)), metric="latency"
    )
    assert back.verdict == "unchanged" and "over 24 nights" in back.reason, back.reason
    assert (
        "Back from the regression of +15.2% raised on night 21 for 3 nights: it did not persist"
    ) in back.reason
    assert back.back_from == 20  # the excursion's first night: its regression is back
    tonight = assess_night(
        nights(levels(quiet(20) + [18.0, 12.5] + quiet(3))), Night(25, (100.2,)), metric="latency"
    )
    assert tonight.verdict == "unchanged" and "over 25 nights" in tonight.reason, tonight.reason
    assert "Back from" not in tonight.reason and tonight.back_from is None
    # Two nights back are not enough: a step whose level comes back after two low nights is
    # the same step, raised once.
    twice = online_flags(levels(quiet(20) + [18.0, 18.0] + quiet(2) + quiet(10, shift=18)))
    assert [(f["night"], f["resumed_night"]) for f in twice] == [(20, None)]
    # Nights beyond the baseline the other way are no return: the slowdown landing the night
    # after a raised improvement's first night back is raised from its own first night.
    other = online_flags(levels(quiet(20) + quiet(2, shift=-12) + quiet(1) + quiet(8, shift=20)))
    assert [(f["night"], f["direction"], f["resumed_night"]) for f in other] == [
        (20, "improvement", None),
        (23, "regression", None),
    ]
    # A step still standing on the night after it was raised keeps its reset.
    stood = online_flags(levels(quiet(20) + quiet(3, shift=-25) + quiet(12)))
    assert [(f["night"], f["resumed_night"]) for f in stood] == [(20, None)]
    # return_nights=0: a raised step always restarts the baseline (the step is lost).
    off = online_flags_with(levels(excursion + quiet(8, shift=10)), DetectorParams(return_nights=0))
    assert [(f.night, f.resumed_night) for f in off] == [(20, None)]


def test_a_step_whose_second_night_came_out_low_begins_on_its_first_night() -> None:
    # +10% from night 20, night 21 back at the old level: the run must stand at the new level,
    # so it is raised from night 22 on; its first night is 20. Located at 22, the commit range
    # (two nights before the first night) started at night 20's build, after the culprit.
    flags = online_flags(levels(quiet(20) + [10.0, 0.5] + quiet(8, shift=10)))
    assert [(f["night"], f["raised_night"]) for f in flags] == [(20, 23)]
    # The nightly's flow: night 20 a candidate that could not be re-run, night 21 low, night
    # 22 a candidate confirmed by its re-run: the first night is 20, not 22.
    history = nights(levels(quiet(20) + [10.0, 0.5]))
    tonight = Night(22, (110.2,))
    assert assess_night(history, tonight, metric="latency").verdict == "regression"
    raised = confirm(history, tonight, Night(22, (109.8,)), metric="latency")
    assert raised.verdict == "regression" and raised.confirmed, raised.reason
    assert raised.first_night == 20, raised.reason
    # Two low nights are not one: a +15% outlier night two nights before the step is not its
    # first night.
    apart = online_flags(levels(quiet(20) + [15.0, 0.5, 0.2] + quiet(8, shift=10)))
    assert [f["night"] for f in apart] == [23]
    # With min_baseline nights before the step, it begins on its first night too.
    young = online_flags(levels(quiet(4) + [10.0, 0.5] + quiet(8, shift=10)))
    assert [(f["night"], f["raised_night"]) for f in young] == [(4, 9)]


def test_a_step_after_a_return_is_raised_again() -> None:
    # What the issue of a regression whose series came back promises: if the step comes back,
    # it is raised again, from its own first night.
    for shift in (8.0, 10.0, 18.0):
        for gap in (3, 6):  # the three nights back, then the step at once or three nights on
            flags = online_flags(
                levels(quiet(20) + [18.0, 12.5] + quiet(gap) + quiet(12, shift=shift))
            )
            assert [(f["night"], f["raised_night"], f["resumed_night"]) for f in flags] == [
                (20, 21, 24),
                (22 + gap, 24 + gap, None),
            ], (shift, gap, flags)


def online_flags_with(values: list[float], params: DetectorParams) -> list:
    return detect_series(np.array([values]), memory=False, online=True, params=params)


def test_young_series_is_confirmed_by_a_rerun_with_the_t_test():
    # Four nights of baseline: no arrangement of ranks reaches 1% with two nights against four,
    # so the t-test on the change over the robust noise decides.
    history = nights(levels(quiet(4)))
    a = assess_night(history, Night(4, (120.0,)), metric="latency")
    assert a.verdict == "regression" and not a.confirmed
    c = confirm(history, Night(4, (120.0,)), Night(4, (119.6,)), metric="latency")
    assert c.verdict == "regression" and c.confirmed
    assert c.p_value is not None and c.p_value < 0.01
    rank_floor = 2 / (6 * 5)  # the smallest one-sided Mann-Whitney p-value for sizes 2 and 4
    assert c.p_value < rank_floor
    small = confirm(history, Night(4, (102.0,)), Night(4, (102.5,)), metric="latency")
    assert small.verdict == "unchanged"


def test_environment_change_starts_a_new_series_never_a_regression():
    # Another GPU, driver or benchmark_version gives another series key; the new series has no
    # history, so its first nights have no baseline whatever their level.
    old = levels(quiet(30))
    new_gpu = levels(quiet(12, shift=40))
    out = detect_document(
        doc(("m:train:cuda:a100", "latency", old), ("m:train:cuda:h100", "latency", new_gpu)),
        online=True,
    )
    assert out == {"flags": []}
    a = assess_night([], Night(30, (140.0,)), metric="latency")
    assert a.verdict == "no_baseline"


# --------------------------------------------------------------------------------------------
# Latency versus peak memory


def test_memory_steps_are_judged_in_exact_bytes_without_p_value():
    base = [2_147_483_648] * 30
    up8 = online_flags(base + [int(2_147_483_648 * 1.08)] * 3, metric="cpu_peak_mem")
    assert len(up8) == 1 and up8[0]["p_value"] is None
    assert up8[0]["change"] == pytest.approx(0.08, abs=1e-6)
    assert online_flags(base + [int(2_147_483_648 * 1.065)] * 3, metric="cpu_peak_mem") == []
    history = nights([float(x) for x in base])
    a = assess_night(history, Night(30, (2_147_483_648.0,)), metric="gpu_peak_mem")
    assert a.verdict == "unchanged" and a.change == 0.0 and a.p_value is None
    assert a.baseline == 2_147_483_648.0


def test_memory_baseline_of_zero_bytes_gives_finite_changes():
    a = assess_night(nights([0.0] * 10), Night(10, (0.0,)), metric="gpu_peak_mem")
    assert a.verdict == "unchanged" and a.change == 0.0
    grown = assess_night(nights([0.0] * 10), Night(10, (1e9,)), metric="gpu_peak_mem")
    assert grown.verdict == "regression" and math.isfinite(grown.change)
    out = detect_document(doc(("m", "gpu_peak_mem", [0.0] * 10 + [1e9] * 3)), online=True)
    assert [f["night"] for f in out["flags"]] == [10]
    json.dumps(out, allow_nan=False)


def test_noisy_latency_waits_for_more_nights_instead_of_guessing():
    # 3% night-to-night noise: a +8% step needs more than two nights to tell apart from noise.
    rng = np.random.default_rng(3)
    noisy = list(100 * np.exp(rng.normal(0, 0.03, 40)))
    stepped = noisy[:30] + [v * 1.08 for v in noisy[30:]]
    flags = online_flags(stepped)
    quiet_flags = online_flags(levels(quiet(30) + quiet(10, shift=8)))
    assert quiet_flags[0]["raised_night"] == 31
    assert not flags or flags[0]["raised_night"] >= 31
    assert online_flags(noisy) == []


def test_per_metric_and_per_series_thresholds():
    values = levels(quiet(30) + quiet(6, shift=5))
    mem = [1_000_000] * 30 + [1_050_000] * 6
    both = (("lat", "latency", values), ("mem", "gpu_peak_mem", mem))
    assert detect_document(doc(*both), online=True)["flags"] == []
    out = detect_document(doc(*both, threshold={"gpu_peak_mem": 0.03}), online=True)["flags"]
    assert [f["id"] for f in out] == ["mem"]
    d = doc(*both)
    d["series"][0]["threshold"] = 0.03
    assert [f["id"] for f in detect_document(d, online=True)["flags"]] == ["lat"]


# --------------------------------------------------------------------------------------------
# The `nightbench detect` document


def test_document_output_shape_offline_and_online():
    d = doc(
        ("a", "latency", levels(quiet(30) + quiet(10, shift=20))),
        ("b", "cpu_peak_mem", [1e9] * 30 + [1.2e9] * 10),
        ("c", "gpu_peak_mem", [5e8] * 40),
    )
    for online in (True, False):
        out = detect_document(d, online=online)
        assert list(out) == ["flags"]
        assert [f["id"] for f in out["flags"]] == ["a", "b"]
        for f in out["flags"]:
            assert list(f) == [
                "id",
                "night",
                "raised_night",
                "direction",
                "change",
                "p_value",
                "resumed_night",
            ]
            assert f["night"] == 30 and f["resumed_night"] is None
            assert f["raised_night"] == (31 if online else 39)
            assert f["direction"] == "regression"
        assert out["flags"][0]["change"] == pytest.approx(0.2, abs=0.01)
        assert isinstance(out["flags"][0]["p_value"], float)
        assert out["flags"][1]["p_value"] is None
        json.dumps(out)


def test_document_with_several_samples_per_night_uses_their_median():
    d = {
        "series": [
            {
                "id": "x",
                "metric": "latency",
                "nights": [
                    {"night": i, "samples": [v, v * 0.99, v * 1.01, v * 3.0, v]}
                    for i, v in enumerate(levels(quiet(30) + quiet(5, shift=10)))
                ],
            }
        ]
    }
    flags = detect_document(d, online=True)["flags"]
    assert [(f["night"], f["raised_night"]) for f in flags] == [(30, 31)]
    assert flags[0]["change"] == pytest.approx(0.10, abs=0.01)


def test_empty_document_and_short_series():
    assert detect_document({"series": []}, online=True) == {"flags": []}
    assert detect_document(doc(("s", "latency", [1.0])), online=False) == {"flags": []}
    assert detect_document(doc(("s", "latency", [])), online=True) == {"flags": []}


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.pop("series"), "series"),
        (lambda d: d.update(series={}), "series"),
        (lambda d: d["series"][0].update(id=3), "series[0].id"),
        (lambda d: d["series"][0].update(metric="throughput"), "series[0].metric"),
        (lambda d: d["series"][0].update(nights=None), "series[0].nights"),
        (lambda d: d["series"][0]["nights"][2].update(night=1), "series[0].nights[2].night"),
        (lambda d: d["series"][0]["nights"][1].update(night="2"), "series[0].nights[1].night"),
        (lambda d: d["series"][0]["nights"][3].update(samples=[]), "series[0].nights[3].samples"),
        (
            lambda d: d["series"][0]["nights"][3].update(samples=[1.0, "x"]),
            "series[0].nights[3].samples",
        ),
        (
            lambda d: d["series"][0]["nights"][4].update(samples=[-1.0]),
            "series[0].nights[4].samples",
        ),
        (
            lambda d: d["series"][0]["nights"][4].update(samples=[0.0]),
            "series[0].nights[4].samples",
        ),
        (
            lambda d: d["series"][0]["nights"][4].update(samples=[math.inf]),
            "series[0].nights[4].samples",
        ),
        (
            lambda d: d["series"][0]["nights"][0].update(expected="yes"),
            "series[0].nights[0].expected",
        ),
        (lambda d: d.update(threshold=0), "threshold"),
        (lambda d: d.update(threshold="7%"), "threshold"),
        (lambda d: d.update(threshold={"latency": 12}), "threshold.latency"),
        (lambda d: d.update(threshold={"walltime": 0.1}), "threshold"),
        (lambda d: d["series"][0].update(threshold=-0.1), "series[0].threshold"),
    ],
)
def test_bad_input_names_the_field(mutate, field):
    d = doc(("s", "latency", levels(quiet(10))))
    mutate(d)
    with pytest.raises(DetectionInputError) as err:
        detect_document(d, online=True)
    assert str(err.value).startswith(field)
    assert err.value.status_code == 422


def test_document_that_is_not_an_object_is_rejected():
    with pytest.raises(DetectionInputError, match="document"):
        detect_document([], online=False)  # type: ignore[arg-type]


def test_memory_allows_zero_bytes_but_latency_does_not():
    zero = doc(("m", "gpu_peak_mem", [0.0] * 10))
    assert detect_document(zero, online=True) == {"flags": []}


def test_assess_night_rejects_bad_input():
    with pytest.raises(DetectionInputError, match="metric"):
        assess_night([], Night(0, (1.0,)), metric="throughput")
    with pytest.raises(DetectionInputError, match=r"^tonight\.samples"):
        assess_night([], Night(0, ()), metric="latency")
    with pytest.raises(DetectionInputError, match=r"^history\[0\]\.samples"):
        assess_night([Night(0, (-1.0,))], Night(1, (1.0,)), metric="latency")
    with pytest.raises(DetectionInputError, match=r"^rerun\.samples"):
        confirm([], Night(0, (1.0,)), Night(0, (math.nan,)), metric="latency")
    with pytest.raises(DetectionInputError, match="threshold"):
        assess_night([], Night(0, (1.0,)), metric="latency", threshold=0.0)


def test_detector_params_are_checked():
    with pytest.raises(DetectionInputError, match="params"):
        DetectorParams(window=40)
    with pytest.raises(DetectionInputError, match="params"):
        DetectorParams(max_run=1)
    with pytest.raises(DetectionInputError, match="excursion_cap"):
        DetectorParams(excursion_cap=-1)
    with pytest.raises(DetectionInputError, match="2 <= min_run_baseline"):
        DetectorParams(min_run_baseline=1)
    assert DetectorParams(min_baseline=2).run_baseline == 2  # never above min_baseline
    with pytest.raises(DetectionInputError, match="short_run_factor >= 1"):
        DetectorParams(short_run_factor=0.5)
    with pytest.raises(DetectionInputError, match="return_nights >= 0"):
        DetectorParams(return_nights=-1)
    for alpha in (0.0, 1.5):
        with pytest.raises(DetectionInputError, match="excursion_alpha"):
            DetectorParams(excursion_alpha=alpha)


def test_batch_api_maps_positions_back_to_columns_with_missing_nights():
    row = np.array(levels(quiet(30) + quiet(10, shift=10)) + [np.nan] * 5)
    row[[5, 31]] = np.nan  # the step's second night is missing
    flags = detect_series(row[None, :], memory=False, online=True)
    assert [(f.night, f.raised_night) for f in flags] == [(30, 32)]
    with pytest.raises(DetectionInputError, match="levels"):
        detect_series(np.array([[1.0, -2.0]]), memory=False, online=True)


def test_reasons_print_memory_in_mib_and_latency_in_ms() -> None:
    mib = 2**20
    memory = assess_night(
        nights([400.0 * mib] * 10), Night(10, (440.0 * mib,)), metric="cpu_peak_mem"
    )
    assert "baseline of 400.0 MiB" in memory.reason, memory.reason
    latency = assess_night(nights(levels(quiet(10))), Night(10, (100.2,)), metric="latency")
    assert "ms over 10 nights" in latency.reason, latency.reason
