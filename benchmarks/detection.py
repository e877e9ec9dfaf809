"""Evaluate regression detection on seeded labelled series, and time it.

Usage (from the repository root; the machine may be shared, so pin one thread)::

    OMP_NUM_THREADS=1 python -m benchmarks.detection --series 20000 --seed 1
    OMP_NUM_THREADS=1 python -m benchmarks.detection --speed 100000 --repeat 3

The first reports, online (night by night) and offline, for nightbench's detector and for the
naive "7% against last night" rule side by side: precision, recall per step size (eventual and
within 3 nights of the step), false alarms per 100 series-nights on series with no change,
blips / small steps / expected steps flagged, and the detection delay. The second times
``detect_series`` on ``N`` series x 365 nights (and night medians from raw samples).

Labels (see ``benchmarks.series``): persistent steps of |size| >= 7.5% and drifts of >= 10%
must be flagged; steps of 5% are a grey zone (flags neither count for nor against); steps of
<= 3%, expected steps, one-night blips, benign drift and series with no change must not be.
A flag matches an event when its direction agrees and its ``night`` lies in [event - 2,
event end + 28]; the first match is a true positive, a second flag for the same step a false
one (a drift may be flagged in stages); online, a flag must also be raised on or after the
event's night. The delay is ``raised_night - event night`` (online);
"within 3 nights" means raised on the step's first, second or third night (delay <= 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.series import NO_CHANGE, SeriesSet, generate
from service.regressions.detection import detect_series
from service.regressions.robust import median_last

MATCH_AFTER = 28


@dataclass
class Flags:
    """Flags of a detector as parallel arrays."""

    series: np.ndarray
    night: np.ndarray
    raised: np.ndarray
    up: np.ndarray


def nightbench_flags(s: SeriesSet, online: bool, threshold: float = 0.07) -> Flags:
    found = detect_series(
        s.levels, memory=s.memory, threshold=threshold, expected=s.expected, online=online
    )
    return Flags(
        np.array([f.series for f in found], dtype=int),
        np.array([f.night for f in found], dtype=int),
        np.array([f.raised_night for f in found], dtype=int),
        np.array([f.direction == "regression" for f in found], dtype=bool),
    )


def naive_flags(s: SeriesSet, online: bool, threshold: float = 0.07) -> Flags:
    """The naive rule: tonight against the last night with data, beyond +-threshold."""
    lv = s.levels
    present = ~np.isnan(lv)
    # last night with data before each night
    idx = np.where(present, np.arange(lv.shape[1])[None, :], -1)
    prev_idx = np.maximum.accumulate(idx, axis=1)
    prev_idx = np.concatenate([np.full((lv.shape[0], 1), -1), prev_idx[:, :-1]], axis=1)
    prev = np.take_along_axis(lv, np.maximum(prev_idx, 0), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        change = lv / prev - 1
    ok = present & (prev_idx >= 0)
    up = ok & (change > threshold)
    down = ok & (change < -threshold)
    r, n = np.nonzero(up | down)
    last = lv.shape[1] - 1 - np.argmax(present[:, ::-1], axis=1)
    raised = n if online else last[r]
    return Flags(r, n, raised, up[r, n])


def evaluate(s: SeriesSet, f: Flags, online: bool) -> dict[str, object]:
    """Score flags against the labels (see the module docstring)."""
    cat = s.category
    size = s.event_size
    e, end = s.event_night, s.event_end
    step = np.isin(cat, ("step", "mem_step"))
    positive = (step & (np.abs(size) >= 0.075)) | (cat == "drift")
    grey = step & np.isclose(np.abs(size), 0.05)
    fr = f.series
    in_window = (e[fr] >= 0) & (f.night >= e[fr] - 2) & (f.night <= end[fr] + MATCH_AFTER)
    if online:
        in_window &= f.raised >= e[fr]  # raised before the event happened: not a detection
    same_dir = f.up == (size[fr] > 0)
    match = in_window & same_dir
    # first matching flag per positive series
    order = np.lexsort((f.raised, f.night, fr))
    tp = np.zeros(fr.size, dtype=bool)
    seen: set[int] = set()
    delay = np.full(cat.size, -1)
    loc_err = np.full(cat.size, -1)
    for i in order:
        r = int(fr[i])
        if match[i] and positive[r] and r not in seen:
            seen.add(r)
            tp[i] = True
            delay[r] = int(f.raised[i] - e[r])
            loc_err[r] = int(abs(f.night[i] - e[r]))
    neutral = match & (grey[fr] | (positive[fr] & ~tp & (cat[fr] == "drift")))
    fp = ~tp & ~neutral
    detected = delay >= 0
    nights_present = (~np.isnan(s.levels)).sum(axis=1)
    no_change = np.isin(cat, NO_CHANGE)

    def frac(mask_series: np.ndarray, flagged: np.ndarray) -> float | None:
        n = int(mask_series.sum())
        return None if n == 0 else round(float(flagged[mask_series].mean()), 4)

    any_after = np.zeros(cat.size, dtype=bool)
    near = (e[fr] >= 0) & (f.night >= e[fr] - 2) & (f.night <= end[fr] + MATCH_AFTER)
    any_after[fr[near]] = True
    out: dict[str, object] = {
        "flags": int(fr.size),
        "precision": round(float(tp.sum() / max(tp.sum() + fp.sum(), 1)), 4),
        "false_alarms_per_100_series_nights_no_change": round(
            float(fp[no_change[fr]].sum() / max(nights_present[no_change].sum(), 1) * 100), 4
        ),
        "false_alarms_per_100_series_nights_all": round(
            float(fp.sum() / max(nights_present.sum(), 1) * 100), 4
        ),
        "blips_flagged": frac(np.isin(cat, ("blip", "mem_blip")), any_after),
        "small_steps_flagged (<=3%)": frac(step & (np.abs(size) <= 0.03), any_after),
        "grey_steps_flagged (5%)": frac(grey, any_after),
        "expected_steps_flagged": frac(cat == "expected_step", any_after),
        "benign_drift_flagged": frac(cat == "benign_drift", any_after),
        "drift_recall": frac(cat == "drift", detected),
    }
    recall = {}
    for sz in sorted({float(x) for x in np.abs(size[step & positive])}):
        m = step & positive & np.isclose(np.abs(size), sz)
        row = {"n": int(m.sum()), "recall": frac(m, detected)}
        if online:
            row["within_3_nights"] = frac(m, detected & (delay <= 2))
        else:
            row["located_within_1_night"] = frac(m, detected & (loc_err <= 1))
        recall[f"{sz:.3g}"] = row
    out["recall_by_step_size"] = recall
    big = step & positive & (np.abs(size) >= 0.10)
    at75 = step & np.isclose(np.abs(size), 0.075)
    out["recall_>=10%"] = frac(big, detected)
    out["recall_7.5%"] = frac(at75, detected)
    if online:
        out["recall_>=10%_within_3_nights"] = frac(big, detected & (delay <= 2))
        out["recall_7.5%_within_3_nights"] = frac(at75, detected & (delay <= 2))
        d = delay[big & detected]
        if d.size:
            out["delay_>=10%_median_p90_max"] = [
                float(np.median(d)),
                float(np.percentile(d, 90)),
                int(d.max()),
            ]
        bands = {}
        for name, lo, hi in (
            ("cv<1%", 0, 0.01),
            ("cv 1-2.5%", 0.01, 0.025),
            ("cv 2.5-5%", 0.025, 1),
        ):
            band = (~s.memory) & (s.cv >= lo) & (s.cv < hi)
            bands[name] = {
                "7.5%_within_3": frac(at75 & band, detected & (delay <= 2)),
                ">=10%_within_3": frac(big & band, detected & (delay <= 2)),
                "fa_per_100_no_change": round(
                    float(
                        fp[(no_change & band)[fr]].sum()
                        / max(nights_present[no_change & band].sum(), 1)
                        * 100
                    ),
                    4,
                ),
            }
        out["latency_by_noise"] = bands
    else:
        out["located_within_1_night_>=7.5%"] = frac(step & positive, detected & (loc_err <= 1))
    return out


def quality(n_series: int, nights: int, seed: int, console: Console) -> dict[str, object]:
    t0 = time.perf_counter()
    s = generate(n_series, nights=nights, seed=seed)
    console.print(
        f"generated {n_series} series x {nights} nights in "
        f"{time.perf_counter() - t0:.1f} s (seed {seed})"
    )
    result: dict[str, object] = {"series": n_series, "nights": nights, "seed": seed}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("detecting", total=4)
        for name, fn in (("nightbench", nightbench_flags), ("naive_7%_vs_last_night", naive_flags)):
            for online in (True, False):
                t1 = time.perf_counter()
                flags = fn(s, online)
                secs = time.perf_counter() - t1
                key = f"{name} {'online' if online else 'offline'}"
                result[key] = {"seconds": round(secs, 2), **evaluate(s, flags, online)}
                progress.advance(task)
    return result


def speed(n_series: int, nights: int, repeat: int, console: Console) -> dict[str, object]:
    s = generate(n_series, nights=nights, seed=12345)
    times: dict[str, list[float]] = {"online": [], "offline": []}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing", total=2 * repeat + repeat)
        for _ in range(repeat):
            for online in (True, False):
                t0 = time.perf_counter()
                detect_series(s.levels, memory=s.memory, expected=s.expected, online=online)
                times["online" if online else "offline"].append(time.perf_counter() - t0)
                progress.advance(task)
        # Night medians from raw samples (15 per night, the harness minimum), in blocks.
        rng = np.random.default_rng(0)
        med = []
        for _ in range(repeat):
            total = 0.0
            for b0 in range(0, n_series, 2000):
                block = rng.standard_normal((min(2000, n_series - b0), nights, 15))
                t0 = time.perf_counter()
                median_last(block)
                total += time.perf_counter() - t0
            med.append(total)
            progress.advance(task)
    out: dict[str, object] = {"series": n_series, "nights": nights, "repeat": repeat}
    for k, v in (*times.items(), ("night_medians_from_15_samples", med)):
        out[k] = {
            "median_s": round(statistics.median(v), 2),
            "min_s": round(min(v), 2),
            "all_s": [round(x, 2) for x in v],
        }
    return out


QUALITY_ROWS = (
    "precision",
    "recall_>=10%",
    "recall_>=10%_within_3_nights",
    "recall_7.5%",
    "recall_7.5%_within_3_nights",
    "false_alarms_per_100_series_nights_no_change",
    "false_alarms_per_100_series_nights_all",
    "blips_flagged",
    "small_steps_flagged (<=3%)",
    "grey_steps_flagged (5%)",
    "expected_steps_flagged",
    "benign_drift_flagged",
    "drift_recall",
    "delay_>=10%_median_p90_max",
    "located_within_1_night_>=7.5%",
    "seconds",
)


def print_quality(
    result: dict[str, object], console: Console, *, title: str, rows: Sequence[str] = QUALITY_ROWS
) -> None:
    """Print the scored figures of :func:`evaluate` (one column per detector) as a table.

    Args:
        result: detector name -> its figures (a dict holding ``precision``); other keys skipped.
        console: where to print.
        title: the table's title.
        rows: the figures to show, in order; a figure a detector lacks prints empty.
    """
    keys = [k for k in result if isinstance(result[k], dict) and "precision" in result[k]]
    table = Table(title=title)
    table.add_column("measure")
    for k in keys:
        table.add_column(k)
    for row in rows:
        table.add_row(row, *(str(result[k].get(row, "")) for k in keys))  # type: ignore[union-attr]
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=20000, help="labelled series to evaluate")
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", type=int, default=0, help="time N series instead of scoring")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    console = Console(stderr=True, width=150)
    if args.speed:
        result = speed(args.speed, args.nights, args.repeat, console)
    else:
        result = quality(args.series, args.nights, args.seed, console)
        print_quality(
            result,
            console,
            title=(f"detection quality, {result['series']} series x {result['nights']} nights"),
        )
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
