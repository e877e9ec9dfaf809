"""Process-to-process stability: K processes per benchmark, CV and TorchBench's 7% spread rule."""

from __future__ import annotations

import math

import pytest

from suite.cpu_setup import setup_label
from suite.stability import (
    StabilityBenchmark,
    StabilityResult,
    allowed_spread,
    benchmarks_for,
    d2,
    judge,
    measure_stability,
    noise_floor,
    summarize,
)


def test_summarize_applies_the_seven_percent_rule() -> None:
    cv, spread, unstable = summarize([100.0, 102.0, 98.0])
    assert cv == pytest.approx(0.02)
    assert spread == pytest.approx(4 / 98)
    assert unstable is False
    assert summarize([100.0, 106.9])[2] is False
    assert summarize([100.0, 107.0])[2] is True  # TorchBench: stable only below 7%
    assert summarize([100.0, 104.0], threshold=0.03)[2] is True
    assert summarize([100.0]) == (None, None, None)


def test_d2_is_the_expected_range_of_normal_draws() -> None:
    # Tippett (1925) / ASTM E2587's table, to its 3 decimals; d2(2) = 2 / sqrt(pi) exactly.
    assert [round(d2(n), 3) for n in (2, 3, 4, 5, 10)] == [1.128, 1.693, 2.059, 2.326, 3.078]
    assert d2(2) == pytest.approx(2 / math.pi**0.5, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 draws"):
        d2(1)


def test_allowed_spread_scales_the_seven_percent_rule_by_the_process_count() -> None:
    assert allowed_spread(5) == 0.07 and allowed_spread(5, 0.03) == 0.03  # TorchBench's rule
    assert allowed_spread(10) / 0.07 == pytest.approx(3.078 / 2.326, abs=1e-3)
    assert allowed_spread(10) == pytest.approx(0.0926, abs=5e-5)
    assert allowed_spread(2) / 0.07 == pytest.approx(1.128 / 2.326, abs=1e-3)
    # More processes, a wider range of noise: the allowance grows with n.
    assert [allowed_spread(n) for n in range(2, 12)] == sorted(
        allowed_spread(n) for n in range(2, 12)
    )
    with pytest.raises(ValueError, match="at least 2 draws"):
        allowed_spread(1)


def test_summarize_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="positive finite"):
        summarize([10.0, -1.0])
    with pytest.raises(ValueError, match="positive finite"):
        summarize([10.0, float("nan")])


def test_noise_floor_is_the_median_cv() -> None:
    def result(cv: float | None) -> StabilityResult:
        return StabilityResult("m", "eval", "cpu", "eager", 3, [], cv, None, None)

    assert noise_floor([result(0.01), result(0.05), result(0.02), result(None)]) == 0.02
    assert noise_floor([result(None)]) is None


def _record(median_ms: float, cpu: str = "AMD EPYC") -> dict[str, object]:
    """A suite record with a latency median, as one process writes it."""
    return {
        "metrics": [{"metric": "latency", "median": median_ms}],
        "benchmark_version": "v1",
        "environment": {"cpu_model": cpu, "allocator": "jemalloc", "threads": 1},
    }


def test_rounds_interleave_and_each_benchmark_is_judged_on_its_processes() -> None:
    specs = [StabilityBenchmark("variable_latency", "eval"), StabilityBenchmark("crashes", "train")]
    ran: list[str] = []

    def run(spec: StabilityBenchmark) -> dict[str, object]:
        ran.append(spec.model)
        if spec.model == "crashes":
            return {"error": "exited with code 1: the planted failure", "metrics": []}
        return _record(5.0 * (1 + 0.25 * (len(ran) // 2)))

    seen: list[tuple[str, int]] = []
    results = measure_stability(
        specs,
        repeats=3,
        run=run,
        on_record=lambda spec, round_no, record: seen.append((spec.model, round_no)),
    )
    # Round-robin: every benchmark once per round.
    assert seen == [
        ("variable_latency", 0),
        ("crashes", 0),
        ("variable_latency", 1),
        ("crashes", 1),
        ("variable_latency", 2),
        ("crashes", 2),
    ]
    variable, crashing = results
    assert variable.medians_ms == [5.0, 6.25, 7.5] and not variable.errors
    assert variable.repeats == crashing.repeats == 3
    assert variable.spread == pytest.approx(0.5) and variable.unstable is True
    # Three processes are judged by the 7% rule scaled for three.
    assert variable.threshold == 0.07
    assert variable.allowed_spread == pytest.approx(allowed_spread(3))
    [setup] = variable.setups
    assert setup == setup_label(variable.environment)
    assert variable.benchmark_version == "v1" and variable.environment["threads"] == 1
    assert crashing.medians_ms == [] and crashing.unstable is None and crashing.cv is None
    assert crashing.allowed_spread is None and crashing.setups == []
    assert crashing.errors == ["exited with code 1: the planted failure"] * 3


def test_judge_counts_failed_processes_out_of_the_medians() -> None:
    spec = StabilityBenchmark("m", "eval")
    records = [_record(10.0), {"error": "timed out after 600 s", "metrics": []}, _record(10.5)]
    verdict = judge(spec, records, threshold=0.03)
    assert verdict.medians_ms == [10.0, 10.5] and verdict.errors == ["timed out after 600 s"]
    assert verdict.repeats == 3
    # Two processes: 3% scaled by d2(2) / d2(5), which a 5% spread reaches.
    assert verdict.allowed_spread == pytest.approx(allowed_spread(2, 0.03))
    assert verdict.unstable is True and verdict.threshold == 0.03


def test_measure_stability_refuses_bad_arguments() -> None:
    def run(spec: StabilityBenchmark) -> dict[str, object]:
        raise AssertionError("nothing is run")

    with pytest.raises(ValueError, match="at least 2"):
        measure_stability([StabilityBenchmark("ppo", "eval")], repeats=1, run=run)
    with pytest.raises(ValueError, match="no benchmarks"):
        measure_stability([], repeats=3, run=run)


def test_benchmarks_for_follows_the_listing() -> None:
    listing = [
        {"name": "a", "modes": ["train", "eval"], "devices": ["cpu", "cuda"]},
        {"name": "b", "modes": ["eval"], "devices": ["cpu"]},
        {"name": "c", "modes": ["train", "eval"], "devices": ["cuda"]},
    ]
    specs = benchmarks_for(listing, device="cpu")
    assert [s.key for s in specs] == ["a:train:cpu:eager", "a:eval:cpu:eager", "b:eval:cpu:eager"]
    assert [s.key for s in benchmarks_for(listing, device="cuda", modes=["eval"])] == [
        "a:eval:cuda:eager",
        "c:eval:cuda:eager",
    ]
