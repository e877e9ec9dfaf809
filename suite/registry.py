"""Discovery of suite models: ``suite/models/<name>/__init__.py`` + ``metadata.yaml``.

Three sources of models:

- the suite's own, under ``suite/models/``;
- extra model folders named in ``NIGHTBENCH_SUITE_EXTRA_MODELS`` (paths separated by
  ``os.pathsep``), laid out the same way; they are listed only while the variable is set (tests
  use it for models that must never enter the real suite, such as a planted leak);
- TorchBench's own models, named ``torchbench.<name>``, when the ``torchbenchmark`` package is
  importable (see :mod:`suite.torchbench`).

A model's ``benchmark_version`` is a hash of its source files and metadata, of the model contract
(``suite/model.py``) and of the harness's :data:`~suite.records.MEASUREMENT_VERSION` (asv's
"benchmark versioning"): changing a model starts a new series instead of raising a false
regression.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import yaml

from suite.model_info import COUNT_SETTINGS, TORCHBENCH_PREFIX, ModelInfo, hash_folder
from suite.records import MEASUREMENT_VERSION

if TYPE_CHECKING:  # torch is imported only when a model is loaded: listing stays quick
    from suite.model import BenchmarkModel

MODELS_DIR = Path(__file__).parent / "models"
EXTRA_MODELS_ENV = "NIGHTBENCH_SUITE_EXTRA_MODELS"
DOMAINS = (
    "computer_vision",
    "nlp",
    "recommendation",
    "reinforcement_learning",
    "speech",
    "other",
)
_CONTRACT_FILE = Path(__file__).parent / "model.py"
_EXTRA_NAMESPACE = "_nightbench_extra_models"


class UnknownModelError(LookupError):
    """No suite model has the requested name."""


def extra_model_dirs() -> list[Path]:
    """The folders named in ``NIGHTBENCH_SUITE_EXTRA_MODELS`` (empty when unset).

    Raises:
        ValueError: a named path is not a folder.
    """
    dirs = []
    for item in filter(None, os.environ.get(EXTRA_MODELS_ENV, "").split(os.pathsep)):
        path = Path(item).expanduser().resolve()
        if not path.is_dir():
            raise ValueError(f"{EXTRA_MODELS_ENV}: {item!r} is not a folder")
        dirs.append(path)
    return dirs


def model_names(models_dir: Path = MODELS_DIR) -> list[str]:
    """Sorted names of the folders under ``models_dir`` that hold a ``metadata.yaml``."""
    return sorted(
        p.name for p in models_dir.iterdir() if p.is_dir() and (p / "metadata.yaml").is_file()
    )


def _all_dirs(models_dir: Path) -> list[Path]:
    return [models_dir, *extra_model_dirs()] if models_dir == MODELS_DIR else [models_dir]


def model_folder(name: str, models_dir: Path = MODELS_DIR) -> Path:
    """The folder of model ``name`` (the suite's own first, then the extra folders).

    Raises:
        UnknownModelError: no such model.
    """
    for folder in _all_dirs(models_dir):
        candidate = folder / name
        if (candidate / "metadata.yaml").is_file():
            return candidate
    known = sorted({n for d in _all_dirs(models_dir) for n in model_names(d)})
    raise UnknownModelError(f"unknown model {name!r}; known: {', '.join(known)}")


def load_metadata(name: str, models_dir: Path = MODELS_DIR) -> dict[str, Any]:
    """Parse ``<models_dir>/<name>/metadata.yaml``.

    Raises:
        UnknownModelError: no such model.
        ValueError: the metadata lacks a valid ``domain``, or its ``count_settings`` is not a
            mapping of the model's own settings.
    """
    path = model_folder(name, models_dir) / "metadata.yaml"
    meta = yaml.safe_load(path.read_text()) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(meta).__name__}")
    if meta.get("domain") not in DOMAINS:
        raise ValueError(f"{path}: domain must be one of {DOMAINS}, got {meta.get('domain')!r}")
    _check_count_settings(path, meta)
    return meta


_NOT_COUNT_SETTINGS = ("domain", "task", "description", "modes", "devices", "compilers")


def _check_count_settings(path: Path, meta: dict[str, Any]) -> None:
    """``count_settings`` overrides only settings the model has (a misspelt key would silently
    count the full-size step), and never what the model is (its modes, devices, domain)."""
    overrides = meta.get(COUNT_SETTINGS)
    if overrides is None:
        return
    if not isinstance(overrides, dict) or not overrides:
        raise ValueError(f"{path}: {COUNT_SETTINGS} must be a non-empty mapping of settings")
    for key in overrides:
        if key in _NOT_COUNT_SETTINGS or key == COUNT_SETTINGS:
            raise ValueError(f"{path}: {COUNT_SETTINGS} cannot override {key!r}")
        if key not in meta:
            raise ValueError(
                f"{path}: {COUNT_SETTINGS} overrides {key!r}, which is not one of the model's "
                f"settings ({', '.join(k for k in meta if k not in _NOT_COUNT_SETTINGS)})"
            )


def benchmark_version(name: str, models_dir: Path = MODELS_DIR) -> str:
    """A 16-hex-digit SHA-256 of the model's files, the model contract and the method version.

    Args:
        name: a suite model name, or ``torchbench.<name>``.
        models_dir: where the suite's own models live (tests point it at a copy).

    Raises:
        UnknownModelError: no such model.
    """
    if name.startswith(TORCHBENCH_PREFIX):
        from suite import torchbench  # imports torch: only for TorchBench models

        return torchbench.benchmark_version(name[len(TORCHBENCH_PREFIX) :])
    digest = hash_folder(model_folder(name, models_dir))
    digest.update(_CONTRACT_FILE.read_bytes())
    digest.update(MEASUREMENT_VERSION.encode())
    return digest.hexdigest()[:16]


def model_domain(name: str, models_dir: Path = MODELS_DIR) -> str | None:
    """The model's domain (``computer_vision``, ``nlp``, ...): its metadata's, or for a TorchBench
    model the one its source declares (``other`` when none), read without importing it; None
    when neither can be read (the record is still measured)."""
    try:
        if name.startswith(TORCHBENCH_PREFIX):
            from suite import torchbench_checkout

            return torchbench_checkout.describe(name[len(TORCHBENCH_PREFIX) :])[0]
        return str(load_metadata(name, models_dir)["domain"])
    except (LookupError, SyntaxError, ValueError, OSError):
        return None


def model_info(name: str, models_dir: Path = MODELS_DIR) -> ModelInfo:
    """The listing entry of one model (no torch module is built)."""
    meta = load_metadata(name, models_dir)
    return ModelInfo(
        name=name,
        domain=meta["domain"],
        task=str(meta.get("task", "")),
        modes=list(meta.get("modes", ["train", "eval"])),
        devices=list(meta.get("devices", ["cpu", "cuda"])),
        train_batch_size=dict(meta.get("train_batch_size", {})),
        eval_batch_size=dict(meta.get("eval_batch_size", {})),
        benchmark_version=benchmark_version(name, models_dir),
        compilers=list(meta.get("compilers", ["eager", "inductor"])),
        metadata=meta,
    )


def list_models(models_dir: Path = MODELS_DIR) -> list[ModelInfo]:
    """Every model of the suite (plus the extra folders' while set), sorted by name.

    Raises:
        ValueError: two folders define the same model name, or a metadata file is invalid.
    """
    seen: dict[str, Path] = {}
    for folder in _all_dirs(models_dir):
        for name in model_names(folder):
            if name in seen:
                raise ValueError(f"model {name!r} is defined in both {seen[name]} and {folder}")
            seen[name] = folder
    return [model_info(n, models_dir) for n in sorted(seen)]


def _import_model_module(name: str, folder: Path) -> ModuleType:
    if folder.parent == MODELS_DIR:
        return importlib.import_module(f"suite.models.{name}")
    # Extra folders are not packages under suite.models: import them under a private namespace.
    if _EXTRA_NAMESPACE not in sys.modules:
        namespace = ModuleType(_EXTRA_NAMESPACE)
        namespace.__path__ = []
        sys.modules[_EXTRA_NAMESPACE] = namespace
    module_name = f"{_EXTRA_NAMESPACE}.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    init = folder / "__init__.py"
    if not init.is_file():
        raise UnknownModelError(f"{folder} has a metadata.yaml but no __init__.py")
    spec = importlib.util.spec_from_file_location(
        module_name, init, submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_model_class(name: str) -> type[BenchmarkModel]:
    """Import model ``name`` and return its ``Model`` class with name and metadata set.

    ``torchbench.<name>`` returns an adapter around TorchBench's own model class.

    Raises:
        UnknownModelError: no such model.
        TypeError: the module has no ``Model`` subclass of ``BenchmarkModel``.
        suite.torchbench.TorchBenchUnavailable: a ``torchbench.`` name without ``torchbenchmark``.
    """
    if name.startswith(TORCHBENCH_PREFIX):
        from suite import torchbench  # imports torch: only for TorchBench models

        return torchbench.adapter_class(name[len(TORCHBENCH_PREFIX) :])
    from suite.model import BenchmarkModel

    meta = load_metadata(name)
    module = _import_model_module(name, model_folder(name))
    cls = getattr(module, "Model", None)
    if not (isinstance(cls, type) and issubclass(cls, BenchmarkModel)):
        raise TypeError(f"model {name!r} has no class Model(BenchmarkModel)")
    cls.name = name
    cls.metadata = meta
    return cls


__all__ = [
    "DOMAINS",
    "EXTRA_MODELS_ENV",
    "ModelInfo",
    "TORCHBENCH_PREFIX",
    "UnknownModelError",
    "benchmark_version",
    "extra_model_dirs",
    "hash_folder",
    "list_models",
    "load_metadata",
    "load_model_class",
    "model_folder",
    "model_info",
    "model_names",
]
