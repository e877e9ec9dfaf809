"""``nightbench suite stability``'s processes: real ``python -m suite run`` processes of fixture
models, run by :mod:`workers.runner` (the verdicts' method is tested in
``tests/suite/test_suite_stability.py``, the command end to end in
``tests/suite/test_suite_stability_store.py``)."""

from __future__ import annotations

import pytest

from service.errors import InvalidInput
from suite.cpu_setup import setup_label
from suite.stability import StabilityBenchmark, allowed_spread
from tests.suite.helpers import FIXTURE_MODELS, QUICK
from workers.night import stability


def test_planted_instability_is_marked_and_a_failing_model_keeps_its_reason(tmp_path) -> None:
    counter = tmp_path / "count"
    specs = [StabilityBenchmark("variable_latency", "eval"), StabilityBenchmark("crashes", "train")]
    seen: list[tuple[str, int]] = []
    results = stability.measure(
        specs,
        repeats=3,
        run_args=QUICK,
        env={
            "NIGHTBENCH_SUITE_EXTRA_MODELS": str(FIXTURE_MODELS),
            "NIGHTBENCH_TEST_COUNTER": str(counter),
        },
        on_record=lambda spec, round_no, record: seen.append((spec.model, round_no)),
    )
    assert [model for model, _ in seen] == ["variable_latency", "crashes"] * 3
    variable, crashing = results
    assert len(variable.medians_ms) == 3 and not variable.errors
    # Every process ran with the same measurement setup, and the result names it.
    [setup] = variable.setups
    assert setup == setup_label(variable.environment) and setup not in ("-", "glibc (off)")
    assert crashing.setups == []
    # Each process sleeps 25% longer than the one before: 5, 6.25, 7.5 ms.
    assert variable.medians_ms == sorted(variable.medians_ms)
    assert variable.spread > 0.3 and variable.unstable is True
    assert variable.allowed_spread == pytest.approx(allowed_spread(3))
    assert variable.cv > 0.1
    # The runner's environment: one thread unless set, the repository's suite on the path.
    assert variable.benchmark_version and variable.environment["threads"] == 1
    assert crashing.medians_ms == [] and crashing.unstable is None and crashing.cv is None
    assert len(crashing.errors) == 3 and "the planted failure" in crashing.errors[0]


def test_measure_refuses_too_few_processes() -> None:
    with pytest.raises(InvalidInput, match="--repeats must be at least 2, got 1"):
        stability.measure([StabilityBenchmark("ppo", "eval")], repeats=1, run_args=[])
