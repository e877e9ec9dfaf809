"""The profile diff (``service/profiles.py``) on literal operator tables."""

from __future__ import annotations

import pytest

from service.errors import InvalidInput
from service.metrics import MetricKind
from service.profiles import (
    NOISE_RULES,
    NoiseRule,
    Profile,
    ProfileRow,
    RowStatus,
    diff_json,
    diff_profiles,
    measured_noise,
    profile_from_json,
)


def _ops(**rows: tuple[float, ...]) -> Profile:
    """An operator table: ``aten__addmm=(µs per step in each window, ...)``."""
    return Profile(
        metric="latency",
        unit="us",
        rows={
            (name := k.replace("__", "::")): ProfileRow(name=name, values=v, calls=1.0)
            for k, v in rows.items()
        },
    )


# dqn eval's table, trimmed (µs of self CPU time per step, three windows).
BEFORE = _ops(
    aten__mkldnn_convolution=(1040.0, 1028.0, 3900.0),
    aten__addmm=(570.0, 590.0, 2700.0),
    aten__copy_=(80.0, 79.0, 113.0),
    aten__div=(101.0, 104.0, 180.0),
    aten__clamp_min=(33.6, 34.0, 35.0),
)


def test_identical_builds_give_no_row_above_the_noise() -> None:
    again = _ops(
        aten__mkldnn_convolution=(1037.0, 1090.0, 1050.0),
        aten__addmm=(589.0, 3300.0, 600.0),
        aten__copy_=(27.8, 101.0, 90.0),
        aten__div=(102.7, 202.0, 110.0),
        aten__clamp_min=(31.3, 33.0, 34.0),
    )
    diff = diff_profiles(BEFORE, again)
    assert diff.rows == ()
    assert diff.summary().startswith("no row above the noise (5 rows compared")
    # The rule: k × the kind's noise share of the step (the least of each row's windows).
    assert diff.total_before == pytest.approx(1028.0 + 570.0 + 79.0 + 101.0 + 33.6)
    rule = NOISE_RULES[MetricKind.TIMED]
    assert diff.threshold == pytest.approx(rule.k * rule.noise_share * diff.total_before)


def test_a_planted_operator_is_named_first_with_its_share() -> None:
    after = _ops(
        aten__mkldnn_convolution=(1031.0, 1100.0, 1029.0),
        aten__addmm=(575.0, 580.0, 590.0),
        aten__copy_=(80.0, 82.0, 79.5),
        aten__div=(101.0, 101.5, 140.0),
        aten__clamp_min=(33.6, 34.0, 35.0),
        aten__mm=(900.0, 950.0, 1800.0),  # planted: new on every step
        aten__contiguous=(40.0, 40.0, 41.0),  # planted too, below the noise
    )
    diff = diff_profiles(BEFORE, after)
    (row,) = diff.rows
    assert row.name == "aten::mm" and row.status is RowStatus.NEW
    assert (row.before, row.after, row.change) == (0.0, 900.0, 900.0)
    assert row.share == pytest.approx(900.0 / diff.total_change)
    assert diff.appeared == ("aten::mm",) and diff.vanished == ()
    # The step moved by 946.5 µs: +900 planted, +40 below the noise, +6.5 of small moves.
    assert diff.explained == pytest.approx(900.0 / 946.5)
    assert diff.summary() == "the rows explain 95% of the step's change (+946.5 us)"


def test_rows_sort_by_change_and_a_vanished_operator_is_named() -> None:
    after = _ops(
        aten__mkldnn_convolution=(1500.0, 1600.0, 1550.0),
        aten__addmm=(570.0, 590.0, 600.0),
        aten__div=(101.0, 104.0, 180.0),
        aten__clamp_min=(33.6, 34.0, 35.0),
        aten__to_copy=(230.0, 240.0, 250.0),
    )
    diff = diff_profiles(BEFORE, after, rule=NoiseRule(noise_share=0.01, k=2.0, floor=5.0))
    assert [(r.name, r.status) for r in diff.rows] == [
        ("aten::mkldnn_convolution", RowStatus.CHANGED),
        ("aten::to_copy", RowStatus.NEW),
        ("aten::copy_", RowStatus.GONE),
    ]
    assert diff.rows[0].relative == pytest.approx(472.0 / 1028.0)
    assert diff.vanished == ("aten::copy_",)
    assert diff_json(diff)["rows"][2] == {
        "name": "aten::copy_",
        "before": 79.0,
        "after": 0.0,
        "change": -79.0,
        "share": pytest.approx(-79.0 / diff.total_change),
        "status": "gone",
        "calls_before": 1.0,
        "calls_after": None,
    }


def test_a_repeat_profile_measures_the_noise_and_raises_the_threshold() -> None:
    repeat = _ops(
        aten__mkldnn_convolution=(1328.0, 1400.0, 1350.0),  # 300 µs: 16.6% of the step
        aten__addmm=(570.0, 590.0, 2700.0),
        aten__copy_=(80.0, 79.0, 113.0),
        aten__div=(101.0, 104.0, 180.0),
        aten__clamp_min=(33.6, 34.0, 35.0),
    )
    assert measured_noise(BEFORE, repeat) == pytest.approx(300.0 / 1811.6)
    slower = _ops(
        aten__mkldnn_convolution=(1528.0, 1600.0, 1590.0),  # +500 µs
        aten__addmm=(570.0, 590.0, 2700.0),
        aten__copy_=(80.0, 79.0, 113.0),
        aten__div=(101.0, 104.0, 180.0),
        aten__clamp_min=(33.6, 34.0, 35.0),
    )
    assert [r.name for r in diff_profiles(BEFORE, slower).rows] == ["aten::mkldnn_convolution"]
    diff = diff_profiles(BEFORE, slower, repeat=repeat)
    assert diff.rows == () and diff.noise == pytest.approx(300.0 / 1811.6)
    assert diff.threshold == pytest.approx(2 * 300.0)


def test_the_rule_is_the_metric_kinds_and_profiles_must_match() -> None:
    counts = Profile(metric="cpu_instructions", unit="instructions", rows={})
    assert diff_profiles(counts, counts).rule == NOISE_RULES[MetricKind.COUNT]
    with pytest.raises(InvalidInput, match="profiles differ"):
        diff_profiles(BEFORE, counts)
    with pytest.raises(InvalidInput, match="no profile noise rule"):
        mem = Profile(metric="cpu_peak_mem", unit="bytes", rows={})
        diff_profiles(mem, mem)


def test_profile_from_json_reads_the_suites_document() -> None:
    doc = {
        "metric": "cpu_instructions",
        "unit": "instructions",
        "totals": [5_000.0, 5_010.0],
        "rows": [
            {"name": "f", "calls": None, "self": [10, 12], "inclusive": [100, 101]},
        ],
    }
    p = profile_from_json(doc)
    assert p.rows["f"].values == (10.0, 12.0) and p.total == 10.0 and p.windows == (5e3, 5010.0)
    assert profile_from_json(doc, inclusive=True).rows["f"].value == 100.0
    with pytest.raises(InvalidInput, match="not a profile document"):
        profile_from_json({"metric": "latency", "rows": [{"name": "x"}]})
