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

4. **Noise table** (``--noise-table``, nothing else runs): the pure search over 32 commits under
   three noise models (:data:`NOISE`: quiet, loaded, and a busy host's heavy tails: most samples
   at their level, a few 5–13 times it, rounds whose level drifts and rounds where a third of
   the samples are descheduled), a +40% and a +8% step, slot by slot (the local driver) and
   apart (Celery): right / wrong / inconclusive, builds and samples. ``--code DIR`` imports the
   search from another checkout (``git archive <rev> service workers | tar -x -C DIR``), for the
   table before a change.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bisection [--trials 20] [--json out.json] \
        [--chart docs/bisection.png]
    .venv/bin/python -m benchmarks.bisection --replot out.json --chart docs/bisection.png
    .venv/bin/python -m benchmarks.bisection --noise-table --sim-trials 30 [--code /tmp/before]
    .venv/bin/python -m benchmarks.bisection --repeat 5 --commits 32 --busy-loops 2 [--light]
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# --code DIR: the search of another checkout (the table before a change), ahead of this one.
_CODE = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--code"), None)
if _CODE:
    sys.path.insert(0, _CODE)

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


def real_trial(n: int, culprit: int, *, workers: int = 1, light: bool = False) -> dict:
    """One real bisection of an N-commit range with the culprit at ``culprit`` (1..N); ``light``:
    the +8% culprit instead of the +35% one (:func:`make_package_repository`)."""
    with tempfile.TemporaryDirectory(prefix="nightbench-bisect-bench-") as tmp:
        repo = make_package_repository(
            Path(tmp) / "minitok", commits=n, encode_culprit=culprit, light=light
        )
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
        "light": light,
        "load": [round(v, 1) for v in os.getloadavg()],
        "samples": sum(len(r["samples"]) for p in data["probes"] for r in p["results"]),
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


@dataclass(frozen=True)
class NoiseModel:
    """How a simulated host disturbs samples (all factors multiply the commit's level).

    Attributes:
        sigma: per-sample log-normal spread.
        drift: log-normal spread of a round's level (slot by slot) or of each commit's batch
            (apart: each probe measured at its own moment).
        spike_p: chance that one sample is descheduled.
        spike: the range a descheduled sample is multiplied by (uniform).
        bad_round_p: chance that a round is a bad one, where ``bad_spike_p`` of its samples
            are descheduled.
        bad_spike_p: see ``bad_round_p``.
    """

    sigma: float
    drift: float
    spike_p: float = 0.0
    spike: tuple[float, float] = (1.0, 1.0)
    bad_round_p: float = 0.0
    bad_spike_p: float = 0.0


NOISE = {
    "quiet": NoiseModel(sigma=0.02, drift=0.005),
    "loaded": NoiseModel(sigma=0.04, drift=0.03, spike_p=0.03, spike=(1.5, 3.0)),
    # The busy host of issue #42: a probe's samples at 1.0 s mostly and 5-13 s in a few, and a
    # reference at 1.3 s in one round and 1.3-29 s in the next (docs/bisection.md).
    "busy": NoiseModel(
        sigma=0.05,
        drift=0.10,
        spike_p=0.06,
        spike=(5.0, 13.0),
        bad_round_p=0.15,
        bad_spike_p=0.35,
    ),
}


def noisy_trial(
    n: int,
    culprit: int,
    effect: float,
    noise: NoiseModel,
    *,
    paired: bool,
    rng: np.random.Generator,
) -> dict:
    """The pure search over N commits with a step of ``effect`` at ``culprit`` under ``noise``.

    Slot by slot (``paired``), a round's drift and each slot's moment are shared by every commit
    measured in it, as the local driver's interleaving makes them; apart, each commit's batch
    has its own drift, as probes measured by separate Celery tasks.
    """
    state = start([f"{i:040x}" for i in range(n + 1)], ["bench"], SearchConfig())
    for _ in range(400):
        requests = next_probes(state)
        if not requests:
            break
        width = max(r.samples for r in requests)
        round_level = math.exp(noise.drift * rng.standard_normal())
        p = noise.bad_spike_p if rng.random() < noise.bad_round_p else noise.spike_p
        slot_level = np.exp(noise.sigma * rng.standard_normal(width))
        results = []
        for r in requests:
            level = 10.0 * (1 + effect if r.index >= culprit else 1.0)
            own = round_level if paired else math.exp(noise.drift * rng.standard_normal())
            shared = slot_level[: r.samples] if paired else 1.0
            spikes = np.where(rng.random(r.samples) < p, rng.uniform(*noise.spike, r.samples), 1.0)
            values = (
                level
                * own
                * shared
                * spikes
                * np.exp(0.5 * noise.sigma * rng.standard_normal(r.samples))
            )
            results.append(
                ProbeResult(
                    r.sha,
                    r.purpose,
                    {"bench": tuple(float(v) for v in values)},
                    build_seconds=0.0,
                    slots={"bench": tuple(range(r.samples))} if paired else {},
                )
            )
        state = record_round(state, results)
    final = outcome(state)
    if final is None:
        return {
            "verdict": "inconclusive",
            "builds": state.builds,
            "samples": 0,
            "rounds": state.round,
        }
    named = [state.commits.index(sha) for sha, _ in final.culprits]
    verdict = "right" if named == [culprit] else "inconclusive" if not named else "wrong"
    samples = sum(len(batch.values) for batches in state.samples.values() for batch in batches)
    return {"verdict": verdict, "builds": final.builds, "samples": samples, "rounds": final.rounds}


def noise_table(trials: int, seed: int, only: str | None = None) -> dict:
    """Right / wrong / inconclusive, builds and samples per noise model, step and mode
    (``only``: the cells whose name starts so, e.g. ``"loaded +8% apart"``)."""
    rng = np.random.default_rng(seed)
    cells: dict[str, dict] = {}
    cases = [
        (name, effect, paired)
        for name in NOISE
        for effect in (0.40, 0.08)
        for paired in (True, False)
        if only is None or f"{name} +{effect:.0%} {'slots' if paired else 'apart'}".startswith(only)
    ]
    with _progress() as progress:
        bar = progress.add_task("search under modelled noise", total=len(cases) * trials)
        for name, effect, paired in cases:
            rows = []
            for _ in range(trials):
                culprit = int(rng.integers(1, 33))
                rows.append(noisy_trial(32, culprit, effect, NOISE[name], paired=paired, rng=rng))
                progress.advance(bar)
            key = f"{name} +{effect:.0%} {'slots' if paired else 'apart'}"
            cells[key] = {
                "trials": trials,
                "right": sum(r["verdict"] == "right" for r in rows),
                "wrong": sum(r["verdict"] == "wrong" for r in rows),
                "inconclusive": sum(r["verdict"] == "inconclusive" for r in rows),
                "builds_median": float(np.median([r["builds"] for r in rows])),
                "builds_max": max(r["builds"] for r in rows),
                "samples_median": float(np.median([r["samples"] for r in rows])),
            }
    return cells


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


def repeat_real(args: argparse.Namespace) -> int:
    """``--repeat``: real bisections only, one JSON line each, busy loops beside them."""
    rng = random.Random(args.seed)
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy_loops)
    ]
    try:
        for _ in range(args.repeat):
            trial = real_trial(args.commits, rng.randint(1, args.commits), light=args.light)
            print(json.dumps(trial), flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return 0


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
    parser.add_argument(
        "--noise-table", action="store_true", help="only the search under the noise models"
    )
    parser.add_argument("--code", type=Path, default=None, help="import the search from here")
    parser.add_argument("--only", default=None, help="noise table: cells starting so")
    parser.add_argument(
        "--repeat", type=int, default=0, help="only this many real bisections (--commits, --light)"
    )
    parser.add_argument("--commits", type=int, default=32, help="--repeat: commits in range")
    parser.add_argument("--light", action="store_true", help="--repeat: the +8%% culprit")
    parser.add_argument(
        "--busy-loops", type=int, default=0, help="--repeat: busy loops running beside each run"
    )
    args = parser.parse_args(argv)
    if args.repeat:
        return repeat_real(args)
    if args.noise_table:
        table = {
            "code": str(args.code or ROOT),
            "seed": args.seed,
            "cells": noise_table(args.sim_trials, args.seed, args.only),
        }
        text = json.dumps(table, indent=1)
        if args.json:
            args.json.write_text(text)
        print(text)
        return 0
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
