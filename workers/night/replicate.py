"""More processes of a night, to compare it: replicate runs, measured as confirmation re-runs are.

:func:`service.runs.processes.request_processes` stores the replicate runs (same night, same
build spec, ``parent_run_id`` = the night); their jobs are ``bench.run`` steps like every other
job, and a replicate run's own ``night.finish`` only closes it (:func:`workers.night.finish.finish`
detects on nightly and posted runs, and applies confirmation runs, nothing else; a night's own
rounds of processes, :mod:`service.runs.rounds`, are the replicate runs it goes on from, and
their jobs are sent by ``night.finish``, never by the sweep). Whoever asked sends the jobs: the command line here and now, or, for a request made over the API, the
periodic sweep (:func:`dispatch_pending`).
"""

from __future__ import annotations

import logging

from service.config import Settings, get_settings
from service.db import session_scope
from service.runs import processes as service
from workers.enqueue import Step
from workers.night.plan import job_steps

log = logging.getLogger(__name__)


def request_processes(
    run_ids: list[int],
    *,
    processes: int,
    settings: Settings | None = None,
) -> list[service.ProcessRequest]:
    """Ask each run of ``run_ids`` for ``processes`` processes per benchmark (committed).

    All runs are checked before any is asked: a bad id or run stores nothing.

    Raises:
        service.errors.InvalidInput, NotFound, Conflict: as
            :func:`service.runs.processes.request_processes`, for the first bad run.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        return [
            service.request_processes(
                session, run_id=run_id, processes=processes, deadline_s=settings.night_deadline_s
            )
            for run_id in dict.fromkeys(run_ids)
        ]


def claim_steps(parent_ids: list[int] | None = None) -> list[Step]:
    """The ``bench.run`` steps of replicate runs nobody has sent yet (of ``parent_ids`` when
    given), claimed and committed before they are returned for sending."""
    with session_scope() as session:
        claimed = service.claim_pending(session, parent_ids=parent_ids)
    if claimed:
        log.info("replicate run(s) %s: sending their jobs", claimed)
    return [step for run_id in claimed for step in job_steps(run_id)]


def dispatch_pending() -> list[Step]:
    """For the sweep: the jobs of replicate runs asked for over the API, not sent yet."""
    return claim_steps(None)
