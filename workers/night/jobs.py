"""Measuring one job: ``python -m suite run`` in its own process, with a timeout, then storing.

The process is run by :mod:`workers.runner`, as the bisection's probes are.

One subprocess per benchmark (TorchBench and pyperf do the same): a crash, an out-of-memory kill
or a hang ends only that process and becomes an error result with its reason; the worker lives on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.config import ENV_PREFIX, Settings, get_settings
from service.db import session_scope
from service.metrics import INSTRUCTIONS
from service.models import JOB_ENDED, Job, JobStatus
from service.results import service as results
from service.runs import count_plan, rounds
from service.runs import service as runs
from service.series import is_count_round
from workers import runner
from workers.builds import torch_envs as environments
from workers.night import heartbeat

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
# The variable of Settings.torchbench_path, which the suite (suite/torchbench_checkout.py) reads.
TORCHBENCH_PATH_ENV = f"{ENV_PREFIX}TORCHBENCH_PATH"


@dataclass(frozen=True)
class SuiteCommand:
    """How to run the suite: the interpreter of the build under test and its extra environment."""

    python: str = sys.executable
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None  # None: the repository root


def command_for(env: environments.Environment) -> SuiteCommand:
    """The suite command for a build's environment (see ``workers/builds/torch_envs.py``).

    The working directory is the environment's suite path, which holds only the suite, so that
    nothing else from this checkout sits first on the build's ``sys.path``.
    """
    return SuiteCommand(
        python=str(env.python), env=tuple(env.subprocess_env().items()), cwd=str(env.suite_path)
    )


def suite_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The subprocess environment: ours, with the repository root on PYTHONPATH and the
    settings' TorchBench checkout (``torchbench_path``) in ``NIGHTBENCH_TORCHBENCH_PATH``, where
    the suite, which has no settings object, reads it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    checkout = get_settings().torchbench_path
    if checkout is not None:
        env[TORCHBENCH_PATH_ENV] = str(checkout)
    env.update(extra or {})
    return env


def list_suite(
    command: SuiteCommand | None = None, timeout_s: float = 1800, *, torchbench: bool = True
) -> list[dict[str, Any]]:
    """``python -m suite list --json`` of the build under test; with ``torchbench_path`` set
    (``NIGHTBENCH_TORCHBENCH_PATH``), TorchBench's models too (``--suite all``), their imports
    checked in that build's environment where not cached (``--check-imports``: minutes for the
    whole real checkout the first time, hence the timeout).

    Args:
        command: the interpreter and extra environment; None: this interpreter.
        timeout_s: seconds the listing may take.
        torchbench: list TorchBench's models when ``torchbench_path`` is set; False: the
            suite's own models only, whatever the setting (``nightbench suite stability``).

    Raises:
        RuntimeError: the listing failed or timed out (its stderr, or the timeout, is in the
            message).
    """
    command = command or SuiteCommand()
    checkout = get_settings().torchbench_path if torchbench else None
    # TorchBench's models are available once their import passed in the environment under
    # test: the listing checks those not checked there yet (suite/torchbench_check.py).
    args = ["list", "--json"] + (
        ["--suite", "all", "--torchbench", str(checkout), "--check-imports"] if checkout else []
    )
    outcome = runner.run_suite(
        command.python,
        args,
        timeout_s=timeout_s,
        cwd=ROOT,
        env=suite_environment(dict(command.env)),
        record=False,
    )
    if outcome.timed_out:
        raise RuntimeError(f"python -m suite list failed: {outcome.error}")
    if outcome.returncode != 0:
        raise RuntimeError(f"python -m suite list failed: {outcome.stderr.strip()[-2000:]}")
    return list(json.loads(outcome.stdout))


def run_suite(
    *,
    model: str,
    mode: str,
    device: str,
    compiler: str = "eager",
    batch_size: int | None = None,
    settings: Settings | None = None,
    command: SuiteCommand | None = None,
) -> dict[str, Any]:
    """Measure one benchmark in a subprocess and return its record (see ``suite/records.py``).

    The subprocess is :func:`workers.runner.run_suite`'s: its own process group, killed whole
    after ``settings.suite_timeout_s`` seconds.

    Never raises for a benchmark failure: a timeout, a crash or a signal becomes a record with
    ``error`` set to the reason.
    """
    settings = settings or get_settings()
    command = command or SuiteCommand()
    base: dict[str, Any] = {
        "model": model,
        "mode": mode,
        "device": device,
        "compiler": compiler,
        "batch_size": batch_size,
        "metrics": [],
        "environment": {},
    }
    args = [
        "run",
        "--model",
        model,
        "--mode",
        mode,
        "--device",
        device,
        "--compiler",
        compiler,
        "--iterations",
        str(settings.suite_iterations),
        "--min-seconds",
        str(settings.suite_min_seconds),
        "--threads",
        str(settings.suite_threads),
    ]
    if batch_size:
        args += ["--batch-size", str(batch_size)]
    outcome = runner.run_suite(
        command.python,
        args,
        timeout_s=settings.suite_timeout_s,
        cwd=command.cwd or ROOT,
        env=suite_environment(dict(command.env)),
    )
    if outcome.record is None:  # timed out, no record, or an unreadable one
        return {**base, "error": outcome.error}
    record = dict(outcome.record)
    if outcome.returncode != 0 and not record.get("error"):
        record["error"] = f"exited with code {outcome.returncode}"
    return record


def _run_in_build(
    spec: dict[str, Any], *, torch_spec: str, command: SuiteCommand | None
) -> dict[str, Any]:
    """``run_suite`` with the interpreter of the run's build under test.

    ``current`` (or an explicit ``command``) runs as before; any other spec runs in its cached
    venv, leased for the duration so no other worker's eviction removes it. A spec that names no
    installable build becomes an error result; a failed install (network, disk) raises
    ``EnvironmentBuildError``, an ``InfrastructureError`` the task retries.
    """
    if command is not None or torch_spec.strip() == environments.CURRENT:
        return run_suite(**spec, command=command)
    try:
        with environments.use_environment(torch_spec) as env:
            record = run_suite(**spec, command=command_for(env))
    except environments.InvalidTorchSpec as exc:
        return {
            **spec,
            "metrics": [],
            "environment": {},
            "error": f"build under test {torch_spec!r}: {exc.message}",
        }
    return with_build(record, env.build)


def with_build(record: dict[str, Any], build: environments.ResolvedBuild | None) -> dict[str, Any]:
    """The record with what its venv resolved to in its environment (variant, requirements).

    Args:
        record: a suite record.
        build: the venv's resolved build (None: nothing to add).

    Returns:
        ``record`` itself when there is nothing to add, else a copy whose environment also has
        :meth:`~workers.builds.build_lock.ResolvedBuild.environment_fields`.
    """
    if build is None or not record.get("environment"):
        return record
    return {**record, "environment": {**record["environment"], **build.environment_fields()}}


def measure_job(job_id: int, *, worker: str, command: SuiteCommand | None = None) -> int | None:
    """Measure the job ``job_id`` and store its results.

    Returns:
        The run id when this job was the run's last to end (the caller enqueues the next
        step), else None.

    Idempotent: a job that already ended (a redelivered task) is not measured again. A job
    found ``running`` was started by a worker that died before it ended (the broker redelivered
    its task, or the deadline sweep requeued it after its heartbeat stopped: see
    :mod:`workers.night.heartbeat`); one whose heartbeat is still live is waited for, never
    measured beside it. After ``job_max_worker_losses`` such losses it is not started again but
    ended as an error result saying so, since a benchmark that keeps killing its worker (out of
    memory, a native crash of the host) would otherwise take down one worker after another. An
    exception while measuring (an infrastructure error the task retries) puts the job back in
    the queue uncounted.

    Raises:
        Exception: what measuring raised, after the job is queued again.
    """
    limit = get_settings().job_max_worker_losses
    if _held_elsewhere(job_id, worker=worker) and heartbeat.wait_while_alive(job_id):
        return None
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in JOB_ENDED:
            log.info("job %s already %s; nothing to do", job_id, job.status)
            return None
        lost = job.attempts if job.status == JobStatus.RUNNING else 0
        if lost < limit:
            runs.start_job(session, job=job, worker=worker)
        spec = dict(
            model=job.model,
            mode=job.mode,
            device=job.device,
            compiler=job.compiler,
            batch_size=job.batch_size,
        )
        run_id, last_worker = job.run_id, job.worker
        run = runs.get_run(session, run_id)
        torch_spec, counting = run.torch_spec, is_count_round(run.options)
    if lost >= limit:
        log.warning("job %s: its worker died %d times; ending it as an error", job_id, lost)
        return fail_job(
            job_id,
            reason=(
                f"not measured: its worker died {lost} times while running it (last {last_worker}); "
                f"a benchmark that kills its worker (out of memory, a crash) is not started again "
                f"(NIGHTBENCH_JOB_MAX_WORKER_LOSSES={limit})"
            ),
        )
    if counting:
        return count_jobs(job_id, worker=worker, torch_spec=torch_spec, command=command)
    try:
        with heartbeat.heartbeat(job_id, worker=worker):
            record = _run_in_build(spec, torch_spec=torch_spec, command=command)
    except Exception:
        _requeue(job_id)
        raise
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in JOB_ENDED:
            return None
        run = runs.get_run(session, run_id)
        rounds.store_measured(session, run=run, job=job, record=record)
        runs.end_job(session, job=job, error=record.get("error"))
    with session_scope() as session:
        return run_id if runs.begin_finishing(session, run_id=run_id) else None


def run_count(
    specs: list[dict[str, Any]],
    *,
    settings: Settings | None = None,
    command: SuiteCommand | None = None,
) -> list[dict[str, Any]]:
    """Count instructions per step of CPU benchmarks in one valgrind process (``python -m suite
    count``, :mod:`suite.counting`) and return one record per spec, in order.

    Never raises for a benchmark's failure: a benchmark that failed, or that the process did not
    reach (a crash, the timeout), has ``error`` set; a host without valgrind gives records with
    ``skipped`` (no metric, no error).
    """
    settings = settings or get_settings()
    command = command or SuiteCommand()
    items = ",".join(
        f"{s['model']}:{s['mode']}" + (f":{s['batch_size']}" if s.get("batch_size") else "")
        for s in specs
    )
    args = [
        "count",
        "--benchmarks",
        items,
        "--warmup-steps",
        str(settings.count_warmup_steps),
        "--repeats",
        str(settings.count_repeats),
        "--timeout",
        str(settings.count_process_timeout_s),
    ]
    outcome = runner.run_suite(
        command.python,
        args,
        timeout_s=settings.count_process_timeout_s + 60,
        cwd=command.cwd or ROOT,
        env=suite_environment(dict(command.env)),
    )
    records = (outcome.record or {}).get("records")
    if not isinstance(records, list) or len(records) != len(specs):
        why = outcome.error or "the count process wrote no records"
        return [
            {**s, "metrics": [], "environment": {}, "measures": [INSTRUCTIONS], "error": why}
            for s in specs
        ]
    return [dict(r) for r in records]


def _count_in_build(
    specs: list[dict[str, Any]], *, torch_spec: str, command: SuiteCommand | None
) -> list[dict[str, Any]]:
    """``run_count`` with the interpreter of the run's build under test (as ``_run_in_build``)."""
    if command is not None or torch_spec.strip() == environments.CURRENT:
        return run_count(specs, command=command)
    try:
        with environments.use_environment(torch_spec) as env:
            records = run_count(specs, command=command_for(env))
    except environments.InvalidTorchSpec as exc:
        reason = f"build under test {torch_spec!r}: {exc.message}"
        return [
            {**s, "metrics": [], "environment": {}, "measures": [INSTRUCTIONS], "error": reason}
            for s in specs
        ]
    return [with_build(r, env.build) for r in records]


def count_jobs(
    job_id: int, *, worker: str, torch_spec: str, command: SuiteCommand | None = None
) -> int | None:
    """Count the job ``job_id`` of a count pass, with up to ``count_batch - 1`` more of the pass's
    queued jobs in the same valgrind process (``import torch`` under valgrind paid once).

    The job is already started by :func:`measure_job`; the others are claimed here (started,
    under their row locks), so their own tasks, delivered later, find them ended. A benchmark
    that could not be counted on this host (no valgrind) ends done with nothing stored and a
    line in its night's note; a failed count is an error result of the count pass (never of the
    night, whose latency stands).

    Returns:
        The count pass's run id when this batch ended its last job, else None.

    Raises:
        Exception: what counting raised (an infrastructure error), after every claimed job is
            queued again.
    """
    settings = get_settings()
    with session_scope() as session:
        job = runs.get_job(session, job_id)
        run_id = job.run_id
        estimates = (runs.get_run(session, run_id).options or {}).get("estimates") or {}
        fallback = max(estimates.values(), default=count_plan.DEFAULT_COST_S)

        def cost(j: Job) -> float:
            return float(estimates.get(j.benchmark, fallback))

        # The batch's counting must end well inside the process's limit (a wall-clock limit,
        # and a busy host stretches wall time past the CPU time the estimates are in).
        room = 0.5 * settings.count_process_timeout_s - count_plan.PROCESS_CPU_S - cost(job)
        batch = [
            job,
            *runs.claim_queued_jobs(
                session,
                run_id=run_id,
                exclude=job_id,
                limit=settings.count_batch - 1,
                worker=worker,
                cost=cost,
                budget=room,
            ),
        ]
        ids = [j.id for j in batch]
        specs = [
            dict(
                model=j.model,
                mode=j.mode,
                device=j.device,
                compiler=j.compiler,
                batch_size=settings.count_batch_size or j.batch_size,
            )
            for j in batch
        ]
    try:
        with contextlib.ExitStack() as beats:
            for i in ids:
                beats.enter_context(heartbeat.heartbeat(i, worker=worker))
            records = _count_in_build(specs, torch_spec=torch_spec, command=command)
    except Exception:
        for i in ids:
            _requeue(i)
        raise
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        for i, record in zip(ids, records, strict=True):
            job = runs.get_job(session, i, lock=True)
            if job.status in JOB_ENDED:
                continue
            skipped = (record.get("skipped") or {}).get(INSTRUCTIONS)
            if skipped:
                rounds.note_not_counted(session, run=run, reason=skipped)
            else:
                rounds.store_measured(session, run=run, job=job, record=record)
                if record.get("error"):  # the night's note says which count failed, and why
                    rounds.note_not_counted(
                        session, run=run, reason=f"{job.benchmark}: {record['error']}"
                    )
            runs.end_job(session, job=job, error=record.get("error"))
    with session_scope() as session:
        return run_id if runs.begin_finishing(session, run_id=run_id) else None


def _held_elsewhere(job_id: int, *, worker: str) -> bool:
    """Whether the job is running with a live heartbeat of another worker (measuring it); never
    in the embedded default, where one process runs everything.

    A live heartbeat under this worker's own name is a dead process's: a worker runs a job once
    at a time, and the broker hands a task back to its worker at once when the pool process
    running it dies (``reject_on_worker_lost``), before that process's last heartbeat goes stale.
    Waiting for it cost 183 s instead of 1.5 s (docs/reliability.md); the job is measured again
    at once, the lost attempt counted.
    """
    if get_settings().embedded:
        return False
    with session_scope() as session:
        job = runs.get_job(session, job_id)
        if job.status == JobStatus.RUNNING and job.worker == worker:
            log.warning(
                "job %s (%s): its heartbeat is this worker's own (%s), whose process measuring it "
                "died; measured again now",
                job_id,
                job.benchmark,
                worker,
            )
            return False
        return heartbeat.alive(job)


def _requeue(job_id: int) -> None:
    """Put a job whose measuring raised back to ``queued``, its attempt not counted."""
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status == JobStatus.RUNNING:
            job.status = JobStatus.QUEUED
            job.attempts = max(0, job.attempts - 1)


def fail_job(job_id: int, *, reason: str) -> int | None:
    """End a job that could not be measured (the task itself failed) with an error result.

    Returns the run id when this ended the run, else None; a job already ended is left alone.
    """
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in JOB_ENDED:
            return None
        run = runs.get_run(session, job.run_id)
        record = {
            "model": job.model,
            "mode": job.mode,
            "device": job.device,
            "compiler": job.compiler,
            "batch_size": job.batch_size,
            "error": reason,
        }
        results.store_record(session, run=run, job=job, record=record)
        runs.end_job(session, job=job, error=reason)
        run_id = run.id
    with session_scope() as session:
        return run_id if runs.begin_finishing(session, run_id=run_id) else None
