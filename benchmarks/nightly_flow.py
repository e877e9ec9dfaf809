"""The nightly service's detection flow on noisy hosts: candidate, confirmation re-run, next night.

``benchmarks/detection.py`` scores ``detect_series`` over labelled series whose night-to-night
noise is small (night medians of 15+ samples). On a shared CPU host the level of a benchmark
moves by ~5% from process to process, and the nightly service does more than replay a series:
a candidate gets a confirmation re-run of the same build (``confirm``), which counts as one more
night, and a candidate the re-run does not reproduce stays in the history with its re-run. This
benchmark drives ``assess_night`` and ``confirm`` exactly as ``workers/night/finish.py`` does,
night by night, over simulated series:

* ``nb`` baseline nights at level 1, then ``after`` nights at ``1 + step`` (``step`` 0: no
  change; ``blip``: one night at +30%, then level 1 again);
* each night (and each re-run) is measured in ``K`` processes (``--processes``, default 1),
  each in its own *round* (a round measures every benchmark once; rounds follow one another
  minutes apart). Process ``j`` measures ``level * exp(r_j + e_j)``: ``r_j ~ N(0, round_cv)``
  is the host's speed in its round (one draw per round, independent between rounds and
  between nights; ``--round-cv``), ``e_j ~ N(0, process_cv)`` the process's own noise
  (``--process-cv``, or ``--cv`` with no round part). The night's ``Night.samples`` are the
  ``K`` process values (per-process medians), its level their median; a re-run is ``K`` more
  processes in ``K`` fresh rounds. With ``--same-round`` the ``K`` processes share one round
  (one ``r`` for the night) instead. ``K`` = 1 with no round part is the model of the tables
  before processes per night, with the same draws;

and reports, per cell, the share of steps alerted by the step's first, third and seventh
night, the share never alerted within ``after`` nights, and for series with no change the
false alerts per 100 series-nights. It compares the detector's ``max_run`` (the longest run of
nights, re-runs included, tested for persistence).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.nightly_flow --trials 300
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.nightly_flow --trials 200 --max-run 7 \\
        --round-cv 0.057 0 --process-cv 0.0341 0.05 --processes 1 3 5
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from service.regressions.detection import DetectorParams, Night, assess_night, confirm

# (kind, size) of every case; a case's position here is part of its cell's seed.
ALL_CASES: tuple[tuple[str, float], ...] = (("flat", 0.0), ("blip", 0.3)) + tuple(
    ("step", s) for s in (0.03, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30)
)


@dataclass(frozen=True)
class Noise:
    """How one night of one benchmark is measured: ``processes`` processes, two noise parts.

    Attributes:
        process_cv: sd of a process's own noise ``e`` (log scale; 0.05 ~ 5%), >= 0.
        round_cv: sd of the host's speed ``r`` in a round (log scale), >= 0; 0 draws nothing.
        processes: processes a night (and a re-run), each in its own round; >= 1.
        same_round: the night's processes share one round (one ``r``) instead of one each.
        metric: the metric the series is judged as (``--metric``; its kind's rule in
            ``service.metrics``): ``latency``, or ``cpu_instructions`` at a count's noise.

    Raises:
        ValueError: a negative cv or fewer than one process, naming the option.
    """

    process_cv: float
    round_cv: float = 0.0
    processes: int = 1
    same_round: bool = False
    metric: str = "latency"

    def __post_init__(self) -> None:
        for option, value in (("--process-cv", self.process_cv), ("--round-cv", self.round_cv)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{option} must be a finite number >= 0, got {value}")
        if self.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {self.processes}")

    @property
    def total_cv(self) -> float:
        """sd of one process's deviation, ``sqrt(round_cv^2 + process_cv^2)`` (log scale)."""
        return math.hypot(self.round_cv, self.process_cv)

    @property
    def legacy(self) -> bool:
        """One process a night, no round part: the model (and the draws) before processes."""
        return self.processes == 1 and self.round_cv == 0

    def draw(self, level: float, rng: np.random.Generator) -> tuple[float, ...]:
        """The ``processes`` per-process values (ms) of one night (or re-run) at ``level``.

        Draws the processes' own noise first (``processes`` normals), then the rounds' (one
        or ``processes`` normals, none when ``round_cv`` is 0): with one process and no round
        part this is exactly one ``rng.normal(0, process_cv)``, as before processes per night.
        """
        e = rng.normal(0, self.process_cv, self.processes)
        if self.round_cv > 0:
            e = e + rng.normal(0, self.round_cv, 1 if self.same_round else self.processes)
        return tuple(float(v) for v in level * np.exp(e))

    def label(self) -> str:
        """Short text for a table: ``round 5.7% + process 3.4%`` or ``3%``."""
        if self.round_cv == 0:
            return f"{self.process_cv:.1%}".replace(".0%", "%")
        return f"round {self.round_cv:.1%} + process {self.process_cv:.1%}"


@dataclass(frozen=True)
class Outcome:
    """What the nightly flow did with one simulated series.

    Attributes:
        alert_night: nights after the event's first night when the first alert was raised
            (0 = on the event's first night, by its re-run or the night itself); None if none.
        false_alerts: alerts raised before the event (or on a series with no change).
        nights: nights judged (those with a baseline chance: all of them).
        reruns: confirmation re-runs before the event (each a candidate: a re-run's cost).
    """

    alert_night: int | None
    false_alerts: int
    nights: int
    reruns: int = 0


def run_series(
    levels: np.ndarray,
    rerun_levels: np.ndarray,
    event: int,
    rng: np.random.Generator,
    noise: Noise,
    params: DetectorParams,
) -> Outcome:
    """Drive one series through the nightly flow.

    Args:
        levels: (nights,) true levels (ms); night i is measured as ``noise.draw(levels[i])``.
        rerun_levels: (nights,) true levels of the nights' re-runs: a step is in the build and
            comes back in its re-run, a blip (the host's bad night) does not.
        event: index of the event's first night (``len(levels)`` for no event).
        rng: noise source.
        noise: how a night and a re-run are measured (processes, round and process noise).
        params: detector constants.

    Returns:
        The Outcome.
    """
    history: list[Night] = []
    alert: int | None = None
    false_alerts = reruns = 0
    for i, (level, again) in enumerate(zip(levels, rerun_levels, strict=True)):
        tonight = Night(night=i, samples=noise.draw(level, rng))
        a = assess_night(history, tonight, metric=noise.metric, params=params)
        history.append(tonight)
        raised = a.verdict == "regression" and a.confirmed
        if a.verdict == "regression" and not a.confirmed:
            rerun = Night(night=i, samples=noise.draw(again, rng), rerun=True)
            c = confirm(history[:-1], tonight, rerun, metric=noise.metric, params=params)
            history.append(rerun)
            raised = c.verdict == "regression"
            reruns += i < event
        if raised:
            if i >= event and alert is None:
                alert = i - event
            elif i < event:
                false_alerts += 1
    return Outcome(alert, false_alerts, len(levels), reruns)


def case_levels(
    kind: str, size: float, baseline: int, after: int, flat_nights: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """True levels of one case: (nights,) nights, (nights,) their re-runs, the event's index."""
    if kind == "flat":
        levels = np.ones(flat_nights)
        return levels, levels, flat_nights
    if kind == "blip":
        again = np.ones(baseline + after)
        levels = again.copy()
        levels[baseline] = 1 + size
        return levels, again, baseline
    levels = np.r_[np.ones(baseline), np.full(after, 1 + size)]
    return levels, levels, baseline


def cell_seed(seed: int, noise: Noise, case: tuple[str, float]) -> list[int]:
    """The seed of one cell; every ``max_run`` sees the same noise.

    A legacy noise (one process, no round part) keeps the seed of the tables before processes
    per night, ``[seed, cv * 1e4, case index]``; other settings add the round part, the
    processes and ``--same-round``.
    """
    index = ALL_CASES.index(case) if case in ALL_CASES else 1000 + round(case[1] * 1e4)
    key = [seed, round(noise.process_cv * 1e4), index]
    if not noise.legacy:
        key += [round(noise.round_cv * 1e4), noise.processes, int(noise.same_round)]
    return key


def run_cell(
    noise: Noise,
    case: tuple[str, float],
    params: DetectorParams,
    args: argparse.Namespace,
    advance: Any = None,
) -> dict[str, Any]:
    """Run ``args.trials`` series of one case; the row of the table and the JSON."""
    rng = np.random.default_rng(cell_seed(args.seed, noise, case))
    kind, size = case
    alerts, false, nights, reruns = [], 0, 0, 0
    for _ in range(args.trials):
        levels, again, event = case_levels(kind, size, args.baseline, args.after, args.flat_nights)
        o = run_series(levels, again, event, rng, noise, params)
        alerts.append(o.alert_night)
        false += o.false_alerts
        reruns += o.reruns
        nights += event
        if advance is not None:
            advance()
    a = np.array([99 if x is None else x for x in alerts])
    return {
        "max_run": params.max_run,
        "cv": noise.process_cv,
        "round_cv": noise.round_cv,
        "process_cv": noise.process_cv,
        "total_cv": noise.total_cv,
        "processes": noise.processes,
        "same_round": noise.same_round,
        "case": kind,
        "size": size,
        "night1": float(np.mean(a <= 0)),
        "by3": float(np.mean(a <= 2)),
        "by7": float(np.mean(a <= 6)),
        "never": float(np.mean(a == 99)),
        "false_per_100": 100 * false / max(nights, 1),
        "reruns_per_100": 100 * reruns / max(nights, 1),
    }


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _cv(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; invalid values exit with argparse's message naming the option."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trials", type=_positive_int, default=300, help="series per cell")
    ap.add_argument(
        "--baseline", type=_positive_int, default=8, help="baseline nights before the event"
    )
    ap.add_argument("--after", type=_positive_int, default=7, help="nights from the event on")
    ap.add_argument(
        "--flat-nights", type=_positive_int, default=40, help="nights of a no-change series"
    )
    ap.add_argument(
        "--cv",
        type=_cv,
        nargs="+",
        default=[0.01, 0.03, 0.05],
        help="process noise with no round part (ignored with --process-cv)",
    )
    ap.add_argument(
        "--round-cv",
        type=_cv,
        nargs="+",
        default=None,
        help="host speed per round, paired with --process-cv (one value: all)",
    )
    ap.add_argument(
        "--process-cv",
        type=_cv,
        nargs="+",
        default=None,
        help="each process's own noise, paired with --round-cv",
    )
    ap.add_argument(
        "--processes",
        type=_positive_int,
        nargs="+",
        default=[1],
        help="processes a night (and a re-run), each in its own round",
    )
    ap.add_argument(
        "--same-round",
        action="store_true",
        help="a night's processes share one round instead of one round each",
    )
    ap.add_argument(
        "--steps",
        type=float,
        nargs="+",
        default=None,
        help="step sizes (default 0.03 to 0.30); no change and the blip always run",
    )
    ap.add_argument("--max-run", type=_positive_int, nargs="+", default=[3, 7])
    ap.add_argument(
        "--metric",
        default="latency",
        choices=["latency", "cpu_instructions"],
        help="judge the series as this metric (its kind's rule in service.metrics)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rounds, procs = args.round_cv or [0.0], args.process_cv or args.cv
    rounds = rounds * len(procs) if len(rounds) == 1 else rounds
    procs = procs * len(rounds) if len(procs) == 1 else procs
    if len(rounds) != len(procs):
        ap.error(
            f"--round-cv has {len(rounds)} values and --process-cv {len(procs)}: "
            "give as many of each, or one of either"
        )
    args.noises = [
        Noise(p, r, k, args.same_round, args.metric)
        for k in args.processes
        for r, p in zip(rounds, procs, strict=True)
    ]
    steps = ALL_CASES[2:] if args.steps is None else tuple(("step", s) for s in args.steps)
    args.cases = list(ALL_CASES[:2] + steps)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Print the table (and optionally write JSON); returns the rows."""
    args = parse_args(argv)
    table = Table(
        title=f"nightly flow, {args.baseline} baseline nights, {args.trials} series a cell"
    )
    for col in (
        "max_run",
        "noise",
        "K",
        "case",
        "alerted night 1",
        "by night 3",
        "by night 7",
        "never",
        "false alerts /100 nights",
        "re-runs /100 nights",
    ):
        table.add_column(col, justify="right")
    out = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task(
            "series", total=len(args.max_run) * len(args.noises) * len(args.cases) * args.trials
        )
        for mr in args.max_run:
            params = DetectorParams(max_run=mr)
            for noise in args.noises:
                for case in args.cases:
                    row = run_cell(noise, case, params, args, lambda: progress.advance(task))
                    out.append(row)
                    kind, size = case
                    label = kind if kind != "step" else f"step {size:+.1%}"
                    table.add_row(
                        str(mr),
                        noise.label(),
                        str(noise.processes),
                        label,
                        f"{row['night1']:.2f}",
                        f"{row['by3']:.2f}",
                        f"{row['by7']:.2f}",
                        f"{row['never']:.2f}",
                        f"{row['false_per_100']:.3f}",
                        f"{row['reruns_per_100']:.2f}",
                    )
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
