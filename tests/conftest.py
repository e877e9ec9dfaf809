"""Shared fixtures: real Postgres databases, real Redis, real worker processes.

- ``pg_template``: one database per test session, migrated with ``alembic upgrade head``.
- ``session``: a session on the session database inside a transaction rolled back after the
  test (``join_transaction_mode="create_savepoint"``), for service-level tests.
- ``database_url``: a fresh database cloned from the template for one test, with
  ``NIGHTBENCH_DATABASE_URL`` pointing at it, for code that commits (tasks, CLI).
- ``broker_url``: the local Redis with a unique key prefix, for the distributed path.
- ``celery_workers``: start real ``nightbench worker`` processes.

Tests marked ``measured`` assert a verdict on real latency measured in separate processes (a
night flagged, a step confirmed or not, a culprit named). This host's latency moves by ~3%
from process to process and far more while a neighbour loads it (a whole CI run has taken twice
its usual time), so such a verdict can flip with the code unchanged: they get one more try
(pytest-rerunfailures), and a try that needed it shows as ``RERUN`` in the summary. A failure
the code causes fails both. ``make test`` runs them after the rest, one at a time with nothing
beside them; the rest run on every core (pytest-xdist, one file to a worker).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from tests.github_server import FakeGitHub
    from workers.demo.minitok import PackageRepository

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("NIGHTBENCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("NIGHTBENCH_TEST_REDIS", "redis://127.0.0.1:6379/0")
_counter = itertools.count()
_SESSION_TAG = f"nbt_{os.getpid()}_{uuid.uuid4().hex[:6]}"

# Tests measure real models on a shared 2-core machine: one thread each keeps them comparable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# pytest-xdist's workers (`make test`) start with COLUMNS=80 and LINES=24 in their environment,
# which the command line takes as a terminal's width (workers/cli/common.py): its tables would
# then be cut at 80 columns there and nowhere else. Tests read the output as a log's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


MEASURED_RERUNS = 1


@pytest.fixture(autouse=True)
def torchbench_import_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own cache of TorchBench import checks (suite/torchbench_check.py), passed
    on to the suite processes it starts: no test reads a check another one made."""
    path = tmp_path / "torchbench-imports"
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_CACHE", str(path))
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One more try for each test marked ``measured`` (see the module docstring)."""
    for item in items:
        if item.get_closest_marker("measured") is not None:
            item.add_marker(pytest.mark.flaky(reruns=MEASURED_RERUNS, reruns_delay=5))


def _pg_url(dbname: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{dbname}"


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)


def _drop(dbname: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _reset_caches() -> None:
    from service.config import get_settings
    from service.db import get_engine

    get_engine.cache_clear()
    get_settings.cache_clear()
    import workers.app as celery_app

    celery_app.configure(celery_app.app, get_settings())


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Name of a database migrated to head, kept for the whole test session."""
    from service.migrate import upgrade

    name = f"{_SESSION_TAG}_tpl"
    _drop(name)
    _admin(f'CREATE DATABASE "{name}"')
    upgrade(_pg_url(name))
    yield name
    _drop(name)


@pytest.fixture(scope="session")
def pg_main(pg_template: str) -> Iterator[str]:
    """URL of a migrated database shared by rollback-isolated tests."""
    name = f"{_SESSION_TAG}_main"
    _drop(name)
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    _drop(name)


@pytest.fixture
def session(pg_main: str) -> Iterator[Session]:
    """A session whose work is rolled back after the test (savepoints for inner commits)."""
    from service.db import normalise_url

    engine = create_engine(normalise_url(pg_main))
    with engine.connect() as conn:
        trans = conn.begin()
        sess = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
        try:
            yield sess
        finally:
            sess.close()
            trans.rollback()
    engine.dispose()


@pytest.fixture
def database_url(
    pg_template: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[str]:
    """A fresh migrated database for one test; settings point at it (embedded broker)."""
    name = f"{_SESSION_TAG}_{next(_counter)}"
    _drop(name)
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    url = _pg_url(name)
    monkeypatch.setenv("NIGHTBENCH_DATABASE_URL", url)
    monkeypatch.setenv("NIGHTBENCH_DATA_DIR", str(tmp_path / "nightbench"))
    monkeypatch.delenv("NIGHTBENCH_BROKER_URL", raising=False)
    # Short measurements keep tests quick; statistics still see a dozen samples per process.
    monkeypatch.setenv(
        "NIGHTBENCH_SUITE_MIN_SECONDS", os.environ.get("NIGHTBENCH_SUITE_MIN_SECONDS", "0.6")
    )
    monkeypatch.setenv(
        "NIGHTBENCH_SUITE_ITERATIONS", os.environ.get("NIGHTBENCH_SUITE_ITERATIONS", "12")
    )
    # The count pass (valgrind, about a minute a night) only where a test asks for it.
    monkeypatch.setenv("NIGHTBENCH_COUNT_INSTRUCTIONS", "false")
    # The profile probe after a night's bisection (three profiling processes), the same.
    monkeypatch.setenv("NIGHTBENCH_PROFILE_REGRESSIONS", "false")
    monkeypatch.setenv("NIGHTBENCH_COUNT_WARMUP_STEPS", "1")
    monkeypatch.setenv("NIGHTBENCH_COUNT_REPEATS", "2")
    _reset_caches()
    yield url
    from service.db import get_engine

    get_engine.cache_clear()
    _drop(name)
    monkeypatch.undo()
    _reset_caches()


@pytest.fixture
def configure(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Settings for the rest of one test: ``configure(job_max_worker_losses=1)`` sets
    ``NIGHTBENCH_JOB_MAX_WORKER_LOSSES`` and makes every cached setting read it."""

    def apply(**values: object) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"NIGHTBENCH_{name.upper()}", str(value))
        _reset_caches()

    return apply


@pytest.fixture
def minitok_deployment(
    configure: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., PackageRepository]:
    """A deployment whose package under test is ``minitok`` (workers/demo/minitok.py), for one
    test: ``minitok_deployment(fake, history, **settings)`` makes the package's git history
    under ``tmp_path`` (``history``: the arguments of ``make_package_repository``), builds its
    commits with the checkout provider (builds under ``tmp_path / "builds"``), files to the
    GitHub stand-in ``fake`` with the token it answers for, lets the suite find the demo models
    (tokbag), applies ``settings`` over that, and returns the repository."""
    from workers.demo.minitok import INSTALL_COMMAND, make_package_repository
    from workers.demo.run import DEMO_MODELS

    def deploy(
        fake: FakeGitHub, history: Mapping[str, Any], **settings: object
    ) -> PackageRepository:
        repo = make_package_repository(tmp_path / "minitok", **history)
        configure(
            github_repository="octo-org/perf",
            github_token=fake.token,
            github_api_url=fake.base_url,
            source_github_repository="",
            source_repo_path=repo.path,
            bisect_provider="checkout",
            bisect_install_command=INSTALL_COMMAND,
            bisect_work_dir=tmp_path / "builds",
            **settings,
        )
        monkeypatch.setenv("NIGHTBENCH_SUITE_EXTRA_MODELS", str(DEMO_MODELS))
        return repo

    return deploy


@pytest.fixture
def broker_url(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The local Redis as broker, with a key prefix of this test's own."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.ConnectionError as exc:  # pragma: no cover - CI starts Redis
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}")
    # One prefix per test session: kombu's process-wide producer pools are keyed by broker URL,
    # so a prefix that changed between tests would leave this process sending under an old one.
    # Keys are deleted after each test, so tests still start from empty queues.
    prefix = f"{_SESSION_TAG}:"
    monkeypatch.setenv("NIGHTBENCH_BROKER_URL", REDIS_URL)
    monkeypatch.setenv("NIGHTBENCH_QUEUE_PREFIX", prefix)
    # Short limits so a task whose worker was killed is redelivered within the test; the
    # visibility timeout must still exceed the longest task, as in production.
    monkeypatch.setenv("NIGHTBENCH_SUITE_TIMEOUT_S", "40")
    monkeypatch.setenv("NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S", "45")
    monkeypatch.setenv("NIGHTBENCH_TASK_TIME_LIMIT_S", "50")
    monkeypatch.setenv("NIGHTBENCH_VISIBILITY_TIMEOUT_S", "55")
    # Workers scan for tasks past that timeout every second, not every ~100 s (kombu's
    # default): a killed worker's task is redelivered at 55 s, not up to 100 s after it.
    monkeypatch.setenv("NIGHTBENCH_BROKER_RESTORE_EVERY_S", "1")
    # A heartbeat every second; a job silent for 5 s lost its worker (defaults: 30 s, 180 s).
    monkeypatch.setenv("NIGHTBENCH_JOB_HEARTBEAT_S", "1")
    monkeypatch.setenv("NIGHTBENCH_JOB_LOST_AFTER_S", "5")
    _reset_caches()
    yield REDIS_URL
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)


class WorkerPool:
    """Real ``nightbench worker`` processes started for a test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(
        self, *queues: str, log_dir: Path, name: str | None = None, extra: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        name = name or f"w{len(self.procs)}"
        log = log_dir / f"{name}.log"
        args = [
            sys.executable,
            "-m",
            "workers.cli",
            "worker",
            "--name",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            *extra,
        ]
        for q in queues or ("cpu",):
            args += ["--queue", q]
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=dict(os.environ),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        self.logs.append(log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "ready." in log.read_text(errors="replace"):
                return proc
            if proc.poll() is not None:
                raise RuntimeError(f"worker {name} exited: {log.read_text()[-3000:]}")
            time.sleep(0.3)
        raise RuntimeError(f"worker {name} not ready after 60 s: {log.read_text()[-3000:]}")

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Kill the worker and every process of its group (the pool children too)."""
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def celery_workers(broker_url: str) -> Iterator[WorkerPool]:
    pool = WorkerPool()
    yield pool
    pool.stop_all()


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.5, what: str = ""
) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")
