"""A suite record as result rows: the one place that reads a record's fields.

Both write paths build their rows here: ``store_record`` (one record as ORM objects, the
nightly runs) and the ingest path's bulk ``store_records`` (many records in one ``COPY``), so
both store the same rows: the same series keys, machines, error results and checks of a record.
A record has the shape of ``suite/records.py`` (``python -m suite run`` JSON).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.metrics import METRICS
from service.models import CatalogModel, Machine, Run
from service.models.base import utcnow

Bench = tuple[str, str, str, str]
_FINGERPRINT_FIELDS = ("cpu_model", "gpu_name", "driver", "threads")
# The parts of ``environment["measurement_setup"]`` (``suite/cpu_setup.py``) that change what a
# process measures; the library's path and the thread variables (``threads`` covers them) are not.
_SETUP_FINGERPRINT_FIELDS = ("setup", "allocator", "glibc_tunables", "malloc_conf", "thp", "aslr")
# The GPU part (``measurement_setup["gpu"]``, ``suite/gpu_setup.py``): what changes the kernels run
# or how the caching allocator maps memory. The warm-up's outcome is per process and not in it.
_GPU_SETUP_FINGERPRINT_FIELDS = (
    "cudnn_benchmark",
    "cudnn_deterministic",
    "deterministic_algorithms",
    "alloc_conf",
    "allocator_backend",
    "cublas_workspace_config",
)


# How instructions were counted (``environment["counter"]``): another valgrind, other flags or
# another window length count other work and start another series.
_COUNTER_FINGERPRINT_FIELDS = ("tool", "valgrind", "flags", "warmup_steps", "steps")


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def machine_fingerprint(environment: dict[str, Any], device: str) -> str:
    """Fingerprint of the hardware and measurement setup a result was measured on.

    Made of the device, CPU model, GPU name, driver and thread count, so that another GPU,
    driver or thread setting starts a new series; and of the measurement setup verified in the
    benchmark process (allocator, glibc tunables, ``MALLOC_CONF``, transparent huge pages, ASLR;
    on CUDA also cuDNN autotuning, deterministic algorithms, ``PYTORCH_CUDA_ALLOC_CONF`` and the
    allocator backend), so that a change of setup starts a new series instead of raising a
    regression. An instruction count also fingerprints how it was counted (valgrind's version
    and flags, warm-up and window steps, the count process's environment (fixed and padded
    since counts recorded ``process_environment``: the environment moves a count by up to
    0.5%), and the model's ``count_settings`` where it has any: a count at a smaller image is
    another series). A record
    without ``measurement_setup`` (measured before the suite recorded one) fingerprints exactly
    as before, so stored series keep their keys. The torch build is *not* part of it: the build
    is what the series compares.

    Args:
        environment: the record's environment.
        device: ``cpu`` or ``cuda``.

    Returns:
        32 hex digits.
    """
    parts: list[Any] = [device, *(environment.get(f) for f in _FINGERPRINT_FIELDS)]
    setup = environment.get("measurement_setup")
    if isinstance(setup, dict):
        parts.append({f: setup.get(f) for f in _SETUP_FINGERPRINT_FIELDS})
        if isinstance(setup.get("gpu"), dict):  # CUDA records only: CPU keys stay as they were
            parts.append({f: setup["gpu"].get(f) for f in _GPU_SETUP_FINGERPRINT_FIELDS})
    counter = environment.get("counter")
    if isinstance(counter, dict):  # count records only (``suite/counting.py``): others unchanged
        parts.append({f: counter.get(f) for f in _COUNTER_FINGERPRINT_FIELDS})
        if counter.get("settings"):  # a model counted at its count_settings (a smaller image)
            parts.append({"count_settings": counter["settings"]})
        if counter.get("process_environment"):  # the count process's fixed environment
            parts.append({"process_environment": counter["process_environment"]})
    return _digest(*parts)


def torch_variant(version: str | None) -> str:
    """The build variant a torch version names: its PEP 440 local tag, or ``""`` without one.

    ``torch==2.13.0`` matches ``2.13.0+cpu`` and ``2.13.0+cu130`` alike, so the tag is what tells
    the wheels apart.

    Args:
        version: ``torch.__version__``, e.g. ``"2.13.0+cu130"`` (None when unknown).

    Returns:
        ``"cu130"`` for ``"2.13.0+cu130"``, ``"cpu"`` for ``"2.13.0+cpu"``, ``""`` for
        ``"2.13.0"`` or None.
    """
    if not version or "+" not in version:
        return ""
    return version.split("+", 1)[1].strip().lower()


def build_identity(environment: dict[str, Any]) -> tuple[str, str]:
    """The parts of a result's environment that split series besides the machine.

    Args:
        environment: the record's environment.

    Returns:
        ``(torch_variant, requirements_hash)``: the variant from ``torch_variant`` or else the
        local tag of ``torch_version``, and the hash of the environment's frozen requirements
        (``""`` when the record has none, as for the running interpreter).
    """
    variant = environment.get("torch_variant")
    if variant is None:
        variant = torch_variant(environment.get("torch_version"))
    return str(variant), str(environment.get("requirements_hash") or "")


def series_key(
    *,
    model: str,
    mode: str,
    device: str,
    compiler: str,
    metric: str,
    batch_size: int | None,
    benchmark_version: str | None,
    machine: str,
    build: tuple[str, str] = ("", ""),
) -> str:
    """The identity of a series: only results with the same key are comparable (32 hex digits).

    Args:
        model: the model.
        mode: ``train`` | ``eval``.
        device: ``cpu`` | ``cuda``.
        compiler: ``eager`` | ``inductor``.
        metric: the metric's name.
        batch_size: the batch size (None: the model's default).
        benchmark_version: the model's source hash.
        machine: the machine fingerprint (``""`` without environment).
        build: :func:`build_identity` of the environment; a wheel of another variant or other
            frozen suite requirements start another series. ``("", "")`` leaves the key as it
            was before these were part of it.

    Returns:
        32 hex digits.
    """
    parts: tuple[Any, ...] = (
        model,
        mode,
        device,
        compiler,
        metric,
        batch_size,
        benchmark_version,
        machine,
    )
    return _digest(*parts, *build) if any(build) else _digest(*parts)


def get_or_create_machine(session: Session, *, environment: dict[str, Any], device: str) -> Machine:
    """The machine row for ``environment`` (created on first sight)."""
    fingerprint = machine_fingerprint(environment, device)
    machine = session.scalar(select(Machine).where(Machine.fingerprint == fingerprint))
    if machine is None:
        machine = Machine(
            fingerprint=fingerprint,
            device_class=environment.get("device_class") or device,
            cpu_model=environment.get("cpu_model"),
            gpu_name=environment.get("gpu_name"),
            driver=environment.get("driver"),
            hostname=environment.get("hostname"),
            details={
                k: environment.get(k)
                for k in ("cpu_count", "threads", "platform", "cuda", "measurement_setup")
            },
        )
        session.add(machine)
        session.flush()
    return machine


def record_benchmark(record: dict[str, Any]) -> Bench:
    """The record's benchmark, ``(model, mode, device, compiler)``; the compiler defaults to eager.

    Raises:
        InvalidInput: the record lacks ``model``, ``mode`` or ``device``.
    """
    try:
        model, mode, device = record["model"], record["mode"], record["device"]
    except KeyError as exc:
        raise InvalidInput(f"benchmark record lacks field {exc.args[0]!r}") from exc
    return model, mode, device, record.get("compiler") or "eager"


def record_environment(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of the record's environment (empty when it has none)."""
    return dict(record.get("environment") or {})


def record_machine(
    session: Session,
    record: dict[str, Any],
    *,
    known: dict[str, Machine] | None = None,
) -> Machine | None:
    """The machine the record was measured on (created on first sight); None without environment.

    Args:
        session: an open database session.
        record: the record.
        known: machines already looked up, by fingerprint; filled in as machines are found, so
            that a batch of records looks each machine up once.
    """
    environment = record_environment(record)
    if not environment:
        return None
    device = record["device"]
    fingerprint = machine_fingerprint(environment, device)
    machine = known.get(fingerprint) if known is not None else None
    if machine is None:
        machine = get_or_create_machine(session, environment=environment, device=device)
        if known is not None:
            known[fingerprint] = machine
    return machine


def _metric_values(m: Any, where: str) -> tuple[str, str, list[float]]:
    """A record metric's name, unit and samples; :class:`InvalidInput` when malformed or empty."""
    try:
        samples = [float(x) for x in m["samples"]]
        metric, unit = str(m["metric"]), str(m["unit"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"{where}: malformed metric {m!r}: {exc}") from exc
    if not samples:
        raise InvalidInput(f"{where}: metric {metric!r} has no samples")
    return metric, unit, samples


def error_metric(record: dict[str, Any]) -> str:
    """The metric an error record's row is stored under: the first of the record's
    ``measures`` (a count process measures ``cpu_instructions`` only), else ``latency``."""
    measures = record.get("measures")
    if isinstance(measures, list) and measures and isinstance(measures[0], str):
        return measures[0]
    return "latency"


def record_metric_names(record: dict[str, Any]) -> set[str]:
    """The metrics a record's rows are stored under (its error's metric for an error record)."""
    if record.get("error"):
        return {error_metric(record)}
    return {str(m.get("metric")) for m in record.get("metrics", []) if isinstance(m, dict)}


def result_rows(record: dict[str, Any], *, machine: Machine | None) -> list[dict[str, Any]]:
    """The result rows of one record, as column values: one per metric.

    An error record gives one row with ``error`` set and no samples, under :func:`error_metric`. The rows hold
    every column but those of the run (``run_id``, ``job_id``, ``night``), which the caller adds;
    they share one ``environment`` dict.

    Args:
        record: the record (``suite/records.py`` shape).
        machine: its machine (:func:`record_machine`), None when it has no environment.

    Returns:
        The rows, in the order of the record's metrics.

    Raises:
        InvalidInput: the record lacks ``model``, ``mode`` or ``device``, or a metric is
            malformed or has no samples.
    """
    model, mode, device, compiler = record_benchmark(record)
    common: dict[str, Any] = dict(
        machine_id=machine.id if machine else None,
        model=model,
        mode=mode,
        device=device,
        compiler=compiler,
        batch_size=record.get("batch_size"),
        environment=record_environment(record),
        benchmark_version=record.get("benchmark_version"),
        median=None,
        iqr=None,
        series_key=None,
        error=None,
    )
    if record.get("error"):
        name = error_metric(record)
        return [
            {
                **common,
                "metric": name,
                "unit": METRICS[name].unit if name in METRICS else "ms",
                "samples": [],
                "sample_count": 0,
                "error": str(record["error"]),
            }
        ]
    rows: list[dict[str, Any]] = []
    build = build_identity(common["environment"])
    for m in record.get("metrics", []):
        metric, unit, samples = _metric_values(m, f"{model}:{mode}:{device}")
        key = series_key(
            model=model,
            mode=mode,
            device=device,
            compiler=compiler,
            metric=metric,
            batch_size=record.get("batch_size"),
            benchmark_version=record.get("benchmark_version"),
            machine=machine.fingerprint if machine else "",
            build=build,
        )
        rows.append(
            {
                **common,
                "metric": metric,
                "unit": unit,
                "samples": samples,
                "sample_count": len(samples),
                "median": m.get("median"),
                "iqr": m.get("iqr"),
                "series_key": key,
            }
        )
    return rows


def adopt_torch_build(run: Run, records: Iterable[dict[str, Any]]) -> None:
    """Give ``run`` the torch build of the first record with an environment, unless it has one."""
    environment = next((e for e in map(record_environment, records) if e), None)
    if environment and run.torch_version is None:
        run.torch_version = environment.get("torch_version")
        run.torch_git_commit = environment.get("torch_git_version")


def catalogue_models(session: Session, records: Sequence[dict[str, Any]]) -> None:
    """Note each record's model in the models catalogue with its ``model_domain``.

    The suite writes ``environment["model_domain"]`` (``computer_vision``, ``nlp``, ...); the
    latest record of a model wins. Records without one (older records, other tools) leave the
    catalogue as it is. An upsert, so concurrent workers storing the same model never clash.
    """
    domains: dict[str, str] = {}
    for record in records:
        domain = record_environment(record).get("model_domain")
        model = record.get("model")
        if isinstance(model, str) and isinstance(domain, str) and 0 < len(domain) <= 64:
            domains[model] = domain
    if not domains:
        return
    rows = [{"name": m, "domain": d, "created_at": utcnow()} for m, d in domains.items()]
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(CatalogModel).values(rows)
    session.execute(
        stmt.on_conflict_do_update(index_elements=["name"], set_={"domain": stmt.excluded.domain})
    )
