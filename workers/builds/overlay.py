"""The ``python-overlay`` provider: a commit's ``.py`` files laid over an installed build.

For commits that change only ``.py`` files relative to an installed build, a copy of the
installed package with that commit's ``.py`` files laid over it, the way PyTorch's
``tools/nightly.py`` gives developers a Python-only checkout on top of a nightly binary.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput
from workers.builds.base import DEFAULT_TIMEOUT_S, BuildEnvironment, BuildError, BuildProvider
from workers.commits import changed_files

if TYPE_CHECKING:
    from service.config import Settings

# Changes that cannot alter an installed package: the overlay ignores them.
OVERLAY_IGNORED = (
    "*.md",
    "*.rst",
    "*.txt",
    "docs/*",
    ".github/*",
    ".ci/*",
    "test/*",
    "tests/*",
    "benchmarks/*",
    ".gitignore",
    ".flake8",
    ".lintrunner.toml",
    "CODEOWNERS",
)


class PythonOverlayProvider(BuildProvider):
    """An installed build with a commit's ``.py`` files laid over a copy of its package.

    The copy links every non-Python file (shared libraries, headers) to the installed build and
    copies the ``.py`` files, then writes the files the commit changed (relative to the commit
    the installed build was made from) from git's object store; deleted modules are removed.
    Bytecode caches are copied with the sources they were compiled from (Python checks a cache
    against its source's mtime and size, which the copy keeps), and those of the modules the
    commit changed or deleted are removed, so nothing stale is imported and an unchanged module
    is not compiled again in every build (for torch, seconds of CPU a process, minutes under
    valgrind: docs/benchmarks/counts-bisection.md).

    Args:
        repo_path: a local clone holding both commits.
        base_sha: the commit the installed build was made from (for torch,
            ``torch.version.git_version``).
        package: the import name, e.g. ``"torch"``.
        source_dir: the package's directory in the repository (default: ``package``).
        installed: the installed package's directory (default: found by asking ``python``).
        ignored: glob patterns of repository paths whose changes cannot alter the installed
            package (docs, tests, CI files).
        work_dir: where builds go (:class:`BuildProvider`).
        python: the interpreter the environments layer over (:class:`BuildProvider`).
        timeout_s: seconds one build may take (:class:`BuildProvider`).

    Raises:
        InvalidInput: the installed package cannot be found.
    """

    name = "python-overlay"
    options = {
        "repo_path": "local git clone holding the range and the installed build's commit (--repo)",
        "package": "the installed package to lay the commit's .py files over (--package)",
        "base_sha": "the commit the installed package was built from (--base-sha)",
    }

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        work_dir: str | Path | None = None,
        python: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> PythonOverlayProvider:
        """The python-overlay provider of ``options`` (see :meth:`BuildProvider.from_options`).

        Raises:
            InvalidInput: no ``repo_path``, ``package`` or ``base_sha``, or the package is not
                installed.
        """
        repo_path, package = options.get("repo_path"), options.get("package")
        base_sha = options.get("base_sha")
        if repo_path is None or not package or not base_sha:
            raise InvalidInput("the python-overlay provider needs --repo, --package and --base-sha")
        return cls(
            repo_path,
            base_sha=base_sha,
            package=package,
            work_dir=work_dir,
            python=python,
            timeout_s=timeout_s,
        )

    @classmethod
    def spec_from_settings(cls, settings: Settings) -> dict[str, Any] | None:
        """``source_repo_path`` and ``bisect_package``; None without a repository.

        The spec's ``base_sha`` is the first commit of the range bisected, added by the caller.
        """
        if not settings.source_repo_path:
            return None
        return {
            "kind": cls.name,
            "repo": str(settings.source_repo_path),
            "package": settings.bisect_package,
        }

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
        proc = subprocess.run(
            [str(self.python), "-c", code, self.package], capture_output=True, text=True
        )
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
        for dirpath, _dirnames, filenames in os.walk(self.installed):
            rel = Path(dirpath).relative_to(self.installed)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for name in filenames:
                source = Path(dirpath) / name
                if name.endswith((".py", ".pyc")):  # copied: a probe may rewrite its cache
                    shutil.copy2(source, target / rel / name)
                else:
                    os.symlink(source, target / rel / name)
        tree = git.Repo(str(self.repo_path)).commit(sha).tree
        for status, path in changes:
            dest = target / path[len(self.source_dir) + 1 :]
            if dest.exists() or dest.is_symlink():
                dest.unlink()
            for cached in (dest.parent / "__pycache__").glob(f"{dest.stem}.*.pyc"):
                cached.unlink()
            if status != "D":
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tree[path].data_stream.read())
        (root / "overlay.json").write_text(json.dumps(changes))
        return BuildEnvironment(
            sha=sha,
            provider=self.name,
            python=self.python,
            root=root,
            workdir=site,
            pythonpath=(str(site),),
        )
