"""Bisection by instruction counts (``--metric cpu_instructions``): probes counted under
callgrind, which a busy host does not move."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.errors import InvalidInput, MeasureError
from workers.bisect.counts import CommandCountMeasurer, dump_totals
from workers.bisect.local_driver import bisect_repository
from workers.cli import app
from workers.demo.minitok import ENCODE, INSTALL_COMMAND, make_package_repository


def _profile(path: Path, ir: int) -> None:
    path.write_text(f"# callgrind format\nevents: Ir\nsummary: {ir}\n\ntotals: {ir}\n")


def test_dump_totals_orders_windows_and_sums_whole_processes(tmp_path: Path) -> None:
    _profile(tmp_path / "callgrind.200.2", 30)
    _profile(tmp_path / "callgrind.200.1", 10)
    _profile(tmp_path / "callgrind.200.10", 50)
    _profile(tmp_path / "callgrind.200", 0)  # the final dump of a process whose windows dumped
    _profile(tmp_path / "callgrind.100", 7)  # the shell that started it, counted whole
    assert dump_totals(tmp_path) == ([10, 30, 50], 7)
    (tmp_path / "callgrind.300").write_text("garbage\n")
    with pytest.raises(MeasureError, match="not a callgrind profile"):
        dump_totals(tmp_path)


def test_a_bisection_refuses_a_metric_it_cannot_measure(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="metric: must be one of latency, cpu_instructions"):
        bisect_repository(tmp_path, "a" * 40, "b" * 40, commands=["true"], metric="cpu_peak_mem")
    with pytest.raises(InvalidInput, match="non-empty"):
        CommandCountMeasurer({"x": " "})
    out = CliRunner().invoke(
        app,
        [
            "bisect",
            "--repo",
            str(tmp_path),
            "--good",
            "a",
            "--bad",
            "b",
            "--command",
            "true",
            "--metric",
            "wall",
        ],
    )
    assert out.exit_code != 0 and "--metric must be one of latency, cpu_instructions" in out.output


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_pure_python_slowdown_is_bisected_by_its_instruction_count(tmp_path: Path) -> None:
    # bench.py toggles nothing: each probe's whole run is counted (python's start, the
    # tokenizer's calls); the culprit adds checks to encode's loops.
    repo = make_package_repository(tmp_path / "minitok", commits=3, encode_culprit=2)
    data = bisect_repository(
        repo.path,
        repo.good,
        repo.bad,
        commands=[f"MINITOK_INNER=1 {ENCODE}"],
        install=INSTALL_COMMAND,
        work_dir=tmp_path / "builds",
        metric="cpu_instructions",
    ).as_json()
    assert data["outcome"] == "culprit", data
    (culprit,) = data["culprits"]
    assert culprit["sha"] == repo.culprits[ENCODE]
    assert culprit["change"][f"MINITOK_INNER=1 {ENCODE}"] > 0.05
    assert data["builds"] <= math.ceil(math.log2(4)) + 2
    counts = [s for p in data["probes"] for r in p["results"] for s in r["samples"]]
    assert min(counts) > 1e6  # instructions, not milliseconds


def test_a_night_bisects_by_counting_when_a_count_regressed() -> None:
    from service.config import Settings
    from service.models import Bisection, Regression
    from workers.bisect.celery_driver import bisected_by, measurer_for, night_search_config
    from workers.bisect.counts import SuiteCountMeasurer
    from workers.bisect.measure import SuiteMeasurer

    def reg(i: int, model: str, metric: str) -> Regression:
        return Regression(
            id=i, model=model, mode="eval", device="cpu", compiler="eager", metric=metric
        )

    sac_time, sac_count, bert_time = (
        reg(1, "sac", "latency"),
        reg(2, "sac", "cpu_instructions"),
        reg(3, "bert", "latency"),
    )
    # The count moved with sac's time: both bisected by counting; bert's time alone is not.
    metric, covered = bisected_by([sac_time, sac_count, bert_time])
    assert metric == "cpu_instructions" and [r.id for r in covered] == [1, 2]
    metric, covered = bisected_by([sac_time, bert_time])
    assert metric == "latency" and [r.id for r in covered] == [1, 3]
    settings = Settings()
    assert night_search_config(settings, "cpu_instructions").initial_samples == 6
    counted = Bisection(config={"measure": {"suite": True, "metric": "cpu_instructions"}})
    timed = Bisection(config={"measure": {"suite": True}})
    assert isinstance(measurer_for(counted, settings), SuiteCountMeasurer)
    assert isinstance(measurer_for(timed, settings), SuiteMeasurer)


_STAND_IN = """#!/bin/sh
# Stands in for a build's interpreter running `python -m suite count ... --out FILE`: it keeps
# its arguments and writes a record of one count.
printf '%s\\n' "$@" > "$ARGS_FILE"
while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
printf '{"records": [{"metrics": [{"samples": [1234.0]}]}]}' > "$out"
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_counted_probe_counts_at_the_count_series_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The night's count series is counted at NIGHTBENCH_COUNT_BATCH_SIZE (2): a probe counted at
    # the model's own batch (sac eval: 8192) would dilute a Python-level regression out of sight.
    from service.config import get_settings
    from workers.bisect.counts import SuiteCountMeasurer
    from workers.builds.base import BuildEnvironment

    python = tmp_path / "python"
    python.write_text(_STAND_IN)
    python.chmod(0o755)
    env = BuildEnvironment(
        sha="a" * 40, provider="python-overlay", python=python, root=tmp_path, workdir=tmp_path
    )
    monkeypatch.setenv("ARGS_FILE", str(tmp_path / "args"))

    def benchmarks(measurer: SuiteCountMeasurer) -> str:
        assert measurer.measure_once(env, "sac:eval:cpu", 6) == [1234.0]
        args = (tmp_path / "args").read_text().splitlines()
        assert args[:3] == ["-m", "suite", "count"] and args[args.index("--repeats") + 1] == "6"
        return args[args.index("--benchmarks") + 1]

    get_settings.cache_clear()
    try:
        assert benchmarks(SuiteCountMeasurer()) == "sac:eval:2"
        assert benchmarks(SuiteCountMeasurer(batch_size=5)) == "sac:eval:5"
        monkeypatch.setenv("NIGHTBENCH_COUNT_BATCH_SIZE", "0")  # each model's own
        get_settings.cache_clear()
        assert benchmarks(SuiteCountMeasurer()) == "sac:eval"
    finally:
        get_settings.cache_clear()
