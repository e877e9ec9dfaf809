"""Measuring one job: ``python -m suite run`` in its own process, with a timeout, then storing.

One subprocess per benchmark (TorchBench and pyperf do the same): a crash, an out-of-memory kill
or a hang ends only that process and becomes an error result with its reason; the worker lives on.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.config import Settings, get_settings
from service.db import session_scope
from service.results import service as results
from service.runs import service as runs
from workers import environments

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SuiteCommand:
    """How to run the suite: the interpreter of the build under test and its extra environment."""

    python: str = sys.executable
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None  # None: the repository root


def command_for(env: environments.Environment) -> SuiteCommand:
    """The suite command for a build's environment (see ``workers/environments.py``).

    The working directory is the environment's suite path, which holds only the suite, so that
    nothing else from this checkout sits first on the build's ``sys.path``.
    """
    return SuiteCommand(python=str(env.python), env=tuple(env.subprocess_env().items()),
                        cwd=str(env.suite_path))


def suite_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The subprocess environment: ours, with the repository root on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def list_suite(command: SuiteCommand | None = None, timeout_s: float = 300) -> list[dict[str, Any]]:
    """``python -m suite list --json`` of the build under test.

    Raises:
        RuntimeError: the listing failed (its stderr is in the message).
    """
    command = command or SuiteCommand()
    proc = subprocess.run(
        [command.python, "-m", "suite", "list", "--json"], capture_output=True, text=True,
        timeout=timeout_s, cwd=ROOT, env=suite_environment(dict(command.env)),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -m suite list failed: {proc.stderr.strip()[-2000:]}")
    return list(json.loads(proc.stdout))


def run_suite(
    *, model: str, mode: str, device: str, compiler: str = "eager", batch_size: int | None = None,
    settings: Settings | None = None, command: SuiteCommand | None = None,
) -> dict[str, Any]:
    """Measure one benchmark in a subprocess and return its record (see ``suite/records.py``).

    Never raises for a benchmark failure: a timeout, a crash or a signal becomes a record with
    ``error`` set to the reason.
    """
    settings = settings or get_settings()
    command = command or SuiteCommand()
    base = {"model": model, "mode": mode, "device": device, "compiler": compiler,
            "batch_size": batch_size, "metrics": [], "environment": {}}
    with tempfile.TemporaryDirectory(prefix="nightbench-") as tmp:
        out = Path(tmp) / "record.json"
        argv = [
            command.python, "-m", "suite", "run", "--model", model, "--mode", mode,
            "--device", device, "--compiler", compiler, "--out", str(out),
            "--iterations", str(settings.suite_iterations),
            "--min-seconds", str(settings.suite_min_seconds),
            "--threads", str(settings.suite_threads),
        ]
        if batch_size:
            argv += ["--batch-size", str(batch_size)]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=settings.suite_timeout_s,
                cwd=command.cwd or ROOT, env=suite_environment(dict(command.env)),
            )
        except subprocess.TimeoutExpired:
            return {**base, "error": f"timed out after {settings.suite_timeout_s:g} s"}
        if out.is_file():
            try:
                record = json.loads(out.read_text())
            except json.JSONDecodeError as exc:
                return {**base, "error": f"unreadable record: {exc}"}
            if proc.returncode != 0 and not record.get("error"):
                record["error"] = f"exited with code {proc.returncode}"
            return record
        return {**base, "error": _exit_reason(proc)}


def _exit_reason(proc: subprocess.CompletedProcess[str]) -> str:
    tail = (proc.stderr or "").strip().splitlines()[-5:]
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        head = f"killed by {name}{hint}"
    else:
        head = f"exited with code {proc.returncode}"
    return head + (": " + " | ".join(tail) if tail else "")


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
            return run_suite(**spec, command=command_for(env))
    except environments.InvalidTorchSpec as exc:
        return {**spec, "metrics": [], "environment": {},
                "error": f"build under test {torch_spec!r}: {exc.message}"}


def measure_job(job_id: int, *, worker: str, command: SuiteCommand | None = None) -> int | None:
    """Measure the job ``job_id`` and store its results.

    Returns:
        The run id when this job was the run's last to end (the caller enqueues the next
        step), else None.

    Idempotent: a job that already ended (a redelivered task) is not measured again.
    """
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in ("done", "error", "missing"):
            log.info("job %s already %s; nothing to do", job_id, job.status)
            return None
        runs.start_job(session, job=job, worker=worker)
        spec = dict(model=job.model, mode=job.mode, device=job.device, compiler=job.compiler,
                    batch_size=job.batch_size)
        run_id = job.run_id
        torch_spec = runs.get_run(session, run_id).torch_spec
    record = _run_in_build(spec, torch_spec=torch_spec, command=command)
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in ("done", "error", "missing"):
            return None
        run = runs.get_run(session, run_id)
        results.store_record(session, run=run, job=job, record=record)
        runs.end_job(session, job=job, error=record.get("error"))
    with session_scope() as session:
        return run_id if runs.begin_finishing(session, run_id=run_id) else None


def fail_job(job_id: int, *, reason: str) -> int | None:
    """End a job that could not be measured (the task itself failed) with an error result.

    Returns the run id when this ended the run, else None; a job already ended is left alone.
    """
    with session_scope() as session:
        job = runs.get_job(session, job_id, lock=True)
        if job.status in ("done", "error", "missing"):
            return None
        run = runs.get_run(session, job.run_id)
        record = {"model": job.model, "mode": job.mode, "device": job.device,
                  "compiler": job.compiler, "batch_size": job.batch_size, "error": reason}
        results.store_record(session, run=run, job=job, record=record)
        runs.end_job(session, job=job, error=reason)
        run_id = run.id
    with session_scope() as session:
        return run_id if runs.begin_finishing(session, run_id=run_id) else None
