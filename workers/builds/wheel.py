"""The ``wheel`` provider: a wheel per commit that a CI publishes, pip-installed into a venv.

The URL template names the commit, e.g.
``https://ci.example/wheels/{sha}/torch-2.14.0-cp311-cp311-linux_x86_64.whl``.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput
from workers.builds.base import DEFAULT_TIMEOUT_S, BuildEnvironment, BuildProvider
from workers.builds.layered_venv import make_layered_venv, run_logged

if TYPE_CHECKING:
    from service.config import Settings


class WheelProvider(BuildProvider):
    """A wheel per commit, fetched from a URL template and pip-installed into a fresh venv.

    Args:
        url_template: a URL (or path) with ``{sha}`` (full commit id) and optionally ``{short}``
            (its first 7 hex digits), e.g. ``https://ci.example/{sha}/pkg-1.0-py3-none-any.whl``.
        pip_args: extra ``pip install`` arguments (e.g. ``["--no-deps"]``, an index URL).
        work_dir: where builds go (:class:`BuildProvider`).
        python: the interpreter the environments layer over (:class:`BuildProvider`).
        timeout_s: seconds one build may take (:class:`BuildProvider`).

    Raises:
        InvalidInput: the template names no ``{sha}``, or a field other than ``sha``/``short``.
    """

    name = "wheel"
    options = {"wheel_url": "URL template of a commit's wheel, with {sha} (--wheel-url)"}

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        work_dir: str | Path | None = None,
        python: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> WheelProvider:
        """The wheel provider of ``options`` (see :meth:`BuildProvider.from_options`).

        Raises:
            InvalidInput: no ``wheel_url``, or a template without ``{sha}``.
        """
        wheel_url = options.get("wheel_url")
        if not wheel_url:
            raise InvalidInput("the wheel provider needs --wheel-url with {sha}")
        return cls(wheel_url, work_dir=work_dir, python=python, timeout_s=timeout_s)

    @classmethod
    def spec_from_settings(cls, settings: Settings) -> dict[str, Any] | None:
        """``bisect_wheel_url`` (and ``source_repo_path``, if any); None without a URL."""
        if not settings.bisect_wheel_url:
            return None
        repo = str(settings.source_repo_path) if settings.source_repo_path else None
        return {"kind": cls.name, "wheel_url": settings.bisect_wheel_url, "repo": repo}

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
        env = BuildEnvironment(
            sha=sha, provider=self.name, python=python, root=root, workdir=root, venv=root / "venv"
        )
        url = self.url_for(sha)
        run_logged(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--progress-bar",
                "off",
                *self.pip_args,
                url,
            ],
            sha=sha,
            cwd=root,
            env={**env.environ(), "PIP_NO_INPUT": "1"},
            timeout_s=self.timeout_s,
            log_path=root / "build.log",
            what=f"pip install {url}",
        )
        return env
