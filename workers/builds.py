"""Build providers: how one commit of a commit range becomes something a probe can run.

Every provider has one interface, :meth:`BuildProvider.prepare`: a commit in, a
:class:`BuildEnvironment` out (an interpreter, a ``PYTHONPATH``, a working directory, and the
build's wall time in seconds), or a :class:`BuildError` that the bisection records as a skipped
commit, the way ``git bisect skip`` does.

Providers:

- ``checkout`` (:class:`CheckoutProvider`): a git worktree at the commit, a fresh virtual
  environment layered over the running interpreter's packages, and a configured install command
  run in the worktree (``pip install -e .``). For PyTorch itself the install command is a source
  build; with ccache most of a rebuild between neighbouring commits is cache hits::

      CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \\
      CMAKE_CUDA_COMPILER_LAUNCHER=ccache USE_CUDA=1 MAX_JOBS=32 python setup.py develop

  (``pip install --no-build-isolation -v -e .`` in newer trees.)
- ``python-overlay`` (:class:`PythonOverlayProvider`): for commits that change only ``.py`` files
  relative to an installed build, a copy of the installed package with that commit's ``.py``
  files laid over it, the way PyTorch's ``tools/nightly.py`` gives developers a Python-only
  checkout on top of a nightly binary. No compiler runs; a commit that changed anything else
  (C++, CUDA, build files) is refused with the list of files.
- ``wheel`` (:class:`WheelProvider`): a wheel per commit that a CI publishes at a URL template
  such as ``https://ci.example/wheels/{sha}/torch-2.14.0-cp311-cp311-linux_x86_64.whl``,
  pip-installed into a fresh virtual environment.

The virtual environments are created without pip and see the running interpreter's
site-packages through a ``.pth`` file (as ``virtualenv --system-site-packages`` would), so the
suite and its requirements are at hand while what the build installs shadows them. A ``pip``
launcher in the environment's ``bin`` runs the inherited pip, which installs into the
environment.

Each environment lives in ``<work_dir>/<sha>/``; ``build.json`` is written last, so a directory
without it is a build that died and is redone, and a second ``prepare`` of the same commit (a
retried probe task) reuses the first.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import logging
import os
import shutil
import string
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import InvalidInput, NightbenchError
from workers.commits import changed_files

logger = logging.getLogger(__name__)

BUILD_RECORD = "build.json"
PROVIDERS = ("checkout", "python-overlay", "wheel")
DEFAULT_TIMEOUT_S = 3 * 3600.0
# Changes that cannot alter an installed package: the overlay ignores them.
OVERLAY_IGNORED = ("*.md", "*.rst", "*.txt", "docs/*", ".github/*", ".ci/*", "test/*", "tests/*",
                   "benchmarks/*", ".gitignore", ".flake8", ".lintrunner.toml", "CODEOWNERS")
_LOG_TAIL_LINES = 25
_thread_lock = threading.Lock()


class BuildError(NightbenchError):
    """A commit could not be made runnable; the bisection skips it and reports why.

    Attributes:
        sha: the commit.
        log: the tail of the build's output (may be empty).
    """

    status_code = 500

    def __init__(self, sha: str, message: str, *, log: str = "") -> None:
        super().__init__(f"{sha[:10]}: {message}")
        self.sha = sha
        self.reason = message
        self.log = log

    def detail(self, limit: int = 2000) -> str:
        """The reason in full, then as much of the log's end as fits in ``limit`` characters.

        The reason (what failed: ``install command 'pip install -e .' exited with status 2``)
        is never cut; a long traceback in the log is trimmed from its start, where the frames
        that matter least are.
        """
        if not self.log:
            return self.reason
        room = max(limit - len(self.reason) - 1, 0)
        log = self.log.strip()
        return f"{self.reason}\n{log[-room:] if room else ''}".strip()


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

    Args:
        work_dir: where environments are made (``<work_dir>/<sha>/``); a temporary directory
            when None.
        python: the interpreter whose packages environments inherit (default: this one).
        timeout_s: seconds a build may take before it counts as failed.
    """

    name: str = ""

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
        with _locked(self.work_dir / f".{sha}.lock"):
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
                sha=env.sha, provider=self.name, python=env.python, root=root,
                workdir=env.workdir, pythonpath=env.pythonpath, venv=env.venv,
                build_seconds=round(time.perf_counter() - started, 3),
            )
            _write_atomic(record, json.dumps(env.as_json(), indent=1))
            return env

    def release(self, env: BuildEnvironment) -> None:
        """Remove an environment this provider made (idempotent)."""
        with _locked(self.work_dir / f".{env.sha}.lock"):
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
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across threads and processes (``flock`` on ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def site_directories(python: str | Path) -> list[str]:
    """The site-packages directories an interpreter imports from.

    Args:
        python: the interpreter.

    Returns:
        Absolute paths, in ``sys.path`` order.

    Raises:
        InvalidInput: the interpreter does not run.
    """
    code = (
        "import json, os, sys; print(json.dumps([p for p in sys.path "
        "if os.path.basename(p) in ('site-packages', 'dist-packages')]))"
    )
    try:
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise InvalidInput(f"python: cannot run {python}: {exc}") from exc
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PIP_LAUNCHER = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


def make_layered_venv(dest: Path, python: str | Path, *, sha: str = "-") -> Path:
    """Create a virtual environment that also sees ``python``'s installed packages.

    Packages installed into the new environment come first on ``sys.path``; the base
    interpreter's site-packages follow through a ``.pth`` file that calls ``site.addsitedir`` (so
    their own ``.pth`` files, editable installs included, take effect too).

    Args:
        dest: the directory to create.
        python: the interpreter whose packages are inherited.
        sha: the commit the environment is for (named in errors).

    Returns:
        The new environment's interpreter, ``dest/bin/python``.

    Raises:
        BuildError: ``venv`` failed.
    """
    sites = site_directories(python)
    proc = subprocess.run([str(python), "-m", "venv", "--without-pip", str(dest)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(sha, f"could not create a venv at {dest}", log=_tail(proc.stderr))
    new_python = dest / "bin" / "python"
    probe = subprocess.run(
        [str(new_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )
    purelib = Path(probe.stdout.strip())
    purelib.mkdir(parents=True, exist_ok=True)
    lines = [f"import site; site.addsitedir({s!r})" for s in sites]
    (purelib / "_nightbench_inherit.pth").write_text("\n".join(lines) + "\n")
    launcher = dest / "bin" / "pip"
    launcher.write_text(_PIP_LAUNCHER.format(python=new_python))
    launcher.chmod(0o755)
    return new_python


def _run_logged(
    command: str | Sequence[str], *, sha: str, cwd: Path, env: Mapping[str, str], timeout_s: float,
    log_path: Path, what: str,
) -> None:
    try:
        proc = subprocess.run(
            command, shell=isinstance(command, str), cwd=cwd, env=dict(env), timeout=timeout_s,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(sha, f"{what} did not finish in {timeout_s:.0f} s") from exc
    with open(log_path, "a") as fh:
        fh.write(proc.stdout)
    if proc.returncode != 0:
        raise BuildError(sha, f"{what} exited with status {proc.returncode}",
                         log=_tail(proc.stdout))


class CheckoutProvider(BuildProvider):
    """A git worktree at the commit plus an install command run in it.

    Args:
        repo_path: a local clone holding every commit of the range.
        install_command: a shell command run in the worktree with the new environment's
            ``bin`` first on ``PATH``, e.g. ``pip install --no-deps -e .``; for PyTorch, the
            ccache'd ``python setup.py develop`` shown in this module's docstring. Empty: no
            install step (the command under test imports from the checkout).
        work_dir, python, timeout_s: see :class:`BuildProvider`.

    Raises:
        InvalidInput: ``repo_path`` is not a git work tree.
    """

    name = "checkout"

    def __init__(self, repo_path: str | Path, install_command: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.repo_path = Path(repo_path).resolve()
        if not (self.repo_path / ".git").exists():
            raise InvalidInput(f"repo: {self.repo_path} is not a git work tree")
        self.install_command = install_command.strip()

    def _git(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(self.repo_path), *args],
                              capture_output=True, text=True)

    def _build(self, sha: str, root: Path) -> BuildEnvironment:
        src = root / "src"
        # git serialises worktree bookkeeping through files in .git; one add at a time.
        with _thread_lock, _locked(self.work_dir / ".worktree.lock"):
            self._git("worktree", "prune")
            # --force twice: a worktree left locked by a build that was killed mid-way (a
            # redelivered probe task) is taken over rather than refused.
            proc = self._git("worktree", "add", "--detach", "--force", "--force", str(src), sha)
        if proc.returncode != 0:
            raise BuildError(sha, "git worktree add failed", log=_tail(proc.stderr))
        python = make_layered_venv(root / "venv", self.python, sha=sha)
        env = BuildEnvironment(sha=sha, provider=self.name, python=python, root=root,
                               workdir=src, venv=root / "venv")
        if self.install_command:
            _run_logged(self.install_command, sha=sha, cwd=src, env=env.environ(),
                        timeout_s=self.timeout_s, log_path=root / "build.log",
                        what=f"install command {self.install_command!r}")
        return env

    def _discard(self, root: Path) -> None:
        if (root / "src").exists():
            with _thread_lock, _locked(self.work_dir / ".worktree.lock"):
                self._git("worktree", "remove", "--force", "--force", str(root / "src"))
        super()._discard(root)
        with _thread_lock, _locked(self.work_dir / ".worktree.lock"):
            self._git("worktree", "prune")


class PythonOverlayProvider(BuildProvider):
    """An installed build with a commit's ``.py`` files laid over a copy of its package.

    The copy links every non-Python file (shared libraries, headers) to the installed build and
    copies the ``.py`` files, then writes the files the commit changed (relative to the commit
    the installed build was made from) from git's object store; deleted modules are removed.
    Bytecode caches are not copied, so nothing stale is imported.

    Args:
        repo_path: a local clone holding both commits.
        base_sha: the commit the installed build was made from (for torch,
            ``torch.version.git_version``).
        package: the import name, e.g. ``"torch"``.
        source_dir: the package's directory in the repository (default: ``package``).
        installed: the installed package's directory (default: found by asking ``python``).
        ignored: glob patterns of repository paths whose changes cannot alter the installed
            package (docs, tests, CI files).
        work_dir, python, timeout_s: see :class:`BuildProvider`.

    Raises:
        InvalidInput: the installed package cannot be found.
    """

    name = "python-overlay"

    def __init__(
        self,
        repo_path: str | Path,
        *,
        base_sha: str,
        package: str,
        source_dir: str | None = None,
        installed: str | Path | None = None,
        ignored: Sequence[str] = OVERLAY_IGNORED,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.repo_path = Path(repo_path).resolve()
        self.base_sha = base_sha
        self.package = package
        self.source_dir = (source_dir or package).strip("/")
        self.ignored = tuple(ignored)
        self.installed = Path(installed) if installed else self._find_installed()
        if not (self.installed / "__init__.py").is_file():
            raise InvalidInput(f"installed: {self.installed} is not a package directory")

    def _find_installed(self) -> Path:
        code = (
            "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); "
            "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
            "else '')"
        )
        proc = subprocess.run([str(self.python), "-c", code, self.package],
                              capture_output=True, text=True)
        found = proc.stdout.strip()
        if proc.returncode != 0 or not found:
            raise InvalidInput(
                f"package: {self.package!r} is not installed for {self.python}; "
                "pass the installed package directory"
            )
        return Path(found)

    def overlay_changes(self, sha: str) -> list[tuple[str, str]]:
        """The ``.py`` changes to lay over the installed package for ``sha``.

        Args:
            sha: the commit to build.

        Returns:
            ``(status, path)`` pairs under ``source_dir``, status ``A`` | ``M`` | ``D``.

        Raises:
            BuildError: a file that is not Python changed (outside the ``ignored`` patterns), so
                the installed binaries may not match this commit.
        """
        refused, changes = [], []
        for status, path in changed_files(self.repo_path, self.base_sha, sha):
            if any(fnmatch.fnmatch(path, pattern) for pattern in self.ignored):
                continue
            if not path.endswith(".py"):
                refused.append(path)
            elif path.startswith(self.source_dir + "/"):
                changes.append((status if status in ("A", "D") else "M", path))
        if refused:
            more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
            shown = ", ".join(refused[:10]) + more
            raise BuildError(
                sha,
                f"python-overlay needs Python-only changes since the installed build "
                f"{self.base_sha[:10]}, but non-Python files changed: {shown}; "
                "use the checkout or wheel provider for this range",
            )
        return changes

    def _build(self, sha: str, root: Path) -> BuildEnvironment:
        import git

        changes = self.overlay_changes(sha)
        site = root / "site"
        target = site / self.package
        for dirpath, dirnames, filenames in os.walk(self.installed):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = Path(dirpath).relative_to(self.installed)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for name in filenames:
                source = Path(dirpath) / name
                if name.endswith(".py"):
                    shutil.copy2(source, target / rel / name)
                else:
                    os.symlink(source, target / rel / name)
        tree = git.Repo(str(self.repo_path)).commit(sha).tree
        for status, path in changes:
            dest = target / path[len(self.source_dir) + 1:]
            if dest.exists() or dest.is_symlink():
                dest.unlink()
            if status != "D":
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tree[path].data_stream.read())
        (root / "overlay.json").write_text(json.dumps(changes))
        return BuildEnvironment(sha=sha, provider=self.name, python=self.python, root=root,
                                workdir=site, pythonpath=(str(site),))


class WheelProvider(BuildProvider):
    """A wheel per commit, fetched from a URL template and pip-installed into a fresh venv.

    Args:
        url_template: a URL (or path) with ``{sha}`` (full commit id) and optionally ``{short}``
            (its first 7 hex digits), e.g. ``https://ci.example/{sha}/pkg-1.0-py3-none-any.whl``.
        pip_args: extra ``pip install`` arguments (e.g. ``["--no-deps"]``, an index URL).
        work_dir, python, timeout_s: see :class:`BuildProvider`.

    Raises:
        InvalidInput: the template names no ``{sha}``, or a field other than ``sha``/``short``.
    """

    name = "wheel"

    def __init__(self, url_template: str, *, pip_args: Sequence[str] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(url_template) if f is not None}
        except ValueError as exc:
            raise InvalidInput(f"wheel URL template {url_template!r}: {exc}") from exc
        if "sha" not in fields and "short" not in fields:
            raise InvalidInput(f"wheel URL template {url_template!r} must contain {{sha}}")
        if fields - {"sha", "short"}:
            raise InvalidInput(
                f"wheel URL template {url_template!r}: unknown fields "
                f"{sorted(fields - {'sha', 'short'})}; "
                "use {sha} or {short}"
            )
        self.url_template = url_template
        self.pip_args = tuple(pip_args)

    def url_for(self, sha: str) -> str:
        """The wheel URL of ``sha``."""
        return self.url_template.format(sha=sha, short=sha[:7])

    def _build(self, sha: str, root: Path) -> BuildEnvironment:
        python = make_layered_venv(root / "venv", self.python, sha=sha)
        env = BuildEnvironment(sha=sha, provider=self.name, python=python, root=root,
                               workdir=root, venv=root / "venv")
        url = self.url_for(sha)
        _run_logged(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
             "--progress-bar", "off", *self.pip_args, url],
            sha=sha, cwd=root, env={**env.environ(), "PIP_NO_INPUT": "1"},
            timeout_s=self.timeout_s, log_path=root / "build.log", what=f"pip install {url}",
        )
        return env


def make_provider(
    kind: str,
    *,
    repo_path: str | Path | None = None,
    install_command: str = "",
    wheel_url: str | None = None,
    package: str | None = None,
    base_sha: str | None = None,
    work_dir: str | Path | None = None,
    python: str | Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> BuildProvider:
    """The build provider ``kind`` with its options checked.

    Args:
        kind: ``checkout`` | ``python-overlay`` | ``wheel``.
        repo_path: the local clone (``checkout``, ``python-overlay``).
        install_command: the install command (``checkout``).
        wheel_url: the URL template with ``{sha}`` (``wheel``).
        package: the import name laid over (``python-overlay``).
        base_sha: the commit of the installed build (``python-overlay``).
        work_dir, python, timeout_s: see :class:`BuildProvider`.

    Raises:
        InvalidInput: an unknown kind, or an option the kind needs is missing.
    """
    if kind == "checkout":
        if repo_path is None:
            raise InvalidInput("the checkout provider needs --repo")
        return CheckoutProvider(repo_path, install_command, work_dir=work_dir, python=python,
                                timeout_s=timeout_s)
    if kind == "python-overlay":
        if repo_path is None or not package or not base_sha:
            raise InvalidInput("the python-overlay provider needs --repo, --package and --base-sha")
        return PythonOverlayProvider(repo_path, base_sha=base_sha, package=package,
                                     work_dir=work_dir, python=python, timeout_s=timeout_s)
    if kind == "wheel":
        if not wheel_url:
            raise InvalidInput("the wheel provider needs --wheel-url with {sha}")
        return WheelProvider(wheel_url, work_dir=work_dir, python=python, timeout_s=timeout_s)
    raise InvalidInput(
        f"provider: unknown build provider {kind!r}; choose one of {', '.join(PROVIDERS)}"
    )
