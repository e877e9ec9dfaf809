"""The metric table: a new metric is one row, and everything reads the row."""

from __future__ import annotations

import dataclasses

import pytest

from service import metrics
from service.metrics import METRICS, Metric, MetricKind, format_value
from service.regressions.detection import DetectionInputError, Night, assess_night, confirm
from service.results.records import result_rows


def test_the_table_spells_each_metric_once_with_its_kind() -> None:
    assert metrics.ALERT_METRICS == ("latency", "gpu_peak_mem", "cpu_peak_mem", "cpu_instructions")
    assert METRICS["latency"].kind is MetricKind.TIMED
    assert METRICS["cpu_peak_mem"].rule.exact_levels
    assert not METRICS["cpu_instructions"].rule.exact_levels
    assert not METRICS["cpu_instructions"].rule.host_bound
    assert METRICS["cpu_instructions"].rule.bisect_by == "cpu_instructions"
    assert METRICS["latency"].rule.host_bound
    # A count bisection counts each build once; latency measures its endpoints every round.
    assert metrics.bisect_once("cpu_instructions") and not metrics.bisect_once("latency")
    assert not metrics.bisect_once("nope")
    assert metrics.order("latency") < metrics.order("cpu_instructions") < metrics.order("nope")
    with pytest.raises(metrics.UnknownMetric, match="unknown metric 'nope'.*latency"):
        metrics.metric("nope")
    with pytest.raises(metrics.UnknownMetric, match="must be one of latency"):
        metrics.alerting("cpu_time")


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (12.4123, "ms", "12.41 ms"),
        (1234.56, "ms", "1,234.6 ms"),
        (0.51234, "ms", "0.512 ms"),
        (1234.5 * 2**20, "bytes", "1,234.5 MiB"),
        (412.3e6, "instructions", "412.3 M instr"),
        (7.71e6, "instructions", "7.71 M instr"),
        (3.0, "widgets", "3 widgets"),
        (None, "ms", "—"),
    ],
)
def test_one_formatter_for_every_unit(value: float | None, unit: str, shown: str) -> None:
    assert format_value(value, unit) == shown


def _nights(levels: list[float]) -> list[Night]:
    return [Night(i, (v,)) for i, v in enumerate(levels)]


def test_a_count_step_is_a_candidate_on_its_first_night_and_confirmed_by_its_recount() -> None:
    # Counts stray by ~0.1% between processes; a +7.5% step in the work a step does.
    base = [412.3e6 * (1 + 0.001 * ((i * 7) % 5 - 2)) for i in range(10)]
    history = _nights(base)
    tonight = Night(10, (412.3e6 * 1.075,))
    first = assess_night(history, tonight, metric="cpu_instructions")
    assert first.verdict == "regression" and not first.confirmed
    assert "412.3 M instr" in first.reason, first.reason
    again = confirm(history, tonight, Night(10, (412.3e6 * 1.0751,)), metric="cpu_instructions")
    assert again.verdict == "regression" and again.confirmed and again.p_value is not None
    # A count that does not move is unchanged, however noisy latency is on the same host.
    flat = assess_night(history, Night(10, (412.4e6,)), metric="cpu_instructions")
    assert flat.verdict == "unchanged"


def test_a_sub_threshold_count_change_is_never_a_candidate() -> None:
    history = _nights([100e6 * (1 + 0.0005 * (i % 3)) for i in range(12)])
    assert assess_night(history, Night(12, (106.5e6,)), metric="cpu_instructions").verdict == (
        "unchanged"
    )


def test_a_new_metric_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    row = Metric("cpu_cycles", "cycles", MetricKind.COUNT, "cycles per step")
    monkeypatch.setitem(metrics.METRICS, row.name, row)
    monkeypatch.setattr(metrics, "ALERT_METRICS", (*metrics.ALERT_METRICS, row.name))
    monkeypatch.setitem(metrics.UNITS, "cycles", metrics.Unit(scale=1e9, suffix="G cycles"))
    # Formatted ...
    assert format_value(2.5e9, "cycles") == "2.50 G cycles"
    # ... stored (a record's metric becomes a result row with its own series) ...
    record = {
        "model": "m",
        "mode": "eval",
        "device": "cpu",
        "environment": {"cpu_model": "x"},
        "metrics": [
            {"metric": "cpu_cycles", "unit": "cycles", "samples": [2.5e9], "median": 2.5e9}
        ],
    }
    rows = result_rows(record, machine=None)
    assert [(r["metric"], r["unit"], r["samples"]) for r in rows] == [
        ("cpu_cycles", "cycles", [2.5e9])
    ]
    # ... and detected, judged by its kind's rule and printed in its unit.
    history = _nights([2.5e9] * 8)
    verdict = assess_night(history, Night(8, (2.8e9,)), metric="cpu_cycles")
    assert verdict.verdict == "regression" and "2.50 G cycles" in verdict.reason
    with pytest.raises(DetectionInputError, match="must be one of"):
        assess_night(history, Night(8, (2.8e9,)), metric="cpu_wattage")


def test_a_memory_row_keeps_the_memory_rule() -> None:
    history = _nights([100 * 2**20] * 8)
    verdict = assess_night(history, Night(8, (110 * 2**20,)), metric="cpu_peak_mem")
    assert verdict.verdict == "regression" and verdict.p_value is None
    assert "100.0 MiB" in verdict.reason
    assert dataclasses.replace(METRICS["cpu_peak_mem"]).format(2**20) == "1.0 MiB"
