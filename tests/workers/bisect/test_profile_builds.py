"""``nightbench profile``: a benchmark profiled in each build's environment and diffed; two
identical builds give no row above the noise, a planted operator is named in the first rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from service.errors import InvalidInput
from service.profiles import Profile, ProfileRow, RowStatus, diff_profiles
from workers.bisect.profiles import diff_builds, profile_args, profile_build
from workers.cli import app
from workers.cli.profile import diff_table

TINY = ["--batch-size", "2", "--steps", "1", "--windows", "3"]


def test_profile_args_follow_the_metric_table() -> None:
    assert profile_args("dqn:eval:cpu", "latency", steps=2, windows=3) == [
        "profile", "--model", "dqn", "--mode", "eval", "--device", "cpu",
        "--steps", "2", "--windows", "3",
    ]  # fmt: skip
    counted = profile_args("dqn:train:cpu", "cpu_instructions", steps=1, windows=2, batch_size=4)
    assert counted[-3:] == ["--callgrind", "--batch-size", "4"]
    traced = profile_args("dqn:eval:cpu", "latency", steps=1, windows=1, trace=Path("t.json"))
    assert traced[-2:] == ["--trace", "t.json"]
    untraced = profile_args("dqn:eval:cpu", "cpu_instructions", steps=1, windows=1, trace=Path("t"))
    assert "--trace" not in untraced  # a function table keeps no trace
    with pytest.raises(InvalidInput, match="cpu_instructions is measured on cpu"):
        profile_args("dqn:eval:cuda", "cpu_instructions", steps=1, windows=2)
    with pytest.raises(InvalidInput, match="has no profile"):
        profile_args("dqn:eval:cpu", "cpu_peak_mem", steps=1, windows=2)
    with pytest.raises(InvalidInput, match="MODEL:MODE:DEVICE"):
        profile_args("dqn", "latency", steps=1, windows=2)


def test_two_identical_builds_print_no_row_above_the_noise() -> None:
    args = ["profile", "--benchmark", "dqn:eval:cpu", "--build", "current", "--build", "current"]
    out = CliRunner().invoke(app, [*args, *TINY], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "no row above the noise" in out.output


def test_a_planted_operator_is_in_the_first_three_rows() -> None:
    kw = {"steps": 1, "windows": 3, "batch_size": 2}
    before = profile_build("current", "dqn:eval:cpu", **kw)  # type: ignore[arg-type]
    repeat = profile_build("current", "dqn:eval:cpu", **kw)  # type: ignore[arg-type]
    # The planted build: as much matmul work again as the step itself, on every step.
    planted = {"NIGHTBENCH_SUITE_INJECT_WORK": "dqn:eval=1.0"}
    after = profile_build("current", "dqn:eval:cpu", extra_env=planted, **kw)  # type: ignore[arg-type]
    diff = diff_builds(before, after, repeat=repeat)
    top = [(r.name, r.status) for r in diff.rows[:3]]
    assert ("aten::mm", RowStatus.NEW) in top, (top, diff.summary())
    mm = next(r for r in diff.rows if r.name == "aten::mm")
    assert mm.share is not None and mm.share > 0.3


def test_the_table_shows_before_after_change_and_share() -> None:
    def ops(**rows: float) -> Profile:
        return Profile(
            metric="latency",
            unit="us",
            rows={
                k.replace("__", "::"): ProfileRow(k.replace("__", "::"), (v,))
                for k, v in rows.items()
            },
        )

    diff = diff_profiles(ops(aten__addmm=600.0), ops(aten__addmm=610.0, aten__clone=400.0))
    console = Console(width=160, record=True)
    console.print(diff_table(diff, "dqn:eval:cpu latency"))
    text = console.export_text()
    assert "op / function" in text and "share" in text
    (line,) = [row for row in text.splitlines() if "aten::clone" in row]
    cells = [c.strip() for c in line.split("│") if c.strip()]
    assert cells == ["aten::clone", "0.0 µs", "400.0 µs", "+400.0", "98%", "new"]
    assert diff.summary() == "the rows explain 98% of the step's change (+410.0 us)"
