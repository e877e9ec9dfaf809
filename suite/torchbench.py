"""Interop with TorchBench (pytorch/benchmark): its result JSON, and its models as an extra suite.

Result JSON. TorchBench's userbenchmarks write ``{"name", "environ": {"pytorch_git_version",
"pytorch_version", ...}, "metrics": {key: value}}`` (``userbenchmark/utils.py:get_output_json``).
Two key dialects are read:

- ``test_bench`` (``userbenchmark/test_bench/run.py``): ``"model=M, test=T, device=D, bs=B,
  extra_args=[...], metric=X"`` with ``X`` in ``latencies`` (median, ms), ``cpu_peak_mem`` and
  ``gpu_peak_mem`` (GB, 2**30 bytes); a failed configuration holds a string (``"not_implemented"``,
  an error text) instead of a number;
- ``cpu`` (``userbenchmark/cpu/cpu_utils.py``): ``"<model>-<test>_latency"`` (ms) and
  ``"<model>-<test>_cmem"`` (GB), CPU only.

:func:`to_userbenchmark` writes the ``test_bench`` dialect, which carries device, batch size and
the compiler (as TorchBench's ``--torchdynamo inductor`` extra argument).

TorchBench's models. When ``torchbenchmark`` is importable, ``torchbench.<name>`` runs
``torchbenchmark.models.<name>.Model`` through the suite's harness (:func:`adapter_class`);
otherwise every entry point raises :class:`TorchBenchUnavailable` with the reason, and
``python -m suite list --suite torchbench`` prints it and lists nothing.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from suite.model import COMPILERS, DEVICES, TESTS, BenchmarkModel
from suite.records import MEASUREMENT_VERSION, UNITS, BenchmarkRecord, MetricRecord
from suite.registry import TORCHBENCH_PREFIX, ModelInfo, hash_folder

GB = 1024**3
INDUCTOR_ARGS = ["--torchdynamo", "inductor"]
# nightbench metric -> (TorchBench metric, scale from TorchBench's unit to ours)
_TO_TORCHBENCH = {
    "latency": ("latencies", 1.0),
    "cpu_time": ("cpu_time", 1.0),
    "cpu_peak_mem_total": ("cpu_peak_mem", GB),
    "gpu_peak_mem": ("gpu_peak_mem", GB),
    "cpu_peak_mem": ("cpu_peak_mem_above_ready", GB),
    "mem_growth": ("mem_growth", GB),
}
_FROM_TORCHBENCH = {tb: (ours, scale) for ours, (tb, scale) in _TO_TORCHBENCH.items()}
_TEST_BENCH_KEY = re.compile(
    r"model=(?P<model>.*), test=(?P<test>.*), device=(?P<device>.*), bs=(?P<bs>.*), "
    r"extra_args=(?P<extra>.*), metric=(?P<metric>.*)"
)
_CPU_KEY = re.compile(r"(?P<model>.+)-(?P<test>train|eval)_(?P<metric>latency|cmem)")
_VERSIONS_KEY = "nightbench_benchmark_versions"
_ENV_RENAMES = {"pytorch_git_version": "torch_git_version", "pytorch_version": "torch_version"}
_DOMAINS = {
    "computer_vision": "computer_vision",
    "nlp": "nlp",
    "speech": "speech",
    "recommendation": "recommendation",
    "reinforcement_learning": "reinforcement_learning",
}


class TorchBenchUnavailable(RuntimeError):
    """TorchBench's ``torchbenchmark`` package cannot be imported here."""


class TorchBenchFormatError(ValueError):
    """A TorchBench result file does not have the userbenchmark shape."""


# ---------------------------------------------------------------------------------------------
# Result JSON
# ---------------------------------------------------------------------------------------------


def _series_id(record: BenchmarkRecord) -> str:
    return f"{record.model}:{record.mode}:{record.device}:{record.compiler}"


def _config_key(record: BenchmarkRecord) -> str:
    extra = INDUCTOR_ARGS if record.compiler == "inductor" else []
    return (f"model={record.model}, test={record.mode}, device={record.device}, "
            f"bs={record.batch_size}, extra_args={extra}")


def to_userbenchmark(records: Iterable[BenchmarkRecord], name: str = "nightbench"
                     ) -> dict[str, Any]:
    """Export records as a TorchBench userbenchmark result (``test_bench`` key dialect).

    Each metric's median becomes the value (``latencies`` in ms, memory in GB as TorchBench
    writes it); a failed benchmark writes its error text under ``metric=latencies``, as
    TorchBench writes ``"not_implemented"``. ``environ`` holds ``pytorch_git_version`` and
    ``pytorch_version`` plus the rest of the first record's environment, and each benchmark's
    ``benchmark_version`` under ``nightbench_benchmark_versions``.

    Args:
        records: the records to export.
        name: the userbenchmark name written to ``"name"``.

    Returns:
        A JSON-ready dict.
    """
    records = list(records)
    environ: dict[str, Any] = {}
    for record in records:
        for key, value in record.environment.items():
            if environ.get(key) is None:
                environ[key] = value
    for ours, theirs in (("torch_git_version", "pytorch_git_version"),
                         ("torch_version", "pytorch_version")):
        environ[theirs] = environ.pop(ours, None)
    environ[_VERSIONS_KEY] = {_series_id(r): r.benchmark_version for r in records}
    metrics: dict[str, float | str] = {}
    for record in records:
        base = _config_key(record)
        if record.error:
            metrics[f"{base}, metric=latencies"] = record.error
            continue
        for metric in record.metrics:
            if metric.metric not in _TO_TORCHBENCH or metric.median is None:
                continue
            theirs, scale = _TO_TORCHBENCH[metric.metric]
            metrics[f"{base}, metric={theirs}"] = metric.median / scale
    return {"name": name, "environ": environ, "metrics": metrics}


def _environment_from(environ: dict[str, Any]) -> dict[str, Any]:
    env = {_ENV_RENAMES.get(k, k): v for k, v in environ.items() if k != _VERSIONS_KEY}
    if "device" in env and "gpu_name" not in env:
        env["gpu_name"] = env.pop("device")
    return env


def _parse_key(key: str) -> tuple[tuple[str, str, str, int | None, str], str]:
    """``(model, test, device, batch_size, compiler), metric`` of one metrics key."""
    match = _TEST_BENCH_KEY.fullmatch(key)
    if match:
        try:
            bs = ast.literal_eval(match["bs"])
            extra = ast.literal_eval(match["extra"])
        except (ValueError, SyntaxError) as exc:
            raise TorchBenchFormatError(
                f"metrics key {key!r}: unreadable bs or extra_args") from exc
        compiler = "inductor" if "inductor" in list(extra) else "eager"
        return (match["model"], match["test"], match["device"], bs, compiler), match["metric"]
    match = _CPU_KEY.fullmatch(key)
    if match:
        metric = "latencies" if match["metric"] == "latency" else "cpu_peak_mem"
        return (match["model"], match["test"], "cpu", None, "eager"), metric
    raise TorchBenchFormatError(
        f"metrics key {key!r} is in neither TorchBench dialect "
        "('model=M, test=T, device=D, bs=B, extra_args=[...], metric=X' or "
        "'<model>-<test>_latency')"
    )


def from_userbenchmark(data: dict[str, Any], model_prefix: str | None = None
                       ) -> list[BenchmarkRecord]:
    """Import a TorchBench userbenchmark result as records (one per configuration).

    A TorchBench value is a median, so each metric holds one sample and no IQR. A configuration
    whose values are strings (``"not_implemented"``, an error text) becomes an error record.
    Model names are prefixed with ``torchbench.`` (TorchBench's models are not the suite's),
    except in files written by :func:`to_userbenchmark`, whose names are kept.

    Args:
        data: the parsed JSON.
        model_prefix: overrides the prefix put before model names.

    Returns:
        Records sorted by model, mode, device and compiler.

    Raises:
        TorchBenchFormatError: ``data`` lacks ``environ`` or ``metrics``, a key is in neither
            dialect, a value is neither a number nor a string, or a test or device is unknown.
    """
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise TorchBenchFormatError("a TorchBench result needs a 'metrics' object")
    environ = data.get("environ")
    if not isinstance(environ, dict) or "pytorch_git_version" not in environ:
        raise TorchBenchFormatError("a TorchBench result needs 'environ.pytorch_git_version'")
    versions = environ.get(_VERSIONS_KEY) or {}
    prefix = model_prefix if model_prefix is not None else ("" if versions else TORCHBENCH_PREFIX)
    environment = _environment_from(environ)
    grouped: dict[tuple[str, str, str, int | None, str], dict[str, Any]] = {}
    for key, value in data["metrics"].items():
        config, metric = _parse_key(key)
        _, test, device, _, _ = config
        if test not in TESTS or device not in DEVICES:
            raise TorchBenchFormatError(f"metrics key {key!r}: unknown test or device")
        if not isinstance(value, int | float | str) or isinstance(value, bool):
            raise TorchBenchFormatError(f"metrics key {key!r}: value {value!r} is not a number")
        grouped.setdefault(config, {})[metric] = value
    records = []
    for (model, test, device, bs, compiler), values in grouped.items():
        record = BenchmarkRecord(
            model=prefix + model, mode=test, device=device, compiler=compiler, batch_size=bs,
            environment=dict(environment),
            benchmark_version=versions.get(f"{model}:{test}:{device}:{compiler}"),
        )
        errors = [v for v in values.values() if isinstance(v, str)]
        if errors:
            record.error = errors[0]
        else:
            for theirs, value in values.items():
                ours, scale = _FROM_TORCHBENCH.get(theirs, (theirs, 1.0))
                unit = UNITS.get(ours, "")
                v = float(value) * scale
                record.metrics.append(MetricRecord(metric=ours, unit=unit, samples=[v],
                                                   median=v, iqr=None))
            order = list(UNITS)
            record.metrics.sort(key=lambda m: order.index(m.metric) if m.metric in order else 99)
        records.append(record)
    return sorted(records, key=lambda r: (r.model, r.mode, r.device, r.compiler))


# ---------------------------------------------------------------------------------------------
# TorchBench's models as an extra suite
# ---------------------------------------------------------------------------------------------


def _import_torchbenchmark() -> Any:
    if importlib.util.find_spec("torchbenchmark") is None:
        raise TorchBenchUnavailable(
            "the 'torchbenchmark' package is not importable; clone pytorch/benchmark, run its "
            "install.py for the models you want, and put the clone on PYTHONPATH"
        )
    try:
        return importlib.import_module("torchbenchmark")
    except Exception as exc:  # noqa: BLE001 - any import failure means the suite is unavailable
        raise TorchBenchUnavailable(f"importing 'torchbenchmark' failed: {exc}") from exc


def available() -> bool:
    """Whether TorchBench's models can be run here."""
    try:
        _import_torchbenchmark()
    except TorchBenchUnavailable:
        return False
    return True


def _models_dir(tb: Any) -> Path:
    return Path(tb.__file__).resolve().parent / "models"


def model_names() -> list[str]:
    """Names of TorchBench's models (folders of ``torchbenchmark/models`` with an ``__init__.py``).

    Raises:
        TorchBenchUnavailable: ``torchbenchmark`` is not importable.
    """
    tb = _import_torchbenchmark()
    folder = _models_dir(tb)
    return sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())


def _tb_model_class(name: str) -> type:
    tb = _import_torchbenchmark()
    if name not in model_names():
        raise LookupError(f"unknown TorchBench model {name!r}")
    module = importlib.import_module(f"torchbenchmark.models.{name}")
    cls = getattr(module, "Model", None)
    if not isinstance(cls, type):
        raise TypeError(f"torchbenchmark.models.{name} has no class Model")
    del tb
    return cls


def _domain_and_task(cls: type) -> tuple[str, str]:
    task = getattr(cls, "task", None)
    if task is None:
        return "other", ""
    domain = _DOMAINS.get(type(task).__name__.lower(), "other")
    return domain, str(getattr(task, "value", task))


def benchmark_version(name: str) -> str:
    """A 16-hex-digit SHA-256 of a TorchBench model's folder, TorchBench's model base class, the
    suite's contract and the method version.

    Raises:
        TorchBenchUnavailable: ``torchbenchmark`` is not importable.
        LookupError: no such TorchBench model.
    """
    tb = _import_torchbenchmark()
    folder = _models_dir(tb) / name
    if not (folder / "__init__.py").is_file():
        raise LookupError(f"unknown TorchBench model {name!r}")
    digest = hash_folder(folder)
    base = Path(tb.__file__).resolve().parent / "util" / "model.py"
    if base.is_file():
        digest.update(base.read_bytes())
    digest.update((Path(__file__).parent / "model.py").read_bytes())
    digest.update(MEASUREMENT_VERSION.encode())
    return hashlib.sha256(digest.digest()).hexdigest()[:16]


def list_models() -> list[ModelInfo]:
    """Listing entries of TorchBench's models (each model module is imported to read its task).

    Raises:
        TorchBenchUnavailable: ``torchbenchmark`` is not importable.
    """
    infos = []
    for name in model_names():
        cls = _tb_model_class(name)
        domain, task = _domain_and_task(cls)
        train_bs = getattr(cls, "DEFAULT_TRAIN_BSIZE", None)
        eval_bs = getattr(cls, "DEFAULT_EVAL_BSIZE", None)
        infos.append(ModelInfo(
            name=TORCHBENCH_PREFIX + name, domain=domain, task=task,
            modes=list(TESTS), devices=list(DEVICES),
            train_batch_size={"cpu": train_bs, "cuda": train_bs} if train_bs else {},
            eval_batch_size={"cpu": eval_bs, "cuda": eval_bs} if eval_bs else {},
            benchmark_version=benchmark_version(name), suite="torchbench",
        ))
    return infos


def adapter_class(name: str) -> type[BenchmarkModel]:
    """A suite model class that runs ``torchbenchmark.models.<name>.Model``.

    TorchBench's model is built in :meth:`set_compiler` (the harness calls it right after
    construction, before the memory baseline), because TorchBench takes the compiler as an extra
    argument at construction (``--torchdynamo inductor``). TorchBench's own ``NotImplementedError``
    for an unsupported configuration passes through.

    Raises:
        TorchBenchUnavailable: ``torchbenchmark`` is not importable.
        LookupError: no such TorchBench model.
    """
    tb_cls = _tb_model_class(name)
    domain, task = _domain_and_task(tb_cls)

    class TorchBenchModel(BenchmarkModel):
        __doc__ = f"TorchBench's {name} through the suite's harness."

        def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
            if test not in TESTS or device not in DEVICES:
                raise NotImplementedError(f"unsupported test {test!r} or device {device!r}")
            if device == "cuda" and not torch.cuda.is_available():
                raise NotImplementedError("device 'cuda' requested but CUDA is not available")
            self.test = test
            self.device = device
            self.batch_size = batch_size  # type: ignore[assignment]  # TorchBench's default if None
            self.optimizer = None
            self.inner: Any = None

        def set_compiler(self, compiler: str) -> None:
            if compiler not in COMPILERS:
                raise NotImplementedError(f"compiler must be one of {COMPILERS}, got {compiler!r}")
            extra = INDUCTOR_ARGS if compiler == "inductor" else []
            self.inner = tb_cls(test=self.test, device=self.device, batch_size=self.batch_size,
                                extra_args=list(extra))
            self.batch_size = getattr(self.inner, "batch_size", self.batch_size)

        def _built(self) -> Any:
            if self.inner is None:
                self.set_compiler("eager")
            return self.inner

        def get_module(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
            return self._built().get_module()

        def train(self) -> None:
            self._built().train()

        def eval(self) -> Any:
            return self._built().eval()

    TorchBenchModel.name = TORCHBENCH_PREFIX + name
    TorchBenchModel.metadata = {"domain": domain, "task": task, "suite": "torchbench"}
    return TorchBenchModel
