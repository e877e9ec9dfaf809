"""The exact build a torch spec resolved to, and the frozen requirements of its environment.

``torch==2.13.0`` is pinned only up to PEP 440's local tag: it matches ``2.13.0+cpu`` and
``2.13.0+cu130`` alike, and which one pip installs depends on the host's pip configuration. So
after a venv is built, what went into it is read back and kept in its cache entry:

- from pip's installation report (``pip install --report``) of the torch step: the version with
  its local tag, the URL the wheel came from and the wheel's sha256;
- when no report is at hand (a wheel installed some other way), the sha256 of the installed
  distribution's ``RECORD``, which lists every file with its own hash;
- the frozen list of every distribution in the venv (``name==version``, read with
  ``importlib.metadata`` by the venv's own interpreter), written as ``requirements.lock``.

The variant and the hash of the frozen requirements that did not come with torch (the suite's
requirements and theirs) join each result's environment, and through it the series identity
(``service/results/records.py``): a wheel of another variant or moved suite requirements start a
new series instead of reading as a regression.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from service.errors import (
    EnvironmentBuildError,
    InvalidTorchSpec,
)
from service.results.records import torch_variant

__all__ = [
    "LOCK_FILE",
    "EnvironmentBuildError",
    "InvalidTorchSpec",
    "ResolvedBuild",
    "freeze",
    "pip_sources",
    "read_install_report",
    "resolve_build",
    "run_pip",
    "tail",
    "torch_variant",
]

logger = logging.getLogger(__name__)

LOCK_FILE = "requirements.lock"
"""The frozen requirements of a cached venv, one ``name==version`` a line, in its directory."""

_FREEZE_TIMEOUT_S = 300.0
_PIP_TIMEOUT_S = 3600.0
# pip's words when no index has the build or it conflicts with the other pins: the spec is
# wrong, and a retry would fail the same way.
_NO_SUCH_BUILD = (
    "No matching distribution found",
    "Could not find a version that satisfies",
    "ResolutionImpossible",
)
# The pip settings that decide where ``torch==X`` comes from, hence which variant it is.
_PIP_SOURCE_VARIABLES = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_CONFIG_FILE",
)
# What `pip freeze` leaves out too: the installer's own packages say nothing about the build.
_INSTALLER_PACKAGES = frozenset({"pip", "setuptools", "wheel", "distribute"})
_FREEZE_SCRIPT = (
    "import json, importlib.metadata as m; "
    "print(json.dumps(sorted({(d.metadata['Name'] or '', d.version): None "
    "for d in m.distributions()})))"
)
_RECORD_SCRIPT = (
    "import sys, importlib.metadata as m; "
    "d = m.distribution(sys.argv[1]); "
    "r = [p for p in d.files or () if p.name == 'RECORD' and p.parent.name.endswith('.dist-info')]; "
    "print(d.locate_file(r[0]) if r else '')"
)


@dataclass(frozen=True)
class ResolvedBuild:
    """The torch wheel a spec resolved to, and the frozen requirements around it.

    Attributes:
        torch_version: the installed version with its local tag, e.g. ``"2.13.0+cpu"``.
        torch_variant: the local tag (``"cpu"``, ``"cu130"``), ``""`` when there is none.
        source: the URL the wheel came from (an index's file URL, a ``file://`` path, or the
            spec's own URL); ``""`` when unknown.
        index_url: the index torch was installed from (None: pip's configured one).
        torch_sha256: sha256 (hex) of the wheel, or of the distribution's ``RECORD``.
        digest_of: ``"wheel"`` or ``"record"``: what :attr:`torch_sha256` is the hash of.
        requirements: the frozen venv, ``name==version`` lines, sorted, torch included.
        requirements_hash: sha256 (16 hex) of the lines that did not come with torch.
    """

    torch_version: str
    torch_variant: str
    source: str
    index_url: str | None
    torch_sha256: str
    digest_of: str
    requirements: tuple[str, ...]
    requirements_hash: str

    def environment_fields(self) -> dict[str, Any]:
        """What a result's environment records of the build (see ``suite/environment.py``).

        Returns:
            ``torch_variant``, ``torch_source``, ``torch_sha256``, ``torch_sha256_of`` and
            ``requirements_hash``.
        """
        return {
            "torch_variant": self.torch_variant,
            "torch_source": self.source,
            "torch_sha256": self.torch_sha256,
            "torch_sha256_of": self.digest_of,
            "requirements_hash": self.requirements_hash,
        }

    def to_json(self) -> dict[str, Any]:
        """The build as JSON-ready values (for the cache entry's metadata)."""
        return {**asdict(self), "requirements": list(self.requirements)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResolvedBuild:
        """The build written by :meth:`to_json`.

        Args:
            data: the dict :meth:`to_json` returned.

        Returns:
            The build.
        """
        return cls(**{**data, "requirements": tuple(data["requirements"])})


def read_install_report(path: Path) -> dict[str, dict[str, Any]]:
    """What a ``pip install --report`` file says was installed, by canonical name.

    Args:
        path: the report (pip's installation report format, version 1).

    Returns:
        ``name -> {"version", "url", "sha256"}``; ``url`` and ``sha256`` are ``""`` when the
        report has none (a local directory, a requirement already satisfied).

    Raises:
        EnvironmentBuildError: the file is missing or is not a report.
    """
    try:
        report = json.loads(path.read_text())
        items = report["install"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EnvironmentBuildError(
            f"pip's installation report {path} is unreadable: {exc}"
        ) from exc
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        info = item.get("download_info") or {}
        archive = info.get("archive_info") or {}
        sha256 = (archive.get("hashes") or {}).get("sha256", "")
        if not sha256 and str(archive.get("hash", "")).startswith("sha256="):
            sha256 = archive["hash"].split("=", 1)[1]
        name = canonicalize_name(item["metadata"]["name"])
        found[name] = {
            "version": str(item["metadata"]["version"]),
            "url": str(info.get("url", "")),
            "sha256": sha256,
        }
    return found


def _ask(python: Path, script: str, *args: str) -> str:
    try:
        proc = subprocess.run(
            [str(python), "-I", "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=_FREEZE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentBuildError(f"could not ask {python} what it has installed: {exc}") from exc
    if proc.returncode != 0:
        raise EnvironmentBuildError(
            f"{python} could not list its distributions (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}"
        )
    return proc.stdout.strip()


def freeze(python: Path) -> list[str]:
    """The distributions an interpreter has installed, as ``pip freeze`` would pin them.

    Args:
        python: the interpreter (run with ``-I``: nothing on ``PYTHONPATH`` counts).

    Returns:
        Sorted ``name==version`` lines with canonical names; pip, setuptools and wheel left out.

    Raises:
        EnvironmentBuildError: the interpreter does not answer.
    """
    pairs = json.loads(_ask(python, _FREEZE_SCRIPT).splitlines()[-1])
    lines = {f"{canonicalize_name(name)}=={version}" for name, version in pairs if name}
    return sorted(line for line in lines if line.split("==", 1)[0] not in _INSTALLER_PACKAGES)


def _record_sha256(python: Path) -> str:
    """sha256 of the installed torch distribution's ``RECORD`` (``""`` when it has none)."""
    where = _ask(python, _RECORD_SCRIPT, "torch").splitlines()
    if not where or not where[-1]:
        return ""
    return hashlib.sha256(Path(where[-1]).read_bytes()).hexdigest()


def resolve_build(
    python: Path,
    *,
    report: Path | None,
    index_url: str | None,
    lock_path: Path,
) -> ResolvedBuild:
    """Read back which torch wheel a venv got and freeze its requirements into ``lock_path``.

    Args:
        python: the venv's interpreter.
        report: pip's installation report of the torch step (None: no report, the hash is then
            that of the installed distribution's ``RECORD``).
        index_url: the index the torch step was pointed at (None: pip's configured one).
        lock_path: where to write the frozen requirements (the cache entry's lock file).

    Returns:
        The resolved build.

    Raises:
        EnvironmentBuildError: the report is unreadable, or the venv has no torch.
    """
    installed = read_install_report(report) if report is not None else {}
    lines = freeze(python)
    lock_path.write_text("".join(f"{line}\n" for line in lines))
    pins = dict(line.split("==", 1) for line in lines)
    if "torch" not in pins:
        raise EnvironmentBuildError(f"{python} has no torch distribution installed")
    torch = installed.get("torch", {})
    sha256, digest_of = torch.get("sha256", ""), "wheel"
    if not sha256:
        sha256, digest_of = _record_sha256(python), "record"
    # torch and what its own install step brought belong to the build under test, which is what
    # a series compares; the rest (the suite's requirements and theirs) is part of its identity.
    with_torch = set(installed) | {"torch"}
    suite_lines = [line for line in lines if line.split("==", 1)[0] not in with_torch]
    digest = hashlib.sha256("\n".join(suite_lines).encode()).hexdigest()[:16]
    return ResolvedBuild(
        torch_version=pins["torch"],
        torch_variant=torch_variant(pins["torch"]),
        source=str(torch.get("url", "")),
        index_url=index_url,
        torch_sha256=sha256,
        digest_of=digest_of,
        requirements=tuple(lines),
        requirements_hash=digest,
    )


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of ``text`` (for error messages)."""
    return "\n".join(text.strip().splitlines()[-lines:])


def _pip_config_files() -> list[Path]:
    """The configuration files pip reads, where it looks for them (site, user, global; Linux)."""
    home = Path.home()
    xdg = [Path(d) for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep) if d]
    files = [
        *(d / "pip" / "pip.conf" for d in xdg),
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        home / ".config" / "pip" / "pip.conf",
    ]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    return files


def pip_sources() -> dict[str, str]:
    """The host's pip settings that decide which wheel ``torch==X`` resolves to.

    ``torch==2.13.0`` matches ``2.13.0+cpu`` and ``2.13.0+cu130``: the index, extra indexes and
    find-links pip is configured with pick one. They go into the environment's cache key, so a
    host whose pip configuration changed builds a new venv instead of reusing the old variant.

    Returns:
        ``PIP_*`` variables that name sources, and the text of each pip configuration file
        present (keyed by path).
    """
    found = {name: os.environ[name] for name in _PIP_SOURCE_VARIABLES if name in os.environ}
    for path in _pip_config_files():
        if path.is_file():
            try:
                found[str(path)] = path.read_text()
            except OSError as exc:
                found[str(path)] = f"unreadable: {exc}"
    return found


def run_pip(python: Path, args: Sequence[str], *, what: str) -> None:
    """``python -m pip install ARGS``, with pip's refusal of a build as :class:`InvalidTorchSpec`.

    Args:
        python: the venv's interpreter.
        args: pip's arguments after ``install``.
        what: what is installed, as messages name it.

    Raises:
        InvalidTorchSpec: no index has the build, or it conflicts with the other pins.
        EnvironmentBuildError: pip failed otherwise, or did not finish in an hour.
    """
    command = [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        *args,
    ]
    logger.info("installing %s: %s", what, " ".join(command[3:]))
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_PIP_TIMEOUT_S,
            env={**os.environ, "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentBuildError(
            f"pip install of {what} did not finish in {_PIP_TIMEOUT_S:.0f} s"
        ) from exc
    if proc.returncode != 0:
        output = proc.stderr + proc.stdout
        if any(marker in output for marker in _NO_SUCH_BUILD):
            reasons = [
                line.strip()
                for line in output.splitlines()
                if line.startswith("ERROR:") or "requested" in line
            ]
            raise InvalidTorchSpec(
                f"pip cannot install {what}: " + (" ".join(reasons) or tail(output, 3))
            )
        raise EnvironmentBuildError(
            f"pip install of {what} failed (exit {proc.returncode}):\n{tail(output)}"
        )
