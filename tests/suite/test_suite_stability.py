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
    measure_stability,
    noise_floor,
    summarize,
)
from tests.suite.helpers import FIXTURE_MODELS, QUICK


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


def test_planted_instability_is_marked_and_rounds_interleave(tmp_path) -> None:
    counter = tmp_path / "count"
    specs = [StabilityBenchmark("variable_latency", "eval"), StabilityBenchmark("crashes", "train")]
    seen: list[tuple[str, int]] = []
    results = measure_stability(
        specs,
        repeats=3,
        run_args=QUICK,
        env={
            "NIGHTBENCH_SUITE_EXTRA_MODELS": str(FIXTURE_MODELS),
            "NIGHTBENCH_TEST_COUNTER": str(counter),
        },
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
    assert len(variable.medians_ms) == 3 and not variable.errors
    # Every process ran with the same measurement setup, and the result names it.
    [setup] = variable.setups
    assert setup == setup_label(variable.environment) and setup not in ("-", "glibc (off)")
    assert crashing.setups == []
    # Each process sleeps 25% longer than the one before: 5, 6.25, 7.5 ms.
    assert variable.medians_ms == sorted(variable.medians_ms)
    assert variable.spread > 0.3 and variable.unstable is True
    # Three processes are judged by the 7% rule scaled for three.
    assert variable.threshold == 0.07 and variable.allowed_spread == pytest.approx(
        allowed_spread(3)
    )
    assert crashing.allowed_spread is None
    assert variable.cv > 0.1
    assert variable.benchmark_version and variable.environment["threads"] == 1
    assert crashing.medians_ms == [] and crashing.unstable is None and crashing.cv is None
    assert len(crashing.errors) == 3 and "the planted failure" in crashing.errors[0]


def test_measure_stability_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        measure_stability([StabilityBenchmark("ppo", "eval")], repeats=1)
    with pytest.raises(ValueError, match="no benchmarks"):
        measure_stability([], repeats=3)


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
