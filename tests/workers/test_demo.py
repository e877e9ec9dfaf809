"""``nightbench demo`` end to end: real nights, detection, confirmation, bisection, filing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.errors import InvalidInput
from workers.demo.run import DEMO_BENCHMARK, run_demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.measured
@pytest.mark.slow
def test_demo_runs_end_to_end(database_url: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    # Its own process: the demo sets NIGHTBENCH_* variables and PYTHONPATH while it runs.
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--dir", str(workdir), "--json"],
        cwd=ROOT,
        env={**os.environ, "NIGHTBENCH_PROFILE_REGRESSIONS": "true"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    planted = data["planted_culprit"]
    found = [
        r
        for r in data["regressions"]
        if r["benchmark"] == DEMO_BENCHMARK and r["metric"] == "latency"
    ]
    assert found and found[0]["confirmation"] == "reproduced", data["regressions"]
    assert found[0]["change"] > 1.0
    bisection = data["bisection"]
    assert bisection is not None and bisection["outcome"] == "culprit", bisection
    assert [c["sha"] for c in bisection["culprits"]] == [planted]
    assert bisection["culprits"][0]["benchmarks"] == [DEMO_BENCHMARK]
    assert any(p["purpose"] == "verify" for p in bisection["probes"])
    issues = [Path(p).read_text() for p in data["issues"]]
    assert any(planted[:7] in text and "Validate words and pieces" in text for text in issues)
    # What changed: the profile probe of the culprit and its parent names the Python-level
    # checks the culprit added to the tokenizer, not only aten operators, in its first rows.
    [issue] = [text for text in issues if planted[:7] in text]
    changed = issue[issue.index("## What changed") : issue.index("## History")]
    rows = [line for line in changed.splitlines() if line.startswith("| `")][:3]
    assert any("minitok/tokenizer.py: _check_" in row and "(new)" in row for row in rows), changed
    assert "of the profiled step's change" in changed
    # The night measured the package at its commit; the builds of the probes are gone.
    assert not any((workdir / "builds").glob("*/*/src"))


def test_demo_refuses_a_folder_in_use(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(InvalidInput, match="not empty"):
        run_demo(tmp_path)


@pytest.mark.parametrize("first_reproduced", [True, False])
def test_a_step_its_rerun_did_not_reproduce_gets_the_next_night(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, first_reproduced: bool
) -> None:
    # The nights themselves are measured by the end-to-end test above; here, what the demo
    # plays after its bad night: nothing more when the re-run reproduced the step, else one
    # more night at the bad commit over the same commit range (the nightly's "or the next
    # night"), whose outcome the demo then reports.
    from datetime import date, timedelta
    from types import SimpleNamespace

    from workers.demo import run as demo
    from workers.night import plan

    played: list[tuple[date, object, str]] = []

    def create_night(*, night: date, benchmarks: object, commit_range: object = None) -> int:
        played.append((night, commit_range, os.environ["PYTHONPATH"]))
        return len(played)

    def outcome(run_id: int) -> tuple[tuple[dict[str, object], ...], None]:
        done = "reproduced" if first_reproduced or run_id > 3 else "not_reproduced"
        return ({"benchmark": DEMO_BENCHMARK, "metric": "latency", "confirmation": done},), None

    monkeypatch.setattr(plan, "create_night", create_night)
    monkeypatch.setattr(plan, "queued_jobs", lambda run_id: [])
    monkeypatch.setattr(demo, "_night_outcome", outcome)
    commit_range = [{"sha": "b" * 40}]
    said: list[str] = []
    runs = demo._play_nights(
        SimpleNamespace(good="a" * 40, bad="b" * 40),
        (tmp_path / "good", tmp_path / "bad"),
        commit_range,
        baseline_nights=2,
        outer_path=None,
        say=said.append,
    )
    bad = 1 if first_reproduced else 2
    assert runs == list(range(1, 3 + bad))
    assert [p[2] for p in played] == [str(tmp_path / "good")] * 2 + [str(tmp_path / "bad")] * bad
    assert [p[1] for p in played] == [None, None] + [commit_range] * bad
    days = [p[0] for p in played]
    assert all(b - a == timedelta(days=1) for a, b in zip(days, days[1:], strict=False))
    assert days[-1] <= date.today()
    assert ("not reproduced" in said[-1]) is not first_reproduced, said
