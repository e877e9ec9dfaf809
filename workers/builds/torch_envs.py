"""The environment a build under test is measured in: one cached virtual environment per torch spec.

A torch spec is a pip requirement that pins one build (``torch==2.13.0``, a nightly
``torch==2.14.0.dev20261121`` from ``NIGHTBENCH_TORCH_INDEX_URL``, or ``torch @ URL`` for a wheel
a build provider made), or ``current`` for the interpreter running nightbench. For a pinned spec a
worker creates a venv with the standard library's ``venv`` and installs the spec plus the suite's
own requirements (the ``suite`` extra in ``pyproject.toml``) with pip. The venv is cached under
``NIGHTBENCH_ENV_CACHE_DIR`` by a key over everything that decides its contents, so the next night
on the same spec reuses it, and the cache is kept within ``NIGHTBENCH_ENV_CACHE_BUDGET_BYTES`` by
evicting the least-recently-used venvs.

The cache itself (locks, LRU eviction) is ``workers/builds/env_cache.py``; each venv in it also holds
``nightbench-suite/suite``, a link to the worker's suite package, which goes on ``PYTHONPATH``, and
what the spec resolved to (``workers/builds/build_lock.py``: the wheel's variant, source and
sha256, and ``requirements.lock``), since ``torch==2.13.0`` matches ``+cpu`` and ``+cu130`` alike.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
import uuid
import venv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from service.config import Settings, get_settings
from workers.builds.build_lock import (
    LOCK_FILE,
    EnvironmentBuildError,
    InvalidTorchSpec,
    ResolvedBuild,
    pip_sources,
    resolve_build,
    run_pip,
    tail,
)
from workers.builds.env_cache import METADATA_FILE, BuildFn, EnvironmentCache

__all__ = [
    "CURRENT",
    "LOCK_FILE",
    "METADATA_FILE",
    "BuildIdentity",
    "Environment",
    "EnvironmentBuildError",
    "EnvironmentCache",
    "InvalidTorchSpec",
    "ResolvedBuild",
    "environment_key",
    "parse_torch_spec",
    "pip_sources",
    "prepare_environment",
    "query_identity",
    "suite_package_dir",
    "suite_requirements",
    "use_environment",
]

logger = logging.getLogger(__name__)

CURRENT = "current"
"""The spec that means the interpreter running nightbench (the embedded default)."""

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or image directory) nightbench runs from; its ``pyproject.toml`` is read here."""

SUITE_LINK_DIR = "nightbench-suite"

_IDENTITY_TIMEOUT_S = 300.0
_IDENTITY_SCRIPT = (
    "import json, platform, torch; "
    "print(json.dumps({'torch_version': torch.__version__, "
    "'git_version': getattr(torch.version, 'git_version', None), "
    "'python_version': platform.python_version()}))"
)


@dataclass(frozen=True)
class BuildIdentity:
    """What a run was measured on: the torch build's identity.

    Attributes:
        torch_version: ``torch.__version__``, e.g. ``"2.13.0+cpu"``.
        git_version: ``torch.version.git_version``, the 40-hex commit the build came from (None
            for builds that do not record it).
        python_version: the interpreter's version, e.g. ``"3.11.9"``.
    """

    torch_version: str
    git_version: str | None
    python_version: str


@dataclass(frozen=True)
class Environment:
    """An interpreter to run ``python -m suite`` with, for one torch spec.

    Attributes:
        spec: the normalised torch spec (``"current"`` for the running interpreter).
        python: the interpreter's path.
        identity: the torch build it imports.
        key: the cache key (None for ``current``).
        path: the venv's directory (None for ``current``).
        created: True when this call built the venv, False when it was reused.
        suite_path: the directory to put on ``PYTHONPATH`` so that ``python -m suite`` imports
            the suite (for a venv, a directory holding only a link to the suite package, so
            that nothing else of the worker's own installation can shadow the build under test).
        build: the exact wheel and frozen requirements the venv holds (None for ``current`` and
            for venvs cached before these were recorded).
    """

    spec: str
    python: Path
    identity: BuildIdentity
    suite_path: Path
    key: str | None = None
    path: Path | None = None
    created: bool = False
    build: ResolvedBuild | None = None

    def subprocess_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The process environment for running the suite with :attr:`python`.

        Args:
            base: environment to start from (default ``os.environ``).

        Returns:
            A copy of ``base`` with :attr:`suite_path` on ``PYTHONPATH``. For a cached venv the
            outer ``PYTHONPATH`` and the user site are dropped, so nothing from the worker's own
            environment leaks into the build under test.
        """
        env = dict(os.environ if base is None else base)
        if self.path is None:
            outer = env.get("PYTHONPATH")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.suite_path), outer) if p)
        else:
            env["PYTHONPATH"] = str(self.suite_path)
            env["PYTHONNOUSERSITE"] = "1"
            env["VIRTUAL_ENV"] = str(self.path)
            env["PATH"] = os.pathsep.join([str(self.path / "bin"), env.get("PATH", "")])
        return env


def parse_torch_spec(spec: str) -> str:
    """Check that ``spec`` names one torch build and return it normalised.

    Args:
        spec: ``"current"``, ``"torch==VERSION"`` (``===`` too), or ``"torch @ URL"``.

    Returns:
        ``"current"`` or the requirement as ``packaging`` writes it (``"torch==2.13.0"``).

    Raises:
        InvalidTorchSpec: the spec does not parse as a pip requirement, names another package,
            has an environment marker, or does not pin one build (``torch``, ``torch>=2.4``),
            which would make the cache key say nothing about what is installed.
    """
    text = spec.strip()
    if text == CURRENT:
        return CURRENT
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise InvalidTorchSpec(
            f"torch spec {spec!r} is not a pip requirement ({exc}); "
            "use torch==VERSION, torch @ URL or 'current'"
        ) from exc
    if canonicalize_name(requirement.name) != "torch":
        raise InvalidTorchSpec(
            f"torch spec {spec!r} names {requirement.name!r}; it must name the torch package"
        )
    if requirement.marker is not None:
        raise InvalidTorchSpec(f"torch spec {spec!r} has an environment marker; drop it")
    clauses = list(requirement.specifier)
    pinned = requirement.url is not None or (
        len(clauses) == 1
        and clauses[0].operator in ("==", "===")
        and bool(clauses[0].version.strip())
        and "*" not in clauses[0].version
    )
    if not pinned:
        raise InvalidTorchSpec(
            f"torch spec {spec!r} does not pin one build; use torch==VERSION "
            "(e.g. torch==2.13.0 or torch==2.14.0.dev20261121) or torch @ URL"
        )
    return str(requirement)


def suite_requirements(pyproject: Path | None = None) -> list[str]:
    """The suite's own requirements besides torch: the ``suite`` extra of the project.

    Read from ``pyproject.toml`` beside the suite when it is there (a checkout, the image), else
    from the installed ``nightbench`` distribution's metadata, so the list lives in one place.

    Args:
        pyproject: the file to read (default ``<repo root>/pyproject.toml``).

    Returns:
        Requirement strings, e.g. ``["numpy>=1.26", "pyyaml>=6.0", "transformers>=4.44"]``.

    Raises:
        EnvironmentBuildError: neither source names a ``suite`` extra.
    """
    path = pyproject if pyproject is not None else REPO_ROOT / "pyproject.toml"
    if path.is_file():
        project = tomllib.loads(path.read_text()).get("project", {})
        extra = project.get("optional-dependencies", {}).get("suite")
        if extra is not None:
            return [str(item) for item in extra]
    try:
        requires = metadata.requires("nightbench") or []
    except metadata.PackageNotFoundError:
        requires = []
    found = []
    for item in requires:
        requirement = Requirement(item)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "suite"}):
            if not requirement.marker.evaluate({"extra": ""}):
                requirement.marker = None
                found.append(str(requirement))
    if not found:
        raise EnvironmentBuildError(
            f"no 'suite' extra in {path} nor in the installed nightbench metadata; "
            "the suite's requirements cannot be installed into a build's environment"
        )
    return found


def environment_key(
    spec: str,
    *,
    index_url: str | None,
    requirements: Sequence[str],
    python_version: str,
    pip_config: dict[str, str] | None = None,
) -> str:
    """The cache directory name for a venv: a readable slug and a hash of what decides it.

    Args:
        spec: normalised torch spec (see :func:`parse_torch_spec`).
        index_url: the index torch comes from (None: pip's configured index).
        requirements: the suite's requirements installed beside torch.
        python_version: e.g. ``"cpython-3.11.9-x86_64"``.
        pip_config: the host's pip sources (:func:`pip_sources`), which pick the variant a
            ``torch==X`` spec resolves to (``+cpu``, ``+cu130``).

    Returns:
        ``"<slug>-<16 hex>"``, e.g. ``"torch-2.13.0-3f0c9a1b2c4d5e6f"``.
    """
    payload = json.dumps(
        {
            "spec": spec,
            "index_url": index_url,
            "requirements": sorted(requirements),
            "python": python_version,
            "pip": pip_config or {},
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", spec.split("@", 1)[0].replace("==", "-")).strip("-.")
    return f"{slug[:40]}-{digest}"


def suite_package_dir() -> Path:
    """The directory of the ``suite`` package this worker runs (found without importing it).

    Raises:
        EnvironmentBuildError: ``suite`` is not importable from this interpreter.
    """
    spec = importlib.util.find_spec("suite")
    if spec is None or spec.origin is None:
        raise EnvironmentBuildError(
            "the suite package is not importable here; install nightbench or run from a checkout"
        )
    return Path(spec.origin).resolve().parent


def _link_suite(venv_path: Path) -> Path:
    """Point ``<venv>/nightbench-suite/suite`` at the suite package; return the holder dir.

    A link rather than a copy, so a worker updated in place measures with its current suite; it
    is refreshed on every use, atomically (``os.replace``), as several readers may race here.
    """
    target = suite_package_dir()
    holder = venv_path / SUITE_LINK_DIR
    holder.mkdir(exist_ok=True)
    link = holder / "suite"
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        staged = holder / f".suite-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.symlink(target, staged, target_is_directory=True)
        os.replace(staged, link)
    return holder


def _python_tag() -> str:
    return f"{sys.implementation.name}-{platform.python_version()}-{platform.machine()}"


def query_identity(python: Path | str, *, timeout_s: float = _IDENTITY_TIMEOUT_S) -> BuildIdentity:
    """Ask an interpreter which torch build it imports.

    Args:
        python: path of the interpreter.
        timeout_s: seconds to wait for ``import torch``.

    Returns:
        The build's ``torch.__version__`` and ``torch.version.git_version``.

    Raises:
        EnvironmentBuildError: the interpreter cannot import torch, or answers with no JSON.
    """
    try:
        proc = subprocess.run(
            # -I: neither PYTHONPATH nor the current directory may stand in for the real torch.
            [str(python), "-I", "-c", _IDENTITY_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentBuildError(f"could not ask {python} for its torch build: {exc}") from exc
    if proc.returncode != 0:
        raise EnvironmentBuildError(
            f"{python} cannot import torch (exit {proc.returncode}):\n{tail(proc.stderr)}"
        )
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise EnvironmentBuildError(
            f"{python} answered {proc.stdout!r} instead of its torch build"
        ) from exc
    return BuildIdentity(
        torch_version=str(answer["torch_version"]),
        git_version=answer["git_version"],
        python_version=str(answer["python_version"]),
    )


@lru_cache(maxsize=4)
def _current_identity(python: str) -> BuildIdentity:
    return query_identity(python)


def _venv_builder(spec: str, *, index_url: str | None, requirements: Sequence[str]) -> BuildFn:
    def build(path: Path) -> dict[str, Any]:
        logger.info("creating environment %s for %s", path, spec)
        try:
            venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(path)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise EnvironmentBuildError(f"could not create a venv at {path}: {exc}") from exc
        python = path / "bin" / "python"
        # The build first, from its own index when one is set (the nightly index). Only that
        # step sees that index, so no package of the suite's can come from it by name
        # confusion (the torchtriton incident of December 2022 came through --extra-index-url).
        report = path / "torch-install-report.json"
        torch_args = ["--only-binary", "torch", "--report", str(report), spec]
        if index_url:
            torch_args = ["--index-url", index_url, *torch_args]
        run_pip(python, torch_args, what=spec)
        identity = query_identity(python)
        if requirements:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pin:
                # The suite's packages may not move the build under test.
                pin.write(f"torch=={identity.torch_version}\n")
            try:
                run_pip(python, ["-c", pin.name, *requirements], what="the suite's requirements")
            finally:
                os.unlink(pin.name)
        # What the spec resolved to: the wheel, its variant and the frozen venv (LOCK_FILE).
        resolved = resolve_build(
            python, report=report, index_url=index_url, lock_path=path / LOCK_FILE
        )
        return {
            "spec": spec,
            "index_url": index_url,
            "requirements": list(requirements),
            "python": _python_tag(),
            "identity": asdict(identity),
            "build": resolved.to_json(),
        }

    return build


def _current_environment() -> Environment:
    """The running interpreter's environment (the ``current`` spec)."""
    return Environment(
        spec=CURRENT,
        python=Path(sys.executable),
        identity=_current_identity(sys.executable),
        suite_path=suite_package_dir().parent,
    )


def prepare_environment(
    spec: str,
    *,
    settings: Settings | None = None,
    cache_dir: Path | None = None,
    budget_bytes: int | None = None,
    index_url: str | None = None,
    requirements: Sequence[str] | None = None,
) -> Environment:
    """Make sure the environment for ``spec`` exists and return it (see :func:`use_environment`)."""
    with use_environment(
        spec,
        settings=settings,
        cache_dir=cache_dir,
        budget_bytes=budget_bytes,
        index_url=index_url,
        requirements=requirements,
    ) as env:
        return env


@contextmanager
def use_environment(
    spec: str,
    *,
    settings: Settings | None = None,
    cache_dir: Path | None = None,
    budget_bytes: int | None = None,
    index_url: str | None = None,
    requirements: Sequence[str] | None = None,
) -> Iterator[Environment]:
    """The environment for ``spec``, built on first use and held while the context is open.

    ``current`` is the running interpreter. Any other spec gets a venv from the cache (built
    now if missing: ``venv`` with pip, then ``pip install SPEC`` from the torch index, then the
    suite's requirements), and keeps a read lock on it until the context exits so that no other
    worker's eviction removes it mid-run.

    Args:
        spec: the torch spec (see :func:`parse_torch_spec`).
        settings: where the defaults come from (``get_settings()`` when None):
            ``env_cache_dir`` (default ``<data_dir>/envs``), ``env_cache_budget_bytes`` and
            ``torch_index_url``.
        cache_dir: overrides ``env_cache_dir``.
        budget_bytes: overrides ``env_cache_budget_bytes`` (bytes).
        index_url: overrides ``torch_index_url``.
        requirements: overrides the suite's requirements (:func:`suite_requirements`).

    Yields:
        The :class:`Environment`: interpreter path, torch identity, whether it was built now,
        and the build the spec resolved to (wheel, variant, frozen requirements).

    Raises:
        InvalidTorchSpec: the spec pins no single torch build, or no index has that build.
        EnvironmentBuildError: venv creation, pip (network, disk) or ``import torch`` failed.
        filelock.Timeout: another worker held the venv's lock too long.
    """
    normalised = parse_torch_spec(spec)
    if normalised == CURRENT:
        yield _current_environment()
        return
    settings = settings if settings is not None else get_settings()
    root = cache_dir or settings.env_cache_dir or settings.data_dir / "envs"
    budget = budget_bytes if budget_bytes is not None else settings.env_cache_budget_bytes
    index = index_url if index_url is not None else settings.torch_index_url
    reqs = list(requirements) if requirements is not None else suite_requirements()
    key = environment_key(
        normalised,
        index_url=index,
        requirements=reqs,
        python_version=_python_tag(),
        pip_config=pip_sources(),
    )
    cache = EnvironmentCache(Path(root), budget_bytes=budget)
    builder = _venv_builder(normalised, index_url=index, requirements=reqs)
    with cache.lease(key, builder) as (path, created):
        recorded = cache.read_metadata(key)
        build = recorded.get("build")
        yield Environment(
            spec=normalised,
            python=path / "bin" / "python",
            identity=BuildIdentity(**recorded["identity"]),
            suite_path=_link_suite(path),
            key=key,
            path=path,
            created=created,
            build=ResolvedBuild.from_json(build) if build else None,
        )
