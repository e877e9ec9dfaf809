"""Storing and reading stability verdicts (``benchmark_stability``).

A verdict comes from ``suite.stability.StabilityResult.to_json()``: K processes of one benchmark,
the coefficient of variation and the max-min spread of their medians, and ``unstable`` when the
spread reaches the threshold (TorchBench's 7%). The detector reads the unstable ones with their
spreads, machine by machine, through :func:`service.regressions.service.unstable_spreads`
(alerted only beyond it). A verdict says where it came from in ``details``: ``source``
(``measured`` here, ``nightly`` when the nightly re-check of :mod:`service.stability.recheck`
changed it), ``source_text`` (``"measured over 5 processes ..."``), the measurement ``setups`` in
force, and the latest re-check (``recheck``) beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import InvalidInput
from service.models.base import utcnow
from service.models.stability import BenchmarkStability
from service.results.records import get_or_create_machine
from service.stability.recheck import SOURCE_MEASURED

_REQUIRED = ("model", "mode", "device", "repeats", "threshold")


def record_stability(
    session: Session, *, results: Sequence[Mapping[str, Any]], measured_at: datetime | None = None
) -> list[BenchmarkStability]:
    """Store stability verdicts, replacing the previous verdict of each benchmark and machine.

    A verdict without an environment (every process failed) names no machine and is not stored.

    Args:
        session: the caller's session (this function only flushes).
        results: ``StabilityResult.to_json()`` dicts.
        measured_at: when they were measured (default: now).

    Returns:
        The stored rows, in the order of ``results`` (verdicts without environment left out).

    Raises:
        InvalidInput: a verdict lacks a required field or has a malformed one.
    """
    rows = []
    when = measured_at or utcnow()
    for result in results:
        missing = [k for k in _REQUIRED if result.get(k) is None]
        if missing:
            raise InvalidInput(f"stability verdict lacks {', '.join(missing)}: {dict(result)!r}")
        environment = dict(result.get("environment") or {})
        if not environment:
            continue
        device = str(result["device"])
        machine = get_or_create_machine(session, environment=environment, device=device)
        compiler = str(result.get("compiler") or "eager")
        try:
            medians = [float(m) for m in result.get("medians_ms") or []]
            values = dict(
                benchmark_version=result.get("benchmark_version"),
                torch_version=environment.get("torch_version"),
                repeats=int(result["repeats"]),
                medians_ms=medians,
                cv=None if result.get("cv") is None else float(result["cv"]),
                spread=None if result.get("spread") is None else float(result["spread"]),
                threshold=float(result["threshold"]),
                unstable=None if result.get("unstable") is None else bool(result["unstable"]),
                errors=[str(e) for e in result.get("errors") or []],
                measured_at=when,
            )
        except (TypeError, ValueError) as exc:
            raise InvalidInput(
                f"malformed stability verdict for {result.get('model')!r}: {exc}"
            ) from exc
        row = session.scalar(
            select(BenchmarkStability).where(
                BenchmarkStability.model == result["model"],
                BenchmarkStability.mode == result["mode"],
                BenchmarkStability.device == device,
                BenchmarkStability.compiler == compiler,
                BenchmarkStability.machine_id == machine.id,
            )
        )
        if row is None:
            row = BenchmarkStability(
                model=str(result["model"]),
                mode=str(result["mode"]),
                device=device,
                compiler=compiler,
                machine_id=machine.id,
            )
            session.add(row)
        for key, value in values.items():
            setattr(row, key, value)
        row.details = _measured_details(row.details, result)
        rows.append(row)
    session.flush()
    return rows


def _measured_details(
    details: Mapping[str, Any] | None, result: Mapping[str, Any]
) -> dict[str, Any]:
    """A row's details once a measured verdict is in force again: its source and setups; the
    latest nightly re-check stays beside it."""
    out = {k: v for k, v in (details or {}).items() if k != "measured"}
    out.update(
        source=SOURCE_MEASURED,
        setups=[str(s) for s in result.get("setups") or []],
        allowed_spread=result.get("allowed_spread"),
        source_text=f"measured over {int(result['repeats'])} processes "
        "(nightbench suite stability)",
    )
    return out


def list_stability(session: Session, *, machine_id: int | None = None) -> list[BenchmarkStability]:
    """Every stored verdict (of one machine, if given), by model, mode, device, compiler."""
    query = select(BenchmarkStability).order_by(
        BenchmarkStability.model,
        BenchmarkStability.mode,
        BenchmarkStability.device,
        BenchmarkStability.compiler,
        BenchmarkStability.machine_id,
    )
    if machine_id is not None:
        query = query.where(BenchmarkStability.machine_id == machine_id)
    return list(session.scalars(query))
