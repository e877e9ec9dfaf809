"""Install the requirements of chosen TorchBench models with the checkout's own installer.

TorchBench installs a model's requirements through ``install.py`` at the root of a
pytorch/benchmark checkout: ``python install.py [MODEL ...] [--continue_on_fail] [--torch]``
installs the checkout's top-level ``requirements.txt``, then runs each named model's own
``install.py`` (its ``requirements.txt``, data files), every model when none is named
(pytorch/benchmark ``install.py``, ``torchbenchmark.setup``). It needs numpy, torch,
torchvision and torchaudio installed first (:data:`TORCH_DEPS`), and refuses a model whose
install changed their versions.

This module picks the models as ``nightbench nightly --models`` does (``torchbench.<name>`` and
shell-style patterns such as ``torchbench.hf_*``), runs the installer with the interpreter given
(the one nightbench runs in by default, so the models' requirements land where the listing and
the runs look for them), and says afterwards which of the models are still unavailable and why.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from suite import registry
from suite import torchbench_checkout as checkout
from suite.model_info import TORCHBENCH_PREFIX

INSTALLER = "install.py"
# What TorchBench's installer checks before it installs anything: install.py reads the versions
# of these distributions to pin them (build/constraints.txt), and torchbenchmark.setup reads
# them again around each model's install.py (its TORCH_DEPS; install.py's --torch narrows only
# the first check), so without any one of them every model's setup fails.
TORCH_DEPS = ("numpy", "torch", "torchvision", "torchaudio")


class InstallInputError(ValueError):
    """Bad input for an install: not a checkout, no installer, a model pattern that matches
    nothing. The message names what was wrong."""


@dataclass(frozen=True)
class Selection:
    """The models an install covers.

    Attributes:
        torchbench: TorchBench's names of the chosen models (``hf_Bert``, no prefix), sorted.
        own: the own suite's models that were named; their requirements come with nightbench,
            so the installer is not run for them.
    """

    torchbench: list[str]
    own: list[str]


def checkout_for_install(path: str | os.PathLike[str] | None) -> Path:
    """The root of the checkout to install into: ``path``, else ``NIGHTBENCH_TORCHBENCH_PATH``.

    Raises:
        InstallInputError: neither is given, the directory is not a pytorch/benchmark checkout
            (no ``torchbenchmark/__init__.py`` and ``torchbenchmark/models/``), or it has no
            ``install.py`` at its root (TorchBench's installer).
    """
    given = str(path) if path is not None else os.environ.get(checkout.ENV_VAR)
    if not given:
        raise InstallInputError(
            f"no TorchBench checkout: pass --torchbench PATH or set {checkout.ENV_VAR}"
        )
    root = Path(given).expanduser()
    package = root / "torchbenchmark"
    if not (package / "__init__.py").is_file() or not (package / "models").is_dir():
        raise InstallInputError(
            f"{given} is not a pytorch/benchmark checkout "
            f"(no torchbenchmark/__init__.py and torchbenchmark/models/ under it)"
        )
    if not (root / INSTALLER).is_file():
        raise InstallInputError(
            f"{given} has no {INSTALLER} at its root (TorchBench's installer); "
            f"check out pytorch/benchmark as a whole, not only torchbenchmark/"
        )
    return root.resolve()


def _names(root: Path) -> list[str]:
    models = root / "torchbenchmark" / "models"
    return sorted(p.name for p in models.iterdir() if (p / "__init__.py").is_file())


def select(root: Path, patterns: Sequence[str]) -> Selection:
    """The models ``patterns`` pick, with ``nightbench nightly --models`` rules: an entry
    starting ``torchbench.`` matches the checkout's models (``torchbench.hf_*``), any other the
    own suite's (``*`` matches all of the own suite). An empty ``patterns`` is every model of
    the checkout.

    Raises:
        InstallInputError: an entry matches no model (the message names every such entry).
    """
    tb_names = _names(root)
    if not patterns:
        return Selection(torchbench=tb_names, own=[])
    prefixed = [TORCHBENCH_PREFIX + n for n in tb_names]
    own_names = registry.model_names()
    chosen: set[str] = set()
    own: set[str] = set()
    unknown = []
    for pattern in patterns:
        tb_hits = fnmatch.filter(prefixed, pattern)
        own_hits = fnmatch.filter(own_names, pattern)
        chosen.update(name[len(TORCHBENCH_PREFIX) :] for name in tb_hits)
        own.update(own_hits)
        if not tb_hits and not own_hits:
            unknown.append(pattern)
    if unknown:
        raise InstallInputError(
            f"unknown model(s): {', '.join(unknown)}; TorchBench's are named "
            f"{TORCHBENCH_PREFIX}<name> (see `python -m suite list --suite torchbench`)"
        )
    return Selection(torchbench=sorted(chosen), own=sorted(own))


def missing_torch_deps() -> list[str]:
    """The distributions of :data:`TORCH_DEPS` not installed in this interpreter, in order."""
    importlib.invalidate_caches()
    missing = []
    for name in TORCH_DEPS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def check_torch_deps() -> None:
    """Refuse to start TorchBench's installer where it cannot install a model.

    Raises:
        InstallInputError: a distribution of :data:`TORCH_DEPS` is not installed (the message
            names each one and what to install).
    """
    missing = missing_torch_deps()
    if missing:
        raise InstallInputError(
            f"{', '.join(missing)} not installed here: TorchBench's install.py and each "
            f"model's setup read the versions of {', '.join(TORCH_DEPS)}, so every model's "
            f"install would fail; install the torchvision and torchaudio builds that match "
            f"this torch first (from torch's own index)"
        )


def installer_command(models: Sequence[str], *, python: str) -> list[str]:
    """The argv that runs TorchBench's ``install.py`` for ``models`` (TorchBench's names).

    ``--continue_on_fail`` keeps one model's failed install from ending the others; the models
    still unavailable afterwards are reported by :func:`unavailable`.
    """
    return [python, INSTALLER, *models, "--continue_on_fail"]


def run_installer(
    root: Path,
    command: Sequence[str],
    runner: Callable[..., subprocess.CompletedProcess[bytes]] = subprocess.run,
) -> int:
    """Run ``command`` in the checkout's root (``install.py`` imports the checkout's ``utils``
    and ``userbenchmark`` from there), its output on ours. Returns its exit code.

    Raises:
        InstallInputError: the interpreter in ``command`` cannot be started.
    """
    try:
        return runner(list(command), cwd=root, check=False).returncode
    except OSError as exc:
        raise InstallInputError(f"cannot run {command[0]}: {exc.strerror or exc}") from exc


def unavailable(root: Path, models: Sequence[str]) -> dict[str, str]:
    """Which of ``models`` (TorchBench's names) the listing would still mark unavailable, by
    the same reading of files the listing does (requirements not installed, modules not
    found), in the interpreter that calls this. Maps ``torchbench.<name>`` to the reason."""
    importlib.invalidate_caches()  # what the installer just added must be seen
    previous = os.environ.get(checkout.ENV_VAR)
    os.environ[checkout.ENV_VAR] = str(root)
    try:
        reasons = {}
        for name in models:
            requirements = checkout.missing_requirements(name)
            modules = checkout.missing_modules(name)
            parts = []
            if requirements:
                parts.append(f"missing requirement(s): {', '.join(requirements)}")
            if modules:
                parts.append(f"missing module(s): {', '.join(modules)}")
            if parts:
                reasons[TORCHBENCH_PREFIX + name] = "; ".join(parts)
        return reasons
    finally:
        if previous is None:
            del os.environ[checkout.ENV_VAR]
        else:
            os.environ[checkout.ENV_VAR] = previous
