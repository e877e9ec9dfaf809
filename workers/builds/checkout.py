"""The ``checkout`` provider: a git worktree at the commit and an install command run in it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput
from workers.builds.base import (
    DEFAULT_TIMEOUT_S,
    BuildEnvironment,
    BuildError,
    BuildProvider,
    locked,
    log_tail,
)
from workers.builds.layered_venv import make_layered_venv, run_logged

if TYPE_CHECKING:
    from service.config import Settings

_thread_lock = threading.Lock()


class CheckoutProvider(BuildProvider):
    """A git worktree at the commit plus an install command run in it.

    Args:
        repo_path: a local clone holding every commit of the range.
        install_command: a shell command run in the worktree with the new environment's
            ``bin`` first on ``PATH``, e.g. ``pip install --no-deps -e .``; for PyTorch, the
            ccache'd ``python setup.py develop`` shown in :mod:`workers.builds.base`. Empty: no
            install step (the command under test imports from the checkout).
        work_dir: where builds go (:class:`BuildProvider`).
        python: the interpreter the environments layer over (:class:`BuildProvider`).
        timeout_s: seconds one build may take (:class:`BuildProvider`).

    Raises:
        InvalidInput: ``repo_path`` is not a git work tree.
    """

    name = "checkout"
    options = {
        "repo_path": "local git clone holding every commit of the range (--repo)",
        "install_command": "install command run in each probe's checkout (--install)",
    }

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        work_dir: str | Path | None = None,
        python: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CheckoutProvider:
        """The checkout provider of ``options`` (see :meth:`BuildProvider.from_options`).

        Raises:
            InvalidInput: no ``repo_path``, or it is not a git work tree.
        """
        repo_path = options.get("repo_path")
        if repo_path is None:
            raise InvalidInput("the checkout provider needs --repo")
        return cls(
            repo_path,
            options.get("install_command") or "",
            work_dir=work_dir,
            python=python,
            timeout_s=timeout_s,
        )

    @classmethod
    def spec_from_settings(cls, settings: Settings) -> dict[str, Any] | None:
        """``source_repo_path`` and ``bisect_install_command``; None without a repository."""
        if not settings.source_repo_path:
            return None
        return {
            "kind": cls.name,
            "repo": str(settings.source_repo_path),
            "install_command": settings.bisect_install_command,
        }

    def __init__(self, repo_path: str | Path, install_command: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.repo_path = Path(repo_path).resolve()
        if not (self.repo_path / ".git").exists():
            raise InvalidInput(f"repo: {self.repo_path} is not a git work tree")
        self.install_command = install_command.strip()

    def _worktree(self, *args: str) -> tuple[int, str]:
        """``git worktree <args>`` in the clone (GitPython): its exit status and stderr; a
        failure is the caller's to judge (a prune or a remove may fail harmlessly)."""
        import git  # GitPython, as workers/commits.py; imported here to keep imports cheap

        status, _out, err = git.Git(str(self.repo_path)).worktree(
            *args, with_extended_output=True, with_exceptions=False
        )
        return status, err

    def _build(self, sha: str, root: Path) -> BuildEnvironment:
        src = root / "src"
        # git serialises worktree bookkeeping through files in .git; one add at a time.
        with _thread_lock, locked(self.work_dir / ".worktree.lock"):
            self._worktree("prune")
            # --force twice: a worktree left locked by a build that was killed mid-way (a
            # redelivered probe task) is taken over rather than refused.
            status, err = self._worktree("add", "--detach", "--force", "--force", str(src), sha)
        if status != 0:
            raise BuildError(sha, "git worktree add failed", log=log_tail(err))
        python = make_layered_venv(root / "venv", self.python, sha=sha)
        env = BuildEnvironment(
            sha=sha, provider=self.name, python=python, root=root, workdir=src, venv=root / "venv"
        )
        if self.install_command:
            run_logged(
                self.install_command,
                sha=sha,
                cwd=src,
                env=env.environ(),
                timeout_s=self.timeout_s,
                log_path=root / "build.log",
                what=f"install command {self.install_command!r}",
            )
        return env

    def _discard(self, root: Path) -> None:
        if (root / "src").exists():
            with _thread_lock, locked(self.work_dir / ".worktree.lock"):
                self._worktree("remove", "--force", "--force", str(root / "src"))
        super()._discard(root)
        with _thread_lock, locked(self.work_dir / ".worktree.lock"):
            self._worktree("prune")
