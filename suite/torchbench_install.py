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
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from suite import registry
from suite import torchbench_checkout as checkout
from suite.model_info import TORCHBENCH_PREFIX
from suite.torchbench_check import PROBE

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


def installer_command(models: Sequence[str], *, python: str) -> list[str]:
    """The argv that runs TorchBench's ``install.py`` for ``models`` (TorchBench's names).

    ``--continue_on_fail`` keeps one model's failed install from ending the others; its output
    says which failed (:func:`parse_setup_output`).
    """
    return [python, INSTALLER, *models, "--continue_on_fail"]


# ---------------------------------------------------------------------------------------------
# torchvision and torchaudio from the index of the torch under test
# ---------------------------------------------------------------------------------------------

TORCH_LIBRARIES = ("torchvision", "torchaudio")
PYTORCH_INDEX = "https://download.pytorch.org/whl"
_LOCAL_TAG = re.compile(r"\+(cpu|cu\d+|rocm[\d.]+|xpu)$")


def torch_index(torch_version: str, configured: str | None = None) -> str | None:
    """The package index that holds the torchvision and torchaudio builds of ``torch_version``:
    ``configured`` when given; for a local variant tag (``2.13.0+cpu``, ``+cu130``,
    ``+rocm6.4``) PyTorch's index of that variant (``https://download.pytorch.org/whl/cpu``);
    None for a torch without a tag, whose matching builds are on the default index (PyPI).
    PyTorch's own install selector names these indexes (pytorch.org/get-started)."""
    if configured:
        return configured
    tag = _LOCAL_TAG.search(torch_version)
    return f"{PYTORCH_INDEX}/{tag.group(1)}" if tag else None


def _probe(python: str, *args: str) -> str:
    proc = subprocess.run(
        [python, str(PROBE), *args], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        raise InstallInputError(f"cannot run {python}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def library_errors(python: str) -> dict[str, str | None]:
    """Why torchvision and torchaudio do not import in the environment of ``python``
    (``not installed``, or the import's error: ``RuntimeError: operator torchvision::nms does
    not exist`` for a build of another torch), None for each that imports.

    Raises:
        InstallInputError: ``python`` cannot be run.
    """
    return dict(json.loads(_probe(python, "libraries", *TORCH_LIBRARIES)))


def installed_version(python: str, distribution: str) -> str | None:
    """The version of ``distribution`` installed in the environment of ``python``, or None.

    Raises:
        InstallInputError: ``python`` cannot be run.
    """
    for line in _probe(python, "freeze").splitlines():
        name, _, version = line.partition("==")
        if name == distribution.lower():
            return version
    return None


def torch_library_command(python: str, torch_version: str, index: str | None) -> list[str]:
    """The pip command that installs torchvision and torchaudio for ``torch_version`` from
    ``index`` (the default index when None), torch itself held where it is."""
    command = [python, "-m", "pip", "install", *TORCH_LIBRARIES, f"torch=={torch_version}"]
    return command + (["--index-url", index] if index else [])


# ---------------------------------------------------------------------------------------------
# Isolation: what TorchBench's top-level requirements installed is held while models install
# ---------------------------------------------------------------------------------------------


def write_constraints(python: str, path: Path) -> Path:
    """Write every distribution installed in the environment of ``python`` as ``name==version``
    constraints to ``path``: given to each model's pip (``PIP_CONSTRAINT``, which pip adds to
    the ``-c build/constraints.txt`` TorchBench passes), a model may add packages but not move
    one that TorchBench's top-level requirements (transformers, timm, their huggingface-hub)
    or torch installed, so its setup fails instead of breaking the other models.

    Raises:
        InstallInputError: ``python`` cannot be run.
        OSError: ``path`` cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_probe(python, "freeze"))
    return path


def constrained_environment(constraints: Path) -> dict[str, str]:
    """This process's environment with ``constraints`` added to ``PIP_CONSTRAINT``."""
    env = dict(os.environ)
    env["PIP_CONSTRAINT"] = " ".join(filter(None, [env.get("PIP_CONSTRAINT"), str(constraints)]))
    return env


# ---------------------------------------------------------------------------------------------
# What TorchBench's installer said
# ---------------------------------------------------------------------------------------------

_SETUP_LINE = re.compile(r"running setup for (?P<path>.+?)\.\.\.(?P<status>OK|FAIL|SKIP)")
_ERROR_FOR = re.compile(r"^Error for (?P<path>.+):$")
_RULE = re.compile(r"^-{20,}$")
_ERROR_WORD = re.compile(r"error|failed|exception", re.IGNORECASE)


@dataclass(frozen=True)
class SetupOutcome:
    """One model's setup as TorchBench's ``install.py`` reported it: ``status`` is ``OK``,
    ``FAIL`` or ``SKIP``; ``error`` the last error line of its log (None unless it failed)."""

    name: str
    status: str
    error: str | None = None


def parse_setup_output(text: str) -> dict[str, SetupOutcome]:
    """The models' setups in the output of TorchBench's ``install.py``.

    TorchBench's ``torchbenchmark.setup`` prints ``running setup for <model path>...OK`` (or
    ``FAIL``, ``SKIP - ...``) per model, then for each failure ``Error for <model path>:``
    and the model's log (its first and last 20 lines) between two rules of dashes. A failure's
    ``error`` is the last line of its log that says error/failed/exception (pip's ``ERROR: No
    matching distribution found for ...``, a traceback's last line), else its last line.
    """
    outcomes: dict[str, SetupOutcome] = {}
    block: list[str] | None = None
    current = None
    rules = 0
    for line in text.splitlines():
        setup = _SETUP_LINE.search(line)
        if setup:
            name = Path(setup["path"]).name
            outcomes[name] = SetupOutcome(name=name, status=setup["status"])
            continue
        error_for = _ERROR_FOR.match(line.strip())
        if error_for:
            current, block, rules = Path(error_for["path"]).name, [], 0
            continue
        if block is not None and current is not None:
            if _RULE.match(line.strip()):
                rules += 1
                if rules == 2:
                    lines = [ln.strip() for ln in block if ln.strip() and ln.strip() != "..."]
                    worded = [ln for ln in lines if _ERROR_WORD.search(ln)]
                    last = (worded or lines or ["(no output)"])[-1]
                    outcomes[current] = SetupOutcome(name=current, status="FAIL", error=last)
                    block, current = None, None
                continue
            block.append(line)
    return outcomes


def run_installer_captured(
    root: Path, command: Sequence[str], *, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``command`` in the checkout's root, its output passed on to our stderr line by line
    as it comes and kept; returns ``(exit code, output)``.

    Raises:
        InstallInputError: the interpreter in ``command`` cannot be started.
    """
    try:
        proc = subprocess.Popen(
            list(command),
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise InstallInputError(f"cannot run {command[0]}: {exc.strerror or exc}") from exc
    kept = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        kept.append(line)
    return proc.wait(), "".join(kept)
