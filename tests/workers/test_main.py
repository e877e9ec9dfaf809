"""The ``nightbench`` console script: a refused setting ends any command with one line naming
the variable, the value given and what was wrong, and exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import workers.cli  # noqa: F401  # imported with good settings: the commands read them anew
from service.config import get_settings
from service.metrics import METRICS
from workers.main import REFUSED_EXIT_CODE, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.parametrize(
    "command",
    [["status"], ["nightly", "--models", "resnet18"], ["regressions", "list"], ["db", "upgrade"]],
)
def test_a_command_reading_a_refused_setting_says_one_line_and_exits_2(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NIGHTBENCH_AB_METRICS", '["bogus"]')
    monkeypatch.setattr(sys, "argv", ["nightbench", *command])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == REFUSED_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        """error: NIGHTBENCH_AB_METRICS='["bogus"]' refused: unknown bogus; one or more of """
        + ", ".join(METRICS)
    ], err


def test_a_setting_refused_while_the_command_line_is_imported_says_one_line() -> None:
    # The Celery app reads the settings as ``workers.cli`` is imported, before any command.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("NIGHTBENCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "workers.main", "status"],
        cwd=ROOT,
        env={**env, "NIGHTBENCH_NIGHT_PROCESSES": "abc"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: NIGHTBENCH_NIGHT_PROCESSES must be a whole number of processes per benchmark "
        "per night, 1 or more (1: one process a night), got 'abc'"
    ]


def test_the_console_script_is_the_guarded_entry() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["nightbench"] == "workers.main:main"
