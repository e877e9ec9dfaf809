"""Typed settings, read once per process from ``NIGHTBENCH_*`` environment variables.

The defaults are the embedded mode: a SQLite file under ``data_dir``, Celery tasks run in-process,
and issues written as Markdown to ``outbox_dir``. Setting ``NIGHTBENCH_DATABASE_URL`` (Postgres)
and ``NIGHTBENCH_BROKER_URL`` (Redis) gives the distributed deployment on the same code.

Code that changes them for a while (a command's option over its variable, the demo's own
deployment) passes a :class:`Settings` object to :func:`use_settings`; nothing writes
``os.environ`` to reconfigure this process.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from service.errors import InvalidSettings

ENV_PREFIX = "NIGHTBENCH_"


class Settings(BaseSettings):
    """nightbench's configuration (prefix ``NIGHTBENCH_``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, extra="ignore")

    data_dir: Path = Field(
        default=Path(".nightbench"), description="embedded store, outbox, caches"
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default SQLite file"
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker; None runs tasks in-process"
    )
    result_backend: str | None = Field(default=None, description="Celery result backend (optional)")
    threshold: float = Field(default=0.07, gt=0, lt=10, description="relative change that matters")
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description='per metric or benchmark, e.g. {"cpu_peak_mem": 0.05, "bert:train": 0.1}',
    )
    outbox_dir: Path | None = Field(default=None, description="issue Markdown without GitHub")
    github_repository: str | None = Field(
        default=None, description='"owner/name" to file issues in'
    )
    github_token: SecretStr | None = None
    github_api_url: str = "https://api.github.com"
    github_labels: list[str] = Field(default_factory=lambda: ["performance", "regression"])
    source_repo_path: Path | None = Field(
        default=None,
        description="local clone of the source of the build under test (commit ranges)",
    )
    source_github_repository: str | None = Field(
        default="pytorch/pytorch",
        description='"owner/name" where commit ranges come from without a local clone, and where '
        "issues link their commits; with source_repo_path, set it or the clone's origin on GitHub "
        "is linked (empty: no links)",
    )
    bisect_provider: str | None = Field(
        default=None,
        pattern="^(checkout|python-overlay|wheel)$",
        description="build provider for bisecting a night's commit range; None: no bisection",
    )
    bisect_install_command: str = Field(
        default="pip install --no-build-isolation -e .",
        description="checkout provider: run in each probe's worktree (source_repo_path's clone)",
    )
    bisect_wheel_url: str | None = Field(default=None, description="wheel provider: URL with {sha}")
    bisect_package: str = Field(default="torch", description="python-overlay: package laid over")
    bisect_workers: int = Field(default=1, ge=1, le=64, description="commits probed per round")
    bisect_samples: int = Field(default=12, ge=3, description="samples per benchmark per probe")
    bisect_max_samples: int = Field(default=48, ge=3, description="cap when samples double")
    bisect_work_dir: Path | None = Field(
        default=None, description="builds (default data_dir/bisect)"
    )
    schedule_cron: str | None = Field(
        default=None, description='beat dispatches a night on this crontab, e.g. "30 11 * * *"'
    )
    schedule_torch_spec: str = Field(default="current", description="build the beat night tests")
    schedule_models: list[str] = Field(default_factory=list, description="empty: every model")
    schedule_modes: list[str] = Field(default_factory=lambda: ["train", "eval"])
    schedule_device_classes: list[str] = Field(default_factory=lambda: ["cpu"])
    api_base_url: str = Field(default="http://127.0.0.1:8000", description="links in issues")
    api_max_request_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="request bodies above this are refused (413) before they are read",
    )
    api_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="nightbench serve: a request's headers must arrive within this (slowloris)",
    )
    api_body_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="nightbench serve: a request's body must arrive within this of its headers",
    )
    api_keep_alive_s: int = Field(
        default=5, ge=1, description="nightbench serve: an idle kept-alive connection closes"
    )
    api_max_connections: int = Field(
        default=1000,
        ge=1,
        description="nightbench serve: connections and requests at once; past it, 503",
    )
    torchbench_path: Path | None = Field(
        default=None,
        description="a pytorch/benchmark checkout: its models join the listing "
        "as torchbench.<name> (the suite reads the same variable)",
    )
    suite_timeout_s: float = Field(default=900, gt=0, description="per benchmark subprocess")
    suite_iterations: int = Field(default=15, ge=1, description="minimum timed iterations")
    suite_min_seconds: float = Field(default=2.0, ge=0, description="minimum timed seconds")
    suite_threads: int = Field(default=1, ge=0, description="torch threads for CPU benchmarks")
    baseline_nights: int = Field(
        default=60, ge=1, description="earlier nights read for the baseline and slow-drift check"
    )
    stability_recheck: bool = Field(
        default=True,
        description="re-check each benchmark's stability from its own nights after each night "
        "(false: verdicts change only by `nightbench suite stability`)",
    )
    stability_recheck_nights: int = Field(
        default=10,
        ge=2,
        description="nights (K) whose processes the nightly stability re-check judges (the 7% "
        "spread rule for 5 processes is scaled by d2(n) / d2(5) for their number n)",
    )
    stability_recheck_min_processes: int = Field(
        default=5,
        ge=2,
        description="fewest processes (nights and re-runs) that change a stability verdict",
    )
    job_max_worker_losses: int = Field(
        default=3,
        ge=1,
        description="a job whose worker died this many times mid-run ends as an error result",
    )
    job_heartbeat_s: float = Field(
        default=30, gt=0, description="a running job's heartbeat in the database, every s"
    )
    job_lost_after_s: float = Field(
        default=180,
        gt=0,
        description="a running job silent this long lost its worker; the sweep requeues it",
    )
    night_deadline_s: float = Field(default=6 * 3600, gt=0, description="missing-data deadline")
    step_resend_after_s: float = Field(
        default=600,
        gt=0,
        description="a run's night.finish (or a queued job's bench.run) not started this long "
        "after it was due is sent again by the deadline sweep (its message was lost)",
    )
    night_processes: int = Field(
        default=1,
        description="processes of each benchmark per night (k): the night is measured in k "
        "rounds, one after the other, and its level is the median of the "
        "per-process medians; a confirmation re-run gets k too. 1: one process",
    )
    paired_confirmation: bool = Field(
        default=True,
        description="measure the previous night's build beside a confirmation re-run, in "
        "turns, and judge the re-run's latency on their ratio, so that a host slow "
        "for the whole evening does not confirm its own step (unpaired when the "
        "previous night's spec is `current`)",
    )
    paired_confirmation_processes: int = Field(
        default=3,
        ge=1,
        description="processes of each build in a paired confirmation, at least (the night's "
        "own k when that is more): one process a side carries two processes' noise "
        "into the ratio",
    )
    night_processes_by_queue: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="processes per night for the runs of one queue, over night_processes, as "
        'JSON: {"cpu": 5} measures CPU nights in 5 rounds and the rest as '
        "night_processes says (GPU nights stray by about 1%, CPU hosts by 3 to 7%)",
    )
    count_instructions: bool = Field(
        default=True,
        description="after a night's timed processes on a counting queue, count instructions "
        "per step of its benchmarks under valgrind (cpu_instructions); skipped with the reason "
        "where valgrind is missing",
    )
    count_queues: list[str] = Field(
        default_factory=lambda: ["cpu"],
        description="queues whose nights have the count pass (instruction counts are a CPU "
        "metric: counted on the CPU host, in processes of their own after the timed ones)",
    )
    count_models: list[str] = Field(
        default_factory=list,
        description="glob patterns of the models counted (empty: every model of the night)",
    )
    count_batch: int = Field(
        default=1,
        ge=1,
        description="benchmarks counted in turn by one valgrind process. The count process runs "
        "uninstrumented until its first counted window, so its import torch, the first "
        "benchmark's build and its warm-up cost about 15 CPU seconds instead of a minute or "
        "more; the benchmarks after the first in a process are built and warmed up "
        "instrumented (docs/benchmarks.md, 'The count process's instrumentation')",
    )
    count_batch_size: int = Field(
        default=2,
        ge=0,
        description="batch size of the count series (0: each model's own): a step under "
        "valgrind runs hundreds of times slower than timed, and the Python and framework work "
        "a count is there to watch does not grow with the batch",
    )
    count_budget_s: float = Field(
        default=3600,
        ge=0,
        description="CPU seconds of one core a night's count pass may take (0: no budget); "
        "past it the night counts the benchmarks counted longest ago and the rest on the next "
        "nights, in turn (service/runs/count_plan.py)",
    )
    count_warmup_steps: int = Field(default=2, ge=0, description="uncounted steps first")
    count_repeats: int = Field(default=3, ge=1, description="counted windows per benchmark")
    count_timeout_s: float = Field(
        default=1500,
        gt=0,
        description="one valgrind count process (a batch); at most 90% of the task's soft time "
        "limit is used, so that a hung count becomes an error result before Celery interrupts it",
    )
    profile_regressions: bool = Field(
        default=True,
        description="when a night's bisection ends, profile its regressed benchmarks on the "
        "builds either side of the culprit (or the range's ends) and put what changed in the "
        "issue",
    )
    profile_benchmarks: int = Field(
        default=2, ge=1, description="benchmarks profiled per bisection, one per cause"
    )
    profile_steps: int = Field(default=3, ge=1, description="steps in each profiled window")
    profile_windows: int = Field(default=5, ge=1, description="profiled windows per build")
    profile_python_functions: bool = Field(
        default=True,
        description="profiles also have a row per Python function (its self time by "
        "cProfile in an operator table, its bytecodes per step beside a function profile), so a "
        "Python-level change is named",
    )
    profile_timeout_s: float = Field(
        default=1200, gt=0, description="one profiling process of one build (s)"
    )
    ab_benchmarks: list[str] = Field(
        default_factory=lambda: [
            f"{m}:eval:cpu"
            for m in ("resnet18", "mobilenet_v2", "bert", "gpt2", "lstm_lm", "dlrm", "dqn", "ncf")
        ],
        description="a pull request's A/B measures these unless it names others (docs/ab.md)",
    )
    ab_metrics: list[str] = Field(
        default_factory=lambda: ["latency", "cpu_peak_mem"],
        description="what an A/B judges unless it names metrics (cpu_instructions: callgrind, "
        "minutes a counted process)",
    )
    ab_processes: int = Field(default=6, ge=2, le=64, description="A/B processes a side")
    ab_samples: int = Field(default=10, ge=1, description="A/B timed iterations per process")
    task_soft_time_limit_s: float = Field(default=1800, gt=0)
    task_time_limit_s: float = Field(default=2100, gt=0)
    visibility_timeout_s: int = Field(default=4 * 3600, gt=0)
    broker_restore_every_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds between a worker's scans of Redis for unacknowledged tasks past the "
        "visibility timeout, which it delivers again (None: kombu's own period, "
        "a scan every 10th 10 s tick, about 100 s)",
    )
    queue_prefix: str = Field(
        default="", description="prefix for Redis keys (tests, shared brokers)"
    )
    env_cache_dir: Path | None = Field(
        default=None, description="venvs of builds under test; default <data_dir>/envs"
    )
    env_cache_budget_bytes: int = Field(
        default=30 * 2**30, gt=0, description="disk budget of env_cache_dir (bytes), LRU-evicted"
    )
    torch_index_url: str | None = Field(
        default=None, description="pip index for torch builds, e.g. the nightly wheel index"
    )

    @field_validator("torchbench_path", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: object) -> object:
        # docker-compose.yml passes NIGHTBENCH_TORCHBENCH_PATH empty where no checkout is built in.
        return None if value == "" else value

    @field_validator("ab_metrics")
    @classmethod
    def _known_ab_metrics(cls, value: list[str]) -> list[str]:
        from service.metrics import METRICS

        unknown = [name for name in value if name not in METRICS]
        if unknown or not value:
            what = f"unknown {', '.join(unknown)}" if unknown else "none given"
            raise ValueError(f"{what}; one or more of {', '.join(METRICS)}")
        return value

    @field_validator("github_repository")
    @classmethod
    def _repository_form(cls, value: str | None) -> str | None:
        if value is not None and (
            value.count("/") != 1 or value.startswith("/") or value.endswith("/")
        ):
            raise ValueError(f'github_repository must look like "owner/name", got {value!r}')
        return value

    @field_validator("night_processes", mode="before")
    @classmethod
    def _whole_processes(cls, value: object) -> int:
        # Named by its variable: the message is what a deployment sees when it is set wrong.
        n: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            n = int(value.strip())
        if n is None or n < 1:
            raise ValueError(
                f"NIGHTBENCH_NIGHT_PROCESSES must be a whole number of processes per benchmark "
                f"per night, 1 or more (1: one process a night), got {value!r}"
            )
        return n

    @property
    def count_process_timeout_s(self) -> float:
        """The limit of one valgrind count process: ``count_timeout_s``, at most 90% of the
        task's soft time limit."""
        return min(self.count_timeout_s, 0.9 * self.task_soft_time_limit_s)

    def counts_on(self, queue: str, model: str) -> bool:
        """Whether the nights of ``queue`` count instructions of ``model`` (``count_*``)."""
        return (
            self.count_instructions
            and queue in self.count_queues
            and (not self.count_models or any(fnmatch(model, p) for p in self.count_models))
        )

    def processes_for(self, queue: str) -> int:
        """Processes per benchmark per night for the runs of ``queue`` (``cpu``,
        ``gpu.h100``, ...): ``night_processes_by_queue[queue]``, else ``night_processes``."""
        return self.night_processes_by_queue.get(queue, self.night_processes)

    @model_validator(mode="after")
    def _limits(self) -> Settings:
        # Named by their variables and values: a rule across settings has no one field to name.
        suite, soft = self.suite_timeout_s, self.task_soft_time_limit_s
        hard, visibility = self.task_time_limit_s, self.visibility_timeout_s
        if suite >= soft:
            raise ValueError(
                f"NIGHTBENCH_SUITE_TIMEOUT_S ({suite:g}) must be below "
                f"NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S ({soft:g}), so that a hung benchmark "
                "becomes an error result before Celery interrupts the task"
            )
        if soft >= hard:
            raise ValueError(
                f"NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S ({soft:g}) must be below "
                f"NIGHTBENCH_TASK_TIME_LIMIT_S ({hard:g})"
            )
        if visibility <= hard:
            raise ValueError(
                f"NIGHTBENCH_VISIBILITY_TIMEOUT_S ({visibility:g}) must exceed "
                f"NIGHTBENCH_TASK_TIME_LIMIT_S ({hard:g}), or Redis redelivers running tasks"
            )
        return self

    @property
    def source_repository(self) -> str | None:
        """``owner/name`` on GitHub of the repository the night's commits come from, for the
        commit, compare and pull-request links of issues and reports; None: shas without links.

        ``source_github_repository`` where it is set (empty: none). Unset, its default
        (``pytorch/pytorch``) holds only where commit ranges are read from GitHub. Commits read
        from a local clone (``source_repo_path``) link to the GitHub repository its ``origin``
        remote points to (:func:`github_repository_of`), and to none when it has no such
        remote: a link to another project is worse than none.
        """
        if "source_github_repository" in self.model_fields_set or self.source_repo_path is None:
            return self.source_github_repository or None
        return github_repository_of(str(self.source_repo_path))

    @property
    def source_code_url(self) -> str | None:
        """``https://github.com/<source_repository>``, or None (:attr:`source_repository`)."""
        repository = self.source_repository
        return f"https://github.com/{repository}" if repository else None

    @property
    def effective_database_url(self) -> str:
        """The configured URL, or ``sqlite:///<data_dir>/nightbench.db``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'nightbench.db').resolve()}"

    @property
    def effective_outbox_dir(self) -> Path:
        """Where filed issues are written as Markdown files: outbox_dir, else data_dir/outbox."""
        return self.outbox_dir if self.outbox_dir is not None else self.data_dir / "outbox"

    @property
    def embedded(self) -> bool:
        """True when tasks run in-process (no broker configured)."""
        return not self.broker_url

    def threshold_for(self, metric: str, benchmark: str | None = None) -> float:
        """The threshold for ``metric`` of ``benchmark`` (``"model:mode"`` or ``"model"``).

        Most specific first: ``model:mode:metric``, ``model:metric``, ``model:mode``, ``model``,
        ``metric``, then the global ``threshold``.
        """
        keys: list[str] = []
        if benchmark:
            model = benchmark.split(":", 1)[0]
            keys += [f"{benchmark}:{metric}", f"{model}:{metric}", benchmark, model]
        keys.append(metric)
        for key in keys:
            if key in self.thresholds:
                return self.thresholds[key]
        return self.threshold


# The settings of the open use_settings blocks, innermost last; they stand over the environment's.
_chosen: list[Settings] = []


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings: the innermost :func:`use_settings` block's, else read once from
    the environment (tests call ``get_settings.cache_clear()``).

    Raises:
        InvalidSettings: a ``NIGHTBENCH_*`` variable holds a value the settings refuse; one
            line per such variable names it, the value given and what was wrong
            (:func:`refusals`). The command line prints them and exits with code 2.
    """
    if _chosen:
        return _chosen[-1]
    try:
        return Settings()
    except (ValidationError, SettingsError) as exc:
        raise InvalidSettings(refusals(exc)) from exc


def settings_with(**changes: Any) -> Settings:
    """The process's settings with ``changes`` (field names, typed values) over them.

    What was set before (a variable, an earlier change) stays set; the result is validated as
    the variables are.

    Raises:
        pydantic.ValidationError: a change the settings refuse (the caller's values are typed:
            a programming error, not a user's).
    """
    current = get_settings()
    kept = {name: getattr(current, name) for name in current.model_fields_set}
    return Settings(**{**kept, **changes})


@contextmanager
def use_settings(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` the process's for the block: :func:`get_settings` returns them, for
    every caller (the embedded tasks too), until the block ends.

    Caches built from the settings (the engine, the Celery app's configuration) are the
    caller's to rebuild; a child process's environment is built from the settings where it
    needs them (``workers.night.jobs.suite_environment``).
    """
    _chosen.append(settings)
    get_settings.cache_clear()
    try:
        yield settings
    finally:
        _chosen.pop()
        get_settings.cache_clear()


def refusals(exc: ValidationError | SettingsError) -> list[str]:
    """What ``Settings()`` refused, one line per ``NIGHTBENCH_*`` variable:
    ``NIGHTBENCH_X='value' refused: <pydantic's message for the field>``.

    A message that names its variable already (a validator's own, or a rule across settings)
    is the line as it is. The value is the variable's text from the environment (hidden for a
    secret), else the value pydantic was given. A list or object that is not JSON
    (pydantic-settings refuses it before validation, naming only the field) says so, with an
    example from the field's default.
    """
    if isinstance(exc, SettingsError):
        found = re.search(r'error parsing value for field "(\w+)"', str(exc))
        if found is None or found.group(1) not in Settings.model_fields:
            cause = f" ({exc.__cause__})" if exc.__cause__ else ""
            return [f"settings refused: {exc}{cause}"]
        field = found.group(1)
        return [_refusal(field, f"{_json_wanted(field)} ({exc.__cause__})", None)]
    lines = []
    for error in exc.errors(include_url=False):
        context = error.get("ctx") or {}
        reason = str(context["error"]) if error["type"] == "value_error" else error["msg"]
        loc = error["loc"]
        if not loc or str(loc[0]) not in Settings.model_fields:
            lines.append(reason if ENV_PREFIX in reason else f"settings refused: {reason}")
            continue
        inner = ".".join(str(part) for part in loc[1:])
        lines.append(
            _refusal(str(loc[0]), f"{inner}: {reason}" if inner else reason, error.get("input"))
        )
    return lines


def _refusal(field: str, reason: str, given: Any) -> str:
    variable = f"{ENV_PREFIX}{field.upper()}"
    if variable in reason:
        return reason
    raw = next((v for k, v in os.environ.items() if k.upper() == variable), None)
    value = raw if raw is not None else given
    annotation = Settings.model_fields[field].annotation
    shown = "(hidden)" if SecretStr in (annotation, *get_args(annotation)) else repr(value)
    return f"{variable}={shown} refused: {reason}"


def _json_wanted(field: str) -> str:
    default = Settings.model_fields[field].get_default(call_default_factory=True)
    if isinstance(default, list):
        return "must be a JSON list" + (f", e.g. {json.dumps(default[:2])}" if default else "")
    if isinstance(default, dict):
        example = dict(list(default.items())[:1])
        return "must be a JSON object" + (f", e.g. {json.dumps(example)}" if example else "")
    return "must be JSON"


_GITHUB_REMOTE = re.compile(
    r"^(?:https?://(?:[^@/]+@)?github\.com/|ssh://git@github\.com/|git@github\.com:)"
    r"(?P<repository>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+?)(?:\.git)?/?$"
)


@lru_cache(maxsize=16)
def github_repository_of(clone: str) -> str | None:
    """``owner/name`` of the GitHub repository the ``origin`` remote of the git clone at
    ``clone`` points to (``https://github.com/o/n(.git)``, ``git@github.com:o/n.git``,
    ``ssh://git@github.com/o/n``); None when the path is not a clone, it has no ``origin``, or
    ``origin`` is not on GitHub. Read once per path (GitPython)."""
    import git  # GitPython; only where a local clone is configured

    try:
        with git.Repo(clone) as repo:
            urls = list(repo.remote("origin").urls)
    except (git.GitError, ValueError, OSError):
        return None
    for url in urls:
        match = _GITHUB_REMOTE.match(url.strip())
        if match:
            return match["repository"]
    return None
