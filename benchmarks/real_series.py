"""Evaluate online regression detection on real performance histories with planted steps.

Usage (from the repository root; one thread, the machine may be shared)::

    OMP_NUM_THREADS=1 python -m benchmarks.real_series --seed 1 --json real.json

Data: ``benchmarks/data/real_series.json.gz``, night levels of public asv result histories
(sources, commits, licences and the extraction in ``benchmarks/data/README.md``;
``benchmarks.real_extract`` made it). None of them carries annotated change points, so the
labels are built, and the procedure is the evaluation's definition:

1. **Flat segments.** A real series (a benchmark on one machine and environment, nights in
   commit order) is cut where its level moves: with ``sigma`` the robust night-to-night noise
   of its log levels (median absolute successive difference x 1.4826 / sqrt 2) and ``rm`` the
   centred rolling median of ``ROLL`` (15) nights, a segment ends where ``rm`` strays from the
   segment's reference (the median of its first ``ROLL`` values of ``rm``) by more than
   ``tol = max(3%, 2.5 x 1.2533 x sigma / sqrt(ROLL))`` (2.5 standard errors of that rolling
   median). Segments with at least ``MIN_NIGHTS`` (100) nights with data are *flat*: no
   persistent change beyond ``tol`` in them. What stays in them is the real noise: heavy
   tails, outlier nights, bimodal levels, excursions shorter than about half ``ROLL``, slow
   drift within ``tol`` and missing nights.
2. **No change.** Every flat segment is scored as it is (category ``flat``, or ``mem_flat``
   for peak memory): any flag on it is a false alarm.
3. **Planted steps.** Every flat segment is copied once per size in ``SIZES`` (+7.5% to
   +100%, improvements of -10% to -50%) and per replica, with every night from ``e`` on
   multiplied by ``1 + size``; ``e`` is drawn uniformly in ``[40, len - 30)`` from the seed.
   The copy keeps the segment's own noise, before and after the step.

Scoring is ``benchmarks.detection.evaluate`` unchanged (a flag matches when its direction
agrees and its night lies in [e - 2, e + 28], raised on or after e; "within 3 nights" =
``raised_night - e <= 2``; false alarms per 100 series-nights on the no-change category), on
flags from ``benchmarks.detection.nightbench_flags`` (``detect_series(..., online=True)``, the
nightly replay), and again as the nightly alerts them: flags raised while the stability
re-check had the benchmark dark withheld, unless their change is ``--unstable-beyond`` (3)
times the spread that darkened it (``benchmarks.real_stability``). Beside it: the same
figures by noise band (``sigma``), for regression and improvement flags apart (the nightly
files regressions only), the flat segments' flags by the night's position in its segment (a
young baseline or not), up-flags after a planted improvement (the issue of flags that follow
a big improvement), and the flags raised on the unmodified real histories (unlabelled: real
changes and false alarms together).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from benchmarks.detection import Flags, evaluate, naive_flags, nightbench_flags, print_quality
from benchmarks.real_stability import RECHECK_NIGHTS, alerting, dark_share, dark_spreads
from benchmarks.series import SeriesSet
from service.regressions.detection import detect_series
from service.regressions.rules import DEFAULT_PARAMS

DATA = Path(__file__).resolve().parent / "data" / "real_series.json.gz"
ROLL = 15
MIN_NIGHTS = 100
YOUNG = 30
"""Nights from a flat segment's start counted as judged against a young baseline."""
RERUN_DRAWS = ("segment", "next", "paired", "paired-2n")
"""How :func:`with_reruns` draws a re-run: another night of the segment, the next night, or
beside the previous night's build (the paired confirmation; its pair's noise one night's, or
two nights' for the pessimistic bound)."""
SIZES = (0.075, 0.10, 0.15, 0.20, 0.50, 1.00, -0.10, -0.30, -0.50)
NOISE_BANDS = (
    ("sigma<1%", 0.0, 0.01),
    ("sigma 1-3%", 0.01, 0.03),
    ("sigma 3-10%", 0.03, 0.10),
    ("sigma>=10%", 0.10, np.inf),
)


@dataclass
class Real:
    """One real series: ``values`` (nights,) in seconds or bytes, NaN where missing."""

    name: str
    memory: bool
    values: np.ndarray


def load(path: Path = DATA, min_nights: int = MIN_NIGHTS) -> list[Real]:
    """The real series of the data file with at least ``min_nights`` nights with data.

    Raises:
        FileNotFoundError: no data file at ``path``.
        ValueError: the file is not the format ``benchmarks.real_extract`` writes.
    """
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    if "histories" not in doc:
        raise ValueError(f"{path}: no 'histories' (not written by benchmarks.real_extract)")
    out = []
    for h in doc["histories"]:
        for bench, vals in h["series"].items():
            v = np.array([np.nan if x is None else x for x in vals], dtype=float)
            if np.isfinite(v).sum() >= min_nights:
                name = f"{h['source']}:{h['machine']}:{h['env']}:{bench}"
                out.append(Real(name, bench.rsplit(".", 1)[-1].startswith("peakmem_"), v))
    return out


def night_noise(y: np.ndarray) -> float:
    """Robust night-to-night noise (log scale, ~relative) of the nights with data."""
    d = np.diff(y[np.isfinite(y)])
    return float(np.median(np.abs(d)) * 1.4826 / np.sqrt(2)) if d.size else 0.0


def flat_segments(values: np.ndarray, min_nights: int = MIN_NIGHTS) -> list[tuple[int, int]]:
    """[start, end) of the flat segments of one series (procedure: module docstring, step 1).

    The rolling median runs over the nights with data (a gap does not hide a step), and the
    series' last ``ROLL // 2`` nights, which no centred median covers, are left out.
    """
    have = np.nonzero(np.isfinite(values))[0]
    if have.size < min_nights:
        return []
    y = np.log(values[have])
    sigma = night_noise(y)
    tol = max(0.03, 2.5 * 1.2533 * sigma / np.sqrt(ROLL))
    rm = pd.Series(y).rolling(ROLL, center=True).median().to_numpy(copy=True)
    half = ROLL // 2
    rm[:half] = rm[half]  # the first nights: judged by the first full window
    cuts, ref = [0], float(np.median(rm[:ROLL]))
    for j in range(len(y) - half):
        if abs(rm[j] - ref) > tol:
            cuts.append(j)
            ref = float(np.median(rm[j : j + ROLL]))
    cuts.append(len(y) - half)
    segs = [
        (int(have[a]), int(have[b - 1]) + 1)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        if b - a >= min_nights
    ]
    return segs


@dataclass
class Labelled:
    """The labelled set: a SeriesSet (``cv`` holds ``sigma``) and each row's source series."""

    s: SeriesSet
    origin: list[str]


def build(
    reals: list[Real], seed: int = 1, replicas: int = 1, sizes: tuple[float, ...] = SIZES
) -> Labelled:
    """Flat segments as they are plus planted-step copies (module docstring, steps 2 and 3)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[np.ndarray, bool, str, float, int, float, str]] = []
    for r in reals:
        for a, b in flat_segments(r.values):
            seg = r.values[a:b]
            sigma = night_noise(np.log(seg))
            flat = "mem_flat" if r.memory else "flat"
            rows.append((seg, r.memory, flat, 0.0, -1, sigma, r.name))
            for size in sizes:
                for _ in range(replicas):
                    e = int(rng.integers(40, len(seg) - 30))
                    planted = seg.copy()
                    planted[e:] *= 1 + size
                    while not np.isfinite(planted[e]):  # the event night has data
                        e += 1
                    rows.append(
                        (
                            planted,
                            r.memory,
                            "mem_step" if r.memory else "step",
                            size,
                            e,
                            sigma,
                            r.name,
                        )
                    )
    if not rows:
        raise ValueError("no flat segment of at least MIN_NIGHTS nights in the data")
    width = max(len(x[0]) for x in rows)
    levels = np.full((len(rows), width), np.nan)
    for i, x in enumerate(rows):
        levels[i, : len(x[0])] = x[0]
    night = np.array([x[4] for x in rows])
    s = SeriesSet(
        levels=levels,
        memory=np.array([x[1] for x in rows]),
        expected=np.zeros(levels.shape, dtype=bool),
        category=np.array([x[2] for x in rows]),
        cv=np.array([x[5] for x in rows]),
        samples=np.zeros(len(rows), dtype=int),
        event_night=night,
        event_end=night.copy(),
        event_size=np.array([x[3] for x in rows]),
    )
    return Labelled(s, [x[6] for x in rows])


def subset(s: SeriesSet, f: Flags, mask: np.ndarray) -> tuple[SeriesSet, Flags]:
    """The series where ``mask`` holds, and their flags renumbered."""
    idx = np.nonzero(mask)[0]
    new = np.full(mask.size, -1)
    new[idx] = np.arange(idx.size)
    keep = mask[f.series]
    sub = SeriesSet(**{k: getattr(s, k)[idx] for k in s.__dataclass_fields__})
    return sub, Flags(new[f.series[keep]], f.night[keep], f.raised[keep], f.up[keep])


def up_after_improvement(s: SeriesSet, f: Flags) -> dict[str, float]:
    """Up-flags raised after a planted improvement's night, per 100 series-nights after it."""
    imp = np.isin(s.category, ("step", "mem_step")) & (s.event_size < 0)
    t = np.arange(s.levels.shape[1])[None, :]
    after = (t >= s.event_night[:, None]) & np.isfinite(s.levels) & imp[:, None]
    hit = imp[f.series] & f.up & (f.night >= s.event_night[f.series])
    return {
        "series": int(imp.sum()),
        "up_flags": int(hit.sum()),
        "series_with_up_flag": int(np.unique(f.series[hit]).size),
        "per_100_series_nights": round(float(hit.sum() / max(after.sum(), 1) * 100), 4),
    }


def by_direction(s: SeriesSet, f: Flags, online: bool = True) -> dict[str, dict[str, object]]:
    """The figures of :func:`benchmarks.detection.evaluate` for regression flags and for
    improvement flags apart: ``regressions`` is what the nightly files (an improvement is
    filed to nobody), so its precision and false alarms are the ones a maintainer meets.

    Returns:
        ``{"regressions" | "improvements": {"flags", "precision",
        "false_alarms_per_100_series_nights_no_change"}}``; precision counts a flag true when
        it is the first to match a planted step of its own direction.
    """
    out: dict[str, dict[str, object]] = {}
    for name, keep in (("regressions", f.up), ("improvements", ~f.up)):
        r = evaluate(s, Flags(f.series[keep], f.night[keep], f.raised[keep], f.up[keep]), online)
        out[name] = {
            "flags": int(keep.sum()),
            "precision": r["precision"],
            "false_alarms_per_100_series_nights_no_change": r[
                "false_alarms_per_100_series_nights_no_change"
            ],
        }
    return out


def flat_flags_by_age(s: SeriesSet, f: Flags, young: int = YOUNG) -> dict[str, dict[str, object]]:
    """Flags on the flat segments (false alarms) by the night's position in its segment.

    A flat segment starts where its series' level last moved, so its first ``young`` nights
    are judged against a young baseline, as a new benchmark's are, and as every series' is
    after a raised step or improvement restarts it.

    Returns:
        ``{"first <young> nights" | "later": {"nights", "regressions", "improvements",
        "per_100_series_nights"}}``: nights with data, flags by direction, and all flags per
        100 of those nights.
    """
    flat = np.isin(s.category, ("flat", "mem_flat"))
    t = np.arange(s.levels.shape[1])[None, :]
    have = np.isfinite(s.levels) & flat[:, None]
    on = flat[f.series]
    out: dict[str, dict[str, object]] = {}
    for name, nights, mask in (
        (f"first {young} nights", (have & (t < young)).sum(), on & (f.night < young)),
        ("later", (have & (t >= young)).sum(), on & (f.night >= young)),
    ):
        out[name] = {
            "nights": int(nights),
            "regressions": int((mask & f.up).sum()),
            "improvements": int((mask & ~f.up).sum()),
            "per_100_series_nights": round(float(mask.sum() / max(nights, 1) * 100), 4),
        }
    return out


def with_reruns(
    s: SeriesSet, seed: int, threshold: float = 0.07, window: int = 28, draw: str = "segment"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The series with a confirmation re-run after every candidate night, as the nightly does.

    A night is a candidate when it alone stands ``threshold`` or more above the median of the
    nights with data among the ``window`` before it (``assess_night``'s single-night candidate; the
    runs of nights below that are raised without a re-run). Its re-run measures the same build
    on another occasion. With ``draw="segment"``, the level of a night drawn at random from the
    segment's own nights (its host noise: tails, modes, excursions): independent draws, where
    the real excursions (consecutive commits measured on one slow host) are not. With
    ``draw="next"``, the level of the next night with data (a random one after the last): the
    re-run shares whatever the host did to the commits around the candidate, the correlated
    bound. Either way times the planted step where the candidate night is at or after it.
    With ``draw="paired"``, the re-run as the paired confirmation judges it
    (:mod:`service.regressions.paired`): the baseline (the median of the window) times the
    ratio of tonight's build to the previous night's build measured at the same moment: the
    planted step's factor at the candidate night over its factor at the night before (1 when
    the step began before that night), times the pair's own noise: one night of the segment
    over the segment's median (one night's noise, host drift included, where two processes
    minutes apart on one host differ by their process noise); with ``"paired-2n"`` the ratio of
    two nights of the segment (two nights' noise: the pessimistic bound).

    Returns:
        ``(levels, rerun, night)``: the (series, columns) levels with the re-runs inserted
        after their nights (NaN-padded), True at re-run columns, and each column's night in
        ``s.levels`` (a re-run's is the night it re-ran; -1 for padding).

    Raises:
        ValueError: ``draw`` is not one of :data:`RERUN_DRAWS`.
    """
    if draw not in RERUN_DRAWS:
        raise ValueError(f"draw must be one of {RERUN_DRAWS}, got {draw!r}")
    rng = np.random.default_rng(seed)
    lv = s.levels
    t = np.arange(lv.shape[1])[None, :]
    factor = np.where(
        (s.event_night[:, None] >= 0) & (t >= s.event_night[:, None]),
        1 + s.event_size[:, None],
        1.0,
    )
    raw = lv / factor
    log = np.log(lv)
    base = np.full(lv.shape, np.nan)
    for j in range(1, lv.shape[1]):
        past = log[:, max(0, j - window) : j]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            base[:, j] = np.nanmedian(past, axis=1)
    with np.errstate(invalid="ignore"):
        cand = (log - base >= np.log1p(threshold)) & np.isfinite(log)
    rows = []
    for i in range(lv.shape[0]):
        have = np.nonzero(np.isfinite(lv[i]))[0]
        cols, marks, nights = [], [], []
        for n in have:
            cols.append(lv[i, n])
            marks.append(False)
            nights.append(n)
            if cand[i, n]:
                cols.append(_rerun_level(draw, rng, have, n, raw[i], factor[i], base[i, n]))
                marks.append(True)
                nights.append(n)
        rows.append((cols, marks, nights))
    width = max(len(r[0]) for r in rows)
    out = np.full((lv.shape[0], width), np.nan)
    rerun = np.zeros((lv.shape[0], width), dtype=bool)
    night = np.full((lv.shape[0], width), -1)
    for i, (cols, marks, nights) in enumerate(rows):
        out[i, : len(cols)] = cols
        rerun[i, : len(marks)] = marks
        night[i, : len(nights)] = nights
    return out, rerun, night


def _rerun_level(
    draw: str,
    rng: np.random.Generator,
    have: np.ndarray,
    n: int,
    raw: np.ndarray,
    factor: np.ndarray,
    base_log: float,
) -> float:
    """One candidate night's re-run level (:func:`with_reruns`, ``draw``)."""
    if draw in ("paired", "paired-2n"):
        before = have[have < n]
        a, b = rng.choice(have, 2, replace=False)
        noise = raw[a] / (raw[b] if draw == "paired-2n" else np.median(raw[have]))
        return float(
            np.exp(base_log) * factor[n] / factor[before[-1] if before.size else n] * noise
        )
    later = have[have > n]
    j = later[0] if draw == "next" and later.size else rng.choice(have[have != n])
    return float(raw[j] * factor[n])


def rerun_flags(s: SeriesSet, seed: int, draw: str = "segment") -> Flags:
    """nightbench's online flags with confirmation re-runs (:func:`with_reruns`, ``draw``), in
    the nights of ``s``."""
    levels, rerun, night = with_reruns(s, seed, draw=draw)
    found = detect_series(levels, memory=s.memory, threshold=0.07, online=True, rerun=rerun)
    rows = np.array([f.series for f in found], dtype=int)
    return Flags(
        rows,
        night[rows, [f.night for f in found]].astype(int),
        night[rows, [f.raised_night for f in found]].astype(int),
        np.array([f.direction == "regression" for f in found], dtype=bool),
    )


def score(
    lab: Labelled,
    online: bool = True,
    reruns: int | None = None,
    recheck_nights: int = RECHECK_NIGHTS,
    beyond: float = DEFAULT_PARAMS.unstable_beyond,
) -> dict[str, object]:
    """Figures of nightbench's detector and of the naive rule on the labelled set; online, also
    as the nightly alerts (flags raised while the stability re-check had the benchmark dark are
    withheld unless their change is ``beyond`` times its spread: :mod:`benchmarks.real_stability`,
    over ``recheck_nights`` nights); with ``reruns``
    (a seed), also of nightbench with confirmation re-runs (:func:`with_reruns`), drawn from the
    segment, from the next night, and paired with the previous night's build."""
    s = lab.s
    out: dict[str, object] = {
        "series": int(s.category.size),
        "nights_with_data": int(np.isfinite(s.levels).sum()),
    }
    plain = nightbench_flags(s, online)
    detectors: list[tuple[str, Callable[[SeriesSet, bool], Flags]]] = [
        ("nightbench", lambda *_: plain),
        ("naive_7%_vs_last_night", naive_flags),
    ]
    if online:  # as the nightly alerts: the stability re-check replayed (real_stability)
        dark = dark_spreads(s, plain, nights=recheck_nights)
        out["dark_share_of_latency_nights"] = round(dark_share(s, dark), 4)
        detectors.insert(
            1, ("nightbench as alerted", lambda *_: alerting(s, plain, dark, beyond=beyond))
        )
    if reruns is not None and online:
        detectors[1:1] = [
            ("nightbench re-runs", lambda s_, _: rerun_flags(s_, reruns)),
            ("nightbench re-runs next night", lambda s_, _: rerun_flags(s_, reruns, "next")),
            ("nightbench re-runs paired", lambda s_, _: rerun_flags(s_, reruns, "paired")),
            (
                "nightbench re-runs paired, 2 nights' noise",
                lambda s_, _: rerun_flags(s_, reruns, "paired-2n"),
            ),
        ]
    for name, fn in detectors:
        f = fn(s, online)
        res = evaluate(s, f, online)
        res.pop("latency_by_noise", None)  # per-sample CV bands of the synthetic set
        res["up_flags_after_improvement"] = up_after_improvement(s, f)
        res["by_direction"] = by_direction(s, f, online)
        filed = res["by_direction"]["regressions"]
        res["regressions: precision, false alarms / 100"] = [
            filed["precision"],
            filed["false_alarms_per_100_series_nights_no_change"],
        ]
        res["flat_flags_by_age"] = flat_flags_by_age(s, f)
        bands = {}
        for band, lo, hi in NOISE_BANDS:
            m = (s.cv >= lo) & (s.cv < hi)
            if m.any():
                sub, fs = subset(s, f, m)
                b = evaluate(sub, fs, online)
                bands[band] = {
                    "series": int(m.sum()),
                    **{
                        k: b.get(k)
                        for k in (
                            "precision",
                            "recall_>=10%_within_3_nights",
                            "recall_7.5%_within_3_nights",
                            "false_alarms_per_100_series_nights_no_change",
                            "delay_>=10%_median_p90_max",
                        )
                    },
                }
        res["by_noise"] = bands
        out[f"{name} {'online' if online else 'offline'}"] = res
    return out


def unmodified(reals: list[Real]) -> dict[str, object]:
    """Flags the online detector raises on the real histories as they are (unlabelled)."""
    width = max(r.values.size for r in reals)
    levels = np.full((len(reals), width), np.nan)
    for i, r in enumerate(reals):
        levels[i, : r.values.size] = r.values
    s = SeriesSet(
        levels=levels,
        memory=np.array([r.memory for r in reals]),
        expected=np.zeros(levels.shape, dtype=bool),
        category=np.array(["flat"] * len(reals)),
        cv=np.zeros(len(reals)),
        samples=np.zeros(len(reals), dtype=int),
        event_night=np.full(len(reals), -1),
        event_end=np.full(len(reals), -1),
        event_size=np.zeros(len(reals)),
    )
    f = nightbench_flags(s, True)
    nights = int(np.isfinite(levels).sum())
    return {
        "series": len(reals),
        "nights": nights,
        "flags": int(f.series.size),
        "regression_flags": int(f.up.sum()),
        "flags_per_100_series_nights": round(float(f.series.size / max(nights, 1) * 100), 3),
    }


REAL_ROWS = (
    "precision",
    "recall_>=10%",
    "recall_>=10%_within_3_nights",
    "recall_7.5%",
    "recall_7.5%_within_3_nights",
    "delay_>=10%_median_p90_max",
    "false_alarms_per_100_series_nights_no_change",
    "false_alarms_per_100_series_nights_all",
    "regressions: precision, false alarms / 100",
    "up_flags_after_improvement",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA), help="file written by benchmarks.real_extract")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=2, help="planted copies per segment and size")
    ap.add_argument(
        "--reruns",
        action="store_true",
        help="also score the detector with a confirmation re-run after each "
        "candidate night, drawn from another night of the segment and, the "
        "correlated bound, from the next night, and the paired confirmation "
        "(with_reruns; seeded by --seed)",
    )
    ap.add_argument(
        "--recheck-nights",
        type=int,
        default=RECHECK_NIGHTS,
        help="nights the replayed stability re-check judges (the nightly's "
        "NIGHTBENCH_STABILITY_RECHECK_NIGHTS)",
    )
    ap.add_argument(
        "--unstable-beyond",
        type=float,
        default=DEFAULT_PARAMS.unstable_beyond,
        help="a dark benchmark's flag alerts when its change is this many times the "
        "spread that darkened it (DetectorParams.unstable_beyond; 0: never)",
    )
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.recheck_nights < 2:
        ap.error(f"--recheck-nights: at least 2 nights, got {args.recheck_nights}")
    if args.unstable_beyond < 0:
        ap.error(f"--unstable-beyond: at least 0, got {args.unstable_beyond}")
    console = Console(stderr=True, width=150)
    try:
        reals = load(Path(args.data))
    except (OSError, ValueError, KeyError) as exc:
        console.print(f"--data: cannot read {args.data}: {exc}")
        return 2
    lab = build(reals, seed=args.seed, replicas=args.replicas)
    segs = len({o for o, c in zip(lab.origin, lab.s.category, strict=True) if "flat" in c})
    result: dict[str, object] = {
        "real_series": len(reals),
        "series_with_flat_segments": segs,
        "flat_segments": int(np.isin(lab.s.category, ("flat", "mem_flat")).sum()),
        "seed": args.seed,
        "replicas": args.replicas,
        **score(
            lab,
            reruns=args.seed if args.reruns else None,
            recheck_nights=args.recheck_nights,
            beyond=args.unstable_beyond,
        ),
        "unmodified_real_series": unmodified(reals),
    }
    print_quality(
        result,
        console,
        rows=REAL_ROWS,
        title=f"real histories, planted steps: {result['series']} series",
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
