"""``nightbench profile``: a benchmark profiled in each build's environment and diffed; two
identical builds give no row above the noise, a planted operator is named in the first rows."""

from __future__ import annotations

import json
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


def _table(metric: str, unit: str, rows: dict[str, float]) -> Profile:
    return Profile(metric=metric, unit=unit, rows={n: ProfileRow(n, (v,)) for n, v in rows.items()})


def test_a_count_profile_prints_its_python_functions_before_the_c_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workers.bisect import profiles

    c_rows = {"Python/ceval.c:_PyEval_EvalFrameDefault": 4e6, "gemm": 9e6}
    py_rows = {"tok/__init__.py: encode": 90_000.0}
    builds = {
        "torch==2.12.0": (c_rows, py_rows),
        "torch==2.13.0": (
            {**c_rows, "Python/ceval.c:_PyEval_EvalFrameDefault": 9e6},
            {**py_rows, "tok/__init__.py: _check_piece": 500_000.0},
        ),
    }
    calls = []

    def fake_profile_build(spec: str, benchmark: str, metric: str, **kw: object) -> object:
        calls.append((spec, metric, kw["python_functions"]))
        c, py = builds[spec]
        return profiles.BuildProfile(
            spec=spec,
            torch=spec.split("==")[1],
            profile=_table(metric, "instructions", c),
            document={},
            python=_table(metric, "bytecodes", py),
        )

    monkeypatch.setattr(profiles, "profile_build", fake_profile_build)
    args = ["profile", "--benchmark", "dqn:eval:cpu", "--metric", "cpu_instructions"]
    builds_args = ["--build", "torch==2.12.0", "--build", "torch==2.13.0", "--no-repeat"]
    out = CliRunner().invoke(app, [*args, *builds_args], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert calls == [
        ("torch==2.12.0", "cpu_instructions", True),
        ("torch==2.13.0", "cpu_instructions", True),
    ]
    text = " ".join(out.output.split())
    assert text.index("_check_piece") < text.index("_PyEval_EvalFrameDefault")
    assert (
        "Python functions: the rows explain 100% of the step's change (+500,000.0 bytecodes)"
        in text
    )
    assert "Python functions, bytecodes" in text
    assert "the rows explain 100% of the step's change (+5,000,000.0 instructions)" in text
    as_json = CliRunner().invoke(app, [*args, *builds_args, "--json"])
    doc = json.loads(as_json.output[as_json.output.index("{") :])
    assert [r["name"] for r in doc["python"]["rows"]] == ["tok/__init__.py: _check_piece"]
    assert doc["python"]["unit"] == "bytecodes" and doc["unit"] == "instructions"
