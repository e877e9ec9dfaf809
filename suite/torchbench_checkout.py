"""A pytorch/benchmark (TorchBench) checkout read without importing its models.

Where the checkout is (``NIGHTBENCH_TORCHBENCH_PATH``, else an importable ``torchbenchmark``),
which models it has, what each model's ``metadata.yaml`` and ``requirements.txt`` say, and the
version of everything that decides a model's work. Nothing here imports torch or a model
module: listing the real checkout's ~100 models reads files only, so one model's missing
library cannot end the listing (it lists that model as unavailable, with the reason).

TorchBench's own conventions, as its ``torchbenchmark/util/model.py`` and
``torchbenchmark/models/*/metadata.yaml`` use them:

- ``not_implemented``: a list of ``{device?, test?}`` entries; an entry without ``test`` covers
  both tests, one without ``device`` every device. A ``device`` naming a GPU model (``NVIDIA
  A10G``) concerns that GPU only, not the ``cuda`` device class, and is left to the model.
- ``devices``: ``{<GPU name>: {train_batch_size, eval_batch_size}}``, the batch sizes TorchBench
  runs on that GPU; on the CPU the model class's ``DEFAULT_TRAIN_BSIZE`` / ``DEFAULT_EVAL_BSIZE``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from suite.model_info import TORCHBENCH_PREFIX, ModelInfo, hash_folder
from suite.records import MEASUREMENT_VERSION
from suite.torchbench_imports import distributions, import_closure

ENV_VAR = "NIGHTBENCH_TORCHBENCH_PATH"
TESTS = ("train", "eval")
DEVICES = ("cpu", "cuda")
# The code outside a model's folder that decides its work: TorchBench's model base, input and
# framework factories (torchbenchmark/util/, e.g. util/framework/huggingface builds hf_*
# models), the package's own __init__ and task enums.
SHARED_CODE = ("util", "__init__.py", "tasks.py")
# Libraries TorchBench's framework factories build models from: a model's version covers those
# its code can reach (suite.torchbench_imports), every one where that closure is open.
FRAMEWORK_LIBRARIES = (
    "transformers",
    "torchvision",
    "timm",
    "torchaudio",
    "torchtext",
    "diffusers",
    "fairseq",
    "detectron2",
)
_DOMAINS = {
    "computer_vision": "computer_vision",
    "nlp": "nlp",
    "speech": "speech",
    "recommendation": "recommendation",
    "reinforcement_learning": "reinforcement_learning",
}


class TorchBenchUnavailable(RuntimeError):
    """TorchBench's models cannot be run here (no checkout configured or importable)."""


class InvalidCheckout(ValueError):
    """``NIGHTBENCH_TORCHBENCH_PATH`` names a directory that is not a pytorch/benchmark checkout."""


def checkout_root() -> Path:
    """The directory that holds ``torchbenchmark/``.

    Raises:
        InvalidCheckout: ``NIGHTBENCH_TORCHBENCH_PATH`` is set to something else than a
            checkout (no ``torchbenchmark/__init__.py`` and ``torchbenchmark/models/``).
        TorchBenchUnavailable: the variable is unset and no ``torchbenchmark`` is importable.
    """
    configured = os.environ.get(ENV_VAR)
    if configured:
        root = Path(configured).expanduser()
        package = root / "torchbenchmark"
        if not (package / "__init__.py").is_file() or not (package / "models").is_dir():
            raise InvalidCheckout(
                f"{ENV_VAR}={configured} is not a pytorch/benchmark checkout "
                f"(no torchbenchmark/__init__.py and torchbenchmark/models/ under it)"
            )
        return root.resolve()
    spec = importlib.util.find_spec("torchbenchmark")  # a top-level spec imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise TorchBenchUnavailable(
            "the 'torchbenchmark' package is not importable; clone pytorch/benchmark and set "
            f"{ENV_VAR} to the clone (or pass --torchbench PATH)"
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def put_on_path() -> Path:
    """Make ``import torchbenchmark`` find the checkout; returns its root (see checkout_root)."""
    root = checkout_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def model_dir(name: str) -> Path:
    """``torchbenchmark/models/<name>`` of the checkout.

    Raises:
        LookupError: no such model (no folder with an ``__init__.py``).
    """
    folder = checkout_root() / "torchbenchmark" / "models" / name
    if not (folder / "__init__.py").is_file():
        raise LookupError(f"unknown TorchBench model {name!r}")
    return folder


def model_names() -> list[str]:
    """Names of the checkout's models (folders of ``torchbenchmark/models`` with an
    ``__init__.py``), sorted."""
    models = checkout_root() / "torchbenchmark" / "models"
    return sorted(p.name for p in models.iterdir() if (p / "__init__.py").is_file())


def read_metadata(name: str) -> dict[str, Any]:
    """A model's ``metadata.yaml`` as a dict ({} when it has none).

    Raises:
        LookupError: no such model.
        ValueError: the file is not a YAML mapping (the message names the file).
    """
    path = model_dir(name) / "metadata.yaml"
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data


def unsupported(metadata: dict[str, Any], test: str, device: str) -> str | None:
    """Why TorchBench's metadata rules out ``test`` on ``device`` (None when it does not)."""
    for entry in metadata.get("not_implemented") or []:
        if not isinstance(entry, dict):
            continue
        on, what = entry.get("device"), entry.get("test")
        if on is not None and on not in DEVICES:
            continue  # a GPU model's name: that GPU only
        if on in (None, device) and what in (None, test):
            return f"TorchBench's metadata.yaml marks {test} on {device} as not_implemented"
    return None


def missing_requirements(name: str) -> list[str]:
    """The model's ``requirements.txt`` entries that no installed distribution satisfies.

    Lines that are options (``-r``, ``--index-url``), URLs or otherwise not PEP 508
    requirements are not judged. An entry installed at a version outside its specifier is
    listed with the version found.

    Raises:
        LookupError: no such model.
    """
    path = model_dir(name) / "requirements.txt"
    if not path.is_file():
        return []
    missing = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or "://" in line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(f"{req} (installed {version})")
    return missing


def missing_modules(name: str) -> list[str]:
    """Top-level modules the model's ``__init__.py`` imports (absolutely) that cannot be found
    here, e.g. ``torchvision`` for a model whose requirements.txt leaves it to TorchBench's own.

    ``importlib.util.find_spec`` of a top-level name imports nothing, so this stays a read.

    Raises:
        LookupError: no such model.
        SyntaxError: its ``__init__.py`` does not parse.
    """
    tree = ast.parse((model_dir(name) / "__init__.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    names.discard("torchbenchmark")
    return sorted(
        n for n in names if n not in sys.stdlib_module_names and importlib.util.find_spec(n) is None
    )


def _model_class(name: str) -> ast.ClassDef | None:
    tree = ast.parse((model_dir(name) / "__init__.py").read_text())
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)


def _class_constants(cls: ast.ClassDef | None) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in cls.body if cls else []:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            out[node.targets[0].id] = node.value
    return out


def _raises_not_implemented(func: ast.FunctionDef) -> str | None:
    """The message of a ``raise NotImplementedError(...)`` among ``func``'s top-level statements
    (it raises whatever the arguments), or None."""
    for stmt in func.body:
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                args = stmt.exc.args if isinstance(stmt.exc, ast.Call) else []
                text = args[0].value if args and isinstance(args[0], ast.Constant) else ""
                return f"NotImplementedError: {' '.join(str(text).split())}".rstrip(": ")
    return None


def unimplemented_methods(name: str) -> dict[str, str]:
    """``{test: message}`` for the tests whose method on the model's ``Model`` class raises
    ``NotImplementedError`` whatever happens (pyhpc_*'s, maml's and simple_gpt's ``train``):
    TorchBench builds the model and fails the first step, so the test is not offered. Read
    with ``ast``; a method inherited from another class is not seen.

    Raises:
        LookupError: no such model.
        SyntaxError: its ``__init__.py`` does not parse.
    """
    out = {}
    cls = _model_class(name)
    for node in cls.body if cls else []:
        if isinstance(node, ast.FunctionDef) and node.name in TESTS:
            message = _raises_not_implemented(node)
            if message:
                out[node.name] = f"TorchBench's Model.{node.name}() raises {message}"
    return out


def _task_values() -> dict[tuple[str, str], str]:
    """``(DOMAIN, TASK) -> value`` of ``torchbenchmark/tasks.py``'s enums, read as source."""
    path = checkout_root() / "torchbenchmark" / "tasks.py"
    if not path.is_file():
        return {}
    values = {}
    for cls in ast.parse(path.read_text()).body:
        if isinstance(cls, ast.ClassDef):
            for key, value in _class_constants(cls).items():
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    values[cls.name, key] = value.value
    return values


def describe(name: str) -> tuple[str, str, dict[str, int], dict[str, int]]:
    """``(domain, task, train_batch_size, eval_batch_size)`` from the model's source and
    metadata: the ``task = DOMAIN.TASK`` class attribute, the class's default batch sizes (CPU)
    and the metadata's per-GPU batch sizes (CUDA), each ``{device: size}``.

    Raises:
        LookupError: no such model.
        SyntaxError: the model's ``__init__.py`` does not parse.
    """
    constants = _class_constants(_model_class(name))
    domain, task = "other", ""
    value = constants.get("task")
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
        domain = _DOMAINS.get(value.value.id.lower(), "other")
        task = _task_values().get((value.value.id, value.attr), value.attr.lower())
    gpus = [v for v in (read_metadata(name).get("devices") or {}).values() if isinstance(v, dict)]
    sizes = []
    for test in TESTS:
        default = constants.get(f"DEFAULT_{test.upper()}_BSIZE")
        cpu = default.value if isinstance(default, ast.Constant) else None
        cuda = next((g[f"{test}_batch_size"] for g in gpus if f"{test}_batch_size" in g), cpu)
        sizes.append({d: s for d, s in (("cpu", cpu), ("cuda", cuda)) if isinstance(s, int)})
    return domain, task, sizes[0], sizes[1]


def _direct_subclass(name: str) -> bool:
    """Whether the model's ``Model`` derives from TorchBench's ``BenchmarkModel`` directly, so
    that a batch size its class does not set is none at all (one derived from a framework class,
    e.g. ``HuggingFaceGenerationModel``, may inherit one)."""
    cls = _model_class(name)
    bases = cls.bases if cls else []
    return [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in bases] == [
        "BenchmarkModel"
    ]


def exclusions(
    name: str, train_batch_size: dict[str, int], eval_batch_size: dict[str, int]
) -> dict[str, str]:
    """``{"test:device": why}`` for what TorchBench does not offer, read from files: its
    metadata.yaml's ``not_implemented``, a test method that always raises NotImplementedError
    (:func:`unimplemented_methods`), and, for a ``Model`` derived from ``BenchmarkModel``
    directly, no batch size for the device (TorchBench's ``_determine_batch_size`` raises
    NotImplementedError then: llama's train).

    Raises:
        LookupError: no such model.
        ValueError: its metadata.yaml is not a mapping.
        SyntaxError: its ``__init__.py`` does not parse.
    """
    metadata = read_metadata(name)
    methods = unimplemented_methods(name)
    direct = _direct_subclass(name)
    sizes = {"train": train_batch_size, "eval": eval_batch_size}
    out = {}
    for test in TESTS:
        for device in DEVICES:
            why = unsupported(metadata, test, device) or methods.get(test)
            if why is None and direct and device not in sizes[test]:
                why = (
                    f"TorchBench gives no {test} batch size on {device} "
                    f"(DEFAULT_{test.upper()}_BSIZE unset)"
                )
            if why:
                out[f"{test}:{device}"] = why
    return out


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def framework_libraries(name: str) -> tuple[list[str], list[str]]:
    """``(libraries, open)``: the ``FRAMEWORK_LIBRARIES`` the model's code can reach, by its
    static import closure (``suite.torchbench_imports``, read with ``ast``, nothing imported),
    and why that closure may miss some (a dynamic import, a checkout module with no file). With
    any reason in ``open`` the libraries are all of ``FRAMEWORK_LIBRARIES``.

    Raises:
        LookupError: no such model.
    """
    closure = import_closure(checkout_root(), model_dir(name))
    if closure.open:
        return list(FRAMEWORK_LIBRARIES), closure.open
    reached = distributions(closure.third_party)
    return [lib for lib in FRAMEWORK_LIBRARIES if lib in reached], []


def _source_digest(name: str) -> Any:
    digest = hash_folder(model_dir(name))
    package = checkout_root() / "torchbenchmark"
    for part in SHARED_CODE:
        path = package / part
        digest.update(f"\0{part}\0".encode())
        if path.is_dir():
            hash_folder(path, digest)
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest


def source_version(name: str) -> str:
    """A 16-hex-digit SHA-256 of the model's folder and TorchBench's shared code
    (``SHARED_CODE``): what an import check's result depends on besides the environment.

    Raises:
        LookupError: no such model.
        OSError: a file of the model or of the checkout cannot be read.
    """
    return hashlib.sha256(_source_digest(name).digest()).hexdigest()[:16]


def benchmark_version(name: str, suite_contract: bytes) -> str:
    """A 16-hex-digit SHA-256 of everything that decides a TorchBench model's work.

    Covered: the model's folder; TorchBench's shared code (``SHARED_CODE``: the model base,
    input and framework factories under ``util/``, the package's ``__init__`` and task enums);
    the installed versions of the model's requirements.txt entries and of the
    ``FRAMEWORK_LIBRARIES`` its code can reach (:func:`framework_libraries`: a static import
    closure from the model's folder through the checkout's modules; every one of them where the
    closure is open, e.g. a dynamic ``importlib.import_module``); ``suite_contract`` (the suite's
    model contract, from the caller) and the measurement method's version. A change in any of
    them starts a new series instead of reading as a regression; a framework library the model
    cannot reach (transformers for lennard_jones) leaves its series alone.

    Raises:
        LookupError: no such model.
        OSError: a file of the model or of the checkout cannot be read.
    """
    digest = _source_digest(name)
    requirements = model_dir(name) / "requirements.txt"
    names = set(framework_libraries(name)[0])
    if requirements.is_file():
        for raw in requirements.read_text().splitlines():
            try:
                names.add(Requirement(raw.split("#", 1)[0].strip()).name)
            except InvalidRequirement:
                continue
    for dist in sorted(names):
        digest.update(f"\0{dist}=={_installed(dist)}".encode())
    digest.update(suite_contract)
    digest.update(MEASUREMENT_VERSION.encode())
    return hashlib.sha256(digest.digest()).hexdigest()[:16]


def offered(entry: ModelInfo, ruled_out: dict[str, str]) -> ModelInfo:
    """``entry`` with its modes, devices, ``not_implemented`` and ``not_offered`` set from
    ``ruled_out`` (``{"test:device": why}``): a test is offered where some device is not ruled
    out, a device where some test is not."""
    keys = [f"{t}:{d}" for t in TESTS for d in DEVICES]
    return replace(
        entry,
        modes=[t for t in TESTS if any(f"{t}:{d}" not in ruled_out for d in DEVICES)],
        devices=[d for d in DEVICES if any(f"{t}:{d}" not in ruled_out for t in TESTS)],
        not_implemented=[k for k in keys if k in ruled_out],
        not_offered={k: ruled_out[k] for k in keys if k in ruled_out},
    )


def model_info(name: str, suite_contract: bytes) -> ModelInfo:
    """The listing entry of one model, from files only; a model whose files cannot be read or
    whose requirements are missing is listed with ``available=False`` and the reason."""
    entry = ModelInfo(
        name=TORCHBENCH_PREFIX + name,
        domain="other",
        task="",
        modes=[],
        devices=[],
        train_batch_size={},
        eval_batch_size={},
        benchmark_version="",
        suite="torchbench",
    )
    try:
        domain, task, train_bs, eval_bs = describe(name)
        ruled_out = exclusions(name, train_bs, eval_bs)
        entry = replace(
            entry,
            domain=domain,
            task=task,
            train_batch_size=train_bs,
            eval_batch_size=eval_bs,
            benchmark_version=benchmark_version(name, suite_contract),
        )
        entry = offered(entry, ruled_out)
        missing = [
            f"missing {what}: {', '.join(names)}"
            for what, names in (
                ("requirement(s)", missing_requirements(name)),
                ("module(s)", missing_modules(name)),
            )
            if names
        ]
    except (OSError, ValueError, SyntaxError) as exc:
        return replace(entry, available=False, reason=f"{type(exc).__name__}: {exc}")
    if missing:
        return replace(entry, available=False, reason="; ".join(missing))
    return entry


def list_models(suite_contract: bytes) -> list[ModelInfo]:
    """Every model of the checkout, in name order (see :func:`model_info`).

    Raises:
        InvalidCheckout: ``NIGHTBENCH_TORCHBENCH_PATH`` is not a checkout.
        TorchBenchUnavailable: no checkout configured or importable.
    """
    return [model_info(name, suite_contract) for name in model_names()]
