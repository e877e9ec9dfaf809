"""The one way workers run the suite: ``python -m suite ...`` in its own process group.

Both the nightly jobs (:mod:`workers.night.jobs`) and the bisection's probes
(:mod:`workers.bisect.measure`) measure a benchmark by running the suite in a subprocess with the
interpreter of the build under test. This module runs that subprocess once, the same way for
both:

- in a new session, so its process group holds the suite and everything it started (data
  loader workers, compiler subprocesses);
- with a timeout: a run past it has its whole group killed, as has a run whose caller is
  interrupted while it waits (a task's time limit, a signal, ``KeyboardInterrupt``);
- with ``--out FILE`` in a scratch directory, read back as the run's record.

It says what happened, as a :class:`SuiteOutcome`; what that means (an error result, a
``MeasureError``) is the caller's to decide. It imports nothing from nightbench.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

STDERR_TAIL_LINES = 5
CRASH_REPORT_LINES = 40  # of a faulthandler report: the frames of a native crash
"""How many last lines of stderr an exit reason quotes."""


@dataclass(frozen=True)
class SuiteOutcome:
    """What one ``python -m suite`` process came to.

    Attributes:
        returncode: its exit status; negative when a signal ended it (``-9``: SIGKILL).
        stdout: all it printed on stdout (all it printed before the kill, when it timed out).
        stderr: all it printed on stderr (likewise).
        timed_out: it ran past the timeout and its process group was killed.
        record: the JSON object it wrote to ``--out``; None when it wrote none, an unreadable
            one, or none was asked for.
        wrote_record: a record file was there after the run, readable or not.
        error: why the run gave no record (or, without a record, failed); None when it gave
            one (or, without a record, exited with status 0). One of ``timed out after 900 s``,
            ``unreadable record: ...``, ``exited with code 1: <stderr tail>`` and ``killed by
            SIGKILL (out of memory?): <stderr tail>``, the tail being the last lines of stderr
            joined by `` | ``.
    """

    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    record: dict[str, Any] | None = None
    wrote_record: bool = False
    error: str | None = None


def run_suite(
    python: str | os.PathLike[str],
    args: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    record: bool = True,
) -> SuiteOutcome:
    """Run ``python -m suite *args`` in its own process group and say what came of it.

    Never raises for a failure of the suite: a timeout, a non-zero exit, a signal or a missing
    or unreadable record is an outcome with ``error`` set. Whatever interrupts the wait
    (``KeyboardInterrupt``, a task's time limit raised by a signal handler) kills the process
    group, then goes on up unchanged.

    Args:
        python: the interpreter to run the suite with (the build under test's).
        args: the suite's arguments, after ``python -m suite`` (``["run", "--model", ...]``),
            without ``--out``.
        timeout_s: seconds the process may take; past them its whole process group is killed
            (SIGKILL) and the outcome is ``timed_out``.
        env: the process's whole environment; None inherits this process's.
        cwd: its working directory; None runs it in a fresh scratch directory (the one that
            holds the record), so that nothing of this checkout shadows the build's packages.
        record: append ``--out FILE`` to ``args`` and read ``FILE`` back as the record (the
            ``run`` command); False for commands that print their answer on stdout (``list``).

    Returns:
        The outcome: the exit status, the output, and the record or the error.

    Raises:
        OSError: the interpreter could not be started (no such file, not executable).
    """
    with tempfile.TemporaryDirectory(prefix="nightbench-suite-") as scratch:
        out = Path(scratch) / "record.json"
        argv = [os.fspath(python), "-m", "suite", *args]
        if record:
            argv += ["--out", str(out)]
        # A crash in native code (segfault, abort) prints the Python frames it happened in.
        env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
        returncode, stdout, stderr, timed_out = _communicate(
            argv, timeout_s=timeout_s, env=env, cwd=scratch if cwd is None else cwd
        )
        done = SuiteOutcome(
            returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out
        )
        if timed_out:
            return replace(done, error=f"timed out after {timeout_s:g} s")
        if record and out.is_file():
            return _read_record(done, out)
        if record or returncode != 0:  # no record, or a listing that failed
            return replace(done, error=exit_reason(returncode, stderr))
        return done


def exit_reason(returncode: int, stderr: str, lines: int = STDERR_TAIL_LINES) -> str:
    """How a process ended, with the last ``lines`` lines of its stderr.

    A crash the interpreter's ``faulthandler`` reported (``Fatal Python error: ...`` and the
    frames it happened in, innermost first) keeps that whole report, up to
    ``CRASH_REPORT_LINES`` lines, instead of the tail: the model's frame that crashed is the
    line a maintainer needs, and it is rarely among the last five.

    Returns:
        ``exited with code N`` or ``killed by SIGNAME`` (with `` (out of memory?)`` for
        SIGKILL, the kernel's out-of-memory killer's signal), then ``: `` and the stderr tail
        joined by `` | `` when there is one.
    """
    text = stderr.strip().splitlines()
    crash = next((i for i, line in enumerate(text) if line.startswith("Fatal Python error")), None)
    if crash is not None:
        tail = [line.strip() for line in text[crash : crash + CRASH_REPORT_LINES] if line.strip()]
    else:
        tail = text[-lines:] if lines > 0 else []
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-returncode}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        head = f"killed by {name}{hint}"
    else:
        head = f"exited with code {returncode}"
    return head + (": " + " | ".join(tail) if tail else "")


def _communicate(
    argv: list[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str],
) -> tuple[int, str, str, bool]:
    """Run ``argv`` in a new session; kill its process group on a timeout or an interruption.

    Returns:
        ``(returncode, stdout, stderr, timed_out)``.
    """
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_dies_with(os.getpid()) if _LIBC else None,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            # Once the group is dead the pipes close: this returns what it printed in all.
            stdout, stderr = proc.communicate()
            return proc.returncode, stdout, stderr, True
        except BaseException:
            _kill_group(proc.pid)
            # The pipes close once every process of the group has died: return only then.
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)
            raise
    return proc.returncode, stdout, stderr, False


# prctl(2) PR_SET_PDEATHSIG: a new session no longer hears the signals sent to the worker's
# group, so without it a worker killed mid-run would leave its suite running (and measuring
# beside the redelivered job) until the suite ends by itself.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _dies_with(parent: int):  # type: ignore[no-untyped-def]
    """In the child, before exec: be SIGKILLed when ``parent`` (the worker) dies (Linux)."""

    def set_parent_death_signal() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # type: ignore[union-attr]
        if os.getppid() != parent:  # the worker died before the prctl took hold
            os._exit(1)

    return set_parent_death_signal


def _kill_group(pgid: int) -> None:
    """SIGKILL every process of the group ``pgid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _read_record(done: SuiteOutcome, out: Path) -> SuiteOutcome:
    """``done`` with the record read from ``out``, or the error of an unreadable one."""
    try:
        data = json.loads(out.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return replace(done, wrote_record=True, error=f"unreadable record: {exc}")
    if not isinstance(data, dict):
        return replace(
            done,
            wrote_record=True,
            error=f"unreadable record: a JSON {type(data).__name__}, not an object",
        )
    return replace(done, wrote_record=True, record=data)
