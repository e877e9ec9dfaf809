"""What a measurement ran on: torch build, device, driver, CPU, threads, Python.

Modelled on pyperf's ``_collect_metadata.py``: every record carries its environment so that a
change of machine, GPU, driver or numeric default starts a new series instead of raising a false
regression. Only facts that identify the setup are collected (no load average, no clock reading),
so that two runs on the same machine and build describe themselves identically.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from suite.cpu_setup import setup_in_force
from suite.gpu_setup import gpu_setup_in_force


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            out = subprocess.run(
                [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout.strip()
            if out:
                return out.splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    # The kernel module reports its version even where nvidia-smi is not installed.
    line = _read_first_line("/proc/driver/nvidia/version")
    if line and "Kernel Module" in line:
        parts = line.split("Kernel Module", 1)[1].split()
        return parts[0] if parts else None
    return None


def build_variant(version: str | None = None) -> str:
    """The build variant of a torch version string: ``cpu``, ``cu130``, ``rocm6.4``, ...

    The local part of the version (``2.13.0+cu130``) is used when present; otherwise (the default
    wheel on PyPI carries none) it is derived from ``torch.version.cuda`` / ``torch.version.hip``.
    """
    version = version or torch.__version__
    if "+" in version:
        return version.split("+", 1)[1]
    if torch.version.cuda:
        return "cu" + torch.version.cuda.replace(".", "")
    hip = getattr(torch.version, "hip", None)
    if hip:
        return "rocm" + ".".join(hip.split(".")[:2])
    return "cpu"


def _git(directory: Path, *args: str) -> str | None:
    """``git -C directory ARGS``'s output, or None where git is missing or fails."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        return subprocess.run(
            [git, "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def source_tree_state(directory: Path) -> dict[str, Any]:
    """The state of the code in ``directory``: its path and, where it is tracked in a git work
    tree (not ignored there, as a virtual environment inside a repository is), the tree's
    ``HEAD`` commit and the SHA-256 of ``git diff HEAD`` (its uncommitted changes to tracked
    files; ``None`` when there are none).

    Returns:
        ``{"path", "commit", "changes"}``; ``commit`` and ``changes`` are None outside a git
        work tree or without git.
    """
    state: dict[str, Any] = {"path": str(directory), "commit": None, "changes": None}
    if not directory.is_dir():
        return state
    top = _git(directory, "rev-parse", "--show-toplevel")
    if not top or _git(directory, "check-ignore", "-q", ".") is not None:
        return state  # outside a work tree, or ignored by the one it lies in
    state["commit"] = (_git(directory, "rev-parse", "HEAD") or "").strip() or None
    diff = _git(directory, "diff", "HEAD", "--", ".")
    if diff:
        state["changes"] = hashlib.sha256(diff.encode()).hexdigest()
    return state


def code_under_test() -> dict[str, Any]:
    """What decides the code a benchmark runs besides its model: the build under test.

    Two processes that give the same dict ran the same code, so a change between two nights
    whose records agree on it is the host's or the process's, not the build's (the paired
    confirmation measures the previous night's build beside a re-run on that ground:
    :func:`workers.night.finish.paired_build`).

    Returns:
        ``torch_version``, ``torch_git_version``, ``torch_path`` (the directory torch was
        imported from), ``distributions`` (every installed distribution as ``name==version``,
        sorted: torchvision, the model's libraries, ...), and ``source_trees``: the
        :func:`source_tree_state` of torch's directory and of each ``PYTHONPATH`` entry (a
        checkout put first on the path, as ``nightbench demo`` puts its package's).
    """
    torch_dir = Path(torch.__file__).resolve().parent
    path_entries = [
        Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    distributions = sorted(
        {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()}
    )
    return {
        "torch_version": torch.__version__,
        "torch_git_version": getattr(torch.version, "git_version", None),
        "torch_path": str(torch_dir),
        "distributions": distributions,
        "source_trees": [source_tree_state(p) for p in (torch_dir, *path_entries)],
    }


def build_fingerprint() -> str:
    """The SHA-256 (hex, 16 characters) of :func:`code_under_test`: equal for two processes
    that ran the same code, whatever machine or hour they ran at."""
    text = json.dumps(code_under_test(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _static_environment() -> dict[str, Any]:
    """Facts that cannot change within one process (cached: nvidia-smi costs ~50 ms)."""
    cpu_capability = None
    try:
        cpu_capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch < 2.1
        pass
    return {
        "torch_version": torch.__version__,
        "torch_git_version": getattr(torch.version, "git_version", None),
        "build_variant": build_variant(),
        "cuda": torch.version.cuda,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": cpu_capability,
        "cpu_governor": _read_first_line("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": torch.backends.openmp.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "executable": sys.executable,
        "build_fingerprint": build_fingerprint(),
    }


def _gpu_environment() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu_name": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "gpu_capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": int(props.total_memory),
        "cudnn": torch.backends.cudnn.version(),
        "driver": _nvidia_driver(),
    }


def precision_flags() -> dict[str, Any]:
    """The fp32 switches in force: ``float32_matmul_precision``, matmul and cuDNN TF32.

    PyTorch's defaults (kept by the suite) are ``"highest"``, ``False`` and ``True``: CUDA matmuls
    in full fp32, cuDNN convolutions allowed to use TF32.
    """
    flags: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    try:
        flags["cuda_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        flags["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    except (AttributeError, RuntimeError):  # a torch that has only the fp32_precision API
        flags["cuda_matmul_allow_tf32"] = None
        flags["cudnn_allow_tf32"] = None
    # torch >= 2.9 also has a per-backend fp32_precision switch ("none" = follow the old flags).
    flags["cuda_matmul_fp32_precision"] = getattr(
        torch.backends.cuda.matmul, "fp32_precision", None
    )
    flags["cudnn_fp32_precision"] = getattr(torch.backends.cudnn, "fp32_precision", None)
    return flags


def collect_environment(device: str = "cpu") -> dict[str, Any]:
    """Describe the build under test and the hardware it runs on.

    Call it after the thread count and CPU affinity have been set: both are read fresh.

    Args:
        device: ``"cpu"`` or ``"cuda"``; GPU fields are filled for ``cuda`` only.

    Returns:
        A JSON-ready dict: ``torch_version``, ``torch_git_version``, ``build_variant`` (``cpu``,
        ``cu130``, ...), ``cuda``, ``cudnn``, ``driver``, ``gpu_name``, ``gpu_count``,
        ``gpu_capability``, ``gpu_memory_bytes`` (bytes), ``cpu_model``, ``cpu_count``,
        ``cpu_capability``, ``cpu_governor``, ``cpu_affinity``, ``threads``, ``interop_threads``,
        ``mkldnn``, ``openmp``, the fp32 precision flags of :func:`precision_flags`, ``python``,
        ``platform``, ``hostname``, ``executable``, ``build_fingerprint`` (the code under test:
        :func:`build_fingerprint`), and ``measurement_setup``, the allocator,
        tunables and kernel settings verified in force (:func:`suite.cpu_setup.setup_in_force`),
        with, for ``cuda``, the GPU setup under ``measurement_setup["gpu"]``
        (:func:`suite.gpu_setup.gpu_setup_in_force`: cuDNN autotuning, deterministic
        algorithms, ``PYTORCH_CUDA_ALLOC_CONF``).
    """
    env: dict[str, Any] = dict(_static_environment())
    env.update(
        {
            "cudnn": None,
            "driver": None,
            "gpu_name": None,
            "gpu_count": None,
            "gpu_capability": None,
            "gpu_memory_bytes": None,
        }
    )
    if device == "cuda" and torch.cuda.is_available():
        env.update(_gpu_environment())
    env["cpu_affinity"] = (
        sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    )
    env["threads"] = torch.get_num_threads()
    env["interop_threads"] = torch.get_num_interop_threads()
    env.update(precision_flags())
    env["measurement_setup"] = setup_in_force()
    if device == "cuda":
        env["measurement_setup"]["gpu"] = gpu_setup_in_force()
    return env
