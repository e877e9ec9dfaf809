"""Storing benchmark records as results, machines, series keys and series history."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import date
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.models import Job, Machine, Result, Run

ALERT_METRICS = ("latency", "cpu_peak_mem", "gpu_peak_mem")
_FINGERPRINT_FIELDS = ("cpu_model", "gpu_name", "driver", "threads")


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def machine_fingerprint(environment: dict[str, Any], device: str) -> str:
    """Fingerprint of the hardware a result was measured on.

    Made of the device, CPU model, GPU name, driver and thread count, so that another GPU,
    driver or thread setting starts a new series. The torch build is *not* part of it: the build
    is what the series compares.
    """
    return _digest(device, *(environment.get(f) for f in _FINGERPRINT_FIELDS))


def series_key(
    *, model: str, mode: str, device: str, compiler: str, metric: str, batch_size: int | None,
    benchmark_version: str | None, machine: str,
) -> str:
    """The identity of a series: only results with the same key are comparable (32 hex digits)."""
    return _digest(model, mode, device, compiler, metric, batch_size, benchmark_version, machine)


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
            details={k: environment.get(k) for k in ("cpu_count", "threads", "platform", "cuda")},
        )
        session.add(machine)
        session.flush()
    return machine


def store_record(session: Session, *, run: Run, job: Job | None, record: dict[str, Any]) -> list[Result]:
    """Store one benchmark record (``python -m suite run`` JSON) as results of ``run``.

    Idempotent: if results for this benchmark already exist in the run (a redelivered task),
    they are returned and nothing is written. An error record becomes one ``latency`` result
    with ``error`` set and no samples.

    Args:
        session: the caller's session (this function only flushes).
        run: the run the record belongs to.
        job: the job that produced it, if any.
        record: the record dict; see ``suite/records.py`` for its shape.

    Returns:
        The run's results for this benchmark, one per metric.

    Raises:
        InvalidInput: the record lacks ``model``, ``mode`` or ``device``, or a metric is malformed.
    """
    try:
        model, mode, device = record["model"], record["mode"], record["device"]
    except KeyError as exc:
        raise InvalidInput(f"benchmark record lacks field {exc.args[0]!r}") from exc
    compiler = record.get("compiler") or "eager"
    existing = list(
        session.scalars(
            select(Result).where(
                Result.run_id == run.id, Result.model == model, Result.mode == mode,
                Result.device == device, Result.compiler == compiler,
            )
        )
    )
    if existing:
        return existing
    environment = dict(record.get("environment") or {})
    machine = get_or_create_machine(session, environment=environment, device=device) if environment else None
    common = dict(
        run_id=run.id, job_id=job.id if job else None, machine_id=machine.id if machine else None,
        night=run.night, model=model, mode=mode, device=device, compiler=compiler,
        batch_size=record.get("batch_size"), environment=environment,
        benchmark_version=record.get("benchmark_version"),
    )
    results: list[Result] = []
    if record.get("error"):
        results.append(Result(**common, metric="latency", unit="ms", samples=[], error=str(record["error"])))
    else:
        for m in record.get("metrics", []):
            try:
                samples = [float(x) for x in m["samples"]]
                metric, unit = str(m["metric"]), str(m["unit"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidInput(f"{model}:{mode}:{device}: malformed metric {m!r}: {exc}") from exc
            if not samples:
                raise InvalidInput(f"{model}:{mode}:{device}: metric {metric!r} has no samples")
            key = series_key(
                model=model, mode=mode, device=device, compiler=compiler, metric=metric,
                batch_size=record.get("batch_size"), benchmark_version=record.get("benchmark_version"),
                machine=machine.fingerprint if machine else "",
            )
            results.append(Result(
                **common, metric=metric, unit=unit, samples=samples, median=m.get("median"),
                iqr=m.get("iqr"), series_key=key,
            ))
    session.add_all(results)
    if environment and run.torch_version is None:
        run.torch_version = environment.get("torch_version")
        run.torch_git_commit = environment.get("torch_git_version")
    session.flush()
    return results


def series_history(
    session: Session, *, series_key: str, night: date, run_id: int, limit: int,
    kinds: Sequence[str] = ("nightly", "ingest", "confirm"),
) -> list[Result]:
    """Earlier results of a series, oldest first, before ``(night, run_id)``; errors excluded.

    At most ``limit`` results (the most recent ones). Confirmation re-runs are included (right
    after their night, as the detector expects them); probes of bisections are not.
    """
    stmt = (
        select(Result)
        .join(Run, Run.id == Result.run_id)
        .where(
            Result.series_key == series_key,
            Result.error.is_(None),
            Run.kind.in_(kinds),
            or_(Result.night < night, and_(Result.night == night, Result.run_id < run_id)),
        )
        .order_by(Result.night.desc(), Result.run_id.desc())
        .limit(limit)
    )
    return list(reversed(list(session.scalars(stmt))))
