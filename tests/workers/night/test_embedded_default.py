"""The README's first command on a fresh machine: ``nightbench nightly`` on the embedded
default (a SQLite file, tasks in-process), with no server configured."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_nightly_on_the_embedded_default_migrates_measures_and_compares(tmp_path: Path) -> None:
    # No NIGHTBENCH_* settings from the test session: only a data directory of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTBENCH_")}
    env["NIGHTBENCH_DATA_DIR"] = str(tmp_path / "data")
    # The count pass runs as make nightly runs it, with fewer counted steps, on the second night
    # only (a minute under valgrind a night; tests/workers/night/test_count_pass.py compares
    # counted nights).
    env["NIGHTBENCH_COUNT_WARMUP_STEPS"] = "1"
    env["NIGHTBENCH_COUNT_REPEATS"] = "2"
    outputs = []
    for day, count in (("2026-11-01", "false"), ("2026-11-02", "true")):
        env["NIGHTBENCH_COUNT_INSTRUCTIONS"] = count
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "nightly",
                "--models",
                "dqn",
                "--modes",
                "eval",
                "--date",
                day,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        outputs.append(proc.stdout)
    assert "dqn:eval:cpu" in outputs[0] and "no_baseline" in outputs[0]
    db = tmp_path / "data" / "nightbench.db"
    with sqlite3.connect(db) as conn:
        nights = conn.execute(
            "SELECT night, status FROM runs WHERE kind = 'nightly' ORDER BY night"
        ).fetchall()
        latency = conn.execute(
            "SELECT count(*) FROM results WHERE model = 'dqn' AND metric = 'latency' AND median > 0"
        ).fetchone()[0]
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        counts = conn.execute(
            "SELECT r.night, s.median FROM results s JOIN runs r ON r.id = s.run_id "
            "WHERE s.model = 'dqn' AND s.metric = 'cpu_instructions' AND s.error IS NULL "
            "AND r.kind = 'nightly' ORDER BY r.night"
        ).fetchall()
        notes = [n for (n,) in conn.execute("SELECT note FROM runs WHERE kind = 'nightly'")]
    assert [n for n, _ in nights] == ["2026-11-01", "2026-11-02"]
    assert all(status == "complete" for _, status in nights), nights
    assert latency == 2
    if shutil.which("valgrind"):
        # The count pass stored the night's instructions per step in the night itself, and the
        # night's table prints them.
        assert [n for n, _ in counts] == ["2026-11-02"], counts
        assert all(m > 100_000 for _, m in counts), counts
        assert "cpu_instructions" in outputs[1] and "M instr" in outputs[1], outputs[1][-3000:]
    else:
        assert counts == [] and any("valgrind is not installed" in (n or "") for n in notes)
    heads = subprocess.run(
        [sys.executable, "-m", "alembic", "heads"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert revision in heads  # migrated to the newest revision
