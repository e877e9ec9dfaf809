"""A series' stored history: what detection, confirmation, charts and issues all read.

A *series* is one metric of one benchmark on one machine and environment (``Result.series_key``;
see the glossary in docs/architecture.md). Kept below both :mod:`service.results` and
:mod:`service.regressions`, which each read it, so neither imports the other for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from datetime import date
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.models import Result, Run, RunKind

NIGHT_ROUND = "night"
"""``Run.options["origin"]`` of a replicate run that is one of a night's own rounds of processes
(``NIGHTBENCH_NIGHT_PROCESSES``), as opposed to one asked for by a comparison."""

PAIRED_ROUND = "paired"
"""``Run.options["origin"]`` of a replicate run of a confirmation run that measures the previous
night's build beside the re-run (:mod:`service.regressions.paired`): never part of a series'
history or of a night's level."""


COUNT_ROUND = "count"
"""``Run.options["origin"]`` of a replicate run that counts instructions per step of a night's
(or a confirmation run's) benchmarks under valgrind after its timed processes (the count pass):
its results are stored in the night itself, whose ``cpu_instructions`` they are."""


def series_history(
    session: Session,
    *,
    series_key: str,
    night: date,
    run_id: int,
    limit: int,
    kinds: Sequence[str] = (RunKind.NIGHTLY, RunKind.INGEST, RunKind.CONFIRM),
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


def is_night_round(options: dict[str, Any] | None) -> bool:
    """Whether a replicate run with these ``Run.options`` is a round of its parent's own
    processes (a night's or a confirmation run's), not one asked for by a comparison."""
    return (options or {}).get("origin") == NIGHT_ROUND


def is_count_round(options: dict[str, Any] | None) -> bool:
    """Whether a replicate run with these ``Run.options`` is a night's count pass
    (:data:`COUNT_ROUND`)."""
    return (options or {}).get("origin") == COUNT_ROUND


def is_paired_round(options: dict[str, Any] | None) -> bool:
    """Whether a replicate run with these ``Run.options`` measures the previous night's build
    beside a confirmation re-run (:data:`PAIRED_ROUND`)."""
    return (options or {}).get("origin") == PAIRED_ROUND


def round_results(
    session: Session,
    *,
    run_ids: Collection[int],
    series_key: str | None = None,
) -> dict[tuple[int, str], list[Result]]:
    """The results measured by the night rounds of runs ``run_ids``, errors excluded.

    Only rounds of the run's own processes count (:func:`is_night_round`); replicate runs asked
    for by ``nightbench runs compare --processes`` are left out, so every night of a series has
    the same number of processes whatever was compared since.

    Args:
        session: an open session.
        run_ids: the runs (nights, confirmation runs) whose rounds are read.
        series_key: only this series (None: every series).

    Returns:
        ``{(run id, series_key): [result, ...]}`` in round order; runs without rounds are absent.
    """
    if not run_ids:
        return {}
    stmt = (
        select(Result, Run.parent_run_id, Run.options)
        .join(Run, Run.id == Result.run_id)
        .where(
            Run.kind == RunKind.REPLICATE,
            Run.parent_run_id.in_(set(run_ids)),
            Result.error.is_(None),
            Result.series_key.is_not(None),
        )
        .order_by(Result.run_id, Result.id)
    )
    if series_key is not None:
        stmt = stmt.where(Result.series_key == series_key)
    out: dict[tuple[int, str], list[Result]] = {}
    for result, parent, options in session.execute(stmt):
        if is_night_round(options) and result.samples:
            out.setdefault((parent, result.series_key), []).append(result)
    return out


def night_processes(result: Result, rounds: Sequence[Result]) -> list[Result]:
    """The processes of ``result``'s night on its series: itself and its rounds' results
    (:func:`round_results`), those with samples."""
    return [r for r in (result, *rounds) if r.samples]


def night_samples(result: Result, rounds: Sequence[Result]) -> tuple[float, ...]:
    """What detection reads as ``result``'s night: with one process its raw samples (ms or
    bytes), with more the median of each process's samples, one value per process.

    The detector's level of a night is the median of these, so with several processes it is
    the median of the per-process medians: the process, not the iteration, is the unit of
    repetition (Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013).
    """
    processes = night_processes(result, rounds)
    if len(processes) <= 1:
        return tuple(float(s) for s in result.samples or ())
    return tuple(float(statistics.median(r.samples)) for r in processes)
