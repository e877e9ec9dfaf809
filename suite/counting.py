"""Instructions executed per step, counted by valgrind's callgrind: the ``cpu_instructions`` metric.

Method (as ``torch.utils.benchmark.Timer.collect_callgrind`` counts, and PyTorch's
``benchmarks/instruction_counts``): the process runs under ``valgrind --tool=callgrind
--collect-atstart=no --instr-atstart=no``, so nothing is counted until the code asks, and
nothing is instrumented before the first counted window (:func:`instrumentation_on`: ``import
torch``, the build and the warm-up run at valgrind's bare speed); around each counted window
of steps it calls ``torch._C._valgrind_toggle()`` (collection on) and
``torch._C._valgrind_toggle_and_dump_stats()`` (collection off, and one profile dumped), so a
dump holds the instructions (callgrind's ``Ir``) of exactly those steps. The count is made in a
process of its own, never the timed one: one thread, ``PYTHONHASHSEED=0``, the garbage
collector off during the counted windows, after warm-up steps that are not counted. Several
benchmarks may be counted in turn by one valgrind process, each built after the previous one is
released; with instrumentation off until the first window, ``import torch`` costs a process about
12 CPU seconds here (a minute instrumented), and the benchmarks after the first are built
instrumented, so one a process is the nightly's default (``NIGHTBENCH_COUNT_BATCH``).

The count is exact for the code the process ran: it sees Python, the framework and the kernels
it dispatched to, and is blind to threading, caches and memory layout (latency stays the metric
for those). Valgrind 3.19 emulates no AVX-512, so oneDNN and MKL run their AVX2 kernels under
it: a count sees the work of the kernels dispatched there, not of the timed run's. Measured
noise and cost: docs/benchmarks.md ("Instruction counts").

Two layers: :func:`count_benchmarks` runs inside valgrind and writes a manifest of the dumps it
made; :func:`count_records` runs outside, starts valgrind on ``python -m suite count`` and turns
the manifest and the dumps into one record per benchmark.
"""

from __future__ import annotations

import gc
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRIC = "cpu_instructions"
UNIT = "instructions"
INSIDE_ENV = "NIGHTBENCH_COUNT_MANIFEST"
"""Set (to the manifest's path) in the process valgrind runs: count, do not start valgrind."""
VALGRIND_FLAGS = ("--tool=callgrind", "--collect-atstart=no", "--dump-instr=no")
"""The callgrind options of every count and function-level profile (``suite/profiling.py``)."""
COUNT_FLAGS = (*VALGRIND_FLAGS, "--instr-atstart=no")
"""The options of a count: also no instrumentation until the first counted window
(:func:`instrumentation_on`), so ``import torch``, the model's build and its warm-up run at
valgrind's bare speed. Part of the count series' machine fingerprint."""
COUNT_ENV_BYTES = 16384
"""The size the count process's environment is padded to: its ``NAME=value`` strings with their
terminating NULs, plus 8 bytes of pointer each (:func:`count_environment`)."""
COUNT_ENV_PAD = "NIGHTBENCH_COUNT_PAD"
"""The variable that pads the count process's environment to :data:`COUNT_ENV_BYTES`."""
_COUNT_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "MALLOC_CONF",
        "GLIBC_TUNABLES",
        "XDG_CACHE_HOME",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
    }
)
_COUNT_ENV_PREFIXES = (
    "PYTHON",
    "LC_",
    "NIGHTBENCH_SUITE_",
    "NIGHTBENCH_TORCHBENCH_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "DNNL_",
    "ONEDNN_",
    "VALGRIND_",
)
CONTROL = "callgrind_control"
"""Valgrind's tool that switches callgrind's instrumentation on in a running process."""
_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


class CountUnavailable(RuntimeError):
    """Instructions cannot be counted here (no valgrind, or a torch without its client calls)."""


@dataclass(frozen=True)
class CountConfig:
    """How much to count.

    Attributes:
        warmup_steps: steps run before counting (first-call allocations, lazy initialisation).
        steps: steps in each counted window; a sample is the window's count divided by this.
        repeats: counted windows (samples) per benchmark.
        timeout_s: the whole valgrind process's limit (s).
    """

    warmup_steps: int = 2
    steps: int = 1
    repeats: int = 3
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.steps < 1 or self.repeats < 1 or self.timeout_s <= 0:
            raise ValueError(
                "count config: warmup_steps >= 0, steps >= 1, repeats >= 1 and timeout_s > 0, "
                f"got {self.warmup_steps}, {self.steps}, {self.repeats}, {self.timeout_s}"
            )


def valgrind_version(valgrind: str = "valgrind") -> str:
    """The version valgrind reports (``valgrind-3.19.0``).

    Raises:
        CountUnavailable: valgrind is not installed or does not run.
    """
    path = shutil.which(valgrind)
    if path is None:
        raise CountUnavailable(
            "valgrind is not installed (apt-get install valgrind): cpu_instructions not counted"
        )
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise CountUnavailable(
            f"valgrind does not run ({exc}): cpu_instructions not counted"
        ) from exc
    return out.stdout.strip()


def dump_totals(path: Path) -> int:
    """The instructions (``Ir``) a callgrind dump holds: its ``totals:`` (or ``summary:``) line.

    Raises:
        ValueError: the file has neither line (not a callgrind profile).
    """
    match = _TOTALS.search(path.read_text(errors="replace"))
    if match is None:
        raise ValueError(f"{path}: no 'totals:' or 'summary:' line; not a callgrind profile")
    return int(match.group(1))


# ------------------------------------------------------------------------------------------
# Inside valgrind

_instrumented = False


def instrumentation_on(timeout_s: float = 120.0) -> None:
    """Switch callgrind's instrumentation on in this process, once (later calls return at once).

    The count process starts with instrumentation off (``--instr-atstart=no``): until it is
    on, callgrind neither counts nor tracks calls and the process runs at valgrind's bare
    speed, several times faster (``import torch``: 9 s of CPU against 31 s, docs/benchmarks.md
    "The count process's instrumentation"). It is switched on by ``callgrind_control -i on
    PID``, through valgrind's gdbserver, which takes the command at its next poll: this process
    keeps executing while it waits, so the poll comes without ``ptrace``. Once on it stays on:
    switching it off and on again leaves callgrind's call stack stale, and the first window
    after such a switch was measured wrong (2.3 M of sac train's 19.4 M instructions, or a
    negative total).

    Raises:
        CountUnavailable: ``callgrind_control`` is missing, failed or did not answer within
            ``timeout_s`` seconds.
    """
    global _instrumented
    if _instrumented:
        return
    control = shutil.which(CONTROL)
    if control is None:
        raise CountUnavailable(f"{CONTROL} is not installed (it comes with valgrind)")
    proc = subprocess.Popen(
        [control, "-i", "on", str(os.getpid())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise CountUnavailable(f"{CONTROL} -i on did not answer within {timeout_s:.0f} s")
        sum(range(1000))  # guest code running: valgrind polls for the command between blocks
    answer = (proc.stdout.read() if proc.stdout else "").strip()
    if proc.returncode != 0 or "OK" not in answer:
        tail = " | ".join(answer.splitlines()[-2:])
        raise CountUnavailable(f"{CONTROL} -i on failed (exit {proc.returncode}): {tail}")
    _instrumented = True


def _count_one(model: str, mode: str, batch_size: int | None, cfg: CountConfig) -> dict[str, Any]:
    """Build one benchmark and count ``cfg.repeats`` windows of its steps, each dumped.

    The model is built and stepped with its metadata's ``count_settings`` over its own
    (:meth:`suite.model.BenchmarkModel.count_settings`: a smaller image where the full-size
    step costs too long under valgrind).

    Returns:
        ``{"model", "mode", "batch_size", "benchmark_version", "settings", "dumps": k,
        "error"}``: the settings overridden for the count (``{}``: none) and the number of
        profiles dumped for it (in order after the previous benchmark's).
    """
    import torch

    from suite.registry import benchmark_version, load_model_class

    out: dict[str, Any] = {"model": model, "mode": mode, "batch_size": batch_size, "dumps": 0}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        out["benchmark_version"] = benchmark_version(model)
        cls = load_model_class(model)
        with cls.count_settings() as settings:
            out["settings"] = settings
            bench = cls(test=mode, device="cpu", batch_size=batch_size)
            out["batch_size"] = bench.batch_size
            out["build_cpu_s"] = round(time.process_time() - cpu, 2)
            step = bench.train if mode == "train" else bench.eval
            for _ in range(cfg.warmup_steps):
                step()
            out["warmup_cpu_s"] = round(time.process_time() - cpu - out["build_cpu_s"], 2)
            instrumentation_on()
            gc.collect()
            gc.disable()
            try:
                for _ in range(cfg.repeats):
                    torch._C._valgrind_toggle()
                    for _ in range(cfg.steps):
                        step()
                    torch._C._valgrind_toggle_and_dump_stats()
                    out["dumps"] += 1
            finally:
                gc.enable()
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - a benchmark's failure is its record's error
        from suite.harness import describe_failure

        out["error"] = describe_failure(exc)
        out["traceback"] = traceback.format_exc(limit=5)
    # Under valgrind: what counting this benchmark cost (build, warm-up, counted steps, dumps).
    out["wall_s"] = round(time.perf_counter() - wall, 2)
    out["cpu_s"] = round(time.process_time() - cpu, 2)
    return out


def count_benchmarks(
    benchmarks: list[tuple[str, str, int | None]], cfg: CountConfig, manifest: Path
) -> None:
    """Count each benchmark in turn in this process (which valgrind runs), writing the manifest.

    The manifest is rewritten after each benchmark, so a crash leaves what was counted before.

    Args:
        benchmarks: ``(model, mode, batch size or None)`` on CPU.
        cfg: warm-up, steps and repeats.
        manifest: where to write ``{"benchmarks": [...]}`` (see :func:`_count_one`).
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    done: list[dict[str, Any]] = []
    for model, mode, batch_size in benchmarks:
        done.append(_count_one(model, mode, batch_size, cfg))
        manifest.write_text(json.dumps({"benchmarks": done}))
        gc.collect()


# ------------------------------------------------------------------------------------------
# Outside valgrind


def count_environment(environ: Mapping[str, str], manifest: Path) -> dict[str, str]:
    """The environment the valgrind count process starts with: fixed, whatever the worker's.

    A count depends on everything the process starts with, not only on the code it runs: one
    unrelated 3,000-byte variable more moved gcn eval's count by 0.31%, another shell's
    variables by 0.39% (docs/benchmarks.md, "The count's noise over processes"); presumably the
    environment's size moves the stack and with it the heap's layout, allocator paths and
    hash-table probes. So the count process gets only the variables a build and the suite can
    need (paths, Python's, the suite's and TorchBench's, torch's, the thread and allocator
    settings, valgrind's), in name order, padded by :data:`COUNT_ENV_PAD` to
    :data:`COUNT_ENV_BYTES`: another shell, a redeployed worker's settings or its secrets do
    not reach it. A kept variable of another length (another ``PYTHONPATH``) still moves the
    heap, and the interpreter's path and the arguments are the build's own.

    Args:
        environ: the worker's environment (``os.environ``).
        manifest: the manifest the count process writes (:data:`INSIDE_ENV`).

    Returns:
        The count process's environment, with ``PYTHONHASHSEED=0`` and one OpenMP and MKL
        thread; padded to :data:`COUNT_ENV_BYTES` unless the kept variables alone exceed it.
    """
    kept = {
        name: value
        for name, value in environ.items()
        if name in _COUNT_ENV_NAMES or name.startswith(_COUNT_ENV_PREFIXES)
    }
    kept.update(
        {
            INSIDE_ENV: str(manifest),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
    )
    kept.pop(COUNT_ENV_PAD, None)

    def size(env: Mapping[str, str]) -> int:
        return sum(len(f"{k}={v}".encode()) + 1 + 8 for k, v in env.items())

    padding = COUNT_ENV_BYTES - size({**kept, COUNT_ENV_PAD: ""})
    kept[COUNT_ENV_PAD] = "x" * max(0, padding)
    return dict(sorted(kept.items()))


def _environment(version: str, cfg: CountConfig) -> dict[str, Any]:
    from suite.environment import collect_environment

    env = collect_environment("cpu")
    env["threads"] = 1
    env["counter"] = {
        "tool": "callgrind",
        "valgrind": version,
        "flags": list(COUNT_FLAGS),
        "warmup_steps": cfg.warmup_steps,
        "steps": cfg.steps,
        "process_environment": f"kept variables, {COUNT_ENV_BYTES} bytes",
    }
    return env


def _base(model: str, mode: str, batch_size: int | None) -> dict[str, Any]:
    return {
        "model": model,
        "mode": mode,
        "device": "cpu",
        "compiler": "eager",
        "batch_size": batch_size,
        "benchmark_version": None,
        "environment": {},
        "metrics": [],
        "leak": None,
        "error": None,
        "measures": [METRIC],
    }


def count_records(
    benchmarks: list[tuple[str, str, int | None]],
    cfg: CountConfig | None = None,
    *,
    python: str = sys.executable,
    valgrind: str = "valgrind",
) -> list[dict[str, Any]]:
    """Count instructions per step of each benchmark in one valgrind process.

    Args:
        benchmarks: ``(model, mode, batch size or None)``, counted on CPU in this order.
        cfg: warm-up, steps, repeats and the process's timeout.
        python: the interpreter of the build under test.
        valgrind: the valgrind executable.

    Returns:
        One record per benchmark (``suite/records.py`` shape) with the single metric
        ``cpu_instructions`` (instructions per step, one sample per counted window), in the
        order given; a benchmark that failed, or that the process did not reach (a crash, the
        timeout), has ``error`` set instead.

    Raises:
        CountUnavailable: valgrind or its ``callgrind_control`` is missing, or valgrind does
            not run (nothing was counted).
    """
    cfg = cfg or CountConfig()
    version = valgrind_version(valgrind)
    if shutil.which(CONTROL) is None:
        raise CountUnavailable(
            f"{CONTROL} is not installed (it comes with valgrind): cpu_instructions not counted"
        )
    environment = _environment(version, cfg)
    with tempfile.TemporaryDirectory(prefix="nightbench-count-") as tmp:
        work = Path(tmp)
        manifest = work / "manifest.json"
        cmd = [
            shutil.which(valgrind) or valgrind,
            *COUNT_FLAGS,
            f"--callgrind-out-file={work}/callgrind.out",
            python,
            "-m",
            "suite",
            "count",
            "--benchmarks",
            ",".join(f"{m}:{mo}" + (f":{b}" if b else "") for m, mo, b in benchmarks),
            "--warmup-steps",
            str(cfg.warmup_steps),
            "--steps",
            str(cfg.steps),
            "--repeats",
            str(cfg.repeats),
            "--out",
            str(work / "unused.json"),
        ]
        env = count_environment(os.environ, manifest)
        why = None
        started, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=cfg.timeout_s, check=False
            )
            if proc.returncode != 0:
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
                why = f"the count process exited with code {proc.returncode}: {tail}"
        except subprocess.TimeoutExpired:
            why = f"the count process timed out after {cfg.timeout_s:.0f} s"
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        environment["counter"] = {
            **environment["counter"],
            "process_wall_s": round(time.perf_counter() - started, 2),
            "process_cpu_s": round(
                after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 2
            ),
            "process_benchmarks": len(benchmarks),
        }
        counted = json.loads(manifest.read_text())["benchmarks"] if manifest.exists() else []
        numbered = [p for p in work.glob("callgrind.out.*") if p.suffix[1:].isdigit()]
        dumps = sorted(numbered, key=lambda p: int(p.suffix[1:]))
        return _records(benchmarks, counted, dumps, environment, cfg, why)


def _records(
    benchmarks: list[tuple[str, str, int | None]],
    counted: list[dict[str, Any]],
    dumps: list[Path],
    environment: dict[str, Any],
    cfg: CountConfig,
    why: str | None,
) -> list[dict[str, Any]]:
    """Match the manifest's benchmarks with the dumps (numbered, in order: one per window)."""
    numbered = dumps
    out: list[dict[str, Any]] = []
    at = 0
    for i, (model, mode, batch_size) in enumerate(benchmarks):
        record = _base(model, mode, batch_size)
        record["environment"] = dict(environment)
        if i >= len(counted):
            record["error"] = f"not counted: {why or 'the count process ended before it'}"
            out.append(record)
            continue
        entry = counted[i]
        record["environment"]["counter"] = {
            **environment.get("counter", {}),
            "wall_s": entry.get("wall_s"),
            "cpu_s": entry.get("cpu_s"),
            "build_cpu_s": entry.get("build_cpu_s"),
            "warmup_cpu_s": entry.get("warmup_cpu_s"),
        }
        if entry.get("settings"):
            record["environment"]["counter"]["settings"] = entry["settings"]
        record["batch_size"] = entry.get("batch_size", batch_size)
        record["benchmark_version"] = entry.get("benchmark_version")
        mine = numbered[at : at + int(entry["dumps"])]
        at += int(entry["dumps"])
        if entry.get("error"):
            record["error"] = entry["error"]
        elif len(mine) < cfg.repeats:
            record["error"] = f"counted {len(mine)} of {cfg.repeats} windows: {why or 'no dump'}"
        else:
            samples = [dump_totals(p) / cfg.steps for p in mine]
            if min(samples) <= 0:
                record["error"] = (
                    "a counted window held no instructions: this torch was built without "
                    "valgrind's client requests (torch._C._valgrind_toggle)"
                )
            else:
                record["metrics"] = [
                    {
                        "metric": METRIC,
                        "unit": UNIT,
                        "samples": samples,
                        "median": statistics.median(samples),
                        "iqr": _iqr(samples),
                    }
                ]
        out.append(record)
    return out


def _iqr(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[2] - q[0]


def skipped_record(model: str, mode: str, batch_size: int | None, reason: str) -> dict[str, Any]:
    """The record of a benchmark whose instructions could not be counted on this host at all
    (no valgrind): no metric, no error (the benchmark did not fail), ``skipped`` the reason."""
    return {**_base(model, mode, batch_size), "skipped": {METRIC: reason}}


def parse_benchmarks(text: str) -> list[tuple[str, str, int | None]]:
    """``"resnet18:eval,sac:train:8"`` → ``[("resnet18", "eval", None), ("sac", "train", 8)]``.

    Raises:
        ValueError: an item is not ``MODEL:MODE[:BATCH]`` with mode train or eval.
    """
    out: list[tuple[str, str, int | None]] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[1] not in ("train", "eval"):
            raise ValueError(f"--benchmarks: {item!r} is not MODEL:train|eval[:BATCH]")
        batch = None
        if len(parts) == 3:
            if not parts[2].isdigit() or int(parts[2]) < 1:
                raise ValueError(f"--benchmarks: {item!r}: the batch size must be >= 1")
            batch = int(parts[2])
        out.append((parts[0], parts[1], batch))
    if not out:
        raise ValueError("--benchmarks: no benchmark given")
    return out
