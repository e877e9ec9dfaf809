"""The GPU measurement setup: steady warm-up, cuDNN autotuning off, what is recorded.

The rule and the recorded setup are checked on CPU with literal iteration times; what needs a
device is marked ``cuda`` (skipped without one).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from service.results.records import machine_fingerprint
from suite import gpu_setup
from suite.cpu_setup import JEMALLOC_CONF_VALUE
from suite.environment import collect_environment
from suite.harness import HarnessConfig, run_benchmark
from suite.stability import full_setup_label
from tests.suite.helpers import metric, run_record

# A GPU ramping its clocks up: the first iterations slow, then level at about 10 ms.
RAMP = [
    20.0,
    17.0,
    15.0,
    13.5,
    12.4,
    11.6,
    11.0,
    10.6,
    10.3,
    10.15,
    10.05,
    10.02,
    10.0,
    10.01,
    9.99,
    10.0,
    10.02,
    10.0,
    9.98,
    10.01,
    10.0,
    10.01,
]


@pytest.fixture
def torch_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Restore torch's global switches and the variables the setup may set."""
    monkeypatch.delenv(gpu_setup.CUBLAS_ENV, raising=False)
    monkeypatch.delenv(gpu_setup.DETERMINISTIC_ENV, raising=False)
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def test_warmup_is_steady_once_the_median_stops_moving() -> None:
    assert not gpu_setup.is_steady(RAMP[:9])  # fewer than two windows
    assert not gpu_setup.is_steady(RAMP[:10])  # 12.4 ms -> 10.6 ms: still ramping
    # Iterations 14-18 (median 10.0 ms) are the first within 1% of the five before them
    # (10.05 ms); at 17 the two medians, 10.0 and 10.15 ms, are still 1.5% apart.
    n = gpu_setup.steady_after(RAMP)
    assert n == 18
    assert gpu_setup.is_steady(RAMP[:n]) and not gpu_setup.is_steady(RAMP[: n - 1])
    # A looser tolerance settles sooner; a ramp that never levels never settles.
    assert gpu_setup.steady_after(RAMP, tolerance=0.2) < n
    assert gpu_setup.steady_after([20.0 * 0.97**i for i in range(40)]) is None


def test_one_slow_iteration_neither_ends_nor_prolongs_the_warmup() -> None:
    level = [10.0, 10.01, 9.99, 10.0, 10.02, 10.0, 9.98, 10.01, 10.0, 10.0]
    assert gpu_setup.is_steady(level)
    assert gpu_setup.is_steady([*level[:7], 25.0, *level[8:]])


def test_steady_rule_names_bad_input() -> None:
    with pytest.raises(ValueError, match="window >= 1"):
        gpu_setup.is_steady(RAMP, window=0)
    with pytest.raises(ValueError, match="tolerance"):
        gpu_setup.is_steady(RAMP, tolerance=1.5)
    with pytest.raises(ValueError, match="positive finite ms"):
        gpu_setup.is_steady([10.0] * 9 + [-1.0])


def test_setup_turns_autotuning_off_and_is_recorded(torch_flags: None) -> None:
    torch.backends.cudnn.benchmark = True  # as a model's code may leave it
    in_force = gpu_setup.apply_gpu_setup()
    assert in_force["cudnn_benchmark"] is False and torch.backends.cudnn.benchmark is False
    assert in_force["deterministic_algorithms"] is False
    assert in_force["cublas_workspace_config"] is None
    env = collect_environment("cuda")
    assert env["measurement_setup"]["gpu"] == gpu_setup.gpu_setup_in_force()
    assert "gpu" not in collect_environment("cpu")["measurement_setup"]


def test_deterministic_algorithms_only_when_asked(
    torch_flags: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gpu_setup.DETERMINISTIC_ENV, "on")
    monkeypatch.setenv(gpu_setup.ALLOC_CONF_ENV, "expandable_segments:True")
    in_force = gpu_setup.apply_gpu_setup()
    assert in_force["deterministic_algorithms"] is True and in_force["deterministic_warn_only"]
    assert in_force["cudnn_deterministic"] is True
    assert in_force["cublas_workspace_config"] == gpu_setup.CUBLAS_DETERMINISTIC
    assert in_force["alloc_conf"] == "expandable_segments:True"
    assert gpu_setup.apply_gpu_setup(deterministic=False)["deterministic_algorithms"] is False


def _cuda_env(**gpu: object) -> dict:
    setup = {
        "setup": "on",
        "allocator": "jemalloc",
        "malloc_conf": JEMALLOC_CONF_VALUE,
        "gpu": {
            "cudnn_benchmark": False,
            "cudnn_deterministic": False,
            "deterministic_algorithms": False,
            "alloc_conf": None,
            "allocator_backend": "native",
            "cublas_workspace_config": None,
            **gpu,
        },
    }
    return {
        "cpu_model": "EPYC",
        "gpu_name": "NVIDIA H100",
        "driver": "580.1",
        "threads": 1,
        "measurement_setup": setup,
    }


def test_gpu_setup_is_part_of_the_machine_fingerprint() -> None:
    base = machine_fingerprint(_cuda_env(), "cuda")
    for change in (
        {"cudnn_benchmark": True},
        {"deterministic_algorithms": True},
        {"alloc_conf": "expandable_segments:True"},
        {"allocator_backend": "cudaMallocAsync"},
    ):
        assert machine_fingerprint(_cuda_env(**change), "cuda") != base, change
    # The warm-up's outcome is per process, not a setting: it does not split series.
    assert machine_fingerprint({**_cuda_env(), "warmup": {"iterations": 40}}, "cuda") == base
    # A CPU record (no GPU part) fingerprints as it did before the GPU part existed.
    cpu = {"cpu_model": "EPYC", "threads": 1, "measurement_setup": {"setup": "on"}}
    with_gpu_none = {**cpu, "measurement_setup": {"setup": "on", "gpu": None}}
    assert machine_fingerprint(cpu, "cpu") == machine_fingerprint(with_gpu_none, "cpu")


def test_stability_table_names_the_gpu_setup() -> None:
    assert full_setup_label(_cuda_env()) == "jemalloc, cudnn.benchmark off"
    assert full_setup_label(_cuda_env(deterministic_algorithms=True, alloc_conf="x:1")) == (
        "jemalloc, cudnn.benchmark off+deterministic+alloc:x:1"
    )
    assert full_setup_label({"measurement_setup": {"allocator": "glibc", "setup": "on"}}) == "glibc"


def test_steady_warmup_on_cpu_is_recorded(fixture_models: object) -> None:
    cfg = HarnessConfig(
        warmup_iterations=1,
        warmup_seconds=0.0,
        min_iterations=3,
        min_seconds=0.0,
        steady_warmup=True,
        warmup_max_iterations=30,
    )
    record = run_benchmark("steady_alloc", "eval", config=cfg)
    assert record.error is None, record.error
    warmup = record.environment["warmup"]
    assert isinstance(warmup["steady"], bool) and warmup["sm_clock_mhz"] is None
    # At least two windows to compare, at most the cap unless it was steady before.
    assert 2 * gpu_setup.STEADY_WINDOW <= warmup["iterations"] <= 30
    off = run_benchmark(
        "steady_alloc",
        "eval",
        config=HarnessConfig(
            warmup_iterations=2, warmup_seconds=0.0, min_iterations=3, min_seconds=0.0
        ),
    )
    assert off.environment["warmup"] == {"iterations": 2, "steady": None, "sm_clock_mhz": None}


def test_steady_warmup_is_chosen_from_the_environment_of_the_process() -> None:
    proc, record = run_record(
        "steady_alloc", "eval", fixtures=True, NIGHTBENCH_SUITE_STEADY_WARMUP="on"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert isinstance(record["environment"]["warmup"]["steady"], bool)
    proc, record = run_record(
        "steady_alloc",
        "eval",
        "--steady-warmup",
        "off",
        fixtures=True,
        NIGHTBENCH_SUITE_STEADY_WARMUP="on",
    )
    assert proc.returncode == 0 and record["environment"]["warmup"]["steady"] is None


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
def test_cuda_run_warms_up_to_steady_clocks_with_autotuning_off() -> None:
    proc, record = run_record(
        "resnet18", "eval", "--device", "cuda", "--batch-size", "8", "--warmup-seconds", "1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = record["environment"]
    gpu = env["measurement_setup"]["gpu"]
    assert gpu["cudnn_benchmark"] is False and gpu["deterministic_algorithms"] is False
    assert gpu["allocator_backend"] in ("native", "cudaMallocAsync")
    assert env["warmup"]["iterations"] >= 2 * gpu_setup.STEADY_WINDOW
    assert env["warmup"]["steady"] is True, env["warmup"]
    assert metric(record, "latency")["median"] > 0


@pytest.mark.cuda
@cuda
def test_cuda_setup_change_starts_a_new_machine() -> None:
    _, plain = run_record("resnet18", "eval", "--device", "cuda", "--batch-size", "8")
    _, other = run_record(
        "resnet18",
        "eval",
        "--device",
        "cuda",
        "--batch-size",
        "8",
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
    )
    assert other["environment"]["measurement_setup"]["gpu"]["alloc_conf"] == (
        "expandable_segments:True"
    )
    assert machine_fingerprint(plain["environment"], "cuda") != machine_fingerprint(
        other["environment"], "cuda"
    )
