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


@pytest.mark.slow
def test_demo_runs_end_to_end(database_url: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    # Its own process: the demo sets NIGHTBENCH_* variables and PYTHONPATH while it runs.
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--dir", str(workdir), "--json"],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    planted = data["planted_culprit"]
    found = [r for r in data["regressions"] if r["benchmark"] == DEMO_BENCHMARK
             and r["metric"] == "latency"]
    assert found and found[0]["confirmation"] == "reproduced", data["regressions"]
    assert found[0]["change"] > 1.0
    bisection = data["bisection"]
    assert bisection is not None and bisection["outcome"] == "culprit", bisection
    assert [c["sha"] for c in bisection["culprits"]] == [planted]
    assert bisection["culprits"][0]["benchmarks"] == [DEMO_BENCHMARK]
    assert any(p["purpose"] == "verify" for p in bisection["probes"])
    issues = [Path(p).read_text() for p in data["issues"]]
    assert any(planted[:7] in text and "Validate words and pieces" in text for text in issues)
    # The night measured the package at its commit; the builds of the probes are gone.
    assert not any((workdir / "builds").glob("*/*/src"))


def test_demo_refuses_a_folder_in_use(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(InvalidInput, match="not empty"):
        run_demo(tmp_path)
