"""TorchBench's (pytorch/benchmark) result JSON, both ways; plain JSON in and out, no torch.

Two formats are read (:func:`result_format` tells them apart):

**userbenchmark** (``userbenchmark/utils.py:get_output_json``): ``{"name", "environ":
{"pytorch_git_version", "pytorch_version", ...}, "metrics": {key: value}}``, in two key dialects:

- ``test_bench`` (``userbenchmark/test_bench/run.py:config_to_str``): ``"model=M, test=T,
  device=D, bs=B, extra_args=[...], metric=X"``, where ``B`` and ``extra_args`` are Python
  literals (TorchBench reads them back with ``ast.literal_eval``; ``bs=None`` is the model's
  default batch size). ``X`` is one of (``torchbenchmark/util/experiment/metrics.py``):

  - ``latencies``: the median of the per-iteration latencies, **ms**;
  - ``gpu_peak_mem``: ``torch.cuda.max_memory_allocated() / 10**9``, **GB (10**9 bytes)**;
  - ``cpu_peak_mem``: ``psutil.Process().memory_percent() * total / 10**9``: a percentage times
    GB, so **100 times the GB** of the process's resident memory; read as ``value * 10**7``
    bytes (our ``cpu_peak_mem_total``).

  A value that is text is a failure: ``"not_implemented"``, an error message, ``"skip"`` for
  the whole configuration; ``"failed"`` for one metric it could not measure (``gpu_peak_mem``
  on the CPU). Text for one metric leaves only that metric out; a configuration whose values
  are all text is an error record holding the text. ``accuracy`` and ``memleak`` (the
  ``--accuracy`` / ``--memleak`` runs) are not measurements and are skipped.
- ``cpu`` (``userbenchmark/cpu/cpu_utils.py``): ``"<model>-<test>_latency"`` (ms) and
  ``"<model>-<test>_cmem"`` (TorchBench's ``cpu_peak_mem`` above: percent times GB), CPU only.

**pytest-benchmark** (TorchBench's ``test_bench.py`` run with ``--benchmark-json``):
``{"machine_info": {..., "pytorch_version", "pytorch_git_version", "cuda_version"},
"commit_info", "datetime", "benchmarks": [{"name": "test_eval[hf_Bert-cpu]", "stats":
{"median", "iqr", "data", ...}, "extra_info": {"batch_size", "test", "precision", ...}}]}``.
``stats`` are in **seconds** per call of the model's ``invoke()``; they become a ``latency`` in
ms (``stats.data``, the per-round timings kept by ``--benchmark-save-data``, become the samples;
otherwise the median is the one sample). pytest-benchmark writes only benchmarks that passed.

Writing (:func:`to_userbenchmark`) uses the ``test_bench`` dialect, the one TorchBench's
``userbenchmark/test_bench/regression_detector.py`` compares key by key: the suite's
``torchbench.<name>`` models are written as ``<name>``, TorchBench's own spelling; ``bs=`` is the
batch size as TorchBench writes it (``str()`` of an int, ``None`` when the default was used).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

from suite.model_info import TORCHBENCH_PREFIX
from suite.records import UNITS, BenchmarkRecord, MetricRecord

USERBENCHMARK = "userbenchmark"
PYTEST_BENCHMARK = "pytest-benchmark"
FORMATS = (USERBENCHMARK, PYTEST_BENCHMARK)
# suite.model's TESTS and DEVICES, without importing torch (this module serves the CLI).
TESTS = ("train", "eval")
DEVICES = ("cpu", "cuda")

GB = 10**9  # TorchBench's GB: torch.cuda.max_memory_allocated() / 10**9
PERCENT_GB = 10**7  # TorchBench's cpu_peak_mem: memory_percent() * total / 10**9
INDUCTOR_ARGS = ["--torchdynamo", "inductor"]
# nightbench metric -> (TorchBench metric, bytes or ms per TorchBench unit). The last three have
# no TorchBench counterpart; they are written (in GB) so that an export reads back whole.
_TO_TORCHBENCH = {
    "latency": ("latencies", 1.0),
    "cpu_time": ("cpu_time", 1.0),
    "cpu_peak_mem_total": ("cpu_peak_mem", PERCENT_GB),
    "gpu_peak_mem": ("gpu_peak_mem", GB),
    "cpu_peak_mem": ("cpu_peak_mem_above_ready", GB),
    "mem_growth": ("mem_growth", GB),
}
_FROM_TORCHBENCH = {tb: (ours, scale) for ours, (tb, scale) in _TO_TORCHBENCH.items()}
_NOT_MEASUREMENTS = frozenset({"accuracy", "memleak"})
_TEST_BENCH_KEY = re.compile(
    r"model=(?P<model>.*), test=(?P<test>.*), device=(?P<device>.*), bs=(?P<bs>.*), "
    r"extra_args=(?P<extra>.*), metric=(?P<metric>.*)"
)
_CPU_KEY = re.compile(r"(?P<model>.+)-(?P<test>train|eval)_(?P<metric>latency|cmem)")
# test_bench.py's ids: test_<train|eval>[<model folder>-<device>]
_PYTEST_NAME = re.compile(r"test_(?P<test>train|eval)\[(?P<model>.+)-(?P<device>[^-\]]+)\]")
_VERSIONS_KEY = "nightbench_benchmark_versions"
_NAMES_KEY = "nightbench_model_names"
_ENV_RENAMES = {"pytorch_git_version": "torch_git_version", "pytorch_version": "torch_version"}
Config = tuple[str, str, str, int | None, str]  # model, test, device, batch size, compiler


class TorchBenchFormatError(ValueError):
    """A TorchBench result file is in neither format, or records cannot be written in it."""


def torchbench_name(model: str) -> str:
    """TorchBench's name of a suite model: ``torchbench.hf_Bert`` -> ``hf_Bert``; others kept."""
    return model.removeprefix(TORCHBENCH_PREFIX)


def result_format(data: Any) -> str:
    """Which TorchBench result format ``data`` (parsed JSON) is in.

    Returns:
        :data:`USERBENCHMARK` (a ``metrics`` object) or :data:`PYTEST_BENCHMARK` (a
        ``benchmarks`` list).

    Raises:
        TorchBenchFormatError: neither.
    """
    if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
        return USERBENCHMARK
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return PYTEST_BENCHMARK
    raise TorchBenchFormatError(
        "not a TorchBench result: expected a userbenchmark result (an object with 'metrics') "
        "or a pytest-benchmark result (an object with a 'benchmarks' list)"
    )


def from_torchbench(data: Any) -> list[BenchmarkRecord]:
    """Records of a TorchBench result in either format (:func:`result_format`).

    Raises:
        TorchBenchFormatError: see :func:`from_userbenchmark` and :func:`from_pytest_benchmark`.
    """
    if result_format(data) == USERBENCHMARK:
        return from_userbenchmark(data)
    return from_pytest_benchmark(data)


# ---------------------------------------------------------------------------------------------
# userbenchmark
# ---------------------------------------------------------------------------------------------


def _series_id(model: str, record: BenchmarkRecord) -> str:
    return f"{model}:{record.mode}:{record.device}:{record.compiler}"


def _config_key(model: str, record: BenchmarkRecord) -> str:
    extra = INDUCTOR_ARGS if record.compiler == "inductor" else []
    return (
        f"model={model}, test={record.mode}, device={record.device}, "
        f"bs={record.batch_size}, extra_args={extra}"
    )


def to_userbenchmark(
    records: Iterable[BenchmarkRecord], name: str = "nightbench"
) -> dict[str, Any]:
    """Export records as a TorchBench userbenchmark result (``test_bench`` key dialect).

    Each metric's median becomes the value, in TorchBench's units (``latencies`` ms,
    ``gpu_peak_mem`` GB, ``cpu_peak_mem`` percent times GB: see the module docstring); a failed
    benchmark writes its error text under ``metric=latencies``, as TorchBench writes
    ``"not_implemented"``. ``torchbench.<name>`` models are written as ``<name>``. ``environ``
    holds ``pytorch_git_version`` and ``pytorch_version`` plus the rest of the first record's
    environment, each benchmark's ``benchmark_version`` under ``nightbench_benchmark_versions``
    and the renamed models under ``nightbench_model_names``, so that :func:`from_userbenchmark`
    gives the records back.

    Args:
        records: the records to export.
        name: the userbenchmark name written to ``"name"``.

    Returns:
        A JSON-ready dict.

    Raises:
        TorchBenchFormatError: two records would be written under one key (the suite's
            ``resnet18`` and ``torchbench.resnet18`` in the same mode, device, batch size and
            compiler): export them separately.
    """
    records = list(records)
    environ: dict[str, Any] = {}
    for record in records:
        for key, value in record.environment.items():
            if environ.get(key) is None:
                environ[key] = value
    for ours, theirs in (
        ("torch_git_version", "pytorch_git_version"),
        ("torch_version", "pytorch_version"),
    ):
        environ[theirs] = environ.pop(ours, None)
    names = {
        torchbench_name(r.model): r.model for r in records if torchbench_name(r.model) != r.model
    }
    environ[_VERSIONS_KEY] = {
        _series_id(torchbench_name(r.model), r): r.benchmark_version for r in records
    }
    environ[_NAMES_KEY] = names
    metrics: dict[str, float | str] = {}
    written: dict[str, str] = {}
    for record in records:
        base = _config_key(torchbench_name(record.model), record)
        if written.setdefault(base, record.model) != record.model:
            raise TorchBenchFormatError(
                f"{written[base]} and {record.model} would both be written as {base!r}; "
                "export the suite's own models and TorchBench's separately"
            )
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
    env = {
        _ENV_RENAMES.get(k, k): v
        for k, v in environ.items()
        if k not in (_VERSIONS_KEY, _NAMES_KEY)
    }
    if "device" in env and "gpu_name" not in env:
        env["gpu_name"] = env.pop("device")
    return env


def parse_key(key: str) -> tuple[Config, str]:
    """``(model, test, device, batch_size, compiler), metric`` of one userbenchmark metrics key.

    The ``test_bench`` dialect is read as TorchBench's ``str_to_config`` reads it (``bs`` and
    ``extra_args`` through ``ast.literal_eval``); the compiler is ``inductor`` when
    ``extra_args`` holds ``inductor``.

    Raises:
        TorchBenchFormatError: the key is in neither dialect, or ``bs`` / ``extra_args`` is not
            a Python literal.
    """
    match = _TEST_BENCH_KEY.fullmatch(key)
    if match:
        try:
            bs = ast.literal_eval(match["bs"])
            extra = ast.literal_eval(match["extra"])
        except (ValueError, SyntaxError) as exc:
            raise TorchBenchFormatError(
                f"metrics key {key!r}: unreadable bs or extra_args"
            ) from exc
        if bs is not None and (not isinstance(bs, int) or isinstance(bs, bool)):
            raise TorchBenchFormatError(f"metrics key {key!r}: bs must be an integer or None")
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


def _metrics_of(values: dict[str, Any]) -> list[MetricRecord]:
    """One configuration's numeric TorchBench values as our metrics, in our units and order."""
    metrics = []
    for theirs, value in values.items():
        if isinstance(value, str):
            continue
        ours, scale = _FROM_TORCHBENCH.get(theirs, (theirs, 1.0))
        v = float(value) * scale
        metrics.append(
            MetricRecord(metric=ours, unit=UNITS.get(ours, ""), samples=[v], median=v, iqr=None)
        )
    order = list(UNITS)
    return sorted(metrics, key=lambda m: order.index(m.metric) if m.metric in order else 99)


def _check_config(where: str, test: str, device: str) -> None:
    if test not in TESTS:
        raise TorchBenchFormatError(
            f"{where}: unknown test {test!r} (expected {' or '.join(TESTS)})"
        )
    if device not in DEVICES:
        raise TorchBenchFormatError(
            f"{where}: unknown device {device!r} (expected {' or '.join(DEVICES)})"
        )


def from_userbenchmark(
    data: dict[str, Any], model_prefix: str | None = None
) -> list[BenchmarkRecord]:
    """Import a TorchBench userbenchmark result as records (one per configuration).

    A TorchBench value is a median, so each metric holds one sample and no IQR; values are
    converted to the suite's units (ms, bytes). A text value leaves that metric out; a
    configuration with text only (``"not_implemented"``, an error) becomes an error record.
    Model names are prefixed with ``torchbench.`` (TorchBench's models are not the suite's),
    except in files written by :func:`to_userbenchmark`, whose names come back as they were.

    Args:
        data: the parsed JSON.
        model_prefix: overrides the prefix put before the models of a TorchBench file.

    Returns:
        Records sorted by model, mode, device and compiler.

    Raises:
        TorchBenchFormatError: ``data`` lacks ``environ.pytorch_git_version`` or ``metrics``, a
            key is in neither dialect, a value is neither a number nor text, or a test or device
            is unknown.
    """
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise TorchBenchFormatError("a TorchBench result needs a 'metrics' object")
    environ = data.get("environ")
    if not isinstance(environ, dict) or "pytorch_git_version" not in environ:
        raise TorchBenchFormatError("a TorchBench result needs 'environ.pytorch_git_version'")
    ours = _VERSIONS_KEY in environ
    versions = environ.get(_VERSIONS_KEY) or {}
    names = environ.get(_NAMES_KEY) or {}
    prefix = model_prefix if model_prefix is not None else TORCHBENCH_PREFIX
    environment = _environment_from(environ)
    grouped: dict[Config, dict[str, Any]] = {}
    for key, value in data["metrics"].items():
        config, metric = parse_key(key)
        _check_config(f"metrics key {key!r}", config[1], config[2])
        if not isinstance(value, int | float | str) or isinstance(value, bool):
            raise TorchBenchFormatError(f"metrics key {key!r}: value {value!r} is not a number")
        if metric in _NOT_MEASUREMENTS:
            continue
        grouped.setdefault(config, {})[metric] = value
    records = []
    for (model, test, device, bs, compiler), values in grouped.items():
        record = BenchmarkRecord(
            model=names.get(model, model) if ours else prefix + model,
            mode=test,
            device=device,
            compiler=compiler,
            batch_size=bs,
            environment=dict(environment),
            benchmark_version=versions.get(f"{model}:{test}:{device}:{compiler}"),
        )
        texts = [v for v in values.values() if isinstance(v, str)]
        if len(texts) == len(values):
            latency = values.get("latencies")
            record.error = latency if isinstance(latency, str) else texts[0]
        else:
            record.metrics = _metrics_of(values)
        records.append(record)
    return sorted(records, key=lambda r: (r.model, r.mode, r.device, r.compiler))


# ---------------------------------------------------------------------------------------------
# pytest-benchmark (test_bench.py)
# ---------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _pytest_environment(machine_info: dict[str, Any]) -> dict[str, Any]:
    cpu = machine_info.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    env = {
        "torch_version": machine_info.get("pytorch_version"),
        "torch_git_version": machine_info.get("pytorch_git_version"),
        "cuda": machine_info.get("cuda_version"),
        "cpu_model": cpu.get("brand_raw") or machine_info.get("processor") or None,
        "cpu_count": cpu.get("count"),
        "hostname": machine_info.get("node"),
        "python": machine_info.get("python_version"),
        "platform": " ".join(
            filter(None, (machine_info.get("system"), machine_info.get("release")))
        )
        or None,
    }
    return {k: v for k, v in env.items() if v is not None}


def pytest_benchmark_night(data: dict[str, Any]) -> date | None:
    """The day a pytest-benchmark result was written (its ``datetime``), or None."""
    try:
        return datetime.fromisoformat(str(data["datetime"])).date()
    except (KeyError, ValueError):
        return None


def from_pytest_benchmark(
    data: dict[str, Any], model_prefix: str | None = None
) -> list[BenchmarkRecord]:
    """Import the pytest-benchmark JSON of TorchBench's ``test_bench.py`` as records.

    Each benchmark named ``test_<test>[<model>-<device>]`` becomes one eager record of
    ``torchbench.<model>``: its ``latency`` in ms is ``stats.median`` (seconds) times 1000, its
    samples ``stats.data`` (seconds, when saved) times 1000, its IQR ``stats.iqr`` times 1000;
    the batch size is ``extra_info.batch_size``. A median that is not a number (text such as
    ``"failed"``) makes that benchmark an error record holding the text. The environment comes
    from ``machine_info`` (``pytorch_version``, ``pytorch_git_version``, ``cuda_version``,
    ``cpu.brand_raw``, ``node``).

    Args:
        data: the parsed JSON.
        model_prefix: overrides the prefix put before model names (default ``torchbench.``).

    Returns:
        Records sorted by model, mode, device and compiler.

    Raises:
        TorchBenchFormatError: no ``benchmarks`` list or ``machine_info`` object, a benchmark
            name is not ``test_<train|eval>[<model>-<device>]``, a device is unknown, a
            benchmark has no ``stats`` object, or two benchmarks have the same name.
    """
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise TorchBenchFormatError("a pytest-benchmark result needs a 'benchmarks' list")
    machine_info = data.get("machine_info")
    if not isinstance(machine_info, dict):
        raise TorchBenchFormatError("a pytest-benchmark result needs a 'machine_info' object")
    prefix = model_prefix if model_prefix is not None else TORCHBENCH_PREFIX
    environment = _pytest_environment(machine_info)
    records: dict[str, BenchmarkRecord] = {}
    for i, bench in enumerate(data["benchmarks"]):
        name, record = _pytest_record(f"benchmarks[{i}]", bench, prefix, environment)
        if name in records:
            raise TorchBenchFormatError(f"benchmarks[{i}]: {name!r} appears twice")
        records[name] = record
    return sorted(records.values(), key=lambda r: (r.model, r.mode, r.device, r.compiler))


def _pytest_record(
    where: str, bench: Any, prefix: str, environment: dict[str, Any]
) -> tuple[str, BenchmarkRecord]:
    """One pytest-benchmark entry as ``(name, record)`` (see :func:`from_pytest_benchmark`)."""
    name = bench.get("name") if isinstance(bench, dict) else None
    match = _PYTEST_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or not isinstance(name, str):
        raise TorchBenchFormatError(
            f"{where}: name {name!r} is not test_<train|eval>[<model>-<device>] "
            "(TorchBench's test_bench.py)"
        )
    _check_config(f"{where} {name!r}", match["test"], match["device"])
    stats, extra = bench.get("stats"), bench.get("extra_info") or {}
    if not isinstance(stats, dict) or not isinstance(extra, dict):
        raise TorchBenchFormatError(f"{where} {name!r}: needs a 'stats' object")
    batch_size = extra.get("batch_size")
    record = BenchmarkRecord(
        model=prefix + match["model"],
        mode=match["test"],
        device=match["device"],
        compiler="eager",
        batch_size=batch_size if isinstance(batch_size, int) else None,
        environment=dict(environment),
    )
    median = _number(stats.get("median"))
    if median is None:
        record.error = str(stats.get("median"))
        return name, record
    raw = stats.get("data")
    samples = (
        [v * 1000 for v in map(_number, raw) if v is not None] if isinstance(raw, list) else []
    )
    iqr = _number(stats.get("iqr"))
    record.metrics = [
        MetricRecord(
            metric="latency",
            unit=UNITS["latency"],
            samples=samples or [median * 1000],
            median=median * 1000,
            iqr=iqr * 1000 if iqr is not None else None,
        )
    ]
    return name, record


__all__ = [
    "FORMATS",
    "PYTEST_BENCHMARK",
    "USERBENCHMARK",
    "TorchBenchFormatError",
    "from_pytest_benchmark",
    "from_torchbench",
    "from_userbenchmark",
    "parse_key",
    "pytest_benchmark_night",
    "result_format",
    "to_userbenchmark",
    "torchbench_name",
]
