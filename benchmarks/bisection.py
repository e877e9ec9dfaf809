"""Bisection benchmark: accuracy, builds against the floor, and rounds against workers.

Three parts, all on the ``minitok`` repository of :mod:`workers.demo.minitok` (a real package,
a real slowdown in its hot path: about +30% in ``encode``), measured by its ``bench.py``:

1. **Accuracy** (``--trials``, default 20): ``nightbench bisect --json`` on a fresh 32-commit
   repository per trial, the culprit at a seeded random position, real builds
   (``pip install -e .`` per probe) and real measurements. Counts correct / inconclusive /
   wrong, and the builds each trial used (the acceptance bar: at most ⌈log2(33)⌉ + 2 = 8).
2. **Real runs for N = 8, 32, 70** (``--real-per-n``): the same command for each range size,
   for builds and wall time under real noise.
3. **Search under recorded noise** (``--sim-trials`` per case): ``--pool`` pairs of samples
   recorded from ``bench.py``, each pair one process on the good commit and one on the bad
   commit back to back (so a pair shares the machine's state, as a slot of the local driver
   does), feed the pure search (:mod:`workers.bisect.search`): each slot of a round draws one
   recorded pair, and every commit in that slot takes the pair's sample of its side. This
   repeats the search hundreds of times for N = 8, 32, 70 and W = 1, 2, 4 at no build cost:
   builds against ⌈log2(N+1)⌉ + 2 (the endpoints), rounds against W, accuracy.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bisection [--trials 20] [--json out.json] \
        [--chart docs/bisection.png]
    .venv/bin/python -m benchmarks.bisection --replot out.json --chart docs/bisection.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.bisect.search import (  # noqa: E402
    ProbeResult,
    SearchConfig,
    floor_builds,
    next_probes,
    outcome,
    record_round,
    start,
)
from workers.demo.minitok import ENCODE, INSTALL_COMMAND, make_package_repository  # noqa: E402

console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def bisect_cli(repo: Path, good: str, bad: str, *, workers: int = 1) -> dict:
    """Run ``nightbench bisect --json`` as a user would; returns its JSON."""
    command = [
        sys.executable,
        "-m",
        "workers.cli",
        "bisect",
        "--repo",
        str(repo),
        "--good",
        good,
        "--bad",
        bad,
        "--command",
        ENCODE,
        "--install",
        INSTALL_COMMAND,
        "--workers",
        str(workers),
        "--json",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def real_trial(n: int, culprit: int, *, workers: int = 1) -> dict:
    """One real bisection of an N-commit range with the culprit at ``culprit`` (1..N)."""
    with tempfile.TemporaryDirectory(prefix="nightbench-bisect-bench-") as tmp:
        repo = make_package_repository(Path(tmp) / "minitok", commits=n, encode_culprit=culprit)
        started = time.perf_counter()
        data = bisect_cli(repo.path, repo.good, repo.bad, workers=workers)
        seconds = time.perf_counter() - started
    named = [c["sha"] for c in data["culprits"]]
    verdict = (
        "correct" if named == [repo.culprits[ENCODE]] else "inconclusive" if not named else "wrong"
    )
    return {
        "n": n,
        "culprit": culprit,
        "workers": workers,
        "verdict": verdict,
        "outcome": data["outcome"],
        "builds": data["builds"],
        "rounds": data["rounds"],
        "seconds": round(seconds, 1),
        "build_seconds": round(
            sum({p["sha"]: p["build_seconds"] or 0 for p in data["probes"]}.values()), 1
        ),
    }


def record_pairs(count: int) -> list[tuple[float, float]]:
    """``count`` pairs of real ``bench.py encode`` samples (ms): (good commit, bad commit).

    Each sample is one process; the two processes of a pair run back to back, in alternating
    order, so a pair sees one state of the machine.
    """
    with tempfile.TemporaryDirectory(prefix="nightbench-bisect-pool-") as tmp:
        repo = make_package_repository(Path(tmp) / "minitok", commits=2, encode_culprit=2)
        trees = {}
        for side, sha in (("good", repo.shas[1]), ("bad", repo.shas[2])):
            trees[side] = Path(tmp) / side
            subprocess.run(
                ["git", "-C", str(repo.path), "worktree", "add", "--detach", str(trees[side]), sha],
                check=True,
                capture_output=True,
            )
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NIGHTBENCH_SAMPLES": "1"}
        pairs: list[tuple[float, float]] = []
        with _progress() as progress:
            bar = progress.add_task("recording paired noise", total=count)
            for k in range(count):
                got = {}
                for side in ("good", "bad") if k % 2 == 0 else ("bad", "good"):
                    out = subprocess.run(
                        [sys.executable, "bench.py", "encode"],
                        cwd=trees[side],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    got[side] = json.loads(out.stdout.splitlines()[-1])["samples"][0]
                pairs.append((got["good"], got["bad"]))
                progress.advance(bar)
    return pairs


def simulated_trial(
    n: int, culprit: int, pairs: list[tuple[float, float]], *, workers: int, rng: random.Random
) -> dict:
    """The pure search over N commits; each slot of a round draws one recorded pair."""
    state = start([f"{i:040x}" for i in range(n + 1)], ["encode"], SearchConfig(workers=workers))
    while True:
        requests = next_probes(state)
        if not requests:
            break
        drawn = [rng.choice(pairs) for _ in range(max(r.samples for r in requests))]
        results = []
        for r in requests:
            side = 1 if r.index >= culprit else 0
            values = tuple(drawn[slot][side] for slot in range(r.samples))
            results.append(
                ProbeResult(
                    r.sha,
                    r.purpose,
                    {"encode": values},
                    build_seconds=0.0,
                    slots={"encode": tuple(range(r.samples))},
                )
            )
        state = record_round(state, results)
    final = outcome(state)
    assert final is not None
    named = [state.commits.index(sha) for sha, _ in final.culprits]
    verdict = "correct" if named == [culprit] else "inconclusive" if not named else "wrong"
    search_rounds = len({p.round for p in state.probes if p.purpose in ("search", "refine")})
    return {
        "n": n,
        "workers": workers,
        "verdict": verdict,
        "builds": final.builds,
        "rounds": final.rounds,
        "search_rounds": search_rounds,
    }


def _summary(rows: list[dict]) -> dict:
    if not rows:
        return {"trials": 0}
    builds = [r["builds"] for r in rows]
    return {
        "trials": len(rows),
        "correct": sum(r["verdict"] == "correct" for r in rows),
        "inconclusive": sum(r["verdict"] == "inconclusive" for r in rows),
        "wrong": sum(r["verdict"] == "wrong" for r in rows),
        "builds_mean": round(statistics.mean(builds), 2),
        "builds_max": max(builds),
        "rounds_mean": round(statistics.mean(r["rounds"] for r in rows), 2),
        **(
            {"search_rounds_mean": round(statistics.mean(r["search_rounds"] for r in rows), 2)}
            if "search_rounds" in rows[0]
            else {}
        ),
        **(
            {"seconds_mean": round(statistics.mean(r["seconds"] for r in rows), 1)}
            if "seconds" in rows[0]
            else {}
        ),
    }


def plot(report: dict, path: Path) -> None:
    """Builds against the floor per N, and rounds against W, from a report (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = report["simulated"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ns = sorted({c["n"] for c in sim.values()})
    w1 = [sim[f"N={n} W=1"] for n in ns]
    left.plot(ns, [c["builds_mean"] for c in w1], "o-", label="builds, mean (W=1)")
    left.plot(ns, [c["builds_max"] for c in w1], "s--", label="builds, max (W=1)")
    left.plot(ns, [c["floor"] + 2 for c in w1], "k:", label="floor ⌈log2(N+1)⌉ + 2 endpoints")
    real = report.get("real", {})
    if real:
        xs = sorted(int(n) for n in real)
        left.plot(
            xs, [real[str(n)]["builds_mean"] for n in xs], "x", ms=10, label="real runs, mean"
        )
    left.set_xlabel("commits in range (N)")
    left.set_ylabel("distinct commits built")
    left.set_title("builds")
    left.legend(fontsize=8)
    for n in ns:
        ws = sorted({c["workers"] for c in sim.values() if c["n"] == n})
        cases = [sim[f"N={n} W={w}"] for w in ws]
        right.plot(ws, [c["search_rounds_mean"] for c in cases], "o-", label=f"N={n}")
        right.plot(ws, [c["floor_rounds"] for c in cases], ":", color="gray")
    right.set_xlabel("workers (W)")
    right.set_ylabel("search rounds (mean)")
    right.set_title("rounds (dotted: ⌈log_{W+1}(N+1)⌉)")
    right.set_xticks([1, 2, 4])
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="real 32-commit trials")
    parser.add_argument("--real-per-n", type=int, default=2, help="real trials for N=8 and 70")
    parser.add_argument("--sim-trials", type=int, default=200, help="search runs per case")
    parser.add_argument("--pool", type=int, default=400, help="recorded pairs of samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write all figures here")
    parser.add_argument("--chart", type=Path, default=None, help="draw builds and rounds (PNG)")
    parser.add_argument(
        "--replot", type=Path, default=None, help="only draw --chart from a --json written earlier"
    )
    args = parser.parse_args(argv)
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.chart or Path("bisection.png"))
        return 0
    rng = random.Random(args.seed)
    report: dict = {"seed": args.seed}

    accuracy = []
    with _progress() as progress:
        bar = progress.add_task("accuracy (N=32, real)", total=args.trials)
        for _ in range(args.trials):
            accuracy.append(real_trial(32, rng.randint(1, 32)))
            progress.log(accuracy[-1])
            progress.advance(bar)
    report["accuracy"] = {"summary": _summary(accuracy), "trials": accuracy}

    real = {32: accuracy}
    with _progress() as progress:
        bar = progress.add_task("real runs (N=8, 70)", total=2 * args.real_per_n)
        for n in (8, 70):
            real[n] = []
            for _ in range(args.real_per_n):
                real[n].append(real_trial(n, rng.randint(1, n)))
                progress.log(real[n][-1])
                progress.advance(bar)
    report["real"] = {
        str(n): {"floor": floor_builds(n), **_summary(rows)}
        for n, rows in sorted(real.items())
        if rows
    }

    pairs = record_pairs(args.pool)
    good = np.array([g for g, _ in pairs])
    bad = np.array([b for _, b in pairs])
    report["pairs"] = {
        "count": len(pairs),
        "good_median_ms": round(float(np.median(good)), 3),
        "bad_median_ms": round(float(np.median(bad)), 3),
        "change": round(float(np.median(bad) / np.median(good) - 1), 3),
        "good_iqr_ms": round(float(np.subtract(*np.percentile(good, [75, 25]))), 3),
        "good_max_over_min": round(float(good.max() / good.min()), 2),
        "pairs_with_bad_slower": round(float(np.mean(bad > good)), 3),
    }
    simulated: dict[str, dict] = {}
    cases = [(n, w) for n in (8, 32, 70) for w in (1, 2, 4)]
    with _progress() as progress:
        bar = progress.add_task("search under recorded noise", total=len(cases) * args.sim_trials)
        for n, w in cases:
            rows = []
            for _ in range(args.sim_trials):
                rows.append(simulated_trial(n, rng.randint(1, n), pairs, workers=w, rng=rng))
                progress.advance(bar)
            simulated[f"N={n} W={w}"] = {
                "n": n,
                "workers": w,
                "floor": floor_builds(n),
                "floor_rounds": math.ceil(math.log(n + 1, w + 1)),
                **_summary(rows),
            }
    report["simulated"] = simulated

    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text)
    if args.chart:
        plot(report, args.chart)
    print(text)
    acc = report["accuracy"]["summary"]
    if not acc["trials"]:
        return 0
    console.print(
        f"accuracy: {acc['correct']}/{acc['trials']} correct, {acc['wrong']} wrong, "
        f"builds max {acc['builds_max']}"
    )
    return 0 if acc["wrong"] == 0 and acc["correct"] >= math.ceil(0.95 * acc["trials"]) else 1


if __name__ == "__main__":
    sys.exit(main())
