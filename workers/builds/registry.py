"""The build providers by kind: adding a provider is one module and one line here.

A kind's class (a :class:`~workers.builds.base.BuildProvider`) owns its options, how they
make it (``from_options``) and how the settings make a night's provider spec
(``spec_from_settings``; :func:`spec_from_settings` adds what every kind's spec carries).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput
from workers.builds.base import DEFAULT_TIMEOUT_S, BuildProvider
from workers.builds.checkout import CheckoutProvider
from workers.builds.overlay import PythonOverlayProvider
from workers.builds.wheel import WheelProvider

if TYPE_CHECKING:
    from service.config import Settings

__all__ = [
    "KINDS",
    "PROVIDERS",
    "BuildProvider",
    "make_provider",
    "provider_from_spec",
    "spec_from_settings",
]

PROVIDERS: dict[str, type[BuildProvider]] = {
    provider.name: provider for provider in (CheckoutProvider, PythonOverlayProvider, WheelProvider)
}
"""Kind -> provider class, in the order errors and help list them."""
KINDS = tuple(PROVIDERS)
"""The kinds: ``checkout``, ``python-overlay``, ``wheel``."""


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
        kind: a kind of :data:`PROVIDERS`: ``checkout`` | ``python-overlay`` | ``wheel``.
        repo_path: the local clone (``checkout``, ``python-overlay``).
        install_command: the install command (``checkout``).
        wheel_url: the URL template with ``{sha}`` (``wheel``).
        package: the import name laid over (``python-overlay``).
        base_sha: the commit of the installed build (``python-overlay``).
        work_dir: where builds go (:class:`BuildProvider`).
        python: the interpreter the environments layer over (:class:`BuildProvider`).
        timeout_s: seconds one build may take (:class:`BuildProvider`).

    Raises:
        InvalidInput: an unknown kind, or an option the kind needs is missing.
    """
    provider = PROVIDERS.get(kind)
    if provider is None:
        raise InvalidInput(
            f"provider: unknown build provider {kind!r}; choose one of {', '.join(PROVIDERS)}"
        )
    options = {
        "repo_path": repo_path,
        "install_command": install_command,
        "wheel_url": wheel_url,
        "package": package,
        "base_sha": base_sha,
    }
    return provider.from_options(options, work_dir=work_dir, python=python, timeout_s=timeout_s)


def provider_from_spec(spec: Mapping[str, Any], *, work_dir: str | Path | None) -> BuildProvider:
    """The build provider a bisection's stored spec names (``{"kind": ..., "repo": ...}``).

    Args:
        spec: the spec (:func:`spec_from_settings`, or the one a bisection was created with).
        work_dir: where builds go.

    Raises:
        InvalidInput: an unknown kind, or the spec's options are incomplete.
    """
    return make_provider(
        spec.get("kind", ""),
        repo_path=spec.get("repo"),
        install_command=spec.get("install_command", ""),
        wheel_url=spec.get("wheel_url"),
        package=spec.get("package"),
        base_sha=spec.get("base_sha"),
        work_dir=work_dir,
    )


def spec_from_settings(settings: Settings) -> dict[str, Any] | None:
    """The provider spec for bisecting a night's range: ``bisect_provider``'s, from settings.

    Args:
        settings: ``bisect_provider`` and the options of its kind; its
            :attr:`~service.config.Settings.source_code_url` for the spec's ``code_url``.

    Returns:
        ``{"kind": KIND, ..., "code_url": URL}`` (``code_url``: the GitHub repository the source
        comes from, for commit links in issues; None without one), or None when no provider is
        configured or its kind lacks an option.
    """
    provider = PROVIDERS.get(settings.bisect_provider or "")
    spec = provider.spec_from_settings(settings) if provider is not None else None
    if spec is None:
        return None
    spec["code_url"] = settings.source_code_url
    return spec
