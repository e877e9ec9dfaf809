"""The suite harness's timing overhead against a bare timing loop (target: <= 1%).

For each model the benchmark is built once; then, alternating in the same process (ABAB...), the
harness's timed loop (``suite.harness._timed_loop``: perf_counter around each step, the injected
no-op work, the per-iteration memory reading for the leak check, the garbage collector off) and a
bare loop (``perf_counter`` around each step, nothing else) each take the same number of samples.
First, with a no-op step (the harness's cost with nothing to hide it), 200,000 iterations of
each loop give the per-iteration cost inside the timed region (median sample, ns) and the whole
per-iteration cost of the loop (wall time / iterations, ns). Then, per model:

- bias: median over rounds of (harness median / bare median - 1): what the harness adds to the
  latency it reports;
- bookkeeping: the harness loop's wall time outside the timed steps, as a fraction of the timed
  time (what it costs in machine time, not in reported latency).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/suite_harness_overhead.py [--rounds 10]
        [--samples 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from suite.harness import HarnessConfig, _timed_loop
from suite.process_memory import RssReader
from suite.registry import load_model_class

# Fast to slow; batch 1 of the isoneutral kernel is the fastest step in the suite (~0.3 ms).
CASES = [
    ("pyhpc_isoneutral_mixing", "eval", 1),
    ("bilstm_crf", "eval", None),
    ("dlrm", "train", None),
    ("resnet18", "eval", None),
    ("lstm_lm", "train", None),
]


def bare_loop(step, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def harness_loop(step, n: int, rss: RssReader) -> tuple[list[float], float]:
    cfg = HarnessConfig(min_iterations=n, max_iterations=n, min_seconds=0.0)
    readings: list[int] = []
    start = time.perf_counter()
    samples = _timed_loop(step, lambda: None, cfg, False, lambda: None, rss, readings)
    wall_ms = (time.perf_counter() - start) * 1e3
    return samples, wall_ms


def measure(model: str, mode: str, batch: int | None, rounds: int, n: int) -> dict:
    bench = load_model_class(model)(mode, "cpu", batch_size=batch)
    step = bench.train if mode == "train" else bench.eval
    for _ in range(10):  # warm-up
        step()
    rss = RssReader()
    ratios, bookkeeping, bare_meds, harness_meds = [], [], [], []
    try:
        for r in range(rounds):
            gc.collect()
            # Alternate which loop goes first, so a drift within a round favours neither.
            order = ("bare", "harness") if r % 2 == 0 else ("harness", "bare")
            result: dict[str, list[float]] = {}
            for which in order:
                if which == "bare":
                    gc.disable()  # the harness also times with the collector off
                    try:
                        result["bare"] = bare_loop(step, n)
                    finally:
                        gc.enable()
                else:
                    samples, wall = harness_loop(step, n, rss)
                    result["harness"] = samples
                    bookkeeping.append(wall / sum(samples) - 1)
            b, h = statistics.median(result["bare"]), statistics.median(result["harness"])
            bare_meds.append(b)
            harness_meds.append(h)
            ratios.append(h / b - 1)
    finally:
        rss.close()
    return {
        "benchmark": f"{model}:{mode}" + (f" (batch {batch})" if batch else ""),
        "bare_median_ms": statistics.median(bare_meds),
        "harness_median_ms": statistics.median(harness_meds),
        "bias": statistics.median(ratios),
        "bias_iqr": _iqr(ratios),
        "bookkeeping": statistics.median(bookkeeping),
    }


def noop_costs(n: int = 200_000) -> dict[str, float]:
    """Per-iteration cost (ns) of both loops around a step that does nothing."""

    def noop() -> None:
        return None

    rss = RssReader()
    try:
        gc.disable()
        start = time.perf_counter()
        bare = bare_loop(noop, n)
        bare_wall = time.perf_counter() - start
        gc.enable()
        harness, harness_wall_ms = harness_loop(noop, n, rss)
    finally:
        gc.enable()
        rss.close()
    return {
        "bare_sample_ns": statistics.median(bare) * 1e6,
        "harness_sample_ns": statistics.median(harness) * 1e6,
        "bare_loop_ns": bare_wall / n * 1e9,
        "harness_loop_ns": harness_wall_ms / n * 1e6,
    }


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=30, help="samples per loop per round")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    noop = noop_costs()
    print(
        "no-op step, per iteration: timed region {bare_sample_ns:.0f} ns bare vs "
        "{harness_sample_ns:.0f} ns harness; whole loop {bare_loop_ns:.0f} ns bare vs "
        "{harness_loop_ns:.0f} ns harness".format(**noop)
    )
    rows = []
    print(
        f"{'benchmark':<44} {'bare ms':>9} {'harness ms':>11} {'bias':>8} {'IQR':>7} "
        f"{'bookkeeping':>12}"
    )
    for model, mode, batch in CASES:
        row = measure(model, mode, batch, args.rounds, args.samples)
        rows.append(row)
        print(
            f"{row['benchmark']:<44} {row['bare_median_ms']:>9.3f} "
            f"{row['harness_median_ms']:>11.3f} {row['bias']:>+8.2%} {row['bias_iqr']:>7.2%} "
            f"{row['bookkeeping']:>12.3%}",
            flush=True,
        )
    worst = max(abs(r["bias"]) for r in rows)
    print(f"largest |bias|: {worst:.2%} (target <= 1%)")
    if args.json:
        args.json.write_text(
            json.dumps({"noop": noop, "rows": rows, "largest_abs_bias": worst}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
