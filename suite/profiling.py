"""Profiles of one benchmark's step: the operator table, or the function-level instruction counts.

Two kinds of profile, one per kind of metric a regression is found in (the profile probe of
docs/profile.md):

- **operators** (``latency``): ``torch.profiler`` (CPU activity; CUDA activity too on ``cuda``)
  around ``windows`` windows of ``steps`` steps each, after ``warmup_steps`` unprofiled steps;
  each window's ``key_averages()`` gives, per aten operator, its calls and self CPU time (self
  device time on CUDA), divided by ``steps``. The step's total is the sum of the operators' self
  CPU times (what the profiler saw the step spend on the CPU). ``--trace FILE`` keeps the last
  window's Chrome trace. With ``--python-functions`` the same windows run under ``cProfile``
  too (the standard library's deterministic profiler, which keeps per-function totals, not
  events: ``torch.profiler``'s own Python tracer kept 11 GiB of events for fifteen steps of a
  tokenizer), and each Python function is a row of its own, its self time (``tottime``) being
  the time spent in its own bytecode: a Python-level check that now runs on every call is named
  (``minitok/__init__.py: encode``), not only the aten operators. Built-in functions are left
  out (their time is the operators' rows, or C code's), so no time is counted twice. Python
  rows are keyed by the last two parts of their file's path and the function, without the line
  number (:func:`python_function_key`), so two builds installed in different folders, or a
  commit that moved the function down a few lines, line up.
- **functions** (``cpu_instructions``): the process runs under valgrind's callgrind as
  ``suite/counting.py`` counts (``--collect-atstart=no``, collection toggled on around each
  window and the window dumped); each dump is read with ``callgrind_annotate`` (self and
  inclusive), its names standardised and denoised with ``torch.utils.benchmark``'s own
  ``CallgrindStats.as_standardized()`` and ``FunctionCounts.denoise()`` (build prefixes and
  library names stripped; CPython's ``lookdict_unicode`` dropped), divided by ``steps``.
  Callgrind splits a C function over rows by the source file of its inlined code (CPython's
  ``_PyEval_EvalFrameDefault`` over ``ceval.c`` and a dozen headers, each under the build's own
  path): the header rows are folded into the function's row (:func:`fold_inlined`).
  Callgrind does not see Python functions on CPython 3.11 (their bytecode is ``ceval.c``'s
  work), so with ``--python-functions`` the same benchmark is also run outside valgrind, in the
  profiling process itself, under ``sys.settrace`` with opcode events
  (:func:`count_bytecodes`): each Python function is a row of the document's ``python``
  section, its value the bytecode instructions it executed itself per step (unit
  ``bytecodes``). Like instructions, and unlike time, bytecodes do not depend on the host: a
  Python-level check that now runs on every call is named (``minitok/__init__.py:
  _check_piece``) with its share of the step's Python-level change.

Either way the document written is ``{"model", "mode", "device", "batch_size", "metric",
"unit", "warmup_steps", "steps", "windows", "torch", "totals": [per step, per window], "rows":
[{"name", "calls", "self": [...], "inclusive": [...] | null, "self_device": [...] | null}],
"wall_ms": [...], "trace", "error"}`` (and, for functions with ``--python-functions``, a
``"python"`` document of the same shape in ``bytecodes``); ``service/profiles.py`` diffs two of
them. A benchmark's
injected work (``NIGHTBENCH_SUITE_INJECT_WORK``, :func:`suite.harness.injection`) runs after
each step, inside the profiled window, as it does in a timed run.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from suite import counting

INSIDE_ENV = "NIGHTBENCH_PROFILE_MANIFEST"
"""Set (to the manifest's path) in the process valgrind runs: profile, do not start valgrind."""
ANNOTATE_FLAGS = ("--threshold=100", "--show-percs=no")
"""``callgrind_annotate`` options: every function (down to 100% of the total), bare counts."""
_TOTAL_LINE = re.compile(r"^\s*([0-9,]+)\s+PROGRAM TOTALS")
_HEADER_LINE = re.compile(r"^\s*Ir\s+file:function")
_FUNCTION_LINE = re.compile(r"^\s*([0-9,]+)\s+(.+:.+)$")
_UNNAMED_CODE = re.compile(r"^\?\?\?:0x[0-9a-fA-F]+$")
BYTECODES = "bytecodes"
"""The unit of the Python-level rows of a function profile (:func:`count_bytecodes`)."""
UNNAMED_CODE = "???:0x… (code without a symbol: JIT kernels)"
"""The one row every address without a symbol is summed into: oneDNN's JIT kernels land at
addresses that differ between processes, so each would otherwise read as gone and new."""


@dataclass(frozen=True)
class ProfileConfig:
    """How much to profile.

    Attributes:
        warmup_steps: unprofiled steps first (lazy initialisation, first-call allocations).
        steps: steps in each profiled window; every value is per step.
        windows: profiled windows; their spread is the profile's own noise.
        threads: torch threads on CPU.
        timeout_s: the valgrind process's limit (s), for a function profile.
        python_functions: a row per Python function too: in an operator table its self time
            (cProfile), in a function profile its bytecodes (:func:`count_bytecodes`).
    """

    warmup_steps: int = 3
    steps: int = 3
    windows: int = 7
    threads: int = 1
    timeout_s: float = 3600.0
    python_functions: bool = False

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.steps < 1 or self.windows < 1 or self.threads < 1:
            raise ValueError(
                "profile config: warmup_steps >= 0, steps >= 1, windows >= 1 and threads >= 1, "
                f"got {self.warmup_steps}, {self.steps}, {self.windows}, {self.threads}"
            )


class ProfileFailed(RuntimeError):
    """The benchmark could not be profiled (the message says why)."""


def _document(
    model: str,
    mode: str,
    device: str,
    batch_size: int | None,
    cfg: ProfileConfig,
    metric: str,
    unit: str,
) -> dict[str, Any]:
    import torch

    return {
        "model": model,
        "mode": mode,
        "device": device,
        "batch_size": batch_size,
        "metric": metric,
        "unit": unit,
        "warmup_steps": cfg.warmup_steps,
        "steps": cfg.steps,
        "windows": cfg.windows,
        "torch": torch.__version__,
        "totals": [],
        "rows": [],
        "wall_ms": [],
        "trace": None,
        "error": None,
    }


@contextlib.contextmanager
def _built(
    model: str,
    mode: str,
    device: str,
    batch_size: int | None,
    cfg: ProfileConfig,
    *,
    counted: bool = False,
) -> Iterator[tuple[Callable[[], None], int | None]]:
    """The benchmark's step (model step, then its injected work), warmed up; its batch size.

    ``counted``: built with the model's ``count_settings`` (a profile of a ``cpu_instructions``
    regression profiles the step its count series counts, e.g. style_transfer_jit's 32-pixel
    image: :meth:`suite.model.BenchmarkModel.count_settings`).
    """
    import torch

    from suite.harness import injection
    from suite.registry import load_model_class

    if device == "cpu":
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    cls = load_model_class(model)
    settings: contextlib.AbstractContextManager[dict[str, Any]] = (
        cls.count_settings() if counted else contextlib.nullcontext({})
    )
    with settings:
        bench = cls(test=mode, device=device, batch_size=batch_size)
        model_step = bench.train if mode == "train" else bench.eval
        extra = injection(model, mode)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def step() -> None:
            t0 = time.perf_counter()
            model_step()
            sync()
            extra((time.perf_counter() - t0) * 1e3)

        for _ in range(cfg.warmup_steps):
            step()
        gc.collect()
        gc.disable()
        try:
            yield step, bench.batch_size
        finally:
            gc.enable()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def operator_key(key: str) -> str:
    """The row name of a profiler event's key, the same in any process: an object's address
    (``<built-in method sum of Tensor object at 0x7f…>``) is dropped; ``aten::addmm`` is kept."""
    return _ADDRESS.sub("", key)


def python_function_key(path: str, function: str) -> str:
    """The row name of a Python function, the same for the same code in any build.

    Example:
        >>> python_function_key("/tmp/b/1f/src/minitok/__init__.py", "encode")
        'minitok/__init__.py: encode'
    """
    return "/".join(path.replace("\\", "/").split("/")[-2:]) + f": {function}"


def _python_rows(profiler: cProfile.Profile) -> Iterator[tuple[str, int, float]]:
    """``(row name, calls, self time in µs)`` of each Python function ``profiler`` saw; the
    built-ins (file ``~``) are left out."""
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (path, _line, function), (
        _primitive,
        calls,
        self_s,
        _cumulative,
        _callers,
    ) in stats.items():
        if path != "~":
            yield python_function_key(path, function), int(calls), float(self_s) * 1e6


def count_bytecodes(step: Callable[[], None], steps: int) -> dict[str, tuple[float, float]]:
    """The Python functions ``steps`` calls of ``step`` run, and the bytecode instructions each
    executes itself, by ``sys.settrace`` with opcode events (``frame.f_trace_opcodes``, the
    interpreter's own per-instruction trace hook).

    A deterministic Python-level count: the same code on the same inputs executes the same
    bytecodes on any host, under any load (set iteration order aside, hence
    ``PYTHONHASHSEED`` fixed by the caller). A generator's every resumption is one call. Code
    run by C (the operators, built-ins) is not in it: that is callgrind's part. Tracing makes
    Python code some 10 to 50 times slower; the count does not move with it.

    Args:
        step: the benchmark's step, warmed up.
        steps: calls of ``step`` counted.

    Returns:
        ``{row name: (calls per step, bytecodes per step)}``, the row named by
        :func:`python_function_key` with the function's qualified name
        (``minitok/tokenizer.py: _check_piece.<locals>.<genexpr>``).

    Raises:
        ValueError: ``steps`` below 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    seen: dict[CodeType, list[int]] = {}

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "opcode":
            seen[frame.f_code][1] += 1
        return local

    def on_call(frame: FrameType, event: str, _arg: Any) -> Any:
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        entry = seen.get(frame.f_code)
        if entry is None:
            seen[frame.f_code] = entry = [0, 0]
        entry[0] += 1
        return local

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.settrace(previous)
    out: dict[str, tuple[float, float]] = {}
    for code, (calls, executed) in seen.items():
        # The qualified name: a generator expression is its function's, not one `<genexpr>`.
        name = python_function_key(code.co_filename, code.co_qualname)
        had_calls, had = out.get(name, (0.0, 0.0))
        out[name] = (had_calls + calls / steps, had + executed / steps)
    return out


def profile_bytecodes(
    model: str, mode: str, batch_size: int | None, cfg: ProfileConfig
) -> dict[str, Any]:
    """The Python-level section of a function profile: ``cfg.windows`` windows of
    ``cfg.steps`` steps on the CPU, each counted by :func:`count_bytecodes`.

    Returns:
        A profile document (metric ``cpu_instructions``, unit :data:`BYTECODES`): per Python
        function its calls and self bytecodes per step in each window, the totals the windows'
        sums; a failure of the benchmark is its ``error`` (nothing is raised).
    """
    doc = _document(model, mode, "cpu", batch_size, cfg, counting.METRIC, BYTECODES)
    try:
        with _built(model, mode, "cpu", batch_size, cfg, counted=True) as (step, batch):
            doc["batch_size"] = batch
            windows = [count_bytecodes(step, cfg.steps) for _ in range(cfg.windows)]
    except Exception as exc:  # noqa: BLE001 - a benchmark's failure is its document's error
        from suite.harness import describe_failure

        doc["error"] = describe_failure(exc)
        return doc
    for name in sorted({n for win in windows for n in win}):
        seen = [win.get(name, (0.0, 0.0)) for win in windows]
        doc["rows"].append(
            {
                "name": name,
                "calls": max(c for c, _ in seen),
                "self": [b for _, b in seen],
                "inclusive": None,
                "self_device": None,
            }
        )
    doc["totals"] = [sum(b for _, b in win.values()) for win in windows]
    return doc


def _device_time(event: Any) -> float:
    """An averaged event's self device time (µs), across torch versions' names for it."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_operators(
    model: str,
    mode: str,
    device: str = "cpu",
    *,
    batch_size: int | None = None,
    config: ProfileConfig | None = None,
    trace: Path | None = None,
) -> dict[str, Any]:
    """The operator table of one benchmark's step (``torch.profiler``; module docstring).

    Args:
        model: a suite model (``python -m suite list``).
        mode: ``train`` or ``eval``.
        device: ``cpu`` or ``cuda``.
        batch_size: overrides the model's default.
        config: warm-up, steps per window, windows, threads.
        trace: where to write the last window's Chrome trace (None: not kept).

    Returns:
        The profile document (metric ``latency``, unit ``us``): per operator its calls per
        step and self CPU time per step (µs) in each window. A failure of the benchmark is the
        document's ``error`` (the rows then empty); nothing is raised.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = config or ProfileConfig()
    doc = _document(model, mode, device, batch_size, cfg, "latency", "us")
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        with _built(model, mode, device, batch_size, cfg) as (step, batch):
            doc["batch_size"] = batch
            windows: list[dict[str, tuple[int, float, float]]] = []
            for w in range(cfg.windows):
                t0 = time.perf_counter()
                python = cProfile.Profile() if cfg.python_functions else None
                with profile(activities=activities) as prof:
                    if python is not None:
                        python.enable()
                    for _ in range(cfg.steps):
                        step()
                    if python is not None:
                        python.disable()
                doc["wall_ms"].append((time.perf_counter() - t0) * 1e3 / cfg.steps)
                window: dict[str, tuple[int, float, float]] = {}
                for e in prof.key_averages():
                    calls, self_cpu, device_time = window.get(operator_key(e.key), (0, 0.0, 0.0))
                    window[operator_key(e.key)] = (
                        calls + e.count,
                        self_cpu + float(e.self_cpu_time_total),
                        device_time + _device_time(e),
                    )
                for name, calls, self_us in _python_rows(python) if python is not None else ():
                    seen_calls, seen_us, _ = window.get(name, (0, 0.0, 0.0))
                    window[name] = (seen_calls + calls, seen_us + self_us, 0.0)
                windows.append(window)
                if trace is not None and w == cfg.windows - 1:
                    prof.export_chrome_trace(str(trace))
                    doc["trace"] = str(trace)
        names = sorted({k for win in windows for k in win})
        for name in names:
            seen = [win.get(name, (0, 0.0, 0.0)) for win in windows]
            doc["rows"].append(
                {
                    "name": name,
                    "calls": max(c for c, _, _ in seen) / cfg.steps,
                    "self": [t / cfg.steps for _, t, _ in seen],
                    "inclusive": None,
                    "self_device": [d / cfg.steps for _, _, d in seen]
                    if device == "cuda"
                    else None,
                }
            )
        doc["totals"] = [sum(t for _, t, _ in win.values()) / cfg.steps for win in windows]
    except Exception as exc:  # noqa: BLE001 - a benchmark's failure is its document's error
        from suite.harness import describe_failure

        doc["error"] = describe_failure(exc)
        doc["traceback"] = traceback.format_exc(limit=5)
    finally:
        if device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
    return doc


# ------------------------------------------------------------------------------------------
# Functions: inside valgrind


def profile_inside(
    model: str, mode: str, batch_size: int | None, cfg: ProfileConfig, manifest: Path
) -> None:
    """Under valgrind: warm up, then toggle collection around each window and dump it.

    Writes ``{"batch_size", "dumps", "error"}`` to ``manifest`` (the dumps are numbered in
    order, one per window).
    """
    import torch

    out: dict[str, Any] = {"batch_size": batch_size, "dumps": 0, "error": None}
    try:
        with _built(model, mode, "cpu", batch_size, cfg, counted=True) as (step, batch):
            out["batch_size"] = batch
            for _ in range(cfg.windows):
                torch._C._valgrind_toggle()
                for _ in range(cfg.steps):
                    step()
                torch._C._valgrind_toggle_and_dump_stats()
                out["dumps"] += 1
    except Exception as exc:  # noqa: BLE001 - a benchmark's failure is its document's error
        from suite.harness import describe_failure

        out["error"] = describe_failure(exc)
        out["traceback"] = traceback.format_exc(limit=5)
    manifest.write_text(json.dumps(out))


# ------------------------------------------------------------------------------------------
# Functions: outside valgrind


def parse_annotate(text: str) -> tuple[int, list[tuple[int, str]]]:
    """``callgrind_annotate``'s output → ``(program total, [(Ir, "file:function"), ...])``.

    Read as ``torch.utils.benchmark``'s valgrind wrapper reads it: the ``PROGRAM TOTALS`` line,
    then the rows under the ``Ir  file:function`` header until the first other line; a row
    equal to the program total (callgrind's top-level stand-in when a process dumps several
    profiles) is left out.

    Raises:
        ValueError: no ``PROGRAM TOTALS`` line or no function header (not that tool's output).
    """
    total: int | None = None
    rows: list[tuple[int, str]] = []
    parsing = False
    for line in text.splitlines():
        if total is None:
            if m := _TOTAL_LINE.match(line):
                total = int(m.group(1).replace(",", ""))
            continue
        if not parsing:
            parsing = bool(_HEADER_LINE.match(line))
            continue
        if m := _FUNCTION_LINE.match(line):
            ir = int(m.group(1).replace(",", ""))
            if ir != total:
                rows.append((ir, m.group(2)))
        elif not line.strip("-"):  # the header's rule (or a blank line after it)
            if rows:
                break
        else:
            break
    if total is None or not parsing:
        raise ValueError("not callgrind_annotate output: no PROGRAM TOTALS or no function header")
    return total, rows


def standardise(
    self_counts: list[tuple[int, str]], inclusive_counts: list[tuple[int, str]], steps: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Self and inclusive counts by standardised name, denoised, per step.

    Through ``torch.utils.benchmark``'s own ``CallgrindStats.as_standardized()`` (build
    prefixes, ``Python/``, ``Objects/`` and ``[library.so]`` suffixes stripped; rows that then
    share a name summed) and ``FunctionCounts.denoise()`` (CPython's ``lookdict_unicode``
    dropped), then every address without a symbol summed into :data:`UNNAMED_CODE`.

    Returns:
        ``(self, inclusive)``: name → instructions per step.
    """
    from torch.utils.benchmark.utils.common import TaskSpec
    from torch.utils.benchmark.utils.valgrind_wrapper.timer_interface import (
        CallgrindStats,
        FunctionCount,
        FunctionCounts,
    )

    def counts(pairs: list[tuple[int, str]], inclusive: bool) -> FunctionCounts:
        return FunctionCounts(tuple(FunctionCount(c, f) for c, f in pairs), inclusive=inclusive)

    stats = CallgrindStats(
        task_spec=TaskSpec(stmt="step()", setup="pass"),
        number_per_run=steps,
        built_with_debug_symbols=False,
        baseline_inclusive_stats=counts([], True),
        baseline_exclusive_stats=counts([], False),
        stmt_inclusive_stats=counts(inclusive_counts, True),
        stmt_exclusive_stats=counts(self_counts, False),
        stmt_callgrind_out=None,
    ).as_standardized()

    def per_step(fc: FunctionCounts) -> dict[str, float]:
        out: dict[str, float] = {}
        named = fc.transform(lambda f: UNNAMED_CODE if _UNNAMED_CODE.match(f) else f)
        for c, f in named.denoise():
            name = _BUILD_TREE.sub("", f)
            out[name] = out.get(name, 0.0) + c / steps
        return out

    return fold_inlined(per_step(stats.stats(inclusive=False))), per_step(
        stats.stats(inclusive=True)
    )


_BUILD_TREE = re.compile(r"^/\S*?/\./")
"""A header's path in the build tree (``/tmp/python-build.2026…/Python-3.11.7/./Include/…``),
which ``as_standardized()`` leaves: stripped to the part after the build's ``/./``."""
_HEADER = re.compile(r"\.(h|hh|hpp|cuh)$")


def fold_inlined(counts: Mapping[str, float]) -> dict[str, float]:
    """Self counts with each function's inlined header rows folded into its own row.

    Callgrind attributes an inlined line to the file it came from, so one C function reads as
    several ``file:function`` rows (``Python/ceval.c:_PyEval_EvalFrameDefault`` and
    ``Include/internal/pycore_frame.h:_PyEval_EvalFrameDefault``). A row whose file is a
    header is added to the row of the same function in a source file, when there is exactly
    one such row; otherwise it stays as it is.

    Example:
        >>> fold_inlined({"Python/ceval.c:f": 10.0, "Include/a.h:f": 5.0, "x.h:g": 1.0})
        {'Python/ceval.c:f': 15.0, 'x.h:g': 1.0}
    """
    homes: dict[str, list[str]] = {}
    for name in counts:
        path, sep, function = name.partition(":")
        if sep and not _HEADER.search(path):
            homes.setdefault(function, []).append(name)
    out: dict[str, float] = {}
    for name, value in counts.items():
        path, sep, function = name.partition(":")
        home = homes.get(function, []) if sep and _HEADER.search(path) else []
        target = home[0] if len(home) == 1 else name
        out[target] = out.get(target, 0.0) + value
    return out


def _annotate(path: Path, inclusive: bool) -> list[tuple[int, str]]:
    proc = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", *ANNOTATE_FLAGS]
        + [str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise ProfileFailed(f"callgrind_annotate failed on {path.name}: {proc.stderr.strip()}")
    return parse_annotate(proc.stdout)[1]


def profile_functions(
    model: str,
    mode: str,
    *,
    batch_size: int | None = None,
    config: ProfileConfig | None = None,
    python: str = sys.executable,
    valgrind: str = "valgrind",
) -> dict[str, Any]:
    """The function-level instruction counts of one benchmark's step on the CPU (callgrind).

    Args:
        model: a suite model.
        mode: ``train`` or ``eval``.
        batch_size: overrides the model's default.
        config: warm-up, steps per window, windows, the process's timeout.
        python: the interpreter of the build under test.
        valgrind: the valgrind executable.

    Returns:
        The profile document (metric ``cpu_instructions``, unit ``instructions``): per
        standardised function its self and inclusive instructions per step in each window, the
        totals being callgrind's per window; with ``config.python_functions``, its ``python``
        section (:func:`profile_bytecodes`, run in this process after the valgrind one). A
        benchmark that failed, a process that crashed or timed out: the document's ``error``.

    Raises:
        counting.CountUnavailable: valgrind (or ``callgrind_annotate``) is not installed.
    """
    cfg = config or ProfileConfig()
    doc = _document(model, mode, "cpu", batch_size, cfg, counting.METRIC, counting.UNIT)
    doc["valgrind"] = counting.valgrind_version(valgrind)
    if shutil.which("callgrind_annotate") is None:
        raise counting.CountUnavailable(
            "callgrind_annotate is not installed (it comes with valgrind)"
        )
    with tempfile.TemporaryDirectory(prefix="nightbench-profile-") as tmp:
        work = Path(tmp)
        manifest = work / "manifest.json"
        cmd = [
            shutil.which(valgrind) or valgrind,
            *counting.VALGRIND_FLAGS,
            f"--callgrind-out-file={work}/callgrind.out",
            python,
            "-m",
            "suite",
            "profile",
            "--callgrind",
            *_shape_args(model, mode, "cpu", batch_size, cfg),
            "--out",
            str(work / "unused.json"),
        ]
        env = {
            **os.environ,
            INSIDE_ENV: str(manifest),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=cfg.timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            doc["error"] = f"the profile process timed out after {cfg.timeout_s:.0f} s"
            return doc
        doc["process_wall_s"] = round(time.perf_counter() - started, 2)
        inside = json.loads(manifest.read_text()) if manifest.exists() else {}
        if inside.get("error") or proc.returncode != 0 or not inside:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            doc["error"] = inside.get("error") or f"exited with code {proc.returncode}: {tail}"
            return doc
        doc["batch_size"] = inside.get("batch_size", batch_size)
        numbered = [p for p in work.glob("callgrind.out.*") if p.suffix[1:].isdigit()]
        dumps = sorted(numbered, key=lambda p: int(p.suffix[1:]))
        if len(dumps) < cfg.windows:
            doc["error"] = f"profiled {len(dumps)} of {cfg.windows} windows"
            return doc
        windows = []
        for path in dumps[: cfg.windows]:
            total = counting.dump_totals(path)
            self_c, incl = standardise(_annotate(path, False), _annotate(path, True), cfg.steps)
            windows.append((total / cfg.steps, self_c, incl))
    if min(t for t, _, _ in windows) <= 0:
        doc["error"] = (
            "a profiled window held no instructions: this torch was built without valgrind's "
            "client requests (torch._C._valgrind_toggle)"
        )
        return doc
    doc["totals"] = [t for t, _, _ in windows]
    if cfg.python_functions:
        doc["python"] = profile_bytecodes(model, mode, doc["batch_size"], cfg)
    for name in sorted({n for _, s, i in windows for n in (*s, *i)}):
        doc["rows"].append(
            {
                "name": name,
                "calls": None,
                "self": [s.get(name, 0.0) for _, s, _ in windows],
                "inclusive": [i.get(name, 0.0) for _, _, i in windows],
                "self_device": None,
            }
        )
    return doc


def _shape_args(
    model: str, mode: str, device: str, batch_size: int | None, cfg: ProfileConfig
) -> list[str]:
    args = ["--model", model, "--mode", mode, "--device", device]
    args += ["--warmup-steps", str(cfg.warmup_steps), "--steps", str(cfg.steps)]
    args += ["--windows", str(cfg.windows), "--threads", str(cfg.threads)]
    return args + (["--batch-size", str(batch_size)] if batch_size else [])
