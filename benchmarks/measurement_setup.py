"""Process-to-process noise of CPU benchmarks under each measurement setup, interleaved.

For each round, each benchmark runs once under every setup, the setups in a fresh random order
per benchmark and round, each in a fresh ``python -m suite run`` process: ``off`` (``--no-setup``,
the process as launched), ``jemalloc`` (``NIGHTBENCH_SUITE_ALLOCATOR=jemalloc``) and ``glibc``
(``NIGHTBENCH_SUITE_ALLOCATOR=glibc``: glibc's malloc with its thresholds fixed by
``GLIBC_TUNABLES``), ``jemalloc_nodecay`` and ``jemalloc_thp`` (jemalloc with a ``MALLOC_CONF``
that never purges freed pages, or that backs memory with transparent huge pages), and
``jemalloc_noaslr`` (jemalloc in a process started by ``setarch -R``,
without address-space randomisation); see ``suite/cpu_setup.py``. Interleaving puts every setup under the same
drift of the machine. Reported per benchmark and setup: the median of the per-process medians,
their CV and max-min spread (TorchBench's 7% rule), for latency and CPU time per iteration;
per setup the noise floor (median CV over benchmarks), its 90th percentile and the unstable
count. The load average before and after is printed beside the figures.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.measurement_setup --repeats 5 \\
        --models bert,dlrm --json setup.json
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
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from suite.stability import allowed_spread, summarize

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {
    "off": ({}, ["--no-setup"]),
    "jemalloc": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc"}, []),
    "glibc": ({"NIGHTBENCH_SUITE_ALLOCATOR": "glibc"}, []),
    # jemalloc in a process without address-space randomisation (util-linux ``setarch -R``,
    # personality ADDR_NO_RANDOMIZE): the same layout in every process.
    "jemalloc_noaslr": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc"}, []),
    # jemalloc that never hands freed pages back (no decay purges, so no page faults in the
    # timed loop once warm), and jemalloc backing its memory with transparent huge pages
    # (the system's THP mode is ``madvise``; ``thp:always`` makes jemalloc ask for them).
    "jemalloc_nodecay": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc",
                          "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}, []),
    "jemalloc_thp": ({"NIGHTBENCH_SUITE_ALLOCATOR": "jemalloc",
                      "MALLOC_CONF": "thp:always,metadata_thp:always"}, []),
}
PREFIX = {"jemalloc_noaslr": ["setarch", os.uname().machine, "-R"]}
SUBSET = ("bert,bilstm_crf,conv_tasnet,dlrm,lstm_lm,mobilenet_v2,ncf,pyhpc_equation_of_state,"
          "pyhpc_isoneutral_mixing,wavenet")


def _run(model: str, mode: str, setup: str, out: Path) -> dict[str, float] | None:
    """One process: ``{"latency": median ms, "cpu_time": median ms}``, None on an error."""
    env_extra, args = SETUPS[setup]
    env = {**os.environ, **env_extra, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [*PREFIX.get(setup, []), sys.executable, "-m", "suite", "run", "--model", model, "--mode", mode,
           "--threads", "1", "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not out.exists():
        return None
    record = json.loads(out.read_text())
    if record.get("error"):
        return None
    return {m["metric"]: m["median"] for m in record["metrics"]
            if m["metric"] in ("latency", "cpu_time")}


def main() -> None:
    """Measure, print the tables, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="processes per benchmark and setup")
    ap.add_argument("--models", default=SUBSET)
    ap.add_argument("--mode", default="eval", choices=("train", "eval"))
    ap.add_argument("--setups", default="off,jemalloc,glibc")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    setups = [s for s in args.setups.split(",") if s]
    unknown = sorted(set(setups) - SETUPS.keys())
    if unknown:
        ap.error(f"--setups: unknown {', '.join(unknown)} (known: {', '.join(SETUPS)})")
    rng = random.Random(args.seed)
    console = Console(stderr=True)
    medians: dict[tuple[str, str], dict[str, list[float]]] = {}
    errors: dict[tuple[str, str], int] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, Progress(
            TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("setups", total=args.repeats * len(models) * len(setups))
        for r in range(args.repeats):
            for model in models:
                for setup in rng.sample(setups, len(setups)):
                    progress.update(bar, description=f"round {r + 1} {model} {setup}")
                    out = Path(tmp) / f"{model}-{setup}-{r}.json"
                    got = _run(model, args.mode, setup, out)
                    if got is None:
                        errors[(model, setup)] = errors.get((model, setup), 0) + 1
                    else:
                        slot = medians.setdefault((model, setup), {})
                        for metric, value in got.items():
                            slot.setdefault(metric, []).append(value)
                    progress.advance(bar)
    load_after = os.getloadavg()
    rows, floors = [], {}
    table = Table(title=f"{args.mode}, {args.repeats} processes per benchmark and setup, "
                        f"load {load_before[0]:.2f} → {load_after[0]:.2f}")
    for col in ("benchmark", "setup", "median ms", "CV", "spread", "CPU-time CV", "verdict"):
        table.add_column(col, justify="left" if col in ("benchmark", "setup") else "right")
    for model in models:
        for setup in setups:
            got = medians.get((model, setup), {})
            lat = got.get("latency", [])
            if len(lat) < 2:
                continue
            cv, spread, unstable = summarize(lat, allowed_spread(len(lat)))
            assert cv is not None and spread is not None
            cpu_cv = summarize(got["cpu_time"])[0] if len(got.get("cpu_time", [])) >= 2 else None
            row = {"benchmark": f"{model}:{args.mode}", "setup": setup,
                   "median_ms": statistics.median(lat), "cv": cv, "spread": spread,
                   "cpu_time_cv": cpu_cv, "unstable": bool(unstable), "medians_ms": lat,
                   "errors": errors.get((model, setup), 0)}
            rows.append(row)
            table.add_row(row["benchmark"], setup, f"{row['median_ms']:.2f}", f"{cv:.2%}",
                          f"{spread:.2%}", "-" if cpu_cv is None else f"{cpu_cv:.2%}",
                          "UNSTABLE" if row["unstable"] else "stable")
    console.print(table)
    summary = Table(title="per setup")
    for col in ("setup", "noise floor (median CV)", "p90 CV", "CPU-time floor", "unstable"):
        summary.add_column(col, justify="right")
    for setup in setups:
        mine = [r for r in rows if r["setup"] == setup]
        if not mine:
            continue
        cvs = sorted(r["cv"] for r in mine)
        cpu = sorted(r["cpu_time_cv"] for r in mine if r["cpu_time_cv"] is not None)
        floors[setup] = {
            "noise_floor_cv": statistics.median(cvs), "cv_p90": cvs[int(0.9 * (len(cvs) - 1))],
            "cpu_time_noise_floor_cv": statistics.median(cpu) if cpu else None,
            "unstable": [r["benchmark"] for r in mine if r["unstable"]]}
        f = floors[setup]
        summary.add_row(setup, f"{f['noise_floor_cv']:.2%}", f"{f['cv_p90']:.2%}",
                        "-" if f["cpu_time_noise_floor_cv"] is None
                        else f"{f['cpu_time_noise_floor_cv']:.2%}",
                        f"{len(f['unstable'])} of {len(mine)}")
    console.print(summary)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "setups": floors,
                                         "load_average_before": load_before,
                                         "load_average_after": load_after}, indent=1))


if __name__ == "__main__":
    main()
