"""The smallest detectable change (``service/regressions/sensitivity.py``) against the nightly
flow run night by night (``benchmarks/nightly_flow.py``) on simulated series.

For each night-to-night noise, the formula's smallest detectable change at the flow's baseline
(``--baseline`` nights) is computed, and the flow drives ``assess_night`` and ``confirm`` over
``--trials`` series stepping by ``factor`` times it (``--factors``, default 0.8, 1 and 1.25).
The formula claims a step of its size is raised by the step's third night in 95% of series; the
table prints the share the detector actually raised by then, so the two can be compared.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.smallest_change --trials 200
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.nightly_flow import Noise, run_cell
from service.regressions.rules import DetectorParams
from service.regressions.sensitivity import POWER, smallest_detectable_change


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200, help="series per cell")
    ap.add_argument("--baseline", type=int, default=12, help="baseline nights before the step")
    ap.add_argument("--after", type=int, default=7, help="nights from the step on")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.05])
    ap.add_argument("--factors", type=float, nargs="+", default=[0.8, 1.0, 1.25])
    ap.add_argument("--threshold", type=float, default=0.07)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    args.flat_nights = 1  # no flat series here
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    params = DetectorParams()
    table = Table(
        title=f"smallest detectable change vs the nightly flow: {args.baseline} baseline "
        f"nights, {args.trials} series a cell, share raised by the step's third night"
    )
    for col in ("noise", "formula", *(f"{f:g}x" for f in args.factors)):
        table.add_column(col, justify="right")
    out = []
    for cv in args.noise:
        sdc = float(smallest_detectable_change(cv, args.baseline, args.threshold, params=params))
        cells = []
        for factor in args.factors:
            noise = Noise(process_cv=cv, threshold=args.threshold)
            row = run_cell(noise, ("step", round(sdc * factor, 4)), params, args)
            out.append({"noise": cv, "formula": sdc, "factor": factor, **row})
            cells.append(f"{row['by3']:.2f} (step {sdc * factor:+.1%})")
        table.add_row(f"{cv:.0%}", f"{sdc:+.1%} (claims {POWER:.0%})", *cells)
    Console(width=160).print(table)
    return out


if __name__ == "__main__":
    main()
