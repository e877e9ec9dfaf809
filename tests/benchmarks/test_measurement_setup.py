"""The interleaved measurement of setups: the benchmark list and overlapped processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.measurement_setup import _chosen, _every_benchmark, _floors
from suite.registry import EXTRA_MODELS_ENV, list_models
from tests.suite.helpers import FIXTURE_MODELS, ROOT, suite_env


def test_all_is_every_model_the_device_and_modes_allow() -> None:
    cuda = _every_benchmark("cuda", ["train", "eval"])
    models = {m.name: m for m in list_models()}
    assert cuda and len(cuda) == len(set(cuda))
    for name, mode in cuda:
        assert "cuda" in models[name].devices and mode in models[name].modes
    cpu_only = [n for n, m in models.items() if "cuda" not in m.devices]
    assert cpu_only, "the suite has a CPU-only model (quantized_lstm)"
    assert not {n for n, _ in cuda} & set(cpu_only)
    assert _every_benchmark("cpu", ["eval"]) == [
        (n, "eval") for n, m in models.items() if "cpu" in m.devices and "eval" in m.modes
    ]


def test_models_may_name_one_mode_each() -> None:
    # The benchmarks a table left unsteady are model:mode pairs, measured again alone.
    assert _chosen("bart:eval,dlrm,t5:train", "cuda", ["train", "eval"]) == [
        ("bart", "eval"),
        ("dlrm", "train"),
        ("dlrm", "eval"),
        ("t5", "train"),
    ]
    assert _chosen("all", "cpu", ["eval"]) == _every_benchmark("cpu", ["eval"])
    for bad in ("bart:infer", ":eval"):
        with pytest.raises(ValueError, match=bad):
            _chosen(bad, "cpu", ["eval"])


def test_p90_interpolates_between_ranks() -> None:
    # Of two benchmarks, one steady and one at 15%: the 90th percentile lies near the noisy
    # one (it took the rank below, the steady one, and read 0.64%).
    rows = [
        {
            "setup": "jemalloc",
            "cv": cv,
            "cpu_time_cv": None,
            "unstable": cv > 0.1,
            "benchmark": name,
        }
        for name, cv in (("dlrm:eval", 0.15), ("ncf:train", 0.0064))
    ]
    floor = _floors(rows, ["jemalloc"])["jemalloc"]
    assert floor["cv_p90"] == pytest.approx(0.0064 + 0.9 * (0.15 - 0.0064))
    assert floor["noise_floor_cv"] == pytest.approx((0.15 + 0.0064) / 2)
    assert floor["unstable"] == ["dlrm:eval"]


def test_overlapped_processes_each_measure_under_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "setups.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.measurement_setup",
            "--models",
            "steady_alloc,eval_only",
            "--modes",
            "eval",
            "--setups",
            "off",
            "--repeats",
            "2",
            "--overlap",
            "2",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=suite_env(**{EXTRA_MODELS_ENV: str(FIXTURE_MODELS)}),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = {r["benchmark"]: r for r in doc["rows"]}
    assert set(rows) == {"steady_alloc:eval", "eval_only:eval"}
    for row in rows.values():
        assert len(row["medians_ms"]) == 2 and row["errors"] == 0
        waits = row["lock_waited_s"]
        assert len(waits) == 2 and all(w is not None and w >= 0 for w in waits)
