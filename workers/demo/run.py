"""``nightbench demo``: a regression found, confirmed, bisected and filed, end to end, on CPU.

The demo plays the whole night on this machine, with a small real package standing in for the
build under test:

1. a git repository of ``minitok`` (:mod:`workers.demo.minitok`) with ordinary commits and one
   culprit, of the kind chosen (:data:`CULPRIT_KINDS`): ``python-check`` adds a redundant
   validity check to the tokenizer's innermost loop (re-validating the word and the piece at
   every vocabulary lookup: a check already guaranteed, paid on every call, the kind of
   slowdown PyTorch PR #61056 was about); ``aten-op`` adds an extra aten operator on a large
   tensor in the model's forward (``minitok.tensors.pool`` copies the whole embedding table,
   400,000 pieces by 32 floats, column-major on every call: ``table.t().contiguous().t()``);
2. the suite model ``tokbag`` (``suite/demo_models/tokbag``), a bag-of-tokens classifier whose
   iterations are mostly ``minitok``'s tokenization, its forward pooling the embedding table
   through ``minitok.tensors.pool``;
3. baseline nights measured with ``minitok`` at the first commit, then a night at the last
   commit, whose commit range is the repository's history (and, when that night's
   confirmation re-run does not reproduce its step on a busy machine, the next night at the
   same commit, which raises it as the nightly would);
4. the night's own steps, unchanged: detection against the baseline, a confirmation re-run, a
   bisection of the commit range (``checkout`` builds with ``pip install -e .``, probes measured
   with the suite), and an issue filed to the outbox naming the culprit.

With ``counted_nights``, the last of the good nights and the bad one(s) also count the
instructions per step of ``tokbag`` under valgrind (``cpu_instructions``, at the count series'
batch of :data:`DEMO_COUNT_BATCH_SIZE`): the night's count pass, confirmation and a bisection
by counts then run as in the nightly, and the profile probe diffs callgrind's function tables.
Each counted process pays valgrind's start and the counted steps (tens of seconds), so only the
last nights are counted: enough for the detector's baseline, not fourteen.

Everything runs in-process (Celery's eager mode) and writes under ``--dir``: the repository,
the store (a SQLite file, unless ``NIGHTBENCH_DATABASE_URL`` names another database), the builds
and the outbox.

The demo's nights run seconds apart, on a machine that may be busy with other work, so they
swing far more than real nights on a dedicated runner (a busy 2-core machine can double or
triple a night's latency). The planted slowdowns are therefore large (about 7x in the
tokenizer; the table's copy about twice the step) and the demo's latency threshold for its
benchmark is high: +200% for the tokenizer's checks (:data:`DEMO_THRESHOLD`), +100% for the
copy (``CulpritKind.threshold``). Instruction counts do not swing with the host: they keep the
project's threshold.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from service.config import Settings
from service.errors import InvalidInput
from service.metrics import BISECT_METRICS, INSTRUCTIONS
from service.models import Confirmation
from workers.demo.minitok import ENCODE, POOL

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_MODELS = REPO_ROOT / "suite" / "demo_models"
DEMO_MODEL = "tokbag"
DEMO_MODE = "eval"
DEMO_BENCHMARK = f"{DEMO_MODEL}:{DEMO_MODE}:cpu"
DEMO_THRESHOLD = 2.0
"""The demo's latency threshold for its benchmark with the tokenizer's checks planted (+200%;
they make its step about 7 times slower)."""
DEMO_COUNT_BATCH_SIZE = 2
"""The batch size of the demo's count series (a step under valgrind is ~50 times slower)."""
MIN_COUNTED_NIGHTS = 4
"""Fewest counted good nights: the detector's baseline (``DetectorParams.min_baseline``)."""


@dataclass(frozen=True)
class CulpritKind:
    """One kind of planted culprit: how the ``minitok`` repository is made for it.

    Attributes:
        name: the kind's name (``nightbench demo --culprit-kind``).
        command: the key of the culprit in ``PackageRepository.culprits`` (its bench command).
        argument: the argument of :func:`~workers.demo.minitok.make_package_repository` that
            takes the culprit's position.
        options: its other arguments for this kind.
        planted: what the culprit adds, in words.
        threshold: the demo's latency threshold for its benchmark (relative; module
            docstring): well under the planted step, well over the busy host's swings.
    """

    name: str
    command: str
    argument: str
    options: dict[str, Any]
    planted: str
    threshold: float = DEMO_THRESHOLD


CULPRIT_KINDS: dict[str, CulpritKind] = {
    k.name: k
    for k in (
        CulpritKind(
            name="python-check",
            command=ENCODE,
            argument="encode_culprit",
            options={"per_lookup": True},
            planted="validity checks in the tokenizer's innermost loop (pure Python)",
        ),
        CulpritKind(
            name="aten-op",
            command=POOL,
            argument="pool_culprit",
            # 400,000 x 32 floats: a transposed copy of 51 MB per step, about twice tokbag's
            # eval step at its batch of 8 (docs/benchmarks/planted.md).
            options={"vocab_size": 400_000},
            planted="a transposed copy of the embedding table in the model's forward (aten::copy_)",
            threshold=1.0,
        ),
    )
}
"""The demo's culprit kinds, by name."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo did.

    Attributes:
        workdir: where everything was written.
        repo: the package repository (path, commits, the planted culprit).
        runs: the nightly runs, oldest first (the last one is the bad night).
        regressions: the bad night's regressions: benchmark, metric, change, confirmation.
        bisection: the bisection's outcome JSON (see ``nightbench bisect --json``), or None.
        issues: the Markdown files in the outbox.
        kind: the culprit's kind (:data:`CULPRIT_KINDS`).
        counted_nights: good nights that also counted instructions (0: none).
    """

    workdir: Path
    repo: Any
    runs: tuple[int, ...]
    regressions: tuple[dict[str, Any], ...]
    bisection: dict[str, Any] | None
    issues: tuple[Path, ...]
    kind: str = "python-check"
    counted_nights: int = 0

    @property
    def culprit(self) -> str:
        """The commit the demo planted the slowdown in."""
        return str(self.repo.culprits[CULPRIT_KINDS[self.kind].command])

    def as_json(self) -> dict[str, Any]:
        """The demo's outcome as JSON (``nightbench demo --json``)."""
        return {
            "workdir": str(self.workdir),
            "repo": str(self.repo.path),
            "culprit_kind": self.kind,
            "counted_nights": self.counted_nights,
            "planted_culprit": self.culprit,
            "runs": list(self.runs),
            "regressions": list(self.regressions),
            "bisection": self.bisection,
            "issues": [str(p) for p in self.issues],
        }


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore them."""
    # Stays: the suite processes of the in-process tasks inherit these (suite_environment).
    saved = {key: os.environ.get(key) for key in values}
    try:
        os.environ.update(values)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _deployment(settings: Settings) -> Iterator[None]:
    """Run the block with ``settings`` as the process's (the store, the Celery app and filing
    read them), then put back those it ran with before."""
    from service.config import use_settings

    try:
        with use_settings(settings):
            _reload_settings()
            yield
    finally:
        _reload_settings()


def _reload_settings() -> None:
    """Rebuild what is built from the settings: the engine, the Celery app's configuration."""
    from service.config import get_settings
    from service.db import get_engine
    from workers import app as celery_app

    get_engine.cache_clear()
    celery_app.configure(celery_app.app, get_settings())


def _prepare_database() -> None:
    """Migrate the store (a new SQLite file, or the configured database) to the head revision."""
    from service.migrate import upgrade

    upgrade()


def worktree(repo: Path, sha: str, path: Path) -> Path:
    """``git worktree add --detach path sha`` in ``repo`` (GitPython): a checkout of ``sha``
    sharing the repository's objects; returns ``path``.

    Raises:
        git.GitCommandError: git refused (an unknown commit, ``path`` in use); its message names
            the command line and quotes git's stderr.
    """
    import git  # GitPython, as workers/builds/checkout.py; imported here to keep imports cheap

    with git.Repo(repo) as clone:
        clone.git.worktree("add", "--detach", str(path), sha)
    return path


def run_demo(
    workdir: str | Path,
    *,
    baseline_nights: int = 14,
    commits: int = 12,
    culprit: int = 7,
    culprit_kind: str = "python-check",
    counted_nights: int = 0,
    on_step: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run the demo in ``workdir`` (created; must be empty).

    Args:
        workdir: where to write the repository, store, builds and outbox.
        baseline_nights: good nights before the bad one. The detector needs a baseline of
            earlier nights, and enough of them for a two-night step (the bad night and its
            confirmation re-run) to be significant.
        commits: commits in the bad night's range.
        culprit: which of them (1-based) adds the slowdown.
        culprit_kind: what the culprit plants, a key of :data:`CULPRIT_KINDS` (``python-check``
            or ``aten-op``).
        counted_nights: the last this-many good nights, and the bad one(s), also count
            instructions per step of ``tokbag`` under valgrind (``cpu_instructions``, a
            minute or more a night); 0: no count pass. At least :data:`MIN_COUNTED_NIGHTS`
            when not 0, at most ``baseline_nights``.
        on_step: called with a line of text as each stage starts (progress).

    Returns:
        The :class:`DemoResult`.

    Raises:
        InvalidInput: ``workdir`` is not empty, the culprit is outside the range, the kind is
            unknown, or ``counted_nights`` is outside ``{0} ∪ [MIN_COUNTED_NIGHTS,
            baseline_nights]``.
    """
    from workers.commits import local_commit_range
    from workers.demo.minitok import make_package_repository

    say = on_step or (lambda text: None)
    root = Path(workdir).resolve()
    if root.exists() and any(root.iterdir()):
        raise InvalidInput(f"dir: {root} is not empty")
    if not 1 <= culprit <= commits:
        raise InvalidInput(f"culprit must lie in 1..{commits}, got {culprit}")
    kind = CULPRIT_KINDS.get(culprit_kind)
    if kind is None:
        raise InvalidInput(
            f"culprit kind must be one of {', '.join(CULPRIT_KINDS)}, got {culprit_kind!r}"
        )
    if counted_nights and not MIN_COUNTED_NIGHTS <= counted_nights <= baseline_nights:
        raise InvalidInput(
            f"counted nights must be 0 or lie in {MIN_COUNTED_NIGHTS}..{baseline_nights}, "
            f"got {counted_nights}"
        )
    root.mkdir(parents=True, exist_ok=True)
    say(
        f"creating the minitok repository ({commits + 1} commits, culprit: {kind.planted}) "
        f"in {root / 'minitok'}"
    )
    planted: dict[str, Any] = {kind.argument: culprit, **kind.options}
    repo = make_package_repository(root / "minitok", commits=commits, **planted)
    trees = (
        worktree(repo.path, repo.good, root / "installed-good"),
        worktree(repo.path, repo.bad, root / "installed-bad"),
    )
    settings = _demo_settings(
        root, repo.path, counting=counted_nights > 0, threshold=kind.threshold
    )
    outer_path = os.environ.get("PYTHONPATH")
    commit_range = [c.as_json() for c in local_commit_range(repo.path, repo.good, repo.bad)]
    with _deployment(settings), _environment(_suite_variables()):
        _prepare_database()
        runs = _play_nights(
            repo,
            trees,
            commit_range,
            baseline_nights=baseline_nights,
            outer_path=outer_path,
            say=say,
            count_from=baseline_nights - counted_nights if counted_nights else None,
        )
        regressions, result = _night_outcome(runs[-1])
        outbox = root / "outbox"
        issues = tuple(sorted(outbox.glob("issue-*.md"))) if outbox.is_dir() else ()
    return DemoResult(
        workdir=root,
        repo=repo,
        runs=tuple(runs),
        regressions=regressions,
        bisection=result,
        issues=issues,
        kind=kind.name,
        counted_nights=counted_nights,
    )


def _demo_settings(
    root: Path, repo: Path, *, counting: bool = False, threshold: float = DEMO_THRESHOLD
) -> Settings:
    """The demo's settings, over the process's, for :func:`_deployment`; with ``counting``,
    what the count pass counts (tokbag only, at :data:`DEMO_COUNT_BATCH_SIZE`), each night
    then turning it on or off (:func:`_play_nights`)."""
    from service.config import get_settings, settings_with
    from workers.demo.minitok import INSTALL_COMMAND

    given = get_settings().model_fields_set
    return settings_with(
        data_dir=root / "data",
        outbox_dir=root / "outbox",
        broker_url=None,
        github_repository=None,
        github_token=None,
        source_repo_path=repo,
        source_github_repository="",  # a local package: no commit links
        bisect_provider="checkout",
        bisect_install_command=INSTALL_COMMAND,
        bisect_work_dir=root / "builds",
        # Nights seconds apart on a machine others may be busy on swing far more than real
        # nights on a dedicated runner: a high bar for this benchmark, under the planted step.
        # Counts do not swing with the host: the project's threshold.
        thresholds={
            DEMO_MODEL: threshold,
            f"{DEMO_MODEL}:{INSTRUCTIONS}": Settings.model_fields["threshold"].default,
        },
        **({} if "suite_min_seconds" in given else {"suite_min_seconds": 0.5}),
        # For the same reason the nightly stability re-check is off: those nights' spread would
        # darken the benchmark (then it alerts only beyond 3 times their spread) before the
        # planted change is reached.
        stability_recheck=False,
        # The demo's story is latency, found and bisected in minutes; a count pass under
        # valgrind adds a minute or more to each night it counts (``counted_nights``).
        count_instructions=False,
        **(
            {"count_models": [DEMO_MODEL], "count_batch_size": DEMO_COUNT_BATCH_SIZE}
            if counting
            else {}
        ),
    )


def _suite_variables() -> dict[str, str]:
    """What the demo's suite processes read from their environment: the demo models' folder
    (``NIGHTBENCH_SUITE_EXTRA_MODELS``, after any given) and one thread."""
    extra = os.pathsep.join(
        p for p in (os.environ.get("NIGHTBENCH_SUITE_EXTRA_MODELS"), str(DEMO_MODELS)) if p
    )
    return {"NIGHTBENCH_SUITE_EXTRA_MODELS": extra, "OMP_NUM_THREADS": "1"}


def _play_nights(
    repo: Any,
    trees: tuple[Path, Path],
    commit_range: list[dict[str, Any]],
    *,
    baseline_nights: int,
    outer_path: str | None,
    say: Callable[[str], None],
    count_from: int | None = None,
) -> list[int]:
    """The baseline nights at the good commit, then the bad night over the range; their run ids.

    Nights from the ``count_from``-th on (0-based; None: none) have the count pass."""
    from service.config import settings_with
    from service.runs.service import BenchmarkSpec
    from workers.night import plan as nightly

    good_tree, bad_tree = trees
    spec = [BenchmarkSpec(model=DEMO_MODEL, mode=DEMO_MODE)]
    # The last date is kept for a second night at the bad commit, when the first one's
    # confirmation re-run does not reproduce its step.
    first = date.today() - timedelta(days=baseline_nights + 1)
    runs: list[int] = []
    for i in range(baseline_nights + 2):
        bad_night = i >= baseline_nights
        if i > baseline_nights and _reproduced(runs[-1]):
            break
        tree = bad_tree if bad_night else good_tree
        night = first + timedelta(days=i)
        counted = count_from is not None and i >= count_from
        say(
            f"night {night}: minitok at {(repo.bad if bad_night else repo.good)[:10]}"
            + (", instructions counted under valgrind" if counted else "")
            + (" (the night after the commit range landed)" if i == baseline_nights else "")
            + (
                " again: the night before's step was not reproduced by its confirmation re-run "
                "(a busy machine); the next night decides, as in the nightly"
                if i > baseline_nights
                else ""
            )
        )
        # The night measures the package as installed at its commit: its checkout first on
        # the suite's path. Bisection probes build their own and drop this path.
        with (
            _environment({"PYTHONPATH": os.pathsep.join(p for p in (str(tree), outer_path) if p)}),
            _deployment(settings_with(count_instructions=counted)),
        ):
            run_id = nightly.create_night(
                night=night, benchmarks=spec, commit_range=commit_range if bad_night else None
            )
            runs.append(run_id)
            for job_id, queue, _ in nightly.queued_jobs(run_id):
                nightly.send_job(job_id, queue)
    return runs


def _reproduced(run_id: int) -> bool:
    """Whether the night ``run_id`` holds a reproduced regression of the demo's benchmark in a
    metric the night bisects (latency, or the instruction count)."""
    regressions, _ = _night_outcome(run_id)
    return any(
        r["benchmark"] == DEMO_BENCHMARK
        and r["metric"] in BISECT_METRICS
        and r["confirmation"] == Confirmation.REPRODUCED
        for r in regressions
    )


def _night_outcome(run_id: int) -> tuple[tuple[dict[str, Any], ...], dict[str, Any] | None]:
    """The night's regressions, and its latest bisection's result (None without one)."""
    from sqlalchemy import select

    from service.db import session_scope
    from service.models import Bisection, Regression

    with session_scope() as session:
        regressions = tuple(
            {
                "benchmark": r.benchmark,
                "metric": r.metric,
                "change": r.change,
                "confirmation": r.confirmation,
                "state": r.state,
            }
            for r in session.scalars(
                select(Regression).where(
                    Regression.run_id == run_id, Regression.direction == "regression"
                )
            )
        )
        bisection = session.scalar(
            select(Bisection)
            .where(Bisection.run_id == run_id)
            .order_by(Bisection.id.desc())
            .limit(1)
        )
        result = bisection.result if bisection is not None else None
    return regressions, result
