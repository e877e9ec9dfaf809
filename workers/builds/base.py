r"""Build providers: how one commit of a commit range becomes something a probe can run.

Every provider has one interface, :meth:`BuildProvider.prepare`: a commit in, a
:class:`BuildEnvironment` out (an interpreter, a ``PYTHONPATH``, a working directory, and the
build's wall time in seconds), or a :class:`BuildError` that the bisection records as a skipped
commit, the way ``git bisect skip`` does.

Providers (one module each, found by kind in :mod:`workers.builds.registry`):

- ``checkout`` (:class:`~workers.builds.checkout.CheckoutProvider`): a git worktree at the
  commit, a fresh virtual environment layered over the running interpreter's packages, and a
  configured install command run in the worktree (``pip install -e .``). For PyTorch itself the
  install command is a source build; with ccache most of a rebuild between neighbouring commits
  is cache hits::

      CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
      CMAKE_CUDA_COMPILER_LAUNCHER=ccache USE_CUDA=1 MAX_JOBS=32 python setup.py develop

  (``pip install --no-build-isolation -v -e .`` in newer trees.)
- ``python-overlay`` (:class:`~workers.builds.overlay.PythonOverlayProvider`): for commits that
  change only ``.py`` files relative to an installed build, a copy of the installed package with
  that commit's ``.py`` files laid over it, the way PyTorch's ``tools/nightly.py`` gives
  developers a Python-only checkout on top of a nightly binary. No compiler runs; a commit that
  changed anything else (C++, CUDA, build files) is refused with the list of files.
- ``wheel`` (:class:`~workers.builds.wheel.WheelProvider`): a wheel per commit that a CI
  publishes at a URL template such as
  ``https://ci.example/wheels/{sha}/torch-2.14.0-cp311-cp311-linux_x86_64.whl``, pip-installed
  into a fresh virtual environment.

The virtual environments (:mod:`workers.builds.layered_venv`) are created without pip and see
the running interpreter's site-packages through a ``.pth`` file (as ``virtualenv
--system-site-packages`` would), so the suite and its requirements are at hand while what the
build installs shadows them. A ``pip`` launcher in the environment's ``bin`` runs the inherited
pip, which installs into the environment.

Each environment lives in ``<work_dir>/<sha>/``; ``build.json`` is written last, so a directory
without it is a build that died and is redone, and a second ``prepare`` of the same commit (a
retried probe task) reuses the first.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import BuildError, InvalidInput

if TYPE_CHECKING:
    from service.config import Settings

logger = logging.getLogger(__name__)

BUILD_RECORD = "build.json"
DEFAULT_TIMEOUT_S = 3 * 3600.0
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class BuildEnvironment:
    """What a probe runs with.

    Attributes:
        sha: the commit built.
        provider: ``checkout`` | ``python-overlay`` | ``wheel``.
        python: the interpreter to run probes with.
        root: the directory this environment owns (removed by :meth:`BuildProvider.release`).
        workdir: the working directory for a benchmark command (the checkout for ``checkout``).
        pythonpath: entries to put first on ``PYTHONPATH``.
        venv: the virtual environment's directory, or None when ``python`` is not in one.
        build_seconds: wall time the build took, in seconds (of the original build when reused).
        reused: True when an earlier, complete build of the same commit was found.
    """

    sha: str
    provider: str
    python: Path
    root: Path
    workdir: Path
    pythonpath: tuple[str, ...] = ()
    venv: Path | None = None
    build_seconds: float = 0.0
    reused: bool = field(default=False, compare=False)

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The process environment to run ``python`` (or a shell command) in.

        Args:
            base: environment to start from (default ``os.environ``).

        Returns:
            A copy of ``base`` with the environment's ``bin`` first on ``PATH`` (so ``python``
            and ``pip`` in a command mean this environment's), ``VIRTUAL_ENV`` set, and
            ``PYTHONPATH`` set to :attr:`pythonpath` alone: an outer ``PYTHONPATH`` would put
            another version of the code under test ahead of the build's.
        """
        env = dict(os.environ if base is None else base)
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        env["PYTHONNOUSERSITE"] = "1"
        env["PATH"] = os.pathsep.join([str(self.python.parent), env.get("PATH", "")])
        if self.venv is not None:
            env["VIRTUAL_ENV"] = str(self.venv)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self.pythonpath)
        return env

    def as_json(self) -> dict[str, object]:
        """The record written to ``build.json`` (paths as strings)."""
        return {
            "sha": self.sha,
            "provider": self.provider,
            "python": str(self.python),
            "root": str(self.root),
            "workdir": str(self.workdir),
            "pythonpath": list(self.pythonpath),
            "venv": str(self.venv) if self.venv else None,
            "build_seconds": self.build_seconds,
        }


class BuildProvider(ABC):
    """Turns a commit into a :class:`BuildEnvironment`.

    A provider kind is one subclass, listed in :mod:`workers.builds.registry`; it names its kind
    (:attr:`name`), its options (:attr:`options`), how those options make one
    (:meth:`from_options`) and how the settings make a bisection's provider spec
    (:meth:`spec_from_settings`).

    Args:
        work_dir: where environments are made (``<work_dir>/<sha>/``); a temporary directory
            when None.
        python: the interpreter whose packages environments inherit (default: this one).
        timeout_s: seconds a build may take before it counts as failed.
    """

    name: str = ""
    options: Mapping[str, str] = {}
    """The options of :func:`~workers.builds.registry.make_provider` this kind reads, with help."""

    @classmethod
    @abstractmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        work_dir: str | Path | None = None,
        python: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> BuildProvider:
        """The provider made from :func:`~workers.builds.registry.make_provider`'s options.

        Args:
            options: ``repo_path``, ``install_command``, ``wheel_url``, ``package``,
                ``base_sha`` (None or empty when not given); the kind reads its own.
            work_dir: where builds go.
            python: the interpreter the environments layer over.
            timeout_s: seconds one build may take.

        Raises:
            InvalidInput: an option the kind needs is missing or wrong.
        """

    @classmethod
    @abstractmethod
    def spec_from_settings(cls, settings: Settings) -> dict[str, Any] | None:
        """The provider spec (``{"kind": name, ...}``) a night's bisection stores, from settings.

        Args:
            settings: ``source_repo_path`` and the ``bisect_*`` settings of this kind.

        Returns:
            The spec, or None when the settings lack an option this kind needs.
        """

    def __init__(
        self,
        *,
        work_dir: str | Path | None = None,
        python: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if timeout_s <= 0:
            raise InvalidInput(f"build timeout must be positive (s), got {timeout_s}")
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="nightbench-builds-")).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.python = Path(python or sys.executable)
        self.timeout_s = timeout_s

    def prepare(self, sha: str) -> BuildEnvironment:
        """Build ``sha`` (or reuse a complete earlier build of it).

        Args:
            sha: full commit id.

        Returns:
            The environment, with ``build_seconds`` measured around the build.

        Raises:
            BuildError: the commit cannot be built; the directory is cleaned up.
        """
        root = self.work_dir / sha
        with locked(self.work_dir / f".{sha}.lock"):
            record = root / BUILD_RECORD
            if record.is_file():
                try:
                    return _from_record(json.loads(record.read_text()))
                except (ValueError, KeyError, TypeError):
                    logger.warning("unreadable %s; rebuilding %s", record, sha)
            self._discard(root)
            root.mkdir(parents=True)
            started = time.perf_counter()
            try:
                env = self._build(sha, root)
            except BuildError:
                self._discard(root)
                raise
            except Exception as exc:
                self._discard(root)
                raise BuildError(sha, f"{self.name} build failed: {exc}") from exc
            env = BuildEnvironment(
                sha=env.sha,
                provider=self.name,
                python=env.python,
                root=root,
                workdir=env.workdir,
                pythonpath=env.pythonpath,
                venv=env.venv,
                build_seconds=round(time.perf_counter() - started, 3),
            )
            _write_atomic(record, json.dumps(env.as_json(), indent=1))
            return env

    def release(self, env: BuildEnvironment) -> None:
        """Remove an environment this provider made (idempotent)."""
        with locked(self.work_dir / f".{env.sha}.lock"):
            self._discard(env.root)

    @abstractmethod
    def _build(self, sha: str, root: Path) -> BuildEnvironment:
        """Fill the empty directory ``root`` for ``sha``; raise :class:`BuildError` on failure."""

    def _discard(self, root: Path) -> None:
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)


def _from_record(data: Mapping[str, Any]) -> BuildEnvironment:
    return BuildEnvironment(
        sha=str(data["sha"]),
        provider=str(data["provider"]),
        python=Path(str(data["python"])),
        root=Path(str(data["root"])),
        workdir=Path(str(data["workdir"])),
        pythonpath=tuple(str(p) for p in data["pythonpath"]),
        venv=Path(str(data["venv"])) if data.get("venv") else None,
        build_seconds=float(data["build_seconds"]),
        reused=True,
    )


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as fh:
        fh.write(text)
    os.replace(fh.name, path)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock across threads and processes (``flock`` on ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def log_tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a build's output (what a :class:`BuildError` carries)."""
    return "\n".join(text.strip().splitlines()[-lines:])
