"""``nightbench --help`` lists each command in one short sentence; ``nightbench status`` says
"none" for an empty section instead of drawing an empty table."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from workers.cli import app


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
