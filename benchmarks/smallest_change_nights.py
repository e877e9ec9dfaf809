"""The smallest detectable change of every CPU latency series of a real nightbench store, set
against what the nightly flow (``benchmarks/nightly_flow.py``) finds for the same noise.

``benchmarks/smallest_change.py`` checks the formula (``service/regressions/sensitivity.py``) on
chosen noise levels and a long baseline; this one takes the noise and baseline of each series a
real store holds (``make nightly`` after a few nights), so the numbers a person reads in
``nightbench report`` and on the model page are checked where they are shown. Method:

1. **The store's series.** Every CPU latency series (device ``cpu``, metric ``latency``) is
   read as the history API reads it (:func:`service.results.history.model_history`: nightly and
   ingested runs, a night's level the median of its processes' medians, in ms), cut where the
   detector's baseline starts (:func:`since_last_reset`: a night marked expected, or the first
   night at the new level of a raised step). A series with at least ``--nights`` nights since
   then is kept. Its noise and window are
   :func:`~service.regressions.sensitivity.window_noise_of` (the detector's scaled median
   absolute successive difference of the last ``window`` log levels; ``k`` = nights in that
   window), its smallest detectable change the formula at its threshold
   (``Settings.threshold_for``: 7% unless the settings give the series one). Where the history
   API gives the series another value (``SeriesHistory.smallest_change``, which cuts the
   series where the detector does too), a line says so: the two reads disagree.
2. **The flow at the same noise.** Series whose noise agrees to ``--noise-step`` (0.05%) are
   one group, simulated once: ``--trials`` series of ``k`` baseline nights at level 1, each
   night one value ``exp(e)``, ``e ~ N(0, noise)`` (``Noise(process_cv=noise, processes=1)``:
   the measured noise is the night level's), then a step; ``run_cell`` drives ``assess_night``
   and ``confirm`` through them as the nightly service does and reports ``by3``, the share of
   series raised by the step's third night. ``by3`` is read at the formula's step times 1,
   then walking down (0.9, 0.8, ... 0.5) while it stays at or above 95%, or up (1.1, 1.2, 1.4,
   1.7, 2) until it gets there; the flow's 95% step is the linear interpolation of the crossing
   between the two bracketing steps (None when the walk ends without one). Three nights after
   the step are simulated (``by3`` needs no more).
3. **Agreement.** The difference is the flow's 95% step minus the formula's, in percentage
   points of the level (+: the flow needs a larger step than the formula claims); beside it the
   crossing's Monte Carlo standard error (:func:`crossing_se`). A series agrees when the
   difference is within ``max(--tolerance-pp, --tolerance-rel x formula)``: 2 points or 10% of
   the formula's step, whichever is larger. Why both: on simulated noise of 0.3% to 6% at 5
   baseline nights (the formula +7.5% to +30%) the two agree within 0.6 points with 400 trials,
   and the crossing's standard error there is 0.3 to 0.9 points, so 2 points is 2 to 3 of it.
   The nights of a loaded CPU host stray by 5% to 100% (the first ``make nightly`` store of
   five nights: formula +26% to +1300%); there ``by3`` climbs slowly around 95% (0.91 to
   0.97 at the formula's step), the crossing's standard error is several points and grows
   with the step, and a fixed number of points would test the Monte Carlo, not the formula.

The group's simulated noise is rounded (``--noise-step``), so a series' own formula and its
group's differ by at most ~0.1 point at 5 nights; the ``by3`` column is read at the group's
formula step. Simulated draws are seeded (``--seed``): the flow's numbers do not depend on the
machine's load; the store's levels do.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.smallest_change_nights \\
        --data-dir .nightbench --nights 5 --trials 400 --json nights.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlalchemy.orm import Session

from benchmarks.nightly_flow import Noise, run_cell
from service.benchmarks import benchmark_name
from service.config import Settings, settings_with
from service.db import session_scope
from service.models import Confirmation
from service.regressions.rules import DEFAULT_PARAMS, DetectorParams
from service.regressions.sensitivity import (
    POWER,
    series_smallest_change,
    smallest_detectable_change,
    window_noise_of,
)
from service.results.catalog import list_models
from service.results.history import SeriesHistory, model_history
from service.results.history_queries import StoredVerdict, stored_regressions
from service.results.points import HistoryFilter

DEVICE = "cpu"
METRIC = "latency"
DOWN = (0.9, 0.8, 0.7, 0.6, 0.5)
"""Factors of the formula's step tried below it, in order, while ``by3`` stays >= 95%."""
UP = (1.1, 1.2, 1.4, 1.7, 2.0)
"""Factors tried above it, in order, until ``by3`` reaches 95%."""
AFTER_NIGHTS = 3
"""Nights simulated from the step on: ``by3`` reads the first three."""
TOLERANCE_PP = 2.0
"""Default ``--tolerance-pp`` (module docstring, item 3)."""
TOLERANCE_REL = 0.10
"""Default ``--tolerance-rel`` (module docstring, item 3)."""
NOISE_STEP = 0.0005
"""Default ``--noise-step``: series whose noise rounds to the same multiple share a simulation."""


@dataclass(frozen=True)
class StoredSeries:
    """One CPU latency series of the store, cut at its last reset.

    Attributes:
        benchmark: ``model:mode:device[:compiler]``.
        machine_id: the machine it is measured on (None: unknown).
        key: its ``series_key``.
        levels: (n,) night levels since its last reset, ms, oldest first (no NaN).
        nights: all its nights in the store (before the reset too).
        threshold: its relative threshold (0.07 = 7%).
        api_smallest: the smallest detectable change the history API gives it (relative),
            None without a baseline.
    """

    benchmark: str
    machine_id: int | None
    key: str
    levels: np.ndarray
    nights: int
    threshold: float
    api_smallest: float | None


def since_last_reset(s: SeriesHistory, stored: dict[int, StoredVerdict]) -> int:
    """Index of the night the next night's baseline starts at: the detector's last reset
    (``detection._baseline_start``; :class:`~service.regressions.baseline.SeriesLevels`), read
    from the stored verdicts as the history API reads them.

    A step marked expected resets at its first night; a raised step (an improvement, or a
    regression its confirmation reproduced) at the first night at its new level. A raised step
    the series came back from (``DetectorParams.return_nights``) is not told apart: it is not
    in the stored verdicts.

    Args:
        s: the series as :func:`~service.results.history.model_history` returns it.
        stored: its stored verdicts, ``{result id: StoredVerdict}`` (``stored_regressions``).

    Returns:
        An index into the series' nights, 0 when it never reset.
    """
    position = {int(r): i for i, r in enumerate(s.result_id.tolist())}
    start = 0
    for result_id, (_, direction, confirmation, state, first_id) in stored.items():
        i = position.get(result_id)
        if i is None:
            continue
        raised = direction == "improvement" or confirmation == Confirmation.REPRODUCED
        if state == "expected" or raised:
            start = max(start, min(position.get(first_id, i), i))
    return start


def cpu_latency_series(
    session: Session, *, settings: Settings, min_nights: int
) -> list[StoredSeries]:
    """Every CPU latency series with at least ``min_nights`` nights since its last reset.

    Args:
        session: an open session on the store.
        settings: the thresholds (``Settings.threshold_for``).
        min_nights: fewest nights since the last reset a series needs to be kept.

    Returns:
        The series, by benchmark then machine.
    """
    _, rows = list_models(session, since=date(1, 1, 1), days=0)
    models = sorted({r[0] for r in rows if r[2] == DEVICE and r[4] == METRIC})
    wanted = HistoryFilter(metric=METRIC, device=DEVICE)
    out = []
    for model in models:
        history = model_history(session, model=model, filters=wanted, settings=settings)
        stored = stored_regressions(session, [s.key for s in history.series])
        for s in history.series:
            since = since_last_reset(s, stored.get(s.key, {}))
            levels = np.asarray(s.median[since:], dtype=float)
            levels = levels[~np.isnan(levels)]
            if levels.size < min_nights:
                continue
            out.append(
                StoredSeries(
                    benchmark=benchmark_name(model, s.mode, s.device, s.compiler),
                    machine_id=s.machine_id,
                    key=s.key,
                    levels=levels,
                    nights=len(s),
                    threshold=s.threshold,
                    api_smallest=s.smallest_change,
                )
            )
    out.sort(key=lambda x: (x.benchmark, x.machine_id or 0))
    return out


@dataclass(frozen=True)
class FlowFinding:
    """What the nightly flow found at one noise, window and threshold.

    Attributes:
        noise: the simulated night-to-night noise (log scale), rounded to the group's.
        nights: baseline nights before the step (the window's ``k``).
        threshold: relative threshold.
        formula: the formula's smallest detectable change at ``noise`` (relative).
        step: the step raised by its third night in 95% of series (relative, interpolated),
            None when the walk ended without a crossing.
        step_se: the Monte Carlo standard error of ``step`` (relative; :func:`crossing_se`),
            None without a crossing.
        by3_at_formula: the share raised by the third night at the formula's step.
        cells: ``((factor, step, by3), ...)`` evaluated, by step.
    """

    noise: float
    nights: int
    threshold: float
    formula: float
    step: float | None
    step_se: float | None
    by3_at_formula: float
    cells: tuple[tuple[float, float, float], ...]


def crossing(lo: tuple[float, float], hi: tuple[float, float], power: float = POWER) -> float:
    """The step at which ``by3`` reaches ``power`` on the line through ``lo`` and ``hi``,
    ``(step, by3)`` pairs with ``lo``'s share below ``power`` and ``hi``'s at or above it."""
    return lo[0] + (power - lo[1]) / (hi[1] - lo[1]) * (hi[0] - lo[0])


def crossing_se(
    lo: tuple[float, float], hi: tuple[float, float], trials: int, power: float = POWER
) -> float:
    """The standard error of :func:`crossing` from the binomial errors of the two shares
    (``trials`` series each; the delta method): small where ``by3`` climbs steeply between the
    two steps, large where it is flat."""
    width, rise = hi[0] - lo[0], hi[1] - lo[1]
    d_lo = -width * (hi[1] - power) / rise**2
    d_hi = -width * (power - lo[1]) / rise**2
    var = [max(b * (1 - b), 1 / trials) / trials for b in (lo[1], hi[1])]
    return math.sqrt(d_lo**2 * var[0] + d_hi**2 * var[1])


def flow_step(
    noise: float,
    nights: int,
    threshold: float,
    *,
    trials: int,
    seed: int,
    params: DetectorParams = DEFAULT_PARAMS,
    advance: Callable[[], None] | None = None,
) -> FlowFinding:
    """The step the nightly flow raises by the step's third night in :data:`POWER` of series.

    Args:
        noise: night-to-night noise on the log scale (0.02 ≈ 2%), > 0.
        nights: baseline nights before the step (>= ``params.min_baseline``).
        threshold: relative threshold (0.07 = 7%).
        trials: simulated series per step tried.
        seed: the seed (each cell's own from it, the noise and the step: ``cell_seed``).
        params: the detector's constants.
        advance: called once per simulated series (a progress bar).

    Returns:
        The FlowFinding (module docstring, item 2, for the walk and the interpolation).
    """
    formula = float(smallest_detectable_change(noise, nights, threshold, params=params))
    args = argparse.Namespace(
        trials=trials, baseline=nights, after=AFTER_NIGHTS, flat_nights=1, seed=seed
    )
    sim = Noise(process_cv=noise, processes=1, metric=METRIC, threshold=threshold)
    cells: list[tuple[float, float, float]] = []

    def by3(factor: float) -> tuple[float, float]:
        step = round(formula * factor, 4)
        share = float(run_cell(sim, ("step", step), params, args, advance)["by3"])
        cells.append((factor, step, share))
        return step, share

    at = last = by3(1.0)
    above = at[1] >= POWER
    found = found_se = None
    for factor in DOWN if above else UP:
        cell = by3(factor)
        if (cell[1] >= POWER) != above:
            lo, hi = (cell, last) if above else (last, cell)
            found, found_se = crossing(lo, hi), crossing_se(lo, hi, trials)
            break
        last = cell
    return FlowFinding(
        noise, nights, threshold, formula, found, found_se, at[1], tuple(sorted(cells))
    )


def noise_group(
    noise: float, nights: int, threshold: float, step: float
) -> tuple[float, int, float]:
    """The simulation a series shares: its noise rounded to a multiple of ``step`` (log scale,
    at least one step), its window nights and its threshold."""
    rounded = max(round(noise / step), 1) * step
    return round(rounded, 6), nights, threshold


def compare(
    series: Sequence[StoredSeries],
    *,
    trials: int,
    seed: int,
    noise_step: float = NOISE_STEP,
    params: DetectorParams = DEFAULT_PARAMS,
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """The formula's smallest detectable change of each series beside the flow's 95% step.

    Args:
        series: the store's series (:func:`cpu_latency_series`).
        trials: simulated series per step tried.
        seed: the simulations' seed.
        noise_step: the rounding of noise into groups (log scale; 0.0005 = 0.05%).
        params: the detector's constants.
        console: where the progress bar is drawn (default: stderr).

    Returns:
        One row per series: ``benchmark``, ``machine_id``, ``series_key``, ``nights`` (in the
        store), ``since_reset`` (nights since the last reset), ``window`` (k), ``noise`` (log
        scale), ``threshold``, ``formula`` (relative), ``api_smallest`` (relative or None),
        ``group_noise``, ``flow_step`` (relative or None), ``flow_step_se`` (its Monte Carlo
        standard error, relative, or None), ``diff_pp`` (flow minus formula,
        percentage points, or None), ``by3_at_formula`` and ``cells`` (``[factor, step,
        by3]``).
    """
    measured = []
    for s in series:
        noise, k = window_noise_of(s.levels, memory=False, params=params)
        formula = series_smallest_change(s.levels, s.threshold, memory=False, params=params)
        measured.append((s, noise, k, formula, noise_group(noise, k, s.threshold, noise_step)))
    groups = sorted({m[4] for m in measured if m[3] is not None})
    findings: dict[tuple[float, int, float], FlowFinding] = {}
    with Progress(console=console or Console(stderr=True, emoji=False)) as progress:
        task = progress.add_task("noise groups", total=len(groups))
        cells = progress.add_task("series simulated", total=None)
        for g in groups:
            progress.update(task, description=f"noise {g[0]:.2%}, {g[1]} nights")
            findings[g] = flow_step(
                *g,
                trials=trials,
                seed=seed,
                params=params,
                advance=lambda: progress.advance(cells),
            )
            progress.advance(task)
    rows = []
    for s, noise, k, formula, g in measured:
        f = findings.get(g)
        step = None if f is None else f.step
        rows.append(
            {
                "benchmark": s.benchmark,
                "machine_id": s.machine_id,
                "series_key": s.key,
                "nights": s.nights,
                "since_reset": int(s.levels.size),
                "window": k,
                "noise": noise,
                "threshold": s.threshold,
                "formula": formula,
                "api_smallest": s.api_smallest,
                "group_noise": g[0],
                "flow_step": step,
                "flow_step_se": None if f is None else f.step_se,
                "diff_pp": None if step is None or formula is None else 100 * (step - formula),
                "by3_at_formula": None if f is None else f.by3_at_formula,
                "cells": [] if f is None else [list(c) for c in f.cells],
            }
        )
    return rows


def agrees(row: dict[str, Any], tolerance_pp: float, tolerance_rel: float) -> bool:
    """Whether a row's flow and formula agree: ``|diff_pp|`` within ``tolerance_pp`` points or
    within ``tolerance_rel`` times the formula's step (False without a flow step)."""
    if row["diff_pp"] is None or row["formula"] is None:
        return False
    return abs(row["diff_pp"]) <= max(tolerance_pp, 100 * tolerance_rel * row["formula"])


def summary(
    rows: Sequence[dict[str, Any]], tolerance_pp: float, tolerance_rel: float = 0.0
) -> dict[str, Any]:
    """How many series agree (:func:`agrees`); the median and largest absolute difference
    (points) and relative difference (fraction of the formula's step); the range and median of
    the flow's ``by3`` at the formula's step. None where no series has the value."""
    both = [r for r in rows if r["diff_pp"] is not None and r["formula"] is not None]
    diffs = [abs(r["diff_pp"]) for r in both]
    rels = [abs(r["diff_pp"]) / (100 * r["formula"]) for r in both]
    shares = [r["by3_at_formula"] for r in rows if r.get("by3_at_formula") is not None]
    return {
        "series": len(rows),
        "compared": len(diffs),
        "agree": sum(agrees(r, tolerance_pp, tolerance_rel) for r in rows),
        "tolerance_pp": tolerance_pp,
        "tolerance_rel": tolerance_rel,
        "median_abs_diff_pp": statistics.median(diffs) if diffs else None,
        "max_abs_diff_pp": max(diffs) if diffs else None,
        "median_abs_rel_diff": statistics.median(rels) if rels else None,
        "max_abs_rel_diff": max(rels) if rels else None,
        "by3_at_formula": (min(shares), statistics.median(shares), max(shares)) if shares else None,
    }


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "—"
    return f"{x:+.1%}" if signed else f"{x:.2%}"


def print_table(rows: Sequence[dict[str, Any]], args: argparse.Namespace, console: Console) -> None:
    """The per-series table and the summary line."""
    table = Table(
        title=f"smallest detectable change of each CPU latency series vs the nightly flow "
        f"({args.trials} series a step, seed {args.seed}; flow: step raised by its third "
        f"night in {POWER:.0%} of series)"
    )
    for col in (
        "benchmark",
        "machine",
        "nights",
        "noise",
        "formula",
        "flow 95%",
        "± MC (pp)",
        "flow − formula (pp)",
        "flow by3 at formula",
    ):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    for r in sorted(rows, key=lambda r: (r["noise"], r["benchmark"])):
        diff = r["diff_pp"]
        table.add_row(
            r["benchmark"],
            str(r["machine_id"]),
            f"{r['since_reset']} (k {r['window']})",
            _pct(math.expm1(r["noise"]), signed=False),
            _pct(r["formula"]),
            _pct(r["flow_step"]),
            "—" if r["flow_step_se"] is None else f"{100 * r['flow_step_se']:.1f}",
            "—" if diff is None else f"{diff:+.1f}",
            "—" if r["by3_at_formula"] is None else f"{r['by3_at_formula']:.2f}",
        )
    console.print(table)
    s = summary(rows, args.tolerance_pp, args.tolerance_rel)
    console.print(summary_line(s))
    console.print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def summary_line(s: dict[str, Any]) -> str:
    """The summary (:func:`summary`) in one sentence."""

    def num(x: float | None, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    shares = s["by3_at_formula"]
    at = (
        ""
        if shares is None
        else f"; at the formula's step the flow raised {shares[0]:.2f} to {shares[2]:.2f} "
        f"(median {shares[1]:.2f}) of series by their third night"
    )
    return (
        f"{s['agree']} of {s['series']} series agree within ±max({s['tolerance_pp']:g} points, "
        f"{s['tolerance_rel']:.0%} of the formula) ({s['compared']} with a flow step); "
        f"|flow − formula| median {num(s['median_abs_diff_pp'], '.1f')} points "
        f"({num(s['median_abs_rel_diff'], '.1%')} of the formula), max "
        f"{num(s['max_abs_diff_pp'], '.1f')} points ({num(s['max_abs_rel_diff'], '.1%')}){at}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=None, help="the store's data dir")
    where.add_argument("--database-url", default=None, help="the store's SQLAlchemy URL")
    ap.add_argument("--nights", type=int, default=5, help="fewest nights since the last reset")
    ap.add_argument("--trials", type=int, default=400, help="simulated series per step tried")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--tolerance-pp",
        type=float,
        default=TOLERANCE_PP,
        help="agreement: |flow - formula| within this many percentage points (or --tolerance-rel)",
    )
    ap.add_argument(
        "--tolerance-rel",
        type=float,
        default=TOLERANCE_REL,
        help="agreement: |flow - formula| within this fraction of the formula (or --tolerance-pp)",
    )
    ap.add_argument(
        "--noise-step",
        type=float,
        default=NOISE_STEP,
        help="noise rounding of the simulated groups (log scale; 0.0005 = 0.05%%)",
    )
    ap.add_argument("--json", default=None, help="write the rows and the summary here")
    args = ap.parse_args(argv)
    if args.nights < DEFAULT_PARAMS.min_baseline:
        ap.error(f"--nights must be at least {DEFAULT_PARAMS.min_baseline} (a baseline)")
    if args.trials < 1 or args.noise_step <= 0:
        ap.error("--trials must be >= 1 and --noise-step > 0")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Read the store, simulate, print the table (and optionally write JSON); the rows."""
    args = parse_args(argv)
    changes: dict[str, Any] = {}
    if args.data_dir is not None:
        changes = {"data_dir": args.data_dir, "database_url": None}
    elif args.database_url is not None:
        changes = {"database_url": args.database_url}
    settings = settings_with(**changes)
    with session_scope(settings.effective_database_url) as session:
        series = cpu_latency_series(session, settings=settings, min_nights=args.nights)
        session.rollback()  # read only
    console = Console(width=160, emoji=False)  # ":train:" is a mode, not an emoji
    for s in series:
        mine = series_smallest_change(s.levels, s.threshold, memory=False)
        if mine != s.api_smallest and not (
            mine is not None
            and s.api_smallest is not None
            and math.isclose(mine, s.api_smallest, rel_tol=1e-9)
        ):
            console.print(
                f"[yellow]{s.benchmark}: the history API gives {_pct(s.api_smallest)} "
                f"but the detector's baseline since its last reset gives "
                f"{_pct(mine)} ({s.levels.size} nights)[/]"
            )
    rows = compare(series, trials=args.trials, seed=args.seed, noise_step=args.noise_step)
    print_table(rows, args, console)
    if args.json:
        totals = summary(rows, args.tolerance_pp, args.tolerance_rel)
        out = {"rows": rows, "summary": totals, "args": vars(args)}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return rows


if __name__ == "__main__":
    main()
