"""``nightbench --help`` lists each command in one short sentence; ``nightbench status`` says
"none" for an empty section instead of drawing an empty table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from workers.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_each_command_is_one_short_sentence_in_the_help() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert len(commands) >= 10
    for name, sub in commands.items():
        first = (sub.help or "").strip().split("\n\n")[0]
        line = " ".join(first.split())
        assert line, f"{name}: no help"
        assert len(line) <= 100, f"{name}: {len(line)} characters: {line}"
        assert line.count(". ") == 0 and line.count("; ") == 0, f"{name}: more than a sentence"


def test_status_says_none_for_an_empty_section(database_url: str) -> None:
    out = CliRunner().invoke(app, ["status"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    for title in ("open runs", "filings pending", "bisections running"):
        assert f"{title}: none" in out.output
    assert "┃ run " not in out.output  # no table drawn of headers alone


def test_status_on_a_fresh_embedded_store_says_none_for_every_section(tmp_path: Path) -> None:
    # No NIGHTBENCH_* settings from the test session: a data directory of its own, no store yet.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTBENCH_")}
    env.update(NIGHTBENCH_DATA_DIR=str(tmp_path / "data"), COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "status"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    titles = [
        "machine classes",
        "open runs",
        "workers (last hour)",
        "filings pending",
        "queues",
        "stability changes (last week)",
        "bisections running",
    ]
    assert [line for line in proc.stdout.splitlines() if line.endswith(": none")] == [
        f"{title}: none" for title in titles
    ]
    assert "┃" not in proc.stdout and "no problems" in proc.stdout
