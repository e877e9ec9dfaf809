"""``nightbench suite stability``: measure which benchmarks are too noisy to alert on, and store it.

The method is :mod:`suite.stability` (K processes per benchmark in interleaved rounds,
TorchBench's 7% max-min spread rule); this module lists the suite's models, runs each process
(:func:`run_once`: ``python -m suite run`` through :mod:`workers.runner`, as a night's job runs
it, with :func:`workers.night.jobs.suite_environment`), and stores the verdicts in
``benchmark_stability`` for the detector.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from service.errors import InvalidInput
from suite import stability as st
from workers import runner
from workers.night import jobs

RUN_TIMEOUT_S = 600.0
"""Seconds one measuring process may take."""
LIST_TIMEOUT_S = 300.0
"""Seconds the listing may take."""


def list_models(
    *,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    timeout_s: float = LIST_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """``python -m suite list --json`` in the environment of ``python``: the suite's own models
    (TorchBench's are not measured here, whatever ``NIGHTBENCH_TORCHBENCH_PATH`` says).

    Args:
        python: the interpreter of the environment under test.
        env: extra environment variables for the process.
        timeout_s: seconds the listing may take.

    Returns:
        The listing's entries (``name``, ``modes``, ``devices``, ...).

    Raises:
        RuntimeError: the listing failed or timed out (:func:`workers.night.jobs.list_suite`).
    """
    command = jobs.SuiteCommand(python=python, env=tuple((env or {}).items()))
    return jobs.list_suite(command, timeout_s, torchbench=False)


def run_once(
    spec: st.StabilityBenchmark,
    *,
    python: str = sys.executable,
    run_args: Sequence[str] = (),
    timeout_s: float = RUN_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Measure ``spec`` once in a fresh ``python -m suite run`` process; return its record.

    The process is :func:`workers.runner.run_suite`'s (its own process group, killed whole past
    the timeout), run from the repository root with :func:`workers.night.jobs.suite_environment`.

    Args:
        spec: the benchmark.
        python: the interpreter of the environment under test.
        run_args: extra ``python -m suite run`` arguments (``["--iterations", "30"]``).
        timeout_s: seconds the process may take.
        env: extra environment variables for the process.

    Returns:
        The process's record (``suite/records.py``). Never raises for a benchmark's failure: a
        timeout, a crash or an unreadable record gives ``{"error": reason, "metrics": []}``, the
        reason as :class:`workers.runner.SuiteOutcome` words it (``timed out after 600 s``,
        ``exited with code 1: <stderr tail>``, ``unreadable record: ...``).

    Raises:
        OSError: ``python`` could not be started.
    """
    args = [
        "run",
        "--model",
        spec.model,
        "--mode",
        spec.mode,
        "--device",
        spec.device,
        "--compiler",
        spec.compiler,
        *run_args,
    ]
    outcome = runner.run_suite(
        python,
        args,
        timeout_s=timeout_s,
        cwd=jobs.ROOT,
        env=jobs.suite_environment(dict(env or {})),
    )
    if outcome.record is None:  # timed out, no record, or an unreadable one
        return {"error": outcome.error, "metrics": []}
    return dict(outcome.record)


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
    threshold: float = st.UNSTABLE_SPREAD,
    on_record: Callable[[st.StabilityBenchmark, int, dict[str, Any]], None] | None = None,
    python: str = sys.executable,
    timeout_s: float = RUN_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> list[st.StabilityResult]:
    """:func:`suite.stability.measure_stability` of ``specs``, each process run by
    :func:`run_once` (see there for ``run_args``, ``python``, ``timeout_s`` and ``env``).

    Args:
        specs: what to measure.
        repeats: processes per benchmark (K >= 2).
        run_args: extra ``python -m suite run`` arguments.
        threshold: spread (fraction) from which a benchmark is unstable over 5 processes.
        on_record: called after each process with the spec, the round (0-based) and the record.
        python: the interpreter of the environment under test.
        timeout_s: seconds one process may take.
        env: extra environment variables for the processes.

    Returns:
        One :class:`suite.stability.StabilityResult` per benchmark, in the order given.

    Raises:
        InvalidInput: ``repeats`` < 2.
        ValueError: ``specs`` is empty.
    """
    if repeats < 2:
        raise InvalidInput(f"--repeats must be at least 2, got {repeats}")
    run = partial(run_once, python=python, run_args=run_args, timeout_s=timeout_s, env=env)
    return st.measure_stability(specs, repeats, run=run, threshold=threshold, on_record=on_record)


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
