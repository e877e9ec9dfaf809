"""How much an instruction count strays from process to process, and what counting costs.

Runs ``python -m suite count`` (``suite/counting.py``: valgrind's callgrind, collection toggled
around the counted steps) ``--processes`` times over the chosen benchmarks, each time as
separate valgrind processes of ``--batch`` benchmarks (as the count pass of a night counts
them), and reports per benchmark: the median count per step, the coefficient of variation and
the spread ``(max - min) / min`` of the per-process medians, the largest spread of one
process's windows, and the wall and CPU seconds one benchmark took under valgrind; then the
suite's median and p90 CV, p90 and max spread, and the cost of the whole pass. The load average
is printed beside the figures (``os.getloadavg``): a count should not move with it, its cost
does.

Usage::

    .venv/bin/python -m benchmarks.count_noise --models dqn,ncf --modes eval --processes 5
    .venv/bin/python -m benchmarks.count_noise --processes 5 --batch 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from suite.counting import CountConfig, count_records
from suite.registry import list_models


def _benchmarks(
    models: str | None, modes: Sequence[str], batch_size: int | None = None
) -> list[tuple[str, str, int | None]]:
    patterns = [m.strip() for m in models.split(",")] if models else ["*"]
    out = []
    for info in list_models():
        if not any(fnmatch(info.name, p) for p in patterns):
            continue
        for mode in modes:
            if mode in info.modes and "cpu" in info.devices:
                out.append((info.name, mode, batch_size))
    return out


def spread(values: Sequence[float]) -> float:
    """``(max - min) / min`` of positive values (0 for fewer than two)."""
    return (max(values) - min(values)) / min(values) if len(values) > 1 else 0.0


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for fewer than two values)."""
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def measure(
    benchmarks: list[tuple[str, str, int | None]],
    *,
    processes: int,
    batch: int,
    cfg: CountConfig,
    checkpoint: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Count every benchmark ``processes`` times, ``batch`` benchmarks a valgrind process.

    ``checkpoint``: a JSON path the raw figures are written to after every valgrind process, so
    that a pass of hours stopped part-way keeps what it counted.

    Returns:
        ``{"model:mode": {"medians": [...], "windows": [[...], ...], "wall_s": [...],
        "cpu_s": [...], "errors": [...]}}`` (``windows``: each process's counts per step, one
        per counted window; ``medians`` their medians)
        and, under ``"_processes"``, each valgrind process's wall and CPU seconds.
    """
    out: dict[str, dict[str, Any]] = {
        f"{m}:{mo}": {
            "medians": [],
            "windows": [],
            "wall_s": [],
            "cpu_s": [],
            "build_cpu_s": [],
            "warmup_cpu_s": [],
            "errors": [],
        }
        for m, mo, _ in benchmarks
    }
    out["_processes"] = {"wall_s": [], "cpu_s": [], "benchmarks": []}
    chunks = [benchmarks[i : i + batch] for i in range(0, len(benchmarks), batch)]
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("counting", total=processes * len(chunks))
        for _ in range(processes):
            for chunk in chunks:
                records = count_records(chunk, cfg)
                counter = records[0]["environment"].get("counter", {})
                out["_processes"]["wall_s"].append(counter.get("process_wall_s"))
                out["_processes"]["cpu_s"].append(counter.get("process_cpu_s"))
                out["_processes"]["benchmarks"].append(len(chunk))
                for r in records:
                    row = out[f"{r['model']}:{r['mode']}"]
                    c = r["environment"].get("counter", {})
                    row["wall_s"].append(c.get("wall_s"))
                    row["cpu_s"].append(c.get("cpu_s"))
                    row["build_cpu_s"].append(c.get("build_cpu_s"))
                    row["warmup_cpu_s"].append(c.get("warmup_cpu_s"))
                    if r["error"]:
                        row["errors"].append(r["error"])
                    else:
                        row["medians"].append(r["metrics"][0]["median"])
                        row["windows"].append(r["metrics"][0]["samples"])
                progress.advance(task)
                if checkpoint:
                    with open(checkpoint, "w") as fh:
                        json.dump({"raw": out}, fh, indent=1)
    return out


def summarise(data: dict[str, dict[str, Any]], processes: int) -> dict[str, Any]:
    """Per benchmark CV, spread and window spread (the largest ``(max - min) / min`` of one
    process's windows), the suite's median and p90 CV, p90 and max spread, and the cost of
    one pass (every benchmark counted once: the valgrind processes' seconds over ``processes``)."""
    rows = {}
    for name, row in data.items():
        if name.startswith("_") or not row["medians"]:
            continue
        rows[name] = {
            "median": statistics.median(row["medians"]),
            "cv": cv(row["medians"]),
            "spread": spread(row["medians"]),
            "window_spread": max((spread(w) for w in row.get("windows", [])), default=0.0),
            "processes": len(row["medians"]),
            "wall_s": statistics.median([w for w in row["wall_s"] if w is not None] or [0]),
            "cpu_s": statistics.median([c for c in row["cpu_s"] if c is not None] or [0]),
        }
    cvs = sorted(r["cv"] for r in rows.values())
    spreads = sorted(r["spread"] for r in rows.values())

    def p90(values: list[float]) -> float | None:
        return values[min(len(values) - 1, int(0.9 * len(values)))] if values else None

    procs = data["_processes"]
    return {
        "benchmarks": rows,
        "failed": {
            k: v["errors"] for k, v in data.items() if not k.startswith("_") and v["errors"]
        },
        "median_cv": statistics.median(cvs) if cvs else None,
        "p90_cv": p90(cvs),
        "p90_spread": p90(spreads),
        "max_spread": max(spreads) if spreads else None,
        "pass_wall_s": sum(w or 0 for w in procs["wall_s"]) / processes,
        "pass_cpu_s": sum(c or 0 for c in procs["cpu_s"]) / processes,
        "valgrind_processes": len(procs["wall_s"]),
        "load_average": os.getloadavg(),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--models", default=None, help="globs, comma-separated (default: all)")
    ap.add_argument("--modes", default="train,eval")
    ap.add_argument("--processes", type=int, default=5, help="separate counts of each")
    ap.add_argument(
        "--batch",
        type=int,
        default=1,
        help="benchmarks per valgrind process; the count pass's default is 1 "
        "(NIGHTBENCH_COUNT_BATCH)",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=2,
        help="each benchmark's batch size (0: the model's own); the count series' default is 2 "
        "(NIGHTBENCH_COUNT_BATCH_SIZE)",
    )
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args(argv)
    benchmarks = _benchmarks(
        args.models, [m.strip() for m in args.modes.split(",")], args.batch_size or None
    )
    if not benchmarks:
        ap.error(f"no CPU benchmark matches --models {args.models!r} --modes {args.modes!r}")
    load_before = os.getloadavg()
    cfg = CountConfig(args.warmup_steps, 1, args.repeats, args.timeout)
    data = measure(
        benchmarks, processes=args.processes, batch=args.batch, cfg=cfg, checkpoint=args.json
    )
    summary = summarise(data, args.processes)
    summary["load_average_before"] = load_before
    table = Table(title=f"cpu_instructions over {args.processes} processes")
    for col in (
        "benchmark",
        "M instr/step",
        "CV %",
        "spread %",
        "window spread %",
        "wall s",
        "CPU s",
    ):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    for name, r in sorted(summary["benchmarks"].items()):
        table.add_row(
            name,
            f"{r['median'] / 1e6:,.2f}",
            f"{r['cv'] * 100:.3f}",
            f"{r['spread'] * 100:.3f}",
            f"{r['window_spread'] * 100:.3f}",
            f"{r['wall_s']:.0f}",
            f"{r['cpu_s']:.0f}",
        )
    console = Console()
    console.print(table)
    for name, errors in summary["failed"].items():
        console.print(f"[magenta]failed[/] {name}: {errors[0]}")
    console.print(
        f"median CV {summary['median_cv']:.4%}, p90 CV {summary['p90_cv']:.4%}, p90 spread {summary['p90_spread']:.4%}, "
        f"max spread {summary['max_spread']:.4%}; one pass {summary['pass_wall_s']:.0f} s wall, "
        f"{summary['pass_cpu_s']:.0f} s CPU; load average {load_before} before, {summary['load_average']} after"
        if summary["median_cv"] is not None
        else "nothing counted"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"raw": data, "summary": summary, "args": vars(args)}, fh, indent=1)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
