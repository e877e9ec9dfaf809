"""Simulation: how often the stability rule darkens a truly stable benchmark, by window size.

A truly stable benchmark here has no step and no drift: each process's median latency is an
independent normal draw around 1 with a process-to-process coefficient of variation ``cv``. For
n processes (5: ``nightbench suite stability``; 10: the nightly re-check's window), the share of
such benchmarks whose spread ``(max - min) / min`` reaches

* the old rule, TorchBench's 7% whatever n, and
* the new rule, 7% scaled by d2(n) / d2(5) (``suite.stability.allowed_spread``),

is the share the rule darkens (never alerted on) without cause. The rule should give the same
share over 10 processes as over 5. Simulated figures, not measurements: numpy draws, seeded; the
new rule's threshold is the project's own function.

Usage::

    python benchmarks/recheck_spread.py [--trials 200000] [--seed 16]
"""

from __future__ import annotations

import argparse

import numpy as np

from suite.stability import UNSTABLE_SPREAD, allowed_spread


def darkened_share(
    rng: np.random.Generator, *, cv: float, processes: int, trials: int, threshold: float
) -> float:
    """The share of ``trials`` stable benchmarks whose spread of ``processes`` medians reaches
    ``threshold`` (fraction); medians are N(1, cv) draws."""
    medians = rng.normal(1.0, cv, size=(trials, processes))
    spread = (medians.max(axis=1) - medians.min(axis=1)) / medians.min(axis=1)
    return float(np.mean(spread >= threshold))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200_000, help="benchmarks per cell")
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.trials} simulated stable benchmarks per cell, seed {args.seed}\n")
    print("| CV | processes | old rule (7%) | new rule (allowed) | darkened, old | darkened, new |")
    print("| --- | --- | --- | --- | --- | --- |")
    for cv in (0.01, 0.02, 0.03):
        for n in (5, 10):
            allowed = allowed_spread(n, UNSTABLE_SPREAD)
            old = darkened_share(
                rng, cv=cv, processes=n, trials=args.trials, threshold=UNSTABLE_SPREAD
            )
            new = darkened_share(rng, cv=cv, processes=n, trials=args.trials, threshold=allowed)
            print(
                f"| {cv:.0%} | {n} | {UNSTABLE_SPREAD:.1%} | {allowed:.2%} | {old:.1%} "
                f"| {new:.1%} |"
            )


if __name__ == "__main__":
    main()
