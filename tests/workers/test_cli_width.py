"""The command line's consoles are wide when their output is a log, not a terminal."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from workers.cli import common


@pytest.fixture(autouse=True)
def _restore_widths():
    yield
    common.console.width = None  # type: ignore[assignment]
    common.err_console.width = None  # type: ignore[assignment]


def test_a_log_gets_log_width_and_a_long_row_is_not_wrapped(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    common.fit_to_output()
    assert common.console.width == common.LOG_WIDTH
    table = Table("benchmark", "baseline", "tonight", "change", "verdict")
    table.add_row(
        "pyhpc_isoneutral_mixing:eval:cpu:eager",
        "23.81 ms",
        "26.02 ms",
        "+9.3%",
        "regression (candidate: needs its confirmation re-run)",
    )
    with common.console.capture() as captured:
        common.console.print(table)
    rows = [ln for ln in captured.get().splitlines() if "pyhpc" in ln]
    assert len(rows) == 1 and "confirmation re-run" in rows[0]


def test_columns_wins_over_log_width(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    common.fit_to_output()
    assert common.console.width == 100
