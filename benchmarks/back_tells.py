"""How often a filed regression's issue is told its series is back, on true and false alarms.

The nightly tells a filed regression's issue when its series is back at its level from before
(:mod:`service.regressions.back`): on the real histories with confirmation re-runs modelled
(:func:`benchmarks.real_series.with_reruns`, each ``--draws``), this counts the regression
flags whose step the series came back from (``Flag.resumed_night``: the issue is told within
``return_nights`` nights), by what the flag is:

* ``true step``: the first flag matching a planted step (the scoring of
  :func:`benchmarks.detection.evaluate`: its night in ``[e - 2, e + 28]``, raised on or after
  ``e``). Told here, the comment is wrong: the planted step persists;
* ``false, no-change series``: any flag on a flat segment as it is;
* ``later flag on a step series``: a further flag after the planted step's first match (an
  excursion on top of the new level);
* ``other``: the rest (a flag before a planted step, up-flags on an improvement's series).

Run: ``PYTHONPATH=. python -m benchmarks.back_tells --seed 1 [--json F]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.real_series import RERUN_DRAWS, build, load, with_reruns
from benchmarks.series import SeriesSet
from service.regressions.scan import Flag, detect_series

KINDS = ("true step", "false, no-change series", "later flag on a step series", "other")


def classify(s: SeriesSet, found: Sequence[Flag], night: np.ndarray) -> dict[str, dict[str, int]]:
    """Regression flags of ``found`` by kind (module docstring), raised and told back.

    Args:
        s: the labelled series.
        found: the online detector's flags on ``s`` with its re-runs inserted.
        night: (series, columns) each column's night in ``s.levels`` (``with_reruns``).

    Returns:
        ``{kind: {"raised": n, "told_back": n}}`` for each of :data:`KINDS`, and ``true step
        by size`` (``{size: [told_back, raised]}``) under ``"true_by_size"``.
    """
    e, size, cat = s.event_night, s.event_size, s.category
    raised, back, sized, sized_back = Counter(), Counter(), Counter(), Counter()
    matched: set[int] = set()
    for f in sorted(found, key=lambda f: (f.series, f.raised_night)):
        if f.direction != "regression":
            continue
        i = f.series
        n, r = night[i, f.night], night[i, f.raised_night]
        if (
            e[i] >= 0
            and size[i] > 0
            and e[i] - 2 <= n <= e[i] + 28
            and r >= e[i]
            and i not in matched
        ):
            matched.add(i)
            kind = KINDS[0]
            sized[float(size[i])] += 1
            sized_back[float(size[i])] += f.resumed_night is not None
        elif str(cat[i]) in ("flat", "mem_flat"):
            kind = KINDS[1]
        else:
            kind = KINDS[2] if i in matched else KINDS[3]
        raised[kind] += 1
        back[kind] += f.resumed_night is not None
    out: dict[str, dict] = {k: {"raised": raised[k], "told_back": back[k]} for k in KINDS}
    out["true_by_size"] = {f"{k:+.1%}": [sized_back[k], sized[k]] for k in sorted(sized)}
    return out


def measure(seed: int, draws: Sequence[str]) -> dict[str, object]:
    """:func:`classify` on the real histories labelled with ``seed``, per re-run draw."""
    s = build(load(), seed=seed).s
    out: dict[str, object] = {"seed": seed, "series": int(s.category.size)}
    for draw in draws:
        levels, rerun, night = with_reruns(s, seed, draw=draw)
        found = detect_series(levels, memory=s.memory, threshold=0.07, online=True, rerun=rerun)
        out[draw] = classify(s, found, night)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--draws",
        default="segment,next,paired",
        help=f"re-run draws, comma-separated, of {', '.join(RERUN_DRAWS)}",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    draws = [d for d in args.draws.split(",") if d]
    bad = [d for d in draws if d not in RERUN_DRAWS]
    if bad:
        ap.error(f"--draws: unknown {', '.join(bad)}; one of {', '.join(RERUN_DRAWS)}")
    res = measure(args.seed, draws)
    for draw in draws:
        table = res[draw]
        assert isinstance(table, dict)
        for kind in KINDS:
            row = table[kind]
            share = row["told_back"] / row["raised"] if row["raised"] else 0.0
            print(
                f"{draw:10s} {kind:30s} raised {row['raised']:6d}  told back "
                f"{row['told_back']:5d} ({share:.1%})"
            )
        print(f"{draw:10s} true steps told back by size: {table['true_by_size']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
