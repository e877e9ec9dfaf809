"""Peak memory against the number of steps a process ran: does ``cpu_peak_mem`` follow the host?

The harness's warm-up and timed loop run for a minimum time as well as a minimum count, so a
process on a fast evening runs more steps than one on a slow evening. For a model whose memory
grows a little every step, a peak read at the end of the run then follows the host's speed, not
the build. The harness reads ``cpu_peak_mem`` after a fixed number of steps instead
(``suite.harness.PeakAfterSteps``). This benchmark measures each benchmark given in separate
processes (``python -m suite run``, this interpreter, one thread) at several minimum timed
seconds (``--min-seconds``: 0.5, 2 and 6 by default, i.e. a slow, the default and a fast
evening's step counts) and prints, per benchmark, the steps each process ran, its
``cpu_peak_mem`` and ``mem_growth`` (MiB), and the spread of the peaks ``(max - min) / min``.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.peak_memory_steps \\
        --benchmarks sac:eval schnet:train conformer_ctc:train bart:train deepar:train dqn:eval
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def measure(model: str, mode: str, min_seconds: float, timeout_s: float = 900) -> dict[str, Any]:
    """One process of ``model`` in ``mode`` on the CPU with ``--min-seconds min_seconds``.

    Returns:
        ``{"steps", "peak_mib", "growth_mib", "peak_steps"}``: the steps the process ran
        (warm-up and timed), ``cpu_peak_mem`` and ``mem_growth`` in MiB, and the step after
        which the peak was read.

    Raises:
        RuntimeError: the process failed or its record holds an error.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, "-m", "suite", "run", "--model", model, "--mode", mode]
        cmd += ["--min-seconds", str(min_seconds), "--out", str(out)]
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{model} {mode}: {proc.stderr.strip()[-500:]}")
        doc = json.loads(out.read_text())
    record = doc[0] if isinstance(doc, list) else doc
    if record.get("error"):
        raise RuntimeError(f"{model} {mode}: {record['error']}")
    metrics = {m["metric"]: m for m in record["metrics"]}
    env = record["environment"]
    return {
        "steps": env["warmup"]["iterations"] + len(metrics["latency"]["samples"]),
        "peak_mib": metrics["cpu_peak_mem"]["median"] / MIB,
        "growth_mib": metrics["mem_growth"]["median"] / MIB,
        "peak_steps": env.get("peak_memory_steps"),
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmarks", nargs="+", required=True, help="MODEL:MODE on the CPU")
    ap.add_argument("--min-seconds", type=float, nargs="+", default=[0.5, 2.0, 6.0])
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    table = Table(title="cpu_peak_mem (MiB) by the steps a process ran")
    for col in ("benchmark", "steps", "cpu_peak_mem", "mem_growth", "peak spread", "read after"):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("measuring", total=len(args.benchmarks) * len(args.min_seconds))
        for bench in args.benchmarks:
            model, _, mode = bench.partition(":")
            seen = []
            for seconds in args.min_seconds:
                seen.append(measure(model, mode or "eval", seconds))
                progress.advance(task)
            peaks = [s["peak_mib"] for s in seen]
            spread = (max(peaks) - min(peaks)) / min(peaks) if min(peaks) > 0 else float("nan")
            rows.append({"benchmark": bench, "processes": seen, "spread": spread})
            table.add_row(
                bench,
                ", ".join(str(s["steps"]) for s in seen),
                ", ".join(f"{p:.1f}" for p in peaks),
                ", ".join(f"{s['growth_mib']:.1f}" for s in seen),
                f"{spread:.1%}",
                str(seen[0]["peak_steps"] or "the end"),
            )
    Console(width=160).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
