"""How often the failure bisection names the right commit, a wrong one, or none, and its cost.

Simulated ranges for :mod:`workers.bisect.failures` (the search a failing benchmark's issue is
told the answer of): each trial draws a commit range of ``--commits`` commits after the good
endpoint, the first failing commit (the culprit) uniformly in it, and a share of commits that
do not build (``--unbuildable``). A probe's outcome is drawn per run:

* before the culprit the benchmark fails with probability ``flaky`` (a benchmark that fails now
  and then: an out-of-memory night, a race), and runs otherwise;
* from the culprit on it fails with probability ``1 - comes_back`` (a break that shows on most
  runs but not every one: a race the commit introduced).

With ``--other N``, a second table: another bug, with another error, makes the benchmark fail
on a window of N commits drawn anywhere in the range (broken, then fixed within the day, or
still broken where the night's culprit lands); the search is run given the night's error (as
the nightly does) and without it (every failure counted as the night's).

Counted per setting: the culprit named (right), a commit named that is not the culprit
(wrong), an inconclusive range (holding the culprit or not), not reproduced, and the builds and
rounds it took. The wrong rate is the one that matters: a wrong name sends a maintainer to the
wrong author.

Run: ``PYTHONPATH=. python -m benchmarks.failure_bisection --trials 2000 [--runs 1 2] [--other 5]
[--json F]``
(seconds; pure Python, no builds).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from workers.bisect.failures import (
    RUNS,
    failure_outcome,
    next_failure_probes,
    record_failures,
    start_failure_search,
)

SETTINGS = (  # (flaky, comes_back): deterministic, then the two ways a failure wavers
    (0.0, 0.0),
    (0.05, 0.0),
    (0.2, 0.0),
    (0.0, 0.05),
    (0.0, 0.2),
    (0.1, 0.1),
)


@dataclass(frozen=True)
class Tally:
    """One setting's counts over its trials (builds and rounds summed)."""

    right: int
    wrong: int
    inconclusive_holding: int
    inconclusive_missing: int
    not_reproduced: int
    builds: int
    rounds: int


NIGHT_ERROR = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (at models/m.py:12)"
OTHER_ERROR = "ImportError: cannot import name 'sdpa_kernel' (at models/m.py:3)"


def trial(
    rng: random.Random,
    *,
    commits: int,
    workers: int,
    flaky: float,
    comes_back: float,
    unbuildable: float,
    runs: int = RUNS,
    other: int = 0,
    match: bool = True,
) -> tuple[str, bool, int, int]:
    """One simulated bisection, each probe ``runs`` runs: ``(outcome kind, whether its answer
    holds the culprit, builds, rounds)``; for ``culprit`` the answer holds it only when the
    named commit is the culprit. (The search itself plans for ``RUNS`` runs a probe; another
    ``runs`` shows what the majority buys.) ``other``: the length of a window of commits that
    fail with another error (0: none); ``match``: the search is given the night's error."""
    shas = [f"{i:040x}" for i in range(commits + 1)]
    culprit = rng.randint(1, commits)
    broken = {i for i in range(1, commits) if rng.random() < unbuildable}
    start = rng.randint(1, commits) if other else 0
    window = set(range(start, min(start + other, commits))) if other else set()
    state = start_failure_search(shas, "bench", workers, NIGHT_ERROR if match else None)
    while wanted := next_failure_probes(state):
        results = []
        for p in wanted:
            if p.index in broken:
                results.append(replace(p, skipped=True))
                continue
            if p.index in window:
                results.append(replace(p, failed=runs, detail=OTHER_ERROR))
                continue
            wavers = comes_back if p.index >= culprit else flaky
            odd = sum(rng.random() < wavers for _ in range(runs))
            ran = odd if p.index >= culprit else runs - odd
            results.append(
                replace(p, ran=ran, failed=runs - ran, detail=NIGHT_ERROR if ran < runs else None)
            )
        state = record_failures(state, results)
    final = failure_outcome(state)
    assert final is not None
    holds = shas[culprit] in final.range
    return final.kind, holds, final.builds, final.rounds


def tally(trials: int, seed: int, **kw: float) -> Tally:
    """:func:`trial` ``trials`` times with one random stream (``seed``); keyword arguments as
    :func:`trial`'s."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    builds = rounds = 0
    for _ in range(trials):
        kind, holds, b, r = trial(rng, **kw)  # type: ignore[arg-type]
        key = {
            "culprit": "right" if holds else "wrong",
            "inconclusive": "inconclusive_holding" if holds else "inconclusive_missing",
        }.get(kind, "not_reproduced")
        counts[key] += 1
        builds, rounds = builds + b, rounds + r
    return Tally(
        counts["right"],
        counts["wrong"],
        counts["inconclusive_holding"],
        counts["inconclusive_missing"],
        counts["not_reproduced"],
        builds,
        rounds,
    )


def report(
    trials: int,
    seed: int,
    commits: int,
    workers: Sequence[int],
    unbuildable: float,
    runs: Sequence[int] = (RUNS,),
    other: int = 0,
) -> list[dict[str, object]]:
    """One row per (runs, workers, flaky, comes_back), and with ``other`` per given the night's
    error or not: shares of trials and mean builds/rounds."""
    rows: list[dict[str, object]] = []
    matches = (True, False) if other else (True,)
    for n, w, (flaky, comes_back), match in (
        (n, w, s, m) for n in runs for w in workers for s in SETTINGS for m in matches
    ):
        t = tally(
            trials,
            seed,
            commits=commits,
            workers=w,
            flaky=flaky,
            comes_back=comes_back,
            unbuildable=unbuildable,
            runs=n,
            other=other,
            match=match,
        )
        rows.append(
            {
                "runs": n,
                "workers": w,
                "flaky": flaky,
                "comes_back": comes_back,
                "other": other,
                "match": match,
                "right": t.right / trials,
                "wrong": t.wrong / trials,
                "inconclusive_holding": t.inconclusive_holding / trials,
                "inconclusive_missing": t.inconclusive_missing / trials,
                "not_reproduced": t.not_reproduced / trials,
                "builds": t.builds / trials,
                "rounds": t.rounds / trials,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Print the table (Markdown); ``--json`` also writes the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--commits",
        type=int,
        default=60,
        help="commits after the good endpoint (a day of PyTorch: 40 to 100)",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--unbuildable", type=float, default=0.05)
    parser.add_argument(
        "--runs",
        type=int,
        nargs="+",
        default=[RUNS],
        help="runs a probe (the search's is RUNS; 1 shows a single run's)",
    )
    parser.add_argument(
        "--other",
        type=int,
        default=0,
        help="commits in a window failing with another error (0: none)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = report(
        args.trials, args.seed, args.commits, args.workers, args.unbuildable, args.runs, args.other
    )
    print(
        "| runs | W | fails before the culprit | runs after it | given the night's error | "
        "right | wrong | inconclusive (holding it / not) | not reproduced | builds | rounds |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['runs']} | {r['workers']} | {r['flaky']:.0%} | {r['comes_back']:.0%} | "
            f"{'yes' if r['match'] else 'no'} | {r['right']:.3f} "
            f"| {r['wrong']:.3f} | {r['inconclusive_holding']:.3f} / "
            f"{r['inconclusive_missing']:.3f} | {r['not_reproduced']:.3f} | "
            f"{r['builds']:.1f} | {r['rounds']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
