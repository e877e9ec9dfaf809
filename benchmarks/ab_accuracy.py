"""The PR A/B's false alarm rate (A/A) and its power against planted slowdowns, measured for real.

Every trial is one :func:`workers.ab.run.run_ab` on this host, builds by the ``checkout``
provider (each commit built once, reused by every trial), the default processes and samples:

* ``planted``: a temporary git repository holding a package ``abwork`` whose benchmark
  (``python bench.py``, a command benchmark) runs a pure-Python loop of ``ITERATIONS`` steps a
  sample. Commits: the base (N), an A/A head that changes only a comment, a head with N x 1.10
  and one with N x 1.20 (planted +10% and +20%).
* ``suite``: A/A of real suite models (``tokbag:eval:cpu`` by default) between two ordinary
  commits of the demo ``minitok`` package (:func:`workers.demo.minitok.make_package_repository`
  with no culprit), measured through the suite, so that its process-to-process noise (allocator,
  pages) is in the figures; every metric the A/B judges (latency, peak memory) counts.

Within a trial round the scenarios run in an order shuffled by ``--seed``, so that the host's
drift falls on all of them alike. Per scenario: runs, runs with a flagged row, the share of
runs whose latency row is a ``regression`` (the power, for a planted slowdown), the median
estimated change, how often the 95% interval held the planted change, seconds per A/B.

``--pr-set`` instead times one A/B of the default PR benchmark set (``Settings().ab_benchmarks``)
between two ordinary minitok commits (A/A for every suite model).

Run: ``PYTHONPATH=. .venv/bin/python -m benchmarks.ab_accuracy --trials-aa 20 --trials-power 10
--json /tmp/ab_accuracy.json`` (about 20 minutes on a quiet 2-core host).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.config import Settings, get_settings
from workers.ab.measure import DEFAULT_PROCESSES, DEFAULT_SAMPLES
from workers.ab.run import ABOutcome, ABRequest, run_ab
from workers.ab.verdicts import REGRESSION
from workers.builds.base import BuildProvider
from workers.builds.registry import make_provider
from workers.demo import minitok
from workers.demo.run import DEMO_MODELS

ITERATIONS = 1_200_000
"""Loop steps a sample of the planted benchmark at the base (about 80 ms here)."""
BENCH_COMMAND = "python bench.py"
SUITE_MODELS = ("tokbag:eval:cpu",)

_BENCH = '''"""The planted benchmark: ``{"samples": [ms, ...]}`` on the last line."""

import json
import os
import time

import abwork

samples = int(os.environ.get("NIGHTBENCH_SAMPLES", "10"))
abwork.work()  # warm-up
taken = []
for _ in range(samples):
    t0 = time.perf_counter()
    abwork.work()
    taken.append((time.perf_counter() - t0) * 1000.0)
print(json.dumps({"samples": taken}))
'''

_PACKAGE = '''"""A package whose work is sized by ITERATIONS{note}."""

ITERATIONS = {iterations}


def work() -> int:
    total = 0
    for i in range(ITERATIONS):
        total += (i * i) % 7
    return total
'''


@dataclass(frozen=True)
class Scenario:
    """One kind of A/B: a base and a head commit, what was planted, how to measure it."""

    name: str
    base: str
    head: str
    planted: float
    provider: BuildProvider
    benchmarks: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


@dataclass
class Trial:
    """One A/B's outcome, as the tally needs it."""

    scenario: str
    flagged: list[str]
    latency_verdict: str | None
    ratio: float | None
    low: float | None
    high: float | None
    seconds: float
    error: str | None = None


@dataclass
class Tally:
    """A scenario's trials summed up."""

    scenario: str
    planted: float
    runs: int = 0
    runs_flagged: int = 0
    runs_regression: int = 0
    covered: int = 0
    ratios: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    errors: int = 0

    def row(self) -> dict[str, Any]:
        """The table's row (shares of runs; the median change as a fraction)."""
        n = max(self.runs, 1)
        return {
            "scenario": self.scenario,
            "planted": self.planted,
            "runs": self.runs,
            "runs_flagged": self.runs_flagged,
            "flagged_fraction": self.runs_flagged / n,
            "regression_fraction": self.runs_regression / n,
            "median_change": statistics.median(self.ratios) - 1 if self.ratios else None,
            "min_change": min(self.ratios) - 1 if self.ratios else None,
            "max_change": max(self.ratios) - 1 if self.ratios else None,
            "interval_covered": self.covered / n,
            "seconds_per_ab": statistics.median(self.seconds) if self.seconds else None,
            "errors": self.errors,
        }


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=path, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_planted_repository(path: Path, iterations: int = ITERATIONS) -> dict[str, str]:
    """Write the ``abwork`` repository at ``path``: commit shas by role (``base``, ``aa``,
    ``plus10``, ``plus20``), one commit after another."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    for key, value in (("user.name", "nightbench"), ("user.email", "bench@localhost")):
        _git(path, "config", key, value)
    (path / "bench.py").write_text(_BENCH)
    pkg = path / "abwork"
    pkg.mkdir()
    shas: dict[str, str] = {}
    for role, n, note in (
        ("base", iterations, ""),
        ("aa", iterations, " (a comment-only change)"),
        ("plus10", round(iterations * 1.10), ""),
        ("plus20", round(iterations * 1.20), ""),
    ):
        (pkg / "__init__.py").write_text(_PACKAGE.format(iterations=n, note=note))
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"{role}: {n} iterations")
        shas[role] = _git(path, "rev-parse", "HEAD")
    return shas


def planted_scenarios(work: Path, iterations: int = ITERATIONS) -> dict[str, Scenario]:
    """The planted repository's scenarios (``aa``, ``plus10``, ``plus20``), built under
    ``work`` with no install step (``bench.py`` imports ``abwork`` from the checkout)."""
    shas = make_planted_repository(work / "abwork", iterations)
    provider = make_provider(
        "checkout", repo_path=work / "abwork", install_command="", work_dir=work / "builds-abwork"
    )
    out = {}
    for role, planted, name in (
        ("aa", 0.0, "A/A command"),
        ("plus10", 0.10, "+10% command"),
        ("plus20", 0.20, "+20% command"),
    ):
        out[role] = Scenario(
            name, shas["base"], shas[role], planted, provider, commands=(BENCH_COMMAND,)
        )
    return out


def suite_scenario(work: Path, models: Sequence[str] = SUITE_MODELS) -> Scenario:
    """A/A of suite ``models`` between two ordinary minitok commits (the demo models found
    through ``NIGHTBENCH_SUITE_EXTRA_MODELS``, which this sets)."""
    extra = [p for p in (os.environ.get("NIGHTBENCH_SUITE_EXTRA_MODELS"), str(DEMO_MODELS)) if p]
    os.environ["NIGHTBENCH_SUITE_EXTRA_MODELS"] = os.pathsep.join(dict.fromkeys(extra))
    repo = minitok.make_package_repository(work / "minitok", commits=2)
    provider = make_provider(
        "checkout",
        repo_path=repo.path,
        install_command=minitok.INSTALL_COMMAND,
        work_dir=work / "builds-minitok",
    )
    name = "A/A suite " + ", ".join(m.split(":")[0] for m in models)
    return Scenario(name, repo.shas[0], repo.shas[1], 0.0, provider, benchmarks=tuple(models))


def one_ab(scenario: Scenario, *, processes: int, samples: int) -> Trial:
    """One A/B of ``scenario`` (builds kept for the next trial; no profiling). The trial's
    latency figures are the first latency row's: with several benchmarks, the largest change."""
    request = ABRequest(
        scenario.base,
        scenario.head,
        benchmarks=scenario.benchmarks,
        commands=scenario.commands,
        processes=processes,
        samples=samples,
        profile=False,
    )
    started = time.perf_counter()
    outcome: ABOutcome = run_ab(
        request, scenario.provider, threshold_for=get_settings().threshold_for, keep_builds=True
    )
    seconds = time.perf_counter() - started
    latency = next((r for r in outcome.rows if r.metric == "latency"), None)
    return Trial(
        scenario.name,
        [f"{r.benchmark} {r.metric} {r.verdict}" for r in outcome.flagged],
        latency.verdict if latency else None,
        latency.ratio if latency else None,
        latency.low if latency else None,
        latency.high if latency else None,
        seconds,
        outcome.error,
    )


def tally(scenarios: Sequence[Scenario], trials: Sequence[Trial]) -> list[Tally]:
    """Per scenario, its trials summed (scenarios in the order given)."""
    out = {s.name: Tally(s.name, s.planted) for s in scenarios}
    for t in trials:
        row = out[t.scenario]
        row.runs += 1
        row.seconds.append(t.seconds)
        if t.error:
            row.errors += 1
            continue
        row.runs_flagged += bool(t.flagged)
        row.runs_regression += t.latency_verdict == REGRESSION
        if t.ratio is not None:
            row.ratios.append(t.ratio)
        if t.low is not None and t.high is not None and t.low <= 1 + row.planted <= t.high:
            row.covered += 1
    return list(out.values())


def run_trials(
    plan: Sequence[tuple[Scenario, int]],
    *,
    seed: int = 1,
    processes: int = DEFAULT_PROCESSES,
    samples: int = DEFAULT_SAMPLES,
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """``(scenario, trials)`` pairs run in rounds, each round's scenarios in a shuffled order."""
    rng = random.Random(seed)
    left = {s.name: n for s, n in plan}
    out: list[Trial] = []
    while any(left.values()):
        round_ = [s for s, _ in plan if left[s.name] > 0]
        rng.shuffle(round_)
        for s in round_:
            trial = one_ab(s, processes=processes, samples=samples)
            left[s.name] -= 1
            out.append(trial)
            if on_trial:
                on_trial(trial)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_table(rows: Sequence[dict[str, Any]], console: Console) -> None:
    table = Table(title="PR A/B: false alarms and power")
    for col in (
        "scenario",
        "runs",
        "runs flagged",
        "flagged share",
        "latency regression share",
        "median change (min..max)",
        "95% CI held planted",
        "s / A/B",
    ):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in rows:
        table.add_row(
            r["scenario"],
            str(r["runs"]),
            str(r["runs_flagged"]),
            f"{r['flagged_fraction']:.2f}",
            f"{r['regression_fraction']:.2f}",
            f"{_pct(r['median_change'])} ({_pct(r['min_change'])}..{_pct(r['max_change'])})",
            f"{r['interval_covered']:.2f}",
            "-" if r["seconds_per_ab"] is None else f"{r['seconds_per_ab']:.1f}",
        )
    console.print(table)


def time_pr_set(work: Path, *, processes: int, samples: int) -> dict[str, Any]:
    """One A/B of the default PR benchmark set between two ordinary minitok commits."""
    models = tuple(Settings().ab_benchmarks)
    scenario = suite_scenario(work, models)
    trial = one_ab(scenario, processes=processes, samples=samples)
    return {"benchmarks": list(models), **asdict(trial)}


def main(argv: Sequence[str] | None = None) -> None:
    """Run the trials, print the table; ``--json`` also writes the rows and every trial."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-aa", type=int, default=20, help="A/A runs per A/A scenario")
    parser.add_argument("--trials-power", type=int, default=10, help="runs per planted slowdown")
    parser.add_argument("--seed", type=int, default=1, help="shuffles each round's order")
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    parser.add_argument("--suite-models", nargs="*", default=list(SUITE_MODELS))
    parser.add_argument("--pr-set", action="store_true", help="time one A/B of the PR set only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    console = Console(width=150)
    load_start = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ab_accuracy_") as tmp:
        work = Path(tmp)
        if args.pr_set:
            result: dict[str, Any] = {
                "pr_set": time_pr_set(work, processes=args.processes, samples=args.samples)
            }
            console.print(result["pr_set"])
        else:
            planted = planted_scenarios(work, args.iterations)
            plan = [
                (planted["aa"], args.trials_aa),
                (planted["plus10"], args.trials_power),
                (planted["plus20"], args.trials_power),
            ]
            if args.suite_models and args.trials_aa:
                plan.append((suite_scenario(work, args.suite_models), args.trials_aa))
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("A/B trials", total=sum(n for _, n in plan))

                def done(t: Trial) -> None:
                    bar.console.print(
                        f"{t.scenario}: latency {t.latency_verdict} {_pct(t.ratio and t.ratio - 1)}"
                        f" [{_pct(t.low and t.low - 1)}, {_pct(t.high and t.high - 1)}]"
                        f" flagged {t.flagged or 'none'} {t.seconds:.1f} s"
                        + (f" error {t.error}" if t.error else "")
                    )
                    bar.advance(task)

                trials = run_trials(
                    plan,
                    seed=args.seed,
                    processes=args.processes,
                    samples=args.samples,
                    on_trial=done,
                )
            rows = [t.row() for t in tally([s for s, _ in plan], trials)]
            print_table(rows, console)
            result = {"rows": rows, "trials": [asdict(t) for t in trials]}
    result.update(
        load_start=load_start,
        load_end=os.getloadavg(),
        seconds=time.time() - started,
        options=vars(args) | {"json": str(args.json) if args.json else None},
    )
    console.print(
        f"load average at start {load_start}, at end {result['load_end']}; "
        f"{result['seconds']:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
