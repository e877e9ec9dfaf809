"""Storing a benchmark record as results of a run, one record at a time (the nightly runs).

The rows of a record, its machine and series keys are made in :mod:`service.results.records`,
which the ingest path's bulk writer shares.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Job, Result, Run
from service.results.records import (
    adopt_torch_build,
    catalogue_models,
    record_benchmark,
    record_machine,
    record_metric_names,
    result_rows,
)


def store_record(
    session: Session, *, run: Run, job: Job | None, record: dict[str, Any]
) -> list[Result]:
    """Store one benchmark record (``python -m suite run`` JSON) as results of ``run``.

    Idempotent: if results of this benchmark's metrics already exist in the run (a redelivered
    task), they are returned and nothing is written. An error record becomes one result with
    ``error`` set and no samples (``latency``, or the metric its process measures:
    :func:`~service.results.records.error_metric`).

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
    model, mode, device, compiler = record_benchmark(record)
    existing = list(
        session.scalars(
            select(Result).where(
                Result.run_id == run.id,
                Result.model == model,
                Result.mode == mode,
                Result.device == device,
                Result.compiler == compiler,
            )
        )
    )
    names = record_metric_names(record)
    # A count pass stores its metric in the night beside the timed process's: only the same
    # metrics already there make this a redelivered record.
    mine = [r for r in existing if r.metric in names]
    if mine:
        return mine
    machine = record_machine(session, record)
    results = [
        Result(**row, run_id=run.id, job_id=job.id if job else None, night=run.night)
        for row in result_rows(record, machine=machine)
    ]
    session.add_all(results)
    catalogue_models(session, [record])
    adopt_torch_build(run, [record])
    session.flush()
    return results
