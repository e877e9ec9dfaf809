"""Process-to-process noise of benchmarks under each measurement setup, interleaved.

For each round, each benchmark runs once under every setup, the setups in a fresh random order
per benchmark and round, each in a fresh ``python -m suite run`` process: ``off`` (``--no-setup``,
the process as launched), ``jemalloc`` (``NIGHTBENCH_SUITE_ALLOCATOR=jemalloc``: the harness's
setup, jemalloc never purging freed pages) and ``glibc`` (``NIGHTBENCH_SUITE_ALLOCATOR=glibc``:
glibc's malloc with its thresholds fixed by ``GLIBC_TUNABLES``), ``jemalloc_nodecay``,
``jemalloc_defaults`` and ``jemalloc_thp`` (jemalloc with a ``MALLOC_CONF`` that never purges
freed pages, that is jemalloc's own defaults, or that backs memory with transparent huge
pages), and
``jemalloc_noaslr`` (jemalloc in a process started by ``setarch -R``,
without address-space randomisation), ``glibc_nommap`` (the fallback with
``glibc.malloc.mmap_max=0``), ``tcmalloc`` and ``tcmalloc_norelease`` (gperftools' tcmalloc
with its defaults, and with ``TCMALLOC_RELEASE_RATE=0``: freed spans never handed back); see
``suite/cpu_setup.py``. With ``--device cuda`` the
setups are the GPU ones (``suite/gpu_setup.py``): ``gpu`` (the setup: steady warm-up,
``cudnn.benchmark`` off), ``gpu_fixed_warmup`` (``NIGHTBENCH_SUITE_STEADY_WARMUP=off``: the
fixed minimum warm-up only), ``gpu_deterministic`` (``NIGHTBENCH_SUITE_DETERMINISTIC=on``) and
``gpu_expandable`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``); a CUDA record's
warm-up (iterations, steady or capped, SM clock) is kept per process. Interleaving puts every setup under the same
drift of the machine. Reported per benchmark and setup: the median of the per-process medians,
their CV and max-min spread (TorchBench's 7% rule), for latency and CPU time per iteration, and
the timed steps' minor page faults per step (the records' ``environment["page_faults"]``);
per setup the noise floor (median CV over benchmarks), its 90th percentile and the unstable
count. The load average before and after is printed beside the figures.

``--deadline-s`` starts no process after that many seconds (a lease on a GPU machine is short);
the JSON is rewritten after every process, so what was measured is kept.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.measurement_setup --repeats 5 \\
        --models bert,dlrm --json setup.json
    .venv/bin/python -m benchmarks.measurement_setup --device cuda --modes train,eval \\
        --setups gpu,gpu_fixed_warmup --deadline-s 300 --json gpu.json
    python3 -m benchmarks.measurement_setup --device cuda --models all --modes train,eval \\
        --setups gpu --repeats 3 --overlap 4 --deadline-s 480 --json gpu-suite.json

``--overlap N`` runs N processes at once under one device lock (``suite/device_lock.py``):
they start, import torch and build their models side by side and warm up and time one at a
time, which on a GPU (some 10 s to prepare, 3 s to measure) measures about N times as many
processes in a short lease. The others' preparation runs beside the timed process, so the
figures can only be noisier than one process at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from suite.device_lock import DEVICE_LOCK_ENV
from suite.registry import list_models
from suite.stability import allowed_spread, summarize

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {
    "off": ({}, ["--no-setup"]),
    "jemalloc": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc"}, []),
    "glibc": ({"NIGHTBENCH_SUITE_ALLOCATOR": "glibc"}, []),
    # glibc's fallback with no mmap at all (``M_MMAP_MAX`` = 0): blocks over the fixed 32 MiB
    # mmap threshold come from the heap too, and stay there once freed (up to the trim
    # threshold at its top), as jemalloc's no-decay setup keeps its pages.
    "glibc_nommap": (
        {"NIGHTBENCH_SUITE_ALLOCATOR": "glibc", "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"},
        [],
    ),
    # jemalloc in a process without address-space randomisation (util-linux ``setarch -R``,
    # personality ADDR_NO_RANDOMIZE): the same layout in every process.
    "jemalloc_noaslr": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc"}, []),
    # ``jemalloc`` is the harness's setup: jemalloc that never hands freed pages back (no decay
    # purges, so no page faults in the timed loop once warm; ``suite.cpu_setup``'s
    # ``JEMALLOC_CONF_VALUE`` since 2026-11-27), ``jemalloc_nodecay`` the same spelled out.
    # ``jemalloc_defaults`` is jemalloc's own defaults (5.3: dirty decay 10 s, muzzy 0, which
    # purges blocks of 8 MiB and more on free), what ``jemalloc`` meant before. Any
    # ``MALLOC_CONF`` replaces the setup's, so ``jemalloc_thp`` is the defaults with jemalloc
    # backing its memory by transparent huge pages (the system's THP mode is ``madvise``;
    # ``thp:always`` makes jemalloc ask for them).
    "jemalloc_nodecay": (
        {
            "NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc",
            "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1",
        },
        [],
    ),
    "jemalloc_defaults": (
        {
            "NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc",
            "MALLOC_CONF": "dirty_decay_ms:10000,muzzy_decay_ms:0",
        },
        [],
    ),
    "jemalloc_thp": (
        {"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc", "MALLOC_CONF": "thp:always,metadata_thp:always"},
        [],
    ),
    # gperftools' tcmalloc, the setup's second choice, with its defaults (freed spans handed
    # back to the kernel gradually, ``TCMALLOC_RELEASE_RATE`` 1) and never handing them back
    # (rate 0: gperftools' "never release", jemalloc's no-decay counterpart).
    "tcmalloc": ({"NIGHTBENCH_SUITE_ALLOCATOR": "tcmalloc"}, []),
    "tcmalloc_norelease": (
        {"NIGHTBENCH_SUITE_ALLOCATOR": "tcmalloc", "TCMALLOC_RELEASE_RATE": "0"},
        [],
    ),
    # The GPU setups (``--device cuda``).
    "gpu": ({}, []),
    "gpu_fixed_warmup": ({"NIGHTBENCH_SUITE_STEADY_WARMUP": "off"}, []),
    "gpu_deterministic": ({"NIGHTBENCH_SUITE_DETERMINISTIC": "on"}, []),
    "gpu_expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, []),
}
DEFAULT_SETUPS = {"cpu": "off,jemalloc,glibc", "cuda": "gpu,gpu_fixed_warmup"}
PREFIX = {"jemalloc_noaslr": ["setarch", os.uname().machine, "-R"]}
SUBSET = (
    "bert,bilstm_crf,conv_tasnet,dlrm,lstm_lm,mobilenet_v2,ncf,pyhpc_equation_of_state,"
    "pyhpc_isoneutral_mixing,wavenet"
)


def _run(
    model: str, mode: str, setup: str, device: str, out: Path, *, lock: str | None = None
) -> dict[str, Any] | None:
    """One process: ``{"latency": median ms, "cpu_time": median ms, "gpu_peak_mem": bytes,
    "warmup": {...}, "minor_faults_per_step": float, "major_faults": int}`` (CPU time on CPU
    only, GPU memory and the record's warm-up on CUDA only, the timed steps' page faults where
    the record has them), None on an error. ``lock``: the device lock file the process
    measures under, if any."""
    env_extra, args = SETUPS[setup]
    env = {**os.environ, **env_extra, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if lock is not None:
        env[DEVICE_LOCK_ENV] = lock
    cmd = [
        *PREFIX.get(setup, []),
        sys.executable,
        "-m",
        "suite",
        "run",
        "--model",
        model,
        "--mode",
        mode,
        "--device",
        device,
        "--threads",
        "1",
        "--out",
        str(out),
        *args,
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not out.exists():
        return None
    record = json.loads(out.read_text())
    if record.get("error"):
        return None
    got: dict[str, Any] = {
        m["metric"]: m["median"]
        for m in record["metrics"]
        if m["metric"] in ("latency", "cpu_time", "gpu_peak_mem")
    }
    if device == "cuda":
        got["warmup"] = record.get("environment", {}).get("warmup")
    if lock is not None:
        got["lock_waited_s"] = (record.get("environment", {}).get("device_lock") or {}).get(
            "waited_s"
        )
    faults = record.get("environment", {}).get("page_faults") or {}
    if faults.get("minor_per_step") is not None:
        got["minor_faults_per_step"] = faults["minor_per_step"]
        got["major_faults"] = faults.get("major")
    return got


def _measure(
    args: argparse.Namespace,
    benchmarks: list[tuple[str, str]],
    setups: list[str],
    write: Callable[
        [dict[tuple[str, str, str], dict[str, list[Any]]], dict[tuple[str, str, str], int]], None
    ],
) -> tuple[dict[tuple[str, str, str], dict[str, list[Any]]], dict[tuple[str, str, str], int]]:
    """Run the interleaved rounds; return the per-process values and error counts, keyed by
    ``(model, mode, setup)``. ``write`` is called after every process (and at the deadline).

    With ``args.overlap`` above 1, that many processes run at once and share one device lock
    (:mod:`suite.device_lock`): they start, import and build side by side and warm up and time
    one at a time, in the rounds' order as far as the lock's queue keeps it."""
    rng = random.Random(args.seed)
    console = Console(stderr=True)
    values: dict[tuple[str, str, str], dict[str, list[Any]]] = {}
    errors: dict[tuple[str, str, str], int] = {}
    jobs = [
        (r, model, mode, setup)
        for r in range(args.repeats)
        for model, mode in benchmarks
        for setup in rng.sample(setups, len(setups))
    ]
    start = time.monotonic()
    done = threading.Lock()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Progress(
            TextColumn("{task.description:<44}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        bar = progress.add_task("setups", total=len(jobs))
        lock = str(Path(tmp) / "device.lock") if args.overlap > 1 else None

        def one(job: tuple[int, str, str, str]) -> None:
            r, model, mode, setup = job
            if args.deadline_s and time.monotonic() - start > args.deadline_s:
                progress.update(bar, description=f"deadline of {args.deadline_s:g} s: skipped")
                return
            progress.update(bar, description=f"round {r + 1} {model}:{mode} {setup}")
            got = _run(
                model,
                mode,
                setup,
                args.device,
                Path(tmp) / f"{model}-{mode}-{setup}-{r}.json",
                lock=lock,
            )
            key = (model, mode, setup)
            with done:
                if got is None:
                    errors[key] = errors.get(key, 0) + 1
                else:
                    slot = values.setdefault(key, {})
                    for metric, value in got.items():
                        slot.setdefault(metric, []).append(value)
                progress.advance(bar)
                write(values, errors)

        with ThreadPoolExecutor(max_workers=args.overlap) as pool:
            list(pool.map(one, jobs))
    return values, errors


def _every_benchmark(device: str, modes: list[str]) -> list[tuple[str, str]]:
    """``(model, mode)`` for every suite model that runs on ``device`` in each of ``modes``
    (its metadata's ``modes`` and ``devices``, less what it marks not implemented)."""
    return [
        (m.name, mode)
        for m in list_models()
        if device in m.devices
        for mode in modes
        if mode in m.modes and f"{mode}:{device}" not in m.not_implemented
    ]


def _chosen(models: str, device: str, modes: list[str]) -> list[tuple[str, str]]:
    """``(model, mode)`` pairs of a ``--models`` value: ``all`` (:func:`_every_benchmark`), or
    comma-separated names, each in every one of ``modes`` or, written ``model:mode``, in that
    mode alone (the benchmarks a table left unsteady, measured again).

    Raises:
        ValueError: an item names a mode other than train or eval, or no model.
    """
    if models == "all":
        return _every_benchmark(device, modes)
    chosen = []
    for item in (i.strip() for i in models.split(",") if i.strip()):
        name, _, mode = item.partition(":")
        if not name or (mode and mode not in ("train", "eval")):
            raise ValueError(f"{item!r}: expected model or model:train / model:eval")
        chosen += [(name, mode)] if mode else [(name, m) for m in modes]
    return chosen


def _rows(
    values: dict[tuple[str, str, str], dict[str, list[Any]]],
    errors: dict[tuple[str, str, str], int],
) -> list[dict[str, Any]]:
    """One row per benchmark and setup with two or more processes: median of the per-process
    medians (ms), CV and max-min spread (fractions), TorchBench's verdict over that many
    processes, the CPU-time CV, the median minor page faults per step, and on CUDA the
    warm-ups."""
    rows = []
    for (model, mode, setup), got in values.items():
        lat = got.get("latency", [])
        if len(lat) < 2:
            continue
        cv, spread, unstable = summarize(lat, allowed_spread(len(lat)))
        cpu_cv = summarize(got["cpu_time"])[0] if len(got.get("cpu_time", [])) >= 2 else None
        rows.append(
            {
                "benchmark": f"{model}:{mode}",
                "setup": setup,
                "median_ms": statistics.median(lat),
                "cv": cv,
                "spread": spread,
                "cpu_time_cv": cpu_cv,
                "unstable": bool(unstable),
                "medians_ms": lat,
                "warmups": got.get("warmup"),
                "lock_waited_s": got.get("lock_waited_s"),
                "errors": errors.get((model, mode, setup), 0),
                "minor_faults_per_step": (
                    statistics.median(got["minor_faults_per_step"])
                    if got.get("minor_faults_per_step")
                    else None
                ),
                "major_faults": got.get("major_faults"),
            }
        )
    return rows


def _floors(rows: list[dict[str, Any]], setups: list[str]) -> dict[str, dict[str, Any]]:
    """Per setup: the noise floor (median CV), its 90th percentile (numpy's linear
    interpolation between ranks), the CPU-time floor and the unstable benchmarks."""
    floors = {}
    for setup in setups:
        mine = [r for r in rows if r["setup"] == setup]
        if not mine:
            continue
        cvs = sorted(r["cv"] for r in mine)
        cpu = sorted(r["cpu_time_cv"] for r in mine if r["cpu_time_cv"] is not None)
        floors[setup] = {
            "benchmarks": len(mine),
            "noise_floor_cv": statistics.median(cvs),
            "cv_p90": float(np.percentile(cvs, 90)),
            "cpu_time_noise_floor_cv": statistics.median(cpu) if cpu else None,
            "unstable": [r["benchmark"] for r in mine if r["unstable"]],
        }
    return floors


def _print(
    console: Console, rows: list[dict[str, Any]], floors: dict[str, dict[str, Any]], title: str
) -> None:
    table = Table(title=title)
    for col in (
        "benchmark",
        "setup",
        "median ms",
        "CV",
        "spread",
        "CPU-time CV",
        "minor faults/step",
        "verdict",
    ):
        table.add_column(col, justify="left" if col in ("benchmark", "setup") else "right")
    for row in sorted(rows, key=lambda r: (r["benchmark"], r["setup"])):
        cpu_cv, faults = row["cpu_time_cv"], row.get("minor_faults_per_step")
        table.add_row(
            row["benchmark"],
            row["setup"],
            f"{row['median_ms']:.3f}",
            f"{row['cv']:.2%}",
            f"{row['spread']:.2%}",
            "-" if cpu_cv is None else f"{cpu_cv:.2%}",
            "-" if faults is None else f"{faults:,.0f}",
            "UNSTABLE" if row["unstable"] else "stable",
        )
    console.print(table)
    summary = Table(title="per setup")
    for col in ("setup", "noise floor (median CV)", "p90 CV", "CPU-time floor", "unstable"):
        summary.add_column(col, justify="right")
    for setup, f in floors.items():
        summary.add_row(
            setup,
            f"{f['noise_floor_cv']:.2%}",
            f"{f['cv_p90']:.2%}",
            "-" if f["cpu_time_noise_floor_cv"] is None else f"{f['cpu_time_noise_floor_cv']:.2%}",
            f"{len(f['unstable'])} of {f['benchmarks']}",
        )
    console.print(summary)


def main() -> None:
    """Measure, print the tables, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="processes per benchmark and setup")
    ap.add_argument(
        "--models",
        default=SUBSET,
        help="comma-separated, or all: every suite model the device and modes "
        "allow; model:mode takes that one mode of the model",
    )
    ap.add_argument(
        "--modes",
        "--mode",
        dest="modes",
        default="eval",
        help="train, eval or both (comma-separated)",
    )
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument(
        "--setups",
        default=None,
        help=f"comma-separated (default: {DEFAULT_SETUPS['cpu']} on cpu, "
        f"{DEFAULT_SETUPS['cuda']} on cuda)",
    )
    ap.add_argument(
        "--deadline-s", type=float, default=None, help="start no process after this many seconds"
    )
    ap.add_argument(
        "--overlap",
        type=int,
        default=1,
        help="processes at once, warming up and timing one at a time under a "
        "device lock (suite/device_lock.py); figures can only be noisier",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"train", "eval"}:
        ap.error(f"--modes: expected train and/or eval, got {args.modes}")
    if args.overlap < 1:
        ap.error(f"--overlap: at least 1 process, got {args.overlap}")
    setups = [s for s in (args.setups or DEFAULT_SETUPS[args.device]).split(",") if s]
    unknown = sorted(set(setups) - SETUPS.keys())
    if unknown:
        ap.error(f"--setups: unknown {', '.join(unknown)} (known: {', '.join(SETUPS)})")
    try:
        benchmarks = _chosen(args.models, args.device, modes)
    except ValueError as exc:
        ap.error(f"--models: {exc}")
    load_before = os.getloadavg()

    def write(
        values: dict[tuple[str, str, str], dict[str, list[Any]]],
        errors: dict[tuple[str, str, str], int],
    ) -> None:
        if args.json:
            rows = _rows(values, errors)
            args.json.write_text(
                json.dumps(
                    {
                        "device": args.device,
                        "repeats": args.repeats,
                        "rows": rows,
                        "setups": _floors(rows, setups),
                        "errors": {":".join(k): n for k, n in errors.items()},
                        "processes": {":".join(k): v for k, v in values.items()},
                        "load_average_before": load_before,
                        "load_average_now": os.getloadavg(),
                    },
                    indent=1,
                )
            )

    values, errors = _measure(args, benchmarks, setups, write)
    load_after = os.getloadavg()
    rows = _rows(values, errors)
    _print(
        Console(stderr=True),
        rows,
        _floors(rows, setups),
        f"{args.device}, {','.join(modes)}, up to {args.repeats} processes per benchmark and "
        f"setup, load {load_before[0]:.2f} → {load_after[0]:.2f}",
    )
    failed = {":".join(k): n for k, n in errors.items()}
    if failed:
        print(f"processes that failed: {failed}", file=sys.stderr)
    write(values, errors)


if __name__ == "__main__":
    main()
