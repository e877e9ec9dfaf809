"""Where a CPU benchmark's noise comes from: between processes, or inside one over time.

Each benchmark runs in ``--processes`` fresh processes (rounds interleave the benchmarks, as
``nightbench suite stability`` does), each with the harness's measurement setup
(``suite.cpu_setup``: jemalloc or glibc tunables, one thread). Inside a process, after the
warm-up, the step is timed in ``--blocks`` blocks of ``--block-seconds`` each, a short pause
between blocks; each block gives its median latency. The log block medians are split into two
variance components by the one-way random-effects analysis of variance (the ANOVA estimators
of Searle, Casella & McCulloch, *Variance Components*, Wiley 1992, ch. 3):

- **within** a process: the block-to-block noise of one process over time (the host's speed
  moving under it, neighbours on shared caches and memory), ``MS_within``;
- **between** processes: what makes one process as a whole faster or slower than the next
  (heap and address-space layout, allocator modes, page placement),
  ``max(0, (MS_between - MS_within) / blocks)``.

The processes of one round run minutes apart from the next round's, so part of ``between`` can be
the host's speed over minutes, shared by every benchmark of a round rather than made by each
process: :func:`round_effects` estimates that common part (the median over benchmarks of each
round's deviation) and what is left of each benchmark's process-to-process noise without it.

A night's level is one process's median over its samples; its variance is
``between + within / blocks`` (in the harness's 2 s of samples, about two blocks). When
``between`` dominates, more processes a night lower the noise and a longer measurement does
not; when ``within`` dominates, the process is not the source: the host's speed over time is,
and only a quieter host (or more time) helps.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.noise_sources --processes 4 --blocks 8 \\
        --models wavenet,mobilenet_v2 --json sources.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
SUBSET = (
    "bert,bilstm_crf,conv_tasnet,dlrm,lstm_lm,mobilenet_v2,ncf,pyhpc_equation_of_state,"
    "pyhpc_isoneutral_mixing,wavenet"
)
PAUSE_S = 0.5


def variance_components(blocks: list[list[float]]) -> dict[str, float]:
    """Split the noise of block medians into within- and between-process components.

    Args:
        blocks: per process, its block median latencies in ms (P >= 2 processes, each with the
            same B >= 2 blocks).

    Returns:
        ``within`` and ``between``: standard deviations in log units (0.01 ~ 1%) of a block
        inside one process and of a process as a whole; ``process_median``: the standard
        deviation of a process's mean log level that they imply (``sqrt(between + within /
        B)``); ``observed``: the sample standard deviation of the processes' mean log levels.

    Raises:
        ValueError: fewer than 2 processes, unequal or fewer than 2 blocks, or a non-positive
            latency.
    """
    p = len(blocks)
    b = len(blocks[0]) if blocks else 0
    if p < 2 or b < 2 or any(len(x) != b for x in blocks):
        raise ValueError(
            f"need >= 2 processes of the same >= 2 blocks, got {[len(x) for x in blocks]}"
        )
    if any(v <= 0 for x in blocks for v in x):
        raise ValueError("latencies must be positive (ms)")
    logs = [[math.log(v) for v in x] for x in blocks]
    means = [statistics.fmean(x) for x in logs]
    grand = statistics.fmean(means)
    ms_within = sum((v - m) ** 2 for x, m in zip(logs, means, strict=True) for v in x) / (
        p * (b - 1)
    )
    ms_between = b * sum((m - grand) ** 2 for m in means) / (p - 1)
    between = max(0.0, (ms_between - ms_within) / b)
    return {
        "within": math.sqrt(ms_within),
        "between": math.sqrt(between),
        "process_median": math.sqrt(between + ms_within / b),
        "observed": statistics.stdev(means),
    }


def round_effects(levels: dict[str, dict[int, float]]) -> tuple[dict[int, float], dict[str, float]]:
    """The host's speed per round, shared by all benchmarks, and each benchmark's noise without it.

    Args:
        levels: per benchmark, ``{round: mean log block median of that round's process}``
            (a failed process leaves its round out).

    Returns:
        ``(effects, residual)``: per round, the median over benchmarks of their deviation from
        their own mean (log units, 0.01 ~ +1%); per benchmark with 3 or more rounds, the sample
        standard deviation of its deviations once the round's effect is taken off (log units).

    Raises:
        ValueError: fewer than 2 benchmarks (a round effect needs several to be common).
    """
    if len(levels) < 2:
        raise ValueError(f"round effects need at least 2 benchmarks, got {len(levels)}")
    dev = {
        b: {r: v - statistics.fmean(x.values()) for r, v in x.items()}
        for b, x in levels.items()
        if x
    }
    rounds = sorted({r for x in dev.values() for r in x})
    effects = {r: statistics.median(x[r] for x in dev.values() if r in x) for r in rounds}
    residual = {
        b: statistics.stdev(v - effects[r] for r, v in x.items())
        for b, x in dev.items()
        if len(x) >= 3
    }
    return effects, residual


def _worker(model: str, mode: str, blocks: int, block_s: float) -> None:
    """Inside the benchmark process: warm up, time ``blocks`` blocks, print one JSON line."""
    from suite.cpu_setup import reexec_if_needed, setup_in_force

    reexec_if_needed(threads=1, cpus=None)
    import torch

    from suite.registry import load_model_class

    torch.set_num_threads(1)
    bench = load_model_class(model)(test=mode, device="cpu", batch_size=None)
    step = bench.train if mode == "train" else bench.eval
    start, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - start < 0.5:  # the harness's warm-up rule
        step()
        n += 1
    gc.collect()
    gc.disable()
    wall, cpu = [], []
    for _ in range(blocks):
        lat: list[float] = []
        cpt: list[float] = []
        t_end = time.perf_counter() + block_s
        while time.perf_counter() < t_end or len(lat) < 3:
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            lat.append((time.perf_counter() - t0) * 1e3)
            cpt.append((time.process_time() - c0) * 1e3)
        wall.append(statistics.median(lat))
        cpu.append(statistics.median(cpt))
        time.sleep(PAUSE_S)
    print(
        json.dumps(
            {
                "blocks_ms": wall,
                "cpu_blocks_ms": cpu,
                "allocator": setup_in_force().get("allocator"),
            }
        )
    )


def _process(model: str, mode: str, blocks: int, block_s: float) -> dict | None:
    """One fresh process of :func:`_worker`; None when it failed."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.noise_sources",
        "--worker",
        model,
        mode,
        "--blocks",
        str(blocks),
        "--block-seconds",
        str(block_s),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if done.returncode == 0 and lines else None


def _verdict(c: dict[str, float], blocks: int) -> str:
    """Which component dominates a process median's variance."""
    b, w = c["between"] ** 2, c["within"] ** 2 / blocks
    if b + w == 0:
        return "none"
    return "between processes" if b > w else "within the process (time)"


def _table(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    for col in (
        "benchmark",
        "median ms",
        "process CV",
        "within (block)",
        "between",
        "without round effect",
        "CPU-time within",
        "source",
    ):
        table.add_column(col, justify="left" if col in ("benchmark", "source") else "right")
    for r in rows:
        table.add_row(
            r["benchmark"],
            f"{r['median_ms']:.2f}",
            f"{r['observed']:.2%}",
            f"{r['within']:.2%}",
            f"{r['between']:.2%}",
            "-" if r["without_round_effect"] is None else f"{r['without_round_effect']:.2%}",
            f"{r['cpu_within']:.2%}",
            r["source"],
        )
    return table


def main() -> None:
    """Measure, print the table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-seconds", type=float, default=1.0)
    ap.add_argument("--models", default=SUBSET)
    ap.add_argument("--modes", default="eval")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker[0], args.worker[1], args.blocks, args.block_seconds)
        return
    if args.processes < 2 or args.blocks < 2:
        ap.error("--processes and --blocks must be at least 2")
    benches = [(m, mode) for m in args.models.split(",") if m for mode in args.modes.split(",")]
    got: dict[tuple[str, str], list[dict]] = {b: [] for b in benches}
    rng, console = random.Random(args.seed), Console(stderr=True, width=120)
    load_before = os.getloadavg()
    with Progress(
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task("processes", total=args.processes * len(benches))
        for r in range(args.processes):
            for model, mode in rng.sample(benches, len(benches)):
                progress.update(bar, description=f"round {r + 1} {model}:{mode}")
                one = _process(model, mode, args.blocks, args.block_seconds)
                if one is not None:
                    got[(model, mode)].append({**one, "round": r})
                progress.advance(bar)
    load_after = os.getloadavg()
    rows = []
    for (model, mode), procs in got.items():
        if len(procs) < 2:
            console.print(f"{model}:{mode}: fewer than 2 processes succeeded, skipped")
            continue
        c = variance_components([p["blocks_ms"] for p in procs])
        cpu = variance_components([p["cpu_blocks_ms"] for p in procs])
        rows.append(
            {
                "benchmark": f"{model}:{mode}",
                "processes": len(procs),
                "median_ms": statistics.median(v for p in procs for v in p["blocks_ms"]),
                **c,
                "cpu_within": cpu["within"],
                "cpu_between": cpu["between"],
                "source": _verdict(c, args.blocks),
                "allocator": procs[0]["allocator"],
                "blocks_ms": [p["blocks_ms"] for p in procs],
            }
        )
    effects, residual = round_effects(
        {
            f"{m}:{mode}": {
                p["round"]: statistics.fmean(math.log(v) for v in p["blocks_ms"]) for p in procs
            }
            for (m, mode), procs in got.items()
            if len(procs) >= 2
        }
    )
    for row in rows:
        row["without_round_effect"] = residual.get(row["benchmark"])
    console.print(
        _table(
            rows,
            f"{args.processes} processes x {args.blocks} blocks of "
            f"{args.block_seconds:g} s, load {load_before[0]:.2f} → "
            f"{load_after[0]:.2f}",
        )
    )
    kept = [r["without_round_effect"] for r in rows if r["without_round_effect"] is not None]
    console.print(
        "round effects (shared by all benchmarks of a round): "
        + ", ".join(f"{100 * (math.exp(e) - 1):+.1f}%" for e in effects.values())
        + f"; median process CV {statistics.median(r['observed'] for r in rows):.2%}"
        + (f", without them {statistics.median(kept):.2%}" if kept else "")
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "round_effects": effects,
                    "load_average_before": load_before,
                    "load_average_after": load_after,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
