"""The nightly re-check of stability: each benchmark's own recent processes, read and stored.

``nightbench suite stability`` measures a benchmark's stability once, in K fresh processes. The
nights measure it again every night: each night is one ``python -m suite run`` process, and so is
each confirmation re-run. After a night, the per-process medians of a benchmark's latency over
its last ``nights`` nights on the same series (same machine fingerprint and build identity, see
``service/results/records.py``), the processes of the nights' own rounds included
(``NIGHTBENCH_NIGHT_PROCESSES``), are a new sample of its process-to-process noise, judged by the
same rule (TorchBench's 7% max-min spread for 5 processes, scaled for the window's number of
processes by d2(n) / d2(5); ``suite/stability.py``, applied by ``workers/night/recheck.py``,
since the service does not import the suite).

A real step is not noise. The window keeps only the processes from the latest step's first night
at the new level on, where the detector itself restarts its baseline
(``service/results/history.py``, ``_flags``): a step marked ``expected``, a raised step (its
confirmation re-run reproduced it, or it was raised once it persisted: its first night is earlier
than the night it was raised), and an improvement. A candidate the detector has not settled yet
(no re-run, or one that failed: the next nights decide) may be the first night of a step still
to be raised; it is ``unsettled`` for ``settle_nights`` nights and kept out of a verdict that
would darken the benchmark. A candidate its re-run did not reproduce was a blip of one process:
noise, and counted.

This module reads the windows (:func:`recheck_window`), stores the re-check beside the measured
verdict (:func:`record_recheck`; ``benchmark_stability.details``), and lists a run's changes of
verdict for its report (:func:`stability_changes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.models import Confirmation, Result, Run, RunKind
from service.models.base import utcnow
from service.models.stability import BenchmarkStability
from service.results.history_queries import StoredVerdict, stored_regressions
from service.series import is_night_round

RECHECK_KINDS = (RunKind.NIGHTLY, RunKind.INGEST, RunKind.CONFIRM)
SOURCE_MEASURED = "measured"
SOURCE_NIGHTLY = "nightly"


@dataclass(frozen=True)
class Process:
    """One benchmark process of a series: a night's result, a confirmation re-run's, or one of
    their rounds' (``NIGHTBENCH_NIGHT_PROCESSES``).

    Attributes:
        result_id: the stored result.
        night: its night.
        median_ms: its median latency (ms).
        unsettled: a candidate step the detector has not settled yet (kept out of darkening).
    """

    result_id: int
    night: date
    median_ms: float
    unsettled: bool = False


@dataclass(frozen=True)
class RecheckWindow:
    """The processes of one benchmark's series that its nightly re-check judges.

    Attributes:
        model, mode, device, compiler: the benchmark.
        machine_id: the machine of the series.
        series_key: the latency series.
        processes: oldest first, from the latest real step's first night on, at most the last
            ``nights`` nights.
        cut_at: the first night of the step the window starts at (None: no step inside).
    """

    model: str
    mode: str
    device: str
    compiler: str
    machine_id: int
    series_key: str
    processes: tuple[Process, ...]
    cut_at: date | None = None

    @property
    def benchmark(self) -> str:
        """``model:mode:device[:compiler]``."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)

    def medians(self, *, settled_only: bool = False) -> list[float]:
        """Per-process medians (ms), oldest first; ``settled_only`` leaves unsettled ones out."""
        return [p.median_ms for p in self.processes if not (settled_only and p.unsettled)]

    def describe(self, *, settled_only: bool = False) -> str:
        """``"nightly re-check over 9 processes, nights 2026-09-01..2026-09-10"``."""
        kept = [p for p in self.processes if not (settled_only and p.unsettled)]
        if not kept:
            return "nightly re-check over 0 processes"
        return (
            f"nightly re-check over {len(kept)} processes, "
            f"nights {kept[0].night.isoformat()}..{kept[-1].night.isoformat()}"
        )


def step_first_result(result_id: int, stored: StoredVerdict) -> int | None:
    """Where a stored verdict puts a real step: the result id of its first night, or None.

    Args:
        result_id: the result the verdict was recorded on.
        stored: ``(regression id, direction, confirmation, state, first night's result id)``
            (``service.results.history_queries.stored_regressions``).

    Returns:
        The first night's result id for a step marked ``expected``, an improvement, a
        reproduced regression, or one raised once it persisted (first night before the night
        it was raised); None for a candidate and for a blip its re-run did not reproduce.
    """
    _, direction, confirmation, state, first_id = stored
    if state == "expected":
        return first_id
    if confirmation == Confirmation.NOT_REPRODUCED:
        return None
    if direction == "improvement" or confirmation == Confirmation.REPRODUCED:
        return first_id
    return first_id if first_id != result_id else None


def _window_results(
    session: Session, *, series_key: str, night: date, run_ids: set[int], nights: int
) -> tuple[list[Result], dict[int, int]]:
    """The series' results of its last ``nights`` nights up to ``night``, oldest first, with
    the results of the nights' own rounds of processes (``NIGHTBENCH_NIGHT_PROCESSES``), and
    for each round's result the run id of the night (or re-run) it is a process of."""
    stmt = (
        select(Result.night)
        .join(Run, Run.id == Result.run_id)
        .where(
            Result.series_key == series_key,
            Result.error.is_(None),
            Result.night <= night,
            Run.kind.in_(RECHECK_KINDS),
        )
        .distinct()
        .order_by(Result.night.desc())
        .limit(nights)
    )
    recent = list(session.scalars(stmt))
    if not recent:
        return [], {}
    rows = session.execute(
        select(Result, Run.kind, Run.parent_run_id, Run.options)
        .join(Run, Run.id == Result.run_id)
        .where(
            Result.series_key == series_key,
            Result.error.is_(None),
            Result.night >= min(recent),
            Result.night <= night,
            Run.kind.in_((*RECHECK_KINDS, RunKind.REPLICATE)),
        )
        .order_by(Result.night, Result.run_id)
    ).all()
    round_of = {
        r.id: parent
        for r, kind, parent, options in rows
        if kind == RunKind.REPLICATE and parent is not None and is_night_round(options)
    }
    kept = [r for r, kind, _, _ in rows if kind != RunKind.REPLICATE or r.id in round_of]
    # Tonight's results beyond the run (its re-runs and their rounds) being finished are not in.
    return [r for r in kept if r.night < night or round_of.get(r.id, r.run_id) in run_ids], round_of


def recheck_window(
    session: Session, *, result: Result, run_ids: Sequence[int], nights: int, settle_nights: int
) -> RecheckWindow | None:
    """The window of processes of ``result``'s latency series that tonight's re-check judges.

    Args:
        session: an open session.
        result: tonight's latency result of the benchmark (from a nightly or posted run).
        run_ids: tonight's run and its confirmation runs (their results count tonight).
        nights: how many recent nights (K) the window spans at most.
        settle_nights: a candidate step this many nights old or newer, neither raised nor
            dropped by its re-run, is ``unsettled``.

    Returns:
        The window, or None when the result has no series or machine.

    Raises:
        ValueError: ``nights`` or ``settle_nights`` is below 1.
    """
    if nights < 1 or settle_nights < 1:
        raise ValueError(f"nights and settle_nights must be >= 1, got {nights}, {settle_nights}")
    if result.series_key is None or result.machine_id is None:
        return None
    rows, round_of = _window_results(
        session,
        series_key=result.series_key,
        night=result.night,
        run_ids=set(run_ids),
        nights=nights,
    )
    stored = stored_regressions(session, [result.series_key]).get(result.series_key, {})
    cut, candidates = _latest_step(rows, stored)
    # A round's process is unsettled with the candidate night (or re-run) it is a process of.
    pending = {rows[i].run_id for i in candidates}
    recent = sorted({r.night for r in rows}, reverse=True)[:settle_nights]
    processes = tuple(
        Process(
            r.id,
            r.night,
            float(r.median),
            unsettled=(i in candidates or round_of.get(r.id) in pending) and r.night >= recent[-1],
        )
        for i, r in enumerate(rows)
        if i >= cut and r.median is not None and r.median > 0
    )
    return RecheckWindow(
        result.model,
        result.mode,
        result.device,
        result.compiler,
        result.machine_id,
        result.series_key,
        processes,
        rows[cut].night if cut > 0 else None,
    )


def _latest_step(rows: Sequence[Result], stored: dict[int, StoredVerdict]) -> tuple[int, set[int]]:
    """Where the latest real step among ``rows`` began (an index, 0 without one), and the
    indices of the candidates that are not steps (blips dropped by their re-run left out)."""
    position = {r.id: i for i, r in enumerate(rows)}
    cut = 0
    candidates: set[int] = set()
    for i, r in enumerate(rows):
        verdict = stored.get(r.id)
        if verdict is None:
            continue
        first = step_first_result(r.id, verdict)
        if first is None:
            if verdict[2] != Confirmation.NOT_REPRODUCED:
                candidates.add(i)
            continue
        # A step that began before the window: the whole window is after it.
        cut = max(cut, position.get(first, 0))
    return cut, candidates


def stored_verdict(session: Session, window: RecheckWindow) -> BenchmarkStability | None:
    """The stored verdict of the window's benchmark on its machine (None: none stored)."""
    return session.scalar(
        select(BenchmarkStability).where(
            BenchmarkStability.model == window.model,
            BenchmarkStability.mode == window.mode,
            BenchmarkStability.device == window.device,
            BenchmarkStability.compiler == window.compiler,
            BenchmarkStability.machine_id == window.machine_id,
        )
    )


def record_recheck(
    session: Session,
    *,
    window: RecheckWindow,
    run: Run,
    medians_ms: Sequence[float],
    cv: float | None,
    spread: float | None,
    unstable: bool | None,
    threshold: float,
    source: str,
    applied: bool,
    setups: Sequence[str] = (),
    allowed: float | None = None,
) -> BenchmarkStability | None:
    """Store a nightly re-check beside the benchmark's measured verdict.

    The re-check is kept in ``details["recheck"]``. When ``applied`` (the re-check changes the
    verdict, or there was none), it also becomes the verdict in force: the row's columns take
    its figures, ``details["source"]`` becomes ``nightly`` and ``details["last_change"]`` names
    the run; the measured verdict it replaces stays in ``details["measured"]``.

    Args:
        session: the caller's session (only flushed).
        window: what was judged.
        run: tonight's run.
        medians_ms: the medians the verdict was computed from (ms).
        cv: their coefficient of variation.
        spread: their ``(max - min) / min``.
        unstable: the re-check's verdict (None: too few processes to judge).
        threshold: the spread from which 5 processes are unstable (the row's ``threshold``).
        source: how it was judged (:meth:`RecheckWindow.describe` and the spread allowed).
        applied: make it the verdict in force.
        setups: the measurement setups in force tonight (``suite.stability.full_setup_label``).
        allowed: the spread allowed for that many processes (None: too few); ``allowed_spread``.

    Returns:
        The row, or None when there is no row and nothing was applied.
    """
    row = stored_verdict(session, window)
    recheck = {
        "run_id": run.id,
        "night": run.night.isoformat(),
        "source": source,
        "processes": len(medians_ms),
        "medians_ms": [float(m) for m in medians_ms],
        "cv": cv,
        "spread": spread,
        "unstable": unstable,
        "threshold": threshold,
        "allowed_spread": allowed,
        "cut_at": window.cut_at and window.cut_at.isoformat(),
    }
    if row is None:
        if not applied:
            return None
        row = BenchmarkStability(
            model=window.model,
            mode=window.mode,
            device=window.device,
            compiler=window.compiler,
            machine_id=window.machine_id,
        )
        session.add(row)
    details: dict[str, Any] = dict(row.details or {})
    details["recheck"] = recheck
    if applied:
        if details.get("source", SOURCE_MEASURED) == SOURCE_MEASURED and row.repeats:
            details["measured"] = {
                "repeats": row.repeats,
                "cv": row.cv,
                "spread": row.spread,
                "unstable": row.unstable,
                "medians_ms": list(row.medians_ms),
                "measured_at": row.measured_at.isoformat() if row.measured_at else None,
            }
        details["last_change"] = {
            "run_id": run.id,
            "night": run.night.isoformat(),
            "from": row.unstable,
            "to": unstable,
            "source": source,
        }
        details["source"] = SOURCE_NIGHTLY
        details["source_text"] = source
        details["allowed_spread"] = allowed
        details["setups"] = list(setups)
        row.repeats, row.medians_ms = len(medians_ms), [float(m) for m in medians_ms]
        row.cv, row.spread, row.unstable, row.threshold = cv, spread, unstable, threshold
        row.measured_at = utcnow()
    row.details = details
    session.flush()
    return row


def stability_changes(
    session: Session, *, run_id: int | None = None, since: date | None = None
) -> list[dict[str, Any]]:
    """The latest change of stability verdict of each benchmark the nightly re-check made: those
    of run ``run_id`` (its report), or those of the nights since ``since`` (the status).

    Returns:
        ``[{"benchmark", "machine_id", "run_id", "night", "from", "to", "cv", "spread",
        "source"}, ...]`` by benchmark; ``from``/``to`` are ``"stable"``, ``"unstable"`` or
        ``"unknown"``, ``night`` an ISO date.
    """
    words = {True: "unstable", False: "stable", None: "unknown"}
    out = []
    for row in session.scalars(
        select(BenchmarkStability).order_by(
            BenchmarkStability.model,
            BenchmarkStability.mode,
            BenchmarkStability.device,
            BenchmarkStability.compiler,
            BenchmarkStability.machine_id,
        )
    ):
        change = (row.details or {}).get("last_change") or {}
        if not change or (run_id is not None and change.get("run_id") != run_id):
            continue
        if since is not None and date.fromisoformat(str(change.get("night"))) < since:
            continue
        out.append(
            {
                "benchmark": benchmark_name(row.model, row.mode, row.device, row.compiler),
                "machine_id": row.machine_id,
                "run_id": change.get("run_id"),
                "night": change.get("night"),
                "from": words[change.get("from")],
                "to": words[change.get("to")],
                "cv": row.cv,
                "spread": row.spread,
                "source": change.get("source"),
            }
        )
    return out
