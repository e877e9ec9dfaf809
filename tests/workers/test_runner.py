"""The suite runner against real subprocesses: a stand-in ``suite`` package plays the suite.

Each test writes ``suite/__main__.py`` into a temporary directory put on ``PYTHONPATH``, so
``python -m suite ...`` runs that script in a real process (and process group). Its callers, a
night's job (``workers.night.jobs``), a bisection's probe (``workers.bisect.measure``) and a
stability process (``workers.night.stability``), are run against the same stand-in for the errors
they make of the outcomes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from service.config import Settings
from suite.stability import StabilityBenchmark
from workers.bisect.measure import MeasureError, SuiteMeasurer
from workers.builds.base import BuildEnvironment
from workers.night import jobs, stability
from workers.runner import SuiteOutcome, exit_reason, run_suite

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

# Starts a grandchild that sleeps (holding the pipes open, as a stray data loader would), says
# both pids, then sleeps itself: only killing the whole group ends it.
SPAWNS_AND_HANGS = """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids = f"{os.getpid()} {child.pid}"
    print(pids, flush=True)
    pathlib.Path(os.environ["PIDS_FILE"]).write_text(pids)
    time.sleep(600)
"""


@pytest.fixture
def fake_suite(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A directory for ``suite/__main__.py`` and an environment that finds it first."""
    package = tmp_path / "fake" / "suite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(package.parent), "PIDS_FILE": str(tmp_path / "pids")}
    yield package, env


def _suite(package: Path, body: str) -> None:
    """The stand-in suite: ``body`` with ``os``, ``sys``, ``json``, ``pathlib`` and ``out``
    (the ``--out`` path, or None) at hand."""
    head = (
        "import json, os, pathlib, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1] if '--out' in sys.argv else None\n"
    )
    (package / "__main__.py").write_text(head + textwrap.dedent(body))


def _alive(pid: int) -> bool:
    """The process runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _group_gone(pgid: int) -> bool:
    """No running process is left in the group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):  # field 5 of stat: pgrp
            return False
    return True


def _assert_all_dead(pids_file: Path) -> None:
    leader, grandchild = (int(p) for p in pids_file.read_text().split())
    assert not _alive(leader)
    assert not _alive(grandchild), "the suite's grandchild outlived the run"
    assert _group_gone(leader), "a process of the suite's group is still running"
    assert os.getpgid(0) != leader  # the suite ran in a group of its own, not ours


def test_a_run_returns_the_record_it_wrote(fake_suite: tuple[Path, dict[str, str]]) -> None:
    package, env = fake_suite
    _suite(
        package,
        """
        pathlib.Path(out).write_text(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}))
        print("a model's chatter", file=sys.stderr)
    """,
    )
    outcome = run_suite(sys.executable, ["run", "--model", "m"], timeout_s=60, env=env)
    assert outcome.returncode == 0 and outcome.error is None and not outcome.timed_out
    assert outcome.wrote_record and outcome.record is not None
    argv = outcome.record["argv"]
    assert argv[:3] == ["run", "--model", "m"] and argv[3] == "--out"
    # Without a cwd it runs in the scratch directory that holds the record.
    assert Path(argv[4]).parent == Path(outcome.record["cwd"])
    assert not Path(argv[4]).exists(), "the scratch directory is removed afterwards"
    assert "a model's chatter" in outcome.stderr


def test_a_listing_answers_on_stdout_in_the_given_directory(
    fake_suite: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = fake_suite
    _suite(package, "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd()}))\n")
    outcome = run_suite(
        sys.executable, ["list", "--json"], timeout_s=60, env=env, cwd=tmp_path, record=False
    )
    assert outcome == SuiteOutcome(returncode=0, stdout=outcome.stdout, stderr="")
    assert json.loads(outcome.stdout) == {"argv": ["list", "--json"], "cwd": str(tmp_path)}


def test_a_failure_without_a_record_is_an_error_with_the_stderr_tail(
    fake_suite: tuple[Path, dict[str, str]],
) -> None:
    package, env = fake_suite
    _suite(
        package,
        """
        for i in range(9):
            print(f"line {i}", file=sys.stderr)
        sys.exit(3)
    """,
    )
    outcome = run_suite(sys.executable, ["run"], timeout_s=60, env=env)
    assert outcome.returncode == 3 and outcome.record is None and not outcome.wrote_record
    assert outcome.error == "exited with code 3: line 4 | line 5 | line 6 | line 7 | line 8"
    listing = run_suite(sys.executable, ["list"], timeout_s=60, env=env, record=False)
    assert listing.error is not None and listing.error.startswith("exited with code 3: line 4")


def test_a_process_killed_by_a_signal_says_which(fake_suite: tuple[Path, dict[str, str]]) -> None:
    package, env = fake_suite
    _suite(
        package,
        """
        print("allocating", file=sys.stderr, flush=True)
        os.kill(os.getpid(), 9)
    """,
    )
    outcome = run_suite(sys.executable, ["run"], timeout_s=60, env=env)
    assert outcome.returncode == -signal.SIGKILL and not outcome.timed_out
    assert outcome.error == "killed by SIGKILL (out of memory?): allocating"


def test_a_record_written_before_a_failing_exit_is_still_returned(
    fake_suite: tuple[Path, dict[str, str]],
) -> None:
    package, env = fake_suite
    _suite(
        package,
        """
        pathlib.Path(out).write_text(json.dumps({"error": "model raised"}))
        sys.exit(1)
    """,
    )
    outcome = run_suite(sys.executable, ["run"], timeout_s=60, env=env)
    assert outcome.returncode == 1 and outcome.record == {"error": "model raised"}
    assert outcome.error is None  # what a failing exit with a record means is the caller's call


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_record_is_an_error(
    fake_suite: tuple[Path, dict[str, str]], text: str
) -> None:
    package, env = fake_suite
    _suite(package, f"pathlib.Path(out).write_text({text!r})\n")
    outcome = run_suite(sys.executable, ["run"], timeout_s=60, env=env)
    assert outcome.wrote_record and outcome.record is None
    assert outcome.error is not None and outcome.error.startswith("unreadable record: ")


def test_a_timed_out_run_has_its_whole_process_group_killed(
    fake_suite: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = fake_suite
    _suite(package, SPAWNS_AND_HANGS)
    outcome = run_suite(sys.executable, ["run"], timeout_s=5, env=env)
    assert outcome.timed_out and outcome.record is None
    assert outcome.error == "timed out after 5 s"
    assert outcome.returncode == -signal.SIGKILL
    pids_file = tmp_path / "pids"
    assert pids_file.exists(), "the stand-in suite did not start its grandchild within 5 s"
    assert outcome.stdout.strip() == pids_file.read_text()  # what it printed before the kill
    _assert_all_dead(pids_file)


class Cancelled(Exception):
    """Stands for a task's time limit, raised by a signal handler while the run is waited on."""


def test_a_cancelled_run_has_its_whole_process_group_killed(
    fake_suite: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = fake_suite
    _suite(package, SPAWNS_AND_HANGS)
    pids_file = tmp_path / "pids"

    def cancel_once_started(signum: int, frame: FrameType | None) -> None:
        if pids_file.exists() and len(pids_file.read_text().split()) == 2:
            raise Cancelled
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # not started yet: look again soon

    previous = signal.signal(signal.SIGALRM, cancel_once_started)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Cancelled):
            run_suite(sys.executable, ["run"], timeout_s=300, env=env)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    _assert_all_dead(pids_file)


def test_the_suite_dies_with_a_worker_killed_mid_run(
    fake_suite: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = fake_suite
    _suite(package, SPAWNS_AND_HANGS)
    pids_file = tmp_path / "pids"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, sys; from workers.runner import run_suite; "
                "run_suite(sys.executable, ['run'], timeout_s=600, env=dict(os.environ))"
            ),
        ],
        env=env,
    )
    try:
        _wait_for(
            lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2,
            "the stand-in suite to start",
        )
        leader = int(pids_file.read_text().split()[0])
        assert _alive(leader)
        worker.kill()  # SIGKILL: no handler of the worker's runs
        worker.wait()
        _wait_for(lambda: not _alive(leader), "the suite to die with its worker")
    finally:
        worker.kill()
        if pids_file.exists():
            for pid in pids_file.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _wait_for(condition: Callable[[], bool], what: str, within_s: float = 60) -> None:
    """Poll ``condition`` every 0.05 s; fail naming ``what`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {within_s} s for {what}"
        time.sleep(0.05)


def test_a_native_crash_keeps_the_model_frame_it_happened_in(
    fake_suite: tuple[Path, dict[str, str]],
) -> None:
    package, env = fake_suite
    _suite(
        package,
        """
        import ctypes
        print("\\n".join(f"loading layer {i}" for i in range(20)), file=sys.stderr)

        def forward_of_the_model():
            ctypes.string_at(0)  # a segfault in native code, as a bad kernel would

        forward_of_the_model()
    """,
    )
    env.pop("PYTHONFAULTHANDLER", None)
    outcome = run_suite(sys.executable, ["run"], timeout_s=60, env=env)
    assert outcome.returncode == -signal.SIGSEGV and outcome.error is not None
    assert outcome.error.startswith("killed by SIGSEGV: Fatal Python error: Segmentation fault")
    assert "in forward_of_the_model" in outcome.error
    assert "loading layer" not in outcome.error  # the report, not the noise before it


def test_exit_reason_names_real_time_signals_too() -> None:
    assert exit_reason(-(signal.SIGRTMIN + 3), "") == f"killed by signal {signal.SIGRTMIN + 3}"
    assert exit_reason(-signal.SIGTERM, "a\nb\n") == "killed by SIGTERM: a | b"
    assert exit_reason(0, "") == "exited with code 0"


# ----- the callers: a night's job, a bisection's probe, a stability process -----------------------


def _job(package: Path, **settings: float) -> dict[str, object]:
    """``jobs.run_suite`` of ``m:eval:cpu`` with the stand-in suite (found first from its cwd)."""
    command = jobs.SuiteCommand(python=sys.executable, cwd=str(package.parent))
    return jobs.run_suite(
        model="m",
        mode="eval",
        device="cpu",
        command=command,
        settings=Settings(suite_min_seconds=0, **settings),
    )


def test_a_job_keeps_its_error_texts(fake_suite: tuple[Path, dict[str, str]]) -> None:
    package, _ = fake_suite
    _suite(
        package,
        """
        record = {"model": "m", "metrics": [{"metric": "latency", "samples": [1.0]}]}
        pathlib.Path(out).write_text(json.dumps(record))
        sys.exit(2)
    """,
    )
    assert _job(package)["error"] == "exited with code 2"  # a record, but a failing exit
    _suite(package, "print('boom', file=sys.stderr); sys.exit(1)\n")
    failed = _job(package)
    assert failed["error"] == "exited with code 1: boom"
    assert failed["model"] == "m" and failed["metrics"] == []
    _suite(package, "pathlib.Path(out).write_text('{')\n")
    assert str(_job(package)["error"]).startswith("unreadable record: ")
    _suite(package, "import time; time.sleep(600)\n")
    assert _job(package, suite_timeout_s=2)["error"] == "timed out after 2 s"


def test_a_listing_failure_is_a_runtime_error(
    fake_suite: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    package, _ = fake_suite
    monkeypatch.setattr(jobs, "ROOT", package.parent)  # lists from there: the stand-in
    command = jobs.SuiteCommand(python=sys.executable)
    _suite(package, "print(json.dumps([{'name': 'm'}]))\n")
    assert jobs.list_suite(command) == [{"name": "m"}]
    _suite(package, "print('no registry', file=sys.stderr); sys.exit(1)\n")
    with pytest.raises(RuntimeError, match="python -m suite list failed: no registry"):
        jobs.list_suite(command)
    _suite(package, "import time; time.sleep(600)\n")
    with pytest.raises(RuntimeError, match="python -m suite list failed: timed out after 2 s"):
        jobs.list_suite(command, timeout_s=2)


def _probe(package: Path, tmp_path: Path, timeout_s: float = 60) -> list[float]:
    env = BuildEnvironment(
        sha="0" * 40,
        provider="checkout",
        python=Path(sys.executable),
        root=tmp_path,
        workdir=tmp_path,
        pythonpath=(str(package.parent),),
    )
    return SuiteMeasurer(timeout_s=timeout_s).measure_once(env, "m:eval:cpu", 3)


def test_a_probe_keeps_its_error_texts(
    fake_suite: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, _ = fake_suite
    _suite(
        package,
        """
        samples = [float(i + 1) for i in range(int(sys.argv[sys.argv.index("--iterations") + 1]))]
        record = {"metrics": [{"metric": "latency", "samples": samples}]}
        pathlib.Path(out).write_text(json.dumps(record))
    """,
    )
    assert _probe(package, tmp_path) == [1.0, 2.0, 3.0]
    _suite(package, "pathlib.Path(out).write_text(json.dumps({'error': 'model raised'}))\n")
    with pytest.raises(MeasureError, match="^m:eval:cpu: model raised$"):
        _probe(package, tmp_path)
    _suite(package, "print('a\\nb', file=sys.stderr); sys.exit(3)\n")
    with pytest.raises(MeasureError, match="^m:eval:cpu wrote no record \\(exit 3\\): a\nb$"):
        _probe(package, tmp_path)
    _suite(package, "pathlib.Path(out).write_text('{')\n")
    with pytest.raises(MeasureError, match="^m:eval:cpu: unreadable record: "):
        _probe(package, tmp_path)
    _suite(package, "import time; time.sleep(600)\n")
    with pytest.raises(MeasureError, match="^m:eval:cpu did not finish in 2 s$"):
        _probe(package, tmp_path, timeout_s=2)


def test_a_stability_process_keeps_its_error_texts(
    fake_suite: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    package, _ = fake_suite
    monkeypatch.setattr(jobs, "ROOT", package.parent)  # runs from there: the stand-in
    spec = StabilityBenchmark("m", "eval")
    _suite(
        package,
        """
        record = {"argv": sys.argv[1:], "threads": os.environ["OMP_NUM_THREADS"],
                  "extra": os.environ.get("EXTRA"), "cwd": os.getcwd()}
        pathlib.Path(out).write_text(json.dumps(record))
    """,
    )
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    record = stability.run_once(spec, run_args=["--iterations", "3"], env={"EXTRA": "x"})
    assert record["argv"][:10] == [
        "run",
        "--model",
        "m",
        "--mode",
        "eval",
        "--device",
        "cpu",
        "--compiler",
        "eager",
        "--iterations",
    ]
    assert record["argv"][-2] == "--out" and record["threads"] == "1"
    assert record["extra"] == "x" and record["cwd"] == str(package.parent)
    _suite(package, "print('a\\nb', file=sys.stderr); sys.exit(3)\n")
    assert stability.run_once(spec) == {"error": "exited with code 3: a | b", "metrics": []}
    _suite(package, "pathlib.Path(out).write_text('[1]')\n")
    assert stability.run_once(spec)["error"].startswith("unreadable record: ")
    _suite(package, "import time; time.sleep(600)\n")
    assert stability.run_once(spec, timeout_s=2) == {
        "error": "timed out after 2 s",
        "metrics": [],
    }
    _suite(package, "print(json.dumps([{'name': 'm'}]))\n")
    assert stability.list_models() == [{"name": "m"}]
