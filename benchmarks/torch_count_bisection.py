"""A Python-only regression in the real torch sources, bisected by counts and by latency.

The end-to-end case of ``cpu_instructions`` (docs/benchmarks/counts-bisection.md):

1. **The repository.** A new git repository whose first commit holds the ``.py`` files of the
   installed torch package under ``torch/`` (the installed build: the python-overlay
   provider's ``base_sha``), then ``--commits`` N commits of harmless edits (a comment line, or
   a module-level constant nothing reads) to modules the model imports, each one a different
   overlay, and at a position drawn with ``--seed`` the culprit: an extra argument check in
   ``Normal.log_prob`` (``torch/distributions/normal.py``), which ``sac`` eval calls once a
   step through its squashed Gaussian policy. The check is four more reductions per call: at the
   count series' batch size (2) a step counts about 1.2 M instructions, mostly Python and
   dispatch, and the check adds a tenth or more to it (``--effect`` counts the culprit and its
   parent once each).
2. **The load.** ``--busy-loops`` Python processes spinning (``while True: pass``), started
   before the first bisection and stopped after the last, as ``benchmarks/bisection.py`` does.
3. **The count bisection.** ``nightbench bisect --metric cpu_instructions --benchmark
   sac:eval:cpu --provider python-overlay --package torch --base-sha FIRST --json`` on the
   range, as a user runs it: the culprit named right or wrong (or nothing), the builds against
   the bar ⌈log2(N+1)⌉ + 2, wall time, the 1-minute load average before and after.
4. **The latency bisection.** The same command with ``--metric latency``, on the same busy
   host and range: what it came to.

Each bisection prints one JSON line on stdout; the last line is the whole report. The CLI's
own progress goes to ``WORK/<metric>-<k>.log``.

Usage::

    .venv/bin/python -m benchmarks.torch_count_bisection [--commits 16] [--seed 1] \
        [--busy-loops 2] [--metrics cpu_instructions,latency] [--repeat 1] [--work-dir DIR] \
        [--json out.json]
    .venv/bin/python -m benchmarks.torch_count_bisection --effect   # the culprit's count only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.bisect.search import floor_builds  # noqa: E402

console = Console(stderr=True)

BENCHMARK = "sac:eval:cpu"
PACKAGE = "torch"
CULPRIT_FILE = "torch/distributions/normal.py"
CULPRIT_ANCHOR = """    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
"""
CULPRIT_CHECK = """        if not (
            torch.isfinite(value).all()
            and torch.isfinite(self.loc).all()
            and torch.isfinite(self.scale).all()
            and (self.scale > 0).all()
        ):
            raise ValueError("Normal.log_prob: value, loc and scale must be finite, scale > 0")
"""
CULPRIT_TITLE = "distributions: Normal.log_prob checks its value and parameters"
# Modules sac eval imports and runs (cProfile of one step): the harmless edits go there.
HARMLESS_FILES = (
    "torch/distributions/normal.py",
    "torch/distributions/transforms.py",
    "torch/distributions/transformed_distribution.py",
    "torch/distributions/independent.py",
    "torch/distributions/distribution.py",
    "torch/distributions/constraints.py",
    "torch/distributions/utils.py",
    "torch/nn/modules/linear.py",
    "torch/nn/modules/activation.py",
    "torch/nn/modules/container.py",
    "torch/nn/modules/module.py",
    "torch/nn/functional.py",
)
AUTHOR = {
    "GIT_AUTHOR_NAME": "Ada Bench",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Bench",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
}


@dataclass(frozen=True)
class TorchRepository:
    """The generated repository.

    Attributes:
        path: its directory.
        shas: every commit, oldest first: ``shas[0]`` the installed build, then the N edits.
        culprit: the culprit's position (1..N) in ``shas``.
    """

    path: Path
    shas: tuple[str, ...]
    culprit: int

    @property
    def good(self) -> str:
        """The installed build's commit: the last good one, and the overlay's base."""
        return self.shas[0]

    @property
    def bad(self) -> str:
        """The range's last commit."""
        return self.shas[-1]


def installed_torch() -> Path:
    """The installed torch package's directory (this interpreter's)."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _git(repo: Path, *args: str, date: int | None = None) -> str:
    env = {**os.environ, **AUTHOR}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date} +0000"
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def _harmless_edit(text: str, k: int) -> str:
    """Edit ``k``: a comment line, or (every third) a module-level constant nothing reads."""
    if k % 3 == 2:
        return text + f"\n_NIGHTBENCH_EDIT_{k} = None  # read by nothing\n"
    return text + f"\n# Note {k}: the shapes above follow the broadcasting rules of torch.\n"


def make_torch_repository(path: Path, *, commits: int, culprit: int) -> TorchRepository:
    """A git repository of the installed torch's Python sources, then ``commits`` edits.

    Args:
        path: the new repository's directory (must not exist).
        commits: N, the edits after the installed build (at least 1).
        culprit: which edit (1..N) is the culprit (:data:`CULPRIT_CHECK` in
            ``Normal.log_prob``); the others are harmless.

    Returns:
        The :class:`TorchRepository`.

    Raises:
        ValueError: ``culprit`` is outside 1..N, or the installed ``normal.py`` no longer has
            the lines the culprit edits.
    """
    if not 1 <= culprit <= commits:
        raise ValueError(f"culprit must be in 1..{commits}, got {culprit}")
    source = installed_torch()
    tree = path / PACKAGE
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = Path(dirpath).relative_to(source)
        for name in filenames:
            if name.endswith(".py"):
                (tree / rel).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(dirpath) / name, tree / rel / name)
    if CULPRIT_ANCHOR not in (path / CULPRIT_FILE).read_text():
        raise ValueError(f"{CULPRIT_FILE}: Normal.log_prob does not start as expected")
    _git(path, "init", "-q", "-b", "main")
    _git(path, "add", "-A")
    date = 1_780_000_000
    _git(
        path, "commit", "-q", "-m", "torch 2.13.0: the installed build's Python sources", date=date
    )
    shas = [_git(path, "rev-parse", "HEAD")]
    for k in range(1, commits + 1):
        if k == culprit:
            file, title = CULPRIT_FILE, CULPRIT_TITLE
            text = (path / file).read_text()
            text = text.replace(CULPRIT_ANCHOR, CULPRIT_ANCHOR + CULPRIT_CHECK, 1)
        else:
            file = HARMLESS_FILES[k % len(HARMLESS_FILES)]
            title = f"{Path(file).parent.name}/{Path(file).name}: note on shapes ({k})"
            text = _harmless_edit((path / file).read_text(), k)
        (path / file).write_text(text)
        _git(path, "commit", "-q", "-am", title, date=date + 3600 * k)
        shas.append(_git(path, "rev-parse", "HEAD"))
    return TorchRepository(path=path, shas=tuple(shas), culprit=culprit)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def bisect_cli(
    repo: TorchRepository, metric: str, *, work: Path, log: Path, timeout_s: float
) -> dict:
    """``nightbench bisect --json`` over the repository's range with the python-overlay
    provider, as a user runs it; the CLI's progress goes to ``log``.

    Returns:
        ``{"verdict": "right"|"wrong"|"inconclusive"|"error", "outcome", "builds", "floor",
        "bar", "rounds", "seconds", "load_before", "load_after", "started", "ended",
        "named", "change", "skipped", "error"}``; seconds are wall time of the whole command.
    """
    command = [
        sys.executable,
        "-m",
        "workers.cli",
        "bisect",
        "--repo",
        str(repo.path),
        "--good",
        repo.good,
        "--bad",
        repo.bad,
        "--benchmark",
        BENCHMARK,
        "--metric",
        metric,
        "--provider",
        "python-overlay",
        "--package",
        PACKAGE,
        "--base-sha",
        repo.good,
        "--work-dir",
        str(work),
        "--json",
    ]
    n = len(repo.shas) - 1
    row: dict = {
        "metric": metric,
        "commits": n,
        "culprit_index": repo.culprit,
        "floor": floor_builds(n),
        "bar": floor_builds(n) + 2,
        "started": _utc(),
        "load_before": _load(),
    }
    began = time.perf_counter()
    with open(log, "w") as err:
        try:
            proc = subprocess.run(
                command,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                timeout=timeout_s,
            )
            failed = None if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            proc, failed = None, f"timed out after {timeout_s:.0f} s"
    row.update(seconds=round(time.perf_counter() - began, 1), ended=_utc(), load_after=_load())
    if failed or proc is None:
        return {**row, "verdict": "error", "error": failed, "log": str(log)}
    data = json.loads(proc.stdout)
    named = [c["sha"] for c in data["culprits"]]
    truth = repo.shas[repo.culprit]
    verdict = "right" if named == [truth] else "wrong" if named else "inconclusive"
    return {
        **row,
        "verdict": verdict,
        "outcome": data["outcome"],
        "builds": data["builds"],
        "rounds": data["rounds"],
        "named": [repo.shas.index(s) if s in repo.shas else s for s in named],
        "change": {c["sha"][:10]: c["change"] for c in data["culprits"]},
        "benchmarks": [
            {k: b[k] for k in ("benchmark", "status", "change", "reason")}
            for b in data["benchmarks"]
        ],
        "skipped": len(data["skipped"]),
        "probes": len(data["probes"]),
        "error": None,
    }


def count_effect(repo: TorchRepository, work: Path) -> dict:
    """The culprit's effect: one counted process of its parent and of itself, with the
    python-overlay provider and the bisection's count measurer (instructions per step)."""
    from workers.bisect.counts import COUNT_SAMPLES, SuiteCountMeasurer
    from workers.builds.overlay import PythonOverlayProvider

    provider = PythonOverlayProvider(repo.path, base_sha=repo.good, package=PACKAGE, work_dir=work)
    measurer = SuiteCountMeasurer()
    out: dict = {"batch_size": measurer.batch_size, "started": _utc(), "load_before": _load()}
    for side, sha in (
        ("parent", repo.shas[repo.culprit - 1]),
        ("culprit", repo.shas[repo.culprit]),
    ):
        env = provider.prepare(sha)
        began = time.perf_counter()
        values = measurer.measure_once(env, BENCHMARK, COUNT_SAMPLES[0])
        out[side] = {
            "samples": values,
            "median": sorted(values)[len(values) // 2],
            "build_s": round(env.build_seconds, 1),
            "count_wall_s": round(time.perf_counter() - began, 1),
        }
        provider.release(env)
    out["change"] = round(out["culprit"]["median"] / out["parent"]["median"] - 1, 4)
    out.update(ended=_utc(), load_after=_load())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=16, help="N: commits after the build")
    parser.add_argument("--seed", type=int, default=1, help="draws the culprit's position")
    parser.add_argument("--busy-loops", type=int, default=2, help="spinning processes beside")
    parser.add_argument(
        "--metrics",
        default="cpu_instructions,latency",
        help="bisections to run, in order, on the same range",
    )
    parser.add_argument("--repeat", type=int, default=1, help="fresh ranges (seeded culprits)")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument("--timeout", type=float, default=5400.0, help="s per bisection")
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    parser.add_argument(
        "--effect", action="store_true", help="only count the culprit and its parent"
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="nightbench-torch-bisect-"))
    work.mkdir(parents=True, exist_ok=True)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    report: dict = {
        "commits": args.commits,
        "seed": args.seed,
        "busy_loops": args.busy_loops,
        "benchmark": BENCHMARK,
        "cpus": os.cpu_count(),
        "runs": [],
    }
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy_loops)
    ]
    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            total = args.repeat * (1 if args.effect else len(metrics))
            bar = progress.add_task("making the repository", total=total)
            for k in range(args.repeat):
                culprit = rng.randint(1, args.commits)
                repo = make_torch_repository(
                    work / f"torch-{k}", commits=args.commits, culprit=culprit
                )
                if args.effect:
                    progress.update(bar, description=f"range {k}: counting the culprit's effect")
                    report["effect"] = count_effect(repo, work / f"effect-{k}")
                    print(json.dumps(report["effect"]), flush=True)
                    progress.advance(bar)
                    continue
                for metric in metrics:
                    progress.update(
                        bar, description=f"range {k} (culprit {culprit}): bisecting by {metric}"
                    )
                    row = bisect_cli(
                        repo,
                        metric,
                        work=work / f"builds-{metric}-{k}",
                        log=work / f"{metric}-{k}.log",
                        timeout_s=args.timeout,
                    )
                    row["range"] = k
                    report["runs"].append(row)
                    print(json.dumps(row), flush=True)
                    progress.log(
                        f"{metric}: {row['verdict']} ({row.get('outcome')}), "
                        f"{row.get('builds')} builds (bar {row['bar']}), {row['seconds']} s, "
                        f"load {row['load_before']} -> {row['load_after']}"
                    )
                    progress.advance(bar)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    counted = [r for r in report["runs"] if r["metric"] == "cpu_instructions"]
    ok = all(r["verdict"] == "right" and r["builds"] <= r["bar"] for r in counted)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
