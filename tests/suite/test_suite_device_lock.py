"""The device lock: a benchmark process warms up and times only while it holds the lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from suite.device_lock import DEVICE_LOCK_ENV, device_lock
from suite.registry import EXTRA_MODELS_ENV
from tests.suite.helpers import FIXTURE_MODELS, QUICK, ROOT, suite_env


def _waiting_on(path: Path, pid: int) -> bool:
    """Whether ``pid`` is blocked on a ``flock`` of ``path`` (``/proc/locks``: a waiter's line
    reads ``N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...``)."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and "FLOCK" in fields:
            at = fields.index("FLOCK")
            if fields[at + 3] == str(pid) and fields[at + 4].rsplit(":", 1)[-1] == str(inode):
                return True
    return False


def test_a_process_measures_only_once_it_holds_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "device.lock"
    with device_lock(str(lock)) as waited:
        assert waited is not None and waited >= 0
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "suite",
                "run",
                "--model",
                "steady_alloc",
                "--mode",
                "eval",
                "--out",
                "-",
                *QUICK,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=suite_env(**{EXTRA_MODELS_ENV: str(FIXTURE_MODELS), DEVICE_LOCK_ENV: str(lock)}),
        )
        deadline = time.monotonic() + 120
        while not _waiting_on(lock, proc.pid):
            assert proc.poll() is None, "the process ended while the lock was held"
            assert time.monotonic() < deadline, "the process never queued for the lock"
            time.sleep(0.05)
        blocked_at = time.monotonic()
        time.sleep(0.3)
        assert proc.poll() is None  # still queued: nothing measured while another holds it
        held = time.monotonic() - blocked_at
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    record = json.loads(out)
    assert record["error"] is None, record["error"]
    assert record["environment"]["device_lock"]["waited_s"] >= held - 0.05
    assert record["metrics"], "measured once the lock was free"


def test_no_lock_asked_for_is_no_lock_and_no_record_of_one(tmp_path: Path) -> None:
    with device_lock() as waited:  # the environment variable unset in the test run
        assert waited is None
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "run",
            "--model",
            "steady_alloc",
            "--mode",
            "eval",
            "--out",
            "-",
            *QUICK,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=suite_env(**{EXTRA_MODELS_ENV: str(FIXTURE_MODELS)}),
    )
    assert proc.returncode == 0, proc.stderr
    assert "device_lock" not in json.loads(proc.stdout)["environment"]


def test_a_lock_that_cannot_be_opened_is_an_error_record_naming_it(tmp_path: Path) -> None:
    lock = tmp_path / "no-such-dir" / "device.lock"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "run",
            "--model",
            "steady_alloc",
            "--mode",
            "eval",
            "--out",
            "-",
            *QUICK,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=suite_env(**{EXTRA_MODELS_ENV: str(FIXTURE_MODELS), DEVICE_LOCK_ENV: str(lock)}),
    )
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert str(lock) in error and DEVICE_LOCK_ENV in error, error
