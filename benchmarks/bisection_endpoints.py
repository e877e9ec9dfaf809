"""The bisection's endpoint check: how often is a real step called "not reproduced"?

A bisection first measures its commit range's endpoints (the last good build, the first bad
one) and searches only when they differ by at least ``min_change`` (5%); otherwise it ends
``not_reproduced`` and the night's issue says so. For a real step of the detector's threshold
(7%) or more, that answer is wrong, and the culprit goes unnamed. How often it happens depends
on how precisely the endpoints are measured, so this runs the pure search
(:mod:`workers.bisect.search`, the nightly's settings: 12 samples a probe, doubling to 48,
2 processes a probe, no slots, as on Celery workers, and the regression's direction known: the
bad endpoint must measure slower; ``--either`` searches either direction, as a range given by
hand) over a one-commit range whose bad endpoint
is ``1 + step`` times slower, on simulated measurements with three sources of noise, all
log-normal:

* ``--process-cv``: each suite process's own level (allocator, pages: the noise floor that
  ``benchmarks/suite_noise_floor.py`` measures, 3 to 7% median on a shared VM);
* ``--round-cv``: each probe's moment (what the host does while that probe runs; the nightly's
  probes run one after another, possibly on different workers, so nothing is shared);
* 2% between the iterations of one process.

Reports, per step size and process noise, the share of bisections that end ``not_reproduced``,
the share that measure the endpoints less than half the threshold apart (the share a
"paired confirmation" read off the bisection would wrongly withhold, for real steps), and the
share that name the commit as the culprit (for no step, a culprit that is not one).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bisection_endpoints --trials 1000 \\
        [--either] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.bisect.search import (  # noqa: E402
    CULPRIT,
    NOT_REPRODUCED,
    ProbeResult,
    SearchConfig,
    next_probes,
    outcome,
    record_round,
    start,
)

THRESHOLD = 0.07
PROCESSES = 2  # processes a probe's samples are spread over (SuiteMeasurer's default)
ITERATION_CV = 0.02
STEPS = (0.0, 0.035, 0.05, 0.07, 0.075, 0.10, 0.15)
PROCESS_CVS = (0.01, 0.03, 0.05, 0.10)


def probe_samples(
    level: float, samples: int, *, process_cv: float, round_cv: float, rng: np.random.Generator
) -> tuple[float, ...]:
    """``samples`` latencies (ms) of one probe at ``level``: ``PROCESSES`` processes, each at its
    own log-normal level, in one moment of the host (shared by the probe's processes)."""
    moment = level * rng.lognormal(0.0, round_cv)
    per = -(-samples // PROCESSES)
    out: list[float] = []
    for _ in range(PROCESSES):
        process = moment * rng.lognormal(0.0, process_cv)
        out.extend(process * rng.lognormal(0.0, ITERATION_CV, per))
    return tuple(out[:samples])


def endpoint_outcome(
    step: float,
    *,
    process_cv: float,
    round_cv: float,
    rng: np.random.Generator,
    slower: bool | None = True,
) -> tuple[str, float | None]:
    """One bisection of a one-commit range whose bad endpoint is ``1 + step`` times slower.

    Args:
        slower: ``SearchConfig.slower``: True, the nightly's (a slowdown is bisected); None,
            either direction.

    Returns:
        ``(status, change)``: how it ended (``culprit`` | ``inconclusive`` |
        ``not_reproduced``), and the endpoints' measured change (fraction; None when not
        measured).
    """
    state = start(["0" * 40, "1" * 40], ["b"], SearchConfig(slower=slower))
    while requests := next_probes(state):
        results = [
            ProbeResult(
                r.sha,
                r.purpose,
                {
                    "b": probe_samples(
                        10.0 * (1 + step if r.index == 1 else 1.0),
                        r.samples,
                        process_cv=process_cv,
                        round_cv=round_cv,
                        rng=rng,
                    )
                },
                build_seconds=0.0,
            )
            for r in requests
        ]
        state = record_round(state, results)
    final = outcome(state)
    if final is None:
        raise RuntimeError("the search stopped without an outcome")
    [track] = final.benchmarks
    return track.status, track.change


def shares(
    step: float,
    *,
    process_cv: float,
    round_cv: float,
    trials: int,
    rng: np.random.Generator,
    slower: bool | None = True,
) -> dict[str, float]:
    """Over ``trials`` bisections: ``not_reproduced`` (share ending so), ``under_half``
    (share ending so, or measuring the endpoints less than half of 7% apart) and ``culprit``
    (share naming the commit)."""
    ended = [
        endpoint_outcome(step, process_cv=process_cv, round_cv=round_cv, rng=rng, slower=slower)
        for _ in range(trials)
    ]
    nr = [status == NOT_REPRODUCED for status, _ in ended]
    return {
        "not_reproduced": sum(nr) / trials,
        "under_half": sum(
            n or (c is not None and c < THRESHOLD / 2) for n, (_, c) in zip(nr, ended, strict=True)
        )
        / trials,
        "culprit": sum(status == CULPRIT for status, _ in ended) / trials,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="bisections per cell")
    parser.add_argument("--round-cv", type=float, default=0.02, help="noise of a probe's moment")
    parser.add_argument("--process-cv", type=float, nargs="+", default=list(PROCESS_CVS))
    parser.add_argument("--steps", type=float, nargs="+", default=list(STEPS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--either",
        action="store_true",
        help="search either direction (a range given by hand), not a slowdown",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    cells: dict[str, dict[str, dict[str, float]]] = {}
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task("bisections", total=len(args.process_cv) * len(args.steps))
        for cv in args.process_cv:
            cells[f"{cv:g}"] = {}
            for step in args.steps:
                cells[f"{cv:g}"][f"{step:g}"] = shares(
                    step,
                    process_cv=cv,
                    round_cv=args.round_cv,
                    trials=args.trials,
                    rng=rng,
                    slower=None if args.either else True,
                )
                progress.advance(bar)
    table = Table(
        title=f"not reproduced / under half of 7% / culprit named (round noise "
        f"{args.round_cv:g}, {args.trials} bisections a cell, "
        f"{'either direction' if args.either else 'a slowdown'})"
    )
    table.add_column("process noise")
    for step in args.steps:
        table.add_column(f"step {step:+.1%}", justify="right")
    for cv, row in cells.items():
        table.add_row(
            f"{float(cv):.0%}",
            *(
                f"{row[f'{s:g}']['not_reproduced']:.3f} / {row[f'{s:g}']['under_half']:.3f} / "
                f"{row[f'{s:g}']['culprit']:.3f}"
                for s in args.steps
            ),
        )
    Console().print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "trials": args.trials,
                    "round_cv": args.round_cv,
                    "seed": args.seed,
                    "either": args.either,
                    "cells": cells,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
