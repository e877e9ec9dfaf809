"""The suite's noise floor (median process-to-process CV of all CPU benchmarks; target <= 2%) and
the wall time of the whole CPU suite.

Each CPU benchmark runs ``--repeats`` times, each time in a fresh ``python -m suite run`` process
(``workers.night.stability``: rounds interleave the benchmarks). Reported: every benchmark's CV and
max-min spread of per-process medians, the median CV (the noise floor), how many benchmarks reach
TorchBench's 7% spread, and per round the wall time of running every benchmark once (the suite's
wall time; process start, imports and model building included). The load average before and
after is printed too: on a shared machine it is the first suspect for a high floor.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/suite_noise_floor.py [--repeats 5]
        [--models a,b] [--modes train,eval] [--run-args="--cpus 1"] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from suite.stability import benchmarks_for, noise_floor, summarize
from workers.night.stability import list_models, measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=None, help="comma-separated (default: all)")
    parser.add_argument("--modes", default="train,eval")
    parser.add_argument(
        "--run-args",
        default="",
        help="extra `python -m suite run` arguments; they start with dashes, so "
        'write them with "=": --run-args="--cpus 1"',
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    listing = list_models()
    if args.models:
        wanted = set(args.models.split(","))
        listing = [m for m in listing if m["name"] in wanted]
    specs = benchmarks_for(listing, device="cpu", modes=args.modes.split(","))
    console = Console(stderr=True)
    load_before = os.getloadavg()
    stamps: list[tuple[int, float]] = []
    leaks: set[str] = set()
    cpu_medians: dict[str, list[float]] = {}
    start = time.monotonic()
    with Progress(
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task("noise floor", total=len(specs) * args.repeats)

        def on_record(spec, round_no, record) -> None:
            stamps.append((round_no, time.monotonic()))
            if (record.get("leak") or {}).get("suspected"):
                leaks.add(spec.key)
            for m in record.get("metrics") or []:
                if m["metric"] == "cpu_time" and m.get("median"):
                    cpu_medians.setdefault(spec.key, []).append(m["median"])
            progress.update(bar, advance=1, description=f"round {round_no + 1} {spec.key}")

        results = measure(
            specs, repeats=args.repeats, run_args=shlex.split(args.run_args), on_record=on_record
        )
    load_after = os.getloadavg()
    # Wall time of each round: from the end of the previous round to the end of this one.
    ends = {}
    for round_no, t in stamps:
        ends[round_no] = t
    round_walls, previous = [], start
    for round_no in sorted(ends):
        round_walls.append(ends[round_no] - previous)
        previous = ends[round_no]

    print(f"{'benchmark':<40} {'setup':<16} {'median ms':>10} {'CV':>7} {'spread':>8}  verdict")
    for r in results:
        med = statistics.median(r.medians_ms) if r.medians_ms else float("nan")
        verdict = {True: "UNSTABLE", False: "stable", None: "unknown"}[r.unstable]
        cv = "-" if r.cv is None else f"{r.cv:.2%}"
        spread = "-" if r.spread is None else f"{r.spread:.2%}"
        errors = f" ({len(r.errors)} errors: {r.errors[0][:80]})" if r.errors else ""
        setup = ", ".join(r.setups) or "-"
        print(
            f"{r.model + ':' + r.mode:<40} {setup:<16} {med:>10.3f} {cv:>7} {spread:>8}  "
            f"{verdict}{errors}"
        )
    floor = noise_floor(results)
    # The same floor on CPU time: what is left once waiting for a core is taken out.
    cpu_cvs = sorted(summarize(v)[0] for v in cpu_medians.values() if len(v) >= 2)
    cpu_floor = statistics.median(cpu_cvs) if cpu_cvs else None
    cvs = sorted(r.cv for r in results if r.cv is not None)
    unstable = [f"{r.model}:{r.mode}" for r in results if r.unstable]
    summary = {
        "benchmarks": len(results),
        "repeats": args.repeats,
        "run_args": args.run_args,
        "setups": sorted({s for r in results for s in r.setups}),
        "noise_floor_cv": floor,
        "cpu_time_noise_floor_cv": cpu_floor,
        "cv_p90": float(np.percentile(cvs, 90)) if cvs else None,
        "unstable": unstable,
        "leak_suspected": sorted(leaks),
        "suite_wall_s_per_round": round_walls,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    p90 = "-" if summary["cv_p90"] is None else f"{summary['cv_p90']:.2%}"
    floor_text = "-" if floor is None else f"{floor:.2%}"
    print(
        f"noise floor (median CV over {len(cvs)} benchmarks): {floor_text} (target <= 2%); "
        f"90th percentile CV: {p90}"
    )
    print(
        f"the same over CPU time per iteration: "
        f"{'-' if cpu_floor is None else f'{cpu_floor:.2%}'} ({len(cpu_cvs)} benchmarks)"
    )
    print(f"unstable (spread >= 7%): {len(unstable)} of {len(results)}: {', '.join(unstable)}")
    print(
        "whole CPU suite, wall time per round (s): "
        + ", ".join(f"{w:.0f}" for w in round_walls)
        + f"; median {statistics.median(round_walls):.0f} s"
    )
    print(f"measurement setup in force: {', '.join(summary['setups']) or '-'}")
    print(f"leak suspected in any process: {', '.join(sorted(leaks)) or 'none'}")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "results": [r.to_json() for r in results]}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
