"""The measurement setup of a CUDA benchmark process: the GPU counterpart of ``cpu_setup``.

On a GPU the process-to-process noise has other sources than the host allocator:

- **clocks**: a GPU raises its clocks under load (boost) and lowers them when hot or idle; the
  first iterations run before the clocks settle. The harness warms up until the per-iteration
  time is steady (:func:`is_steady`: the median of the last ``window`` iterations within
  ``tolerance`` of the median of the ``window`` before them; pyperf's and NVIDIA's advice to warm
  up to a steady state rather than for a fixed count), capped in iterations and seconds. How many
  iterations it took and whether it got there are recorded (``environment["warmup"]``), with the
  SM clock at the end of the warm-up where NVML can tell it (``torch.cuda.clock_rate``).
- **cuDNN autotuning**: ``torch.backends.cudnn.benchmark = True`` times several convolution
  algorithms in each process and keeps the fastest *that process* saw, so two processes may run
  different kernels. It is off here, as in TorchBench's models (their ``metadata.yaml`` says
  ``train_benchmark: false`` / ``eval_benchmark: false`` and ``torchbenchmark/__init__.py``
  checks it on CUDA), and set again after the model is built, in case its code turned it on.
- **deterministic algorithms**: ``torch.use_deterministic_algorithms(True)`` swaps some
  operators for slower deterministic ones (scatter/index accumulation, some backward passes)
  and ``cudnn.deterministic`` restricts cuDNN's choice: that changes the work measured, so it is
  off by default, as in TorchBench's performance runs (TorchBench turns it on for accuracy runs
  only: ``save_deterministic_dict`` in ``torchbenchmark/util/env_check.py``, with
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8``). ``NIGHTBENCH_SUITE_DETERMINISTIC=on`` turns it on for a
  benchmark where a GPU run shows it does not change the work (warn-only, so an operator without
  a deterministic version still runs).
- **caching allocator**: ``PYTORCH_CUDA_ALLOC_CONF`` (expandable segments, split sizes, the
  backend) changes when memory is returned and re-mapped. The harness leaves PyTorch's defaults
  (what users run) and records what is in force.

Everything in force is read back inside the process (:func:`gpu_setup_in_force`) and stored in
the record's ``environment["measurement_setup"]["gpu"]``; its settings are part of the machine
fingerprint (``service/results/records.py``), so a change of setup starts new series instead of
raising a regression. Nothing here imports torch at module level: ``suite/stability.py`` reads
:func:`gpu_setup_label` in nightbench's own environment.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
DETERMINISTIC_ENV = "NIGHTBENCH_SUITE_DETERMINISTIC"
CUBLAS_DETERMINISTIC = ":4096:8"  # what TorchBench's save_deterministic_dict sets
STEADY_WINDOW = 5
STEADY_TOLERANCE = 0.01


def is_steady(
    times_ms: Sequence[float], *, window: int = STEADY_WINDOW, tolerance: float = STEADY_TOLERANCE
) -> bool:
    """Whether per-iteration times have settled: the median of the last ``window`` iterations is
    within ``tolerance`` (relative) of the median of the ``window`` before them.

    Medians rather than means, so that one slow iteration (a page fault, a clock dip) neither
    ends the warm-up nor prolongs it.

    Args:
        times_ms: warm-up iteration times (ms), in order.
        window: iterations per compared half (>= 1).
        tolerance: largest relative change that counts as steady (0.01 = 1%).

    Returns:
        False with fewer than ``2 * window`` times.

    Raises:
        ValueError: ``window`` < 1, ``tolerance`` not in (0, 1), or a time that is not a
            positive finite number among the compared ones.
    """
    if window < 1 or not 0 < tolerance < 1:
        raise ValueError(f"need window >= 1 and 0 < tolerance < 1, got {window}, {tolerance}")
    if len(times_ms) < 2 * window:
        return False
    recent = list(times_ms[-2 * window :])
    if any(not (t > 0 and t != float("inf")) for t in recent):
        raise ValueError(f"iteration times must be positive finite ms, got {recent}")
    before = statistics.median(recent[:window])
    last = statistics.median(recent[window:])
    return abs(last - before) / before < tolerance


def steady_after(
    times_ms: Sequence[float], *, window: int = STEADY_WINDOW, tolerance: float = STEADY_TOLERANCE
) -> int | None:
    """How many iterations a warm-up of ``times_ms`` takes to be steady (:func:`is_steady`).

    Returns:
        The smallest ``n`` such that ``is_steady(times_ms[:n])``; None when it never is.
    """
    for n in range(2 * window, len(times_ms) + 1):
        if is_steady(times_ms[:n], window=window, tolerance=tolerance):
            return n
    return None


def deterministic_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``NIGHTBENCH_SUITE_DETERMINISTIC`` is ``on`` (or ``1``, ``true``, ``yes``)."""
    environ = os.environ if environ is None else environ
    return environ.get(DETERMINISTIC_ENV, "off").strip().lower() in ("on", "1", "true", "yes")


def apply_gpu_setup(*, deterministic: bool | None = None) -> dict[str, Any]:
    """Set this process up for measuring on CUDA; call it before the model is built.

    Turns ``torch.backends.cudnn.benchmark`` off; with ``deterministic`` (default:
    :func:`deterministic_requested`) also turns on ``torch.use_deterministic_algorithms(True,
    warn_only=True)`` and ``cudnn.deterministic``, and sets ``CUBLAS_WORKSPACE_CONFIG`` to
    ``:4096:8`` unless it is set (it must be set before cuBLAS starts). Without it, both are
    turned off, so that a model's code cannot carry them over from an earlier benchmark.

    Returns:
        :func:`gpu_setup_in_force` after the change.
    """
    import torch

    if deterministic is None:
        deterministic = deterministic_requested()
    if deterministic:
        # Stays: cuBLAS reads its workspace setting only from the environment, when it starts.
        os.environ.setdefault(CUBLAS_ENV, CUBLAS_DETERMINISTIC)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    return gpu_setup_in_force()


def gpu_setup_in_force() -> dict[str, Any]:
    """The GPU measurement setup this process runs with, read from torch and its environment.

    Returns:
        A JSON-ready dict: ``cudnn_benchmark``, ``cudnn_deterministic``,
        ``deterministic_algorithms``, ``deterministic_warn_only`` (booleans), ``alloc_conf``
        (``PYTORCH_CUDA_ALLOC_CONF``, None when unset), ``allocator_backend`` (``native`` or
        ``cudaMallocAsync``; None without CUDA), ``cublas_workspace_config`` and ``warmup``
        (the steady-state rule: ``"median of 5 within 1%"``).
    """
    import torch

    backend = None
    if torch.cuda.is_available():
        try:
            backend = torch.cuda.get_allocator_backend()
        except (RuntimeError, AttributeError):
            backend = None
    return {
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "alloc_conf": os.environ.get(ALLOC_CONF_ENV),
        "allocator_backend": backend,
        "cublas_workspace_config": os.environ.get(CUBLAS_ENV),
        "warmup": f"median of {STEADY_WINDOW} within {STEADY_TOLERANCE:.0%}",
    }


def sm_clock_mhz() -> int | None:
    """The current SM clock of the current GPU (MHz), through NVML; None where it cannot be read."""
    try:
        import torch

        return int(torch.cuda.clock_rate()) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - NVML missing or refused: the clock is simply unknown
        return None


def gpu_setup_label(environment: Mapping[str, Any]) -> str:
    """A short name of a record environment's GPU setup, for tables: ``cudnn.benchmark off``,
    ``+deterministic``, ``+alloc:<conf>``; ``""`` for a record without one (a CPU benchmark)."""
    setup = environment.get("measurement_setup")
    gpu = setup.get("gpu") if isinstance(setup, Mapping) else None
    if not isinstance(gpu, Mapping):
        return ""
    parts = [f"cudnn.benchmark {'on' if gpu.get('cudnn_benchmark') else 'off'}"]
    if gpu.get("deterministic_algorithms"):
        parts.append("deterministic")
    if gpu.get("alloc_conf"):
        parts.append(f"alloc:{gpu['alloc_conf']}")
    return "+".join(parts)
