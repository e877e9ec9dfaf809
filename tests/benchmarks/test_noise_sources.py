"""The variance components of benchmarks/noise_sources.py on block medians with known parts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.noise_sources import variance_components


def test_offsets_between_processes_are_between_and_nothing_within() -> None:
    # every block of a process at its own level: all the noise is the process's
    levels = [10.0, 11.0, 9.5, 10.4]
    c = variance_components([[v] * 6 for v in levels])
    logs = np.log(levels)
    assert c["within"] == pytest.approx(0.0, abs=1e-12)
    assert c["between"] == pytest.approx(float(np.std(logs, ddof=1)), rel=1e-9)
    assert c["observed"] == pytest.approx(c["between"], rel=1e-9)


def test_the_same_blocks_in_every_process_are_within_and_nothing_between() -> None:
    blocks = [10.0, 10.5, 9.8, 10.2, 10.9, 9.6]
    c = variance_components([blocks, blocks[::-1], blocks[1:] + blocks[:1]])
    assert c["between"] == 0.0
    assert c["within"] > 0.02


def test_simulated_components_are_recovered() -> None:
    rng = np.random.default_rng(3)
    p, b, between, within = 400, 8, 0.03, 0.02
    levels = np.exp(rng.normal(0, between, (p, 1)) + rng.normal(0, within, (p, b))) * 20.0
    c = variance_components(levels.tolist())
    assert c["within"] == pytest.approx(within, rel=0.05)
    assert c["between"] == pytest.approx(between, rel=0.1)
    assert c["process_median"] == pytest.approx(math.sqrt(between**2 + within**2 / b), rel=0.1)


@pytest.mark.parametrize(
    "blocks", [[[1.0, 2.0]], [[1.0, 2.0], [1.0]], [[1.0], [2.0]], [[1.0, 0.0], [1.0, 2.0]]]
)
def test_bad_input_names_what_is_wrong(blocks: list[list[float]]) -> None:
    with pytest.raises(ValueError, match="processes|positive"):
        variance_components(blocks)


def test_a_slow_round_shared_by_every_benchmark_is_a_round_effect() -> None:
    from benchmarks.noise_sources import round_effects

    host = {0: 0.09, 1: -0.03, 2: -0.01, 3: -0.07, 4: 0.02}  # the host's speed per round
    own = {
        "a": [0.004, -0.002, 0.0, 0.001, -0.003],
        "b": [0.0, 0.003, -0.004, 0.002, -0.001],
        "c": [-0.002, 0.0, 0.003, -0.001, 0.0],
    }
    levels = {b: {r: 3.0 + i + host[r] + own[b][r] for r in host} for i, b in enumerate(own)}
    effects, residual = round_effects(levels)
    mean_host = float(np.mean(list(host.values())))
    for r, e in effects.items():
        assert e == pytest.approx(host[r] - mean_host, abs=0.005)
    for b in own:
        assert residual[b] < 0.006  # the benchmarks' own noise, far under the host's 6%
    with pytest.raises(ValueError, match="at least 2 benchmarks"):
        round_effects({"a": levels["a"]})
