"""``nightbench suite stability``: measure which benchmarks are too noisy to alert on, and store it.

The measuring is :mod:`suite.stability` (K ``python -m suite run`` processes per benchmark,
TorchBench's 7% max-min spread rule); this module picks the benchmarks from the suite's listing,
shows progress, and stores the verdicts in ``benchmark_stability`` for the detector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service.errors import InvalidInput
from suite import stability as st


def select_benchmarks(
    listing: Sequence[dict[str, Any]],
    *,
    models: Sequence[str] | None,
    modes: Sequence[str],
    device: str,
    compiler: str,
) -> list[st.StabilityBenchmark]:
    """The benchmarks of ``listing`` (``python -m suite list --json``) to measure.

    Raises:
        InvalidInput: a requested model is not in the listing, a mode is unknown, or nothing
            is left to measure.
    """
    bad_modes = sorted(set(modes) - {"train", "eval"})
    if bad_modes:
        raise InvalidInput(f"unknown mode(s) {', '.join(bad_modes)}; use train and/or eval")
    known = {m["name"] for m in listing}
    if models:
        unknown = sorted(set(models) - known)
        if unknown:
            raise InvalidInput(
                f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        listing = [m for m in listing if m["name"] in set(models)]
    specs = st.benchmarks_for(listing, device=device, modes=modes, compiler=compiler)
    if not specs:
        raise InvalidInput(f"no benchmark of the selected models runs on {device} in {list(modes)}")
    return specs


def measure(
    specs: Sequence[st.StabilityBenchmark],
    *,
    repeats: int,
    run_args: Sequence[str],
    threshold: float,
    on_record: Callable[[st.StabilityBenchmark, int, dict[str, Any]], None] | None,
) -> list[st.StabilityResult]:
    """Run :func:`suite.stability.measure_stability` (see there).

    Raises:
        InvalidInput: ``repeats`` < 2.
    """
    if repeats < 2:
        raise InvalidInput(f"--repeats must be at least 2, got {repeats}")
    return st.measure_stability(
        specs, repeats, run_args=run_args, threshold=threshold, on_record=on_record
    )


def check_store() -> None:
    """Make sure the verdicts can be stored, before minutes of measuring (the embedded SQLite
    store is migrated here, as ``nightbench nightly`` does).

    Raises:
        InvalidInput: the configured database has no ``benchmark_stability`` table.
    """
    from sqlalchemy import select
    from sqlalchemy.exc import DBAPIError

    from service.config import get_settings
    from service.db import session_scope
    from service.models import BenchmarkStability

    settings = get_settings()
    if settings.embedded and settings.effective_database_url.startswith("sqlite"):
        from service.migrate import upgrade

        upgrade()
    try:
        with session_scope() as session:
            session.execute(select(BenchmarkStability.id).limit(1))
    except DBAPIError as exc:
        raise InvalidInput(
            "the database cannot hold stability verdicts (no benchmark_stability table?); run "
            f"`nightbench db upgrade` or pass --no-store: {exc.orig}"
        ) from exc


def store(results: Sequence[st.StabilityResult]) -> int:
    """Store the verdicts in the configured database; returns how many rows were written."""
    from service.db import session_scope
    from service.stability.service import record_stability

    with session_scope() as session:
        return len(record_stability(session, results=[r.to_json() for r in results]))


def stored_verdicts() -> list[dict[str, Any]]:
    """The stored verdicts of the configured database, for ``nightbench suite stability --stored``.

    Returns:
        One dict per benchmark and machine: ``benchmark``, ``machine`` (CPU model or GPU name),
        ``setups``, ``cv``, ``spread``, ``unstable``, ``source`` (``measured`` or ``nightly``),
        ``source_text``, ``recheck`` (the latest nightly re-check, or None) and ``alerts_from``
        (for an unstable benchmark, the least latency regression it still alerts, a fraction:
        ``DetectorParams.unstable_beyond`` times its spread and at least its threshold; None
        otherwise).
    """
    from sqlalchemy import select

    from service.benchmarks import benchmark_name
    from service.config import get_settings
    from service.db import session_scope
    from service.models import Machine
    from service.regressions.unstable import alerts_from
    from service.stability.service import list_stability

    settings = get_settings()
    with session_scope() as session:
        machines = {m.id: m for m in session.scalars(select(Machine))}
        out = []
        for row in list_stability(session):
            details = row.details or {}
            machine = machines.get(row.machine_id)
            out.append(
                {
                    "benchmark": benchmark_name(row.model, row.mode, row.device, row.compiler),
                    "machine": (machine.gpu_name or machine.cpu_model) if machine else None,
                    "setups": list(details.get("setups") or []),
                    "cv": row.cv,
                    "spread": row.spread,
                    "unstable": row.unstable,
                    "source": details.get("source", "measured"),
                    "source_text": details.get("source_text"),
                    "recheck": details.get("recheck"),
                    "alerts_from": alerts_from(
                        row.spread, settings.threshold_for("latency", f"{row.model}:{row.mode}")
                    )
                    if row.unstable
                    else None,
                }
            )
    return out
