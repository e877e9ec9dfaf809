"""``nightbench import torchbench`` / ``nightbench export torchbench``: TorchBench's result JSON
in and out of the database, through the ingest path."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from service.db import session_scope
from service.models import Result, Run
from service.runs.service import run_records
from workers.cli import app

# Modelled on a CPU run of TorchBench's userbenchmark/test_bench/run.py (get_output_json): no
# GPU, so gpu_peak_mem is "failed"; a model without a CPU train raises NotImplementedError, which
# test_bench writes as "not_implemented" for every metric of that configuration.
USERBENCHMARK = {
    "name": "test_bench",
    "environ": {
        "pytorch_git_version": "7f3a1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c",
        "pytorch_version": "2.13.0.dev20261120+cpu",
    },
    "metrics": {
        "model=hf_Bert, test=eval, device=cpu, bs=None, extra_args=[], metric=latencies": 185.25,
        "model=hf_Bert, test=eval, device=cpu, bs=None, extra_args=[], metric=cpu_peak_mem": 3.1,
        "model=hf_Bert, test=eval, device=cpu, bs=None, extra_args=[], metric=gpu_peak_mem": "failed",
        "model=resnet18, test=train, device=cpu, bs=16, extra_args=[], metric=latencies": 412.5,
        "model=resnet18, test=train, device=cpu, bs=16, extra_args=[], metric=cpu_peak_mem": 5.5,
        "model=resnet18, test=train, device=cpu, bs=16, extra_args=[], metric=gpu_peak_mem": "failed",
        "model=maml, test=train, device=cpu, bs=None, extra_args=[], metric=latencies": "not_implemented",
        "model=maml, test=train, device=cpu, bs=None, extra_args=[], metric=cpu_peak_mem": "not_implemented",
        "model=maml, test=train, device=cpu, bs=None, extra_args=[], metric=gpu_peak_mem": "not_implemented",
    },
}

# Modelled on `pytest test_bench.py --benchmark-json out.json --benchmark-save-data` (pytest-benchmark
# 4): stats in seconds, test_bench.py's extra_info, conftest.py's machine_info fields.
PYTEST_BENCHMARK = {
    "machine_info": {
        "node": "bench-host-3",
        "processor": "x86_64",
        "machine": "x86_64",
        "python_compiler": "GCC 11.4.0",
        "python_implementation": "CPython",
        "python_implementation_version": "3.12.7",
        "python_version": "3.12.7",
        "python_build": ["main", "Oct  1 2026 12:00:00"],
        "release": "6.8.0-49-generic",
        "system": "Linux",
        "cpu": {
            "python_version": "3.12.7",
            "arch": "X86_64",
            "bits": 64,
            "count": 16,
            "brand_raw": "AMD EPYC 7B13 64-Core Processor",
        },
        "pytorch_version": "2.13.0.dev20261120+cpu",
        "pytorch_git_version": "7f3a1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c",
        "cuda_version": None,
        "torchvision_version": "*not-installed*",
        "github_run_id": None,
        "torchbench_score_version": None,
    },
    "commit_info": {
        "id": "0e83c440a51cd63464fee34724d01b7c814ce39b",
        "time": "2026-08-22T08:17:28-07:00",
        "author_time": "2026-08-22T08:17:28-07:00",
        "dirty": False,
        "project": "benchmark",
        "branch": "main",
    },
    "benchmarks": [
        {
            "group": "hub",
            "name": "test_eval[hf_Bert-cpu]",
            "fullname": "test_bench.py::TestBenchNetwork::test_eval[hf_Bert-cpu]",
            "params": {"model_path": "/tb/torchbenchmark/models/hf_Bert", "device": "cpu"},
            "param": "hf_Bert-cpu",
            "extra_info": {
                "machine_state": {},
                "batch_size": 1,
                "precision": "fp32",
                "test": "eval",
            },
            "options": {
                "disable_gc": False,
                "timer": "perf_counter",
                "min_rounds": 5,
                "max_time": 1.0,
                "min_time": 5e-06,
                "warmup": True,
            },
            "stats": {
                "min": 0.1801,
                "max": 0.1923,
                "mean": 0.18524,
                "stddev": 0.0047,
                "rounds": 5,
                "median": 0.1843,
                "iqr": 0.0062,
                "q1": 0.1821,
                "q3": 0.1883,
                "iqr_outliers": 0,
                "stddev_outliers": 1,
                "outliers": "1;0",
                "ld15iqr": 0.1801,
                "hd15iqr": 0.1923,
                "ops": 5.3983,
                "total": 0.9262,
                "data": [0.1801, 0.1843, 0.1923, 0.1821, 0.1874],
                "iterations": 1,
            },
        },
        {
            "group": "hub",
            "name": "test_train[lennard_jones-cpu]",
            "fullname": "test_bench.py::TestBenchNetwork::test_train[lennard_jones-cpu]",
            "params": {"model_path": "/tb/torchbenchmark/models/lennard_jones", "device": "cpu"},
            "param": "lennard_jones-cpu",
            "extra_info": {
                "machine_state": {},
                "batch_size": 1000,
                "precision": "fp32",
                "test": "train",
            },
            "options": {
                "disable_gc": False,
                "timer": "perf_counter",
                "min_rounds": 5,
                "max_time": 1.0,
                "min_time": 5e-06,
                "warmup": True,
            },
            "stats": {
                "min": 0.0049,
                "max": 0.0061,
                "mean": 0.0052,
                "stddev": 0.0003,
                "rounds": 120,
                "median": 0.0051,
                "iqr": 0.0002,
                "q1": 0.005,
                "q3": 0.0052,
                "iqr_outliers": 3,
                "stddev_outliers": 9,
                "outliers": "9;3",
                "ld15iqr": 0.0049,
                "hd15iqr": 0.0055,
                "ops": 192.3,
                "total": 0.624,
                "iterations": 1,
            },
        },
    ],
    "datetime": "2026-11-20T03:12:45.123456",
    "version": "4.0.0",
}

# TorchBench's own reading of a test_bench key (userbenchmark/test_bench/run.py:str_to_config).
TB_KEY = re.compile("model=(.*), test=(.*), device=(.*), bs=(.*), extra_args=(.*), metric=(.*)")


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=4))
    return path


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _last_json(output: str) -> dict[str, Any]:
    return json.loads(output.strip().splitlines()[-1])


def _records(run_id: int) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    with session_scope() as session:
        return {
            (r["model"], r["mode"], r["device"], r["compiler"]): r
            for r in run_records(session, run_id=run_id)
        }


def _medians(record: dict[str, Any]) -> dict[str, tuple[str, float]]:
    return {m["metric"]: (m["unit"], m["median"]) for m in record["metrics"]}


def test_import_userbenchmark_values_units_and_failures(database_url: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "test_bench.json", USERBENCHMARK)
    result = _invoke("import", "torchbench", str(path), "--date", "2026-11-20")
    assert result.exit_code == 0, result.output
    run_id = _last_json(result.stdout)["run"]
    records = _records(run_id)
    assert set(records) == {
        ("torchbench.hf_Bert", "eval", "cpu", "eager"),
        ("torchbench.resnet18", "train", "cpu", "eager"),
        ("torchbench.maml", "train", "cpu", "eager"),
    }
    bert = records[("torchbench.hf_Bert", "eval", "cpu", "eager")]
    # latencies: ms; cpu_peak_mem: memory_percent() * total / 10**9, i.e. bytes / 10**7;
    # gpu_peak_mem "failed" leaves that metric out of this configuration only.
    assert _medians(bert) == {
        "latency": ("ms", 185.25),
        "cpu_peak_mem_total": ("bytes", pytest.approx(3.1e7)),
    }
    assert bert["batch_size"] is None and bert["error"] is None
    resnet = records[("torchbench.resnet18", "train", "cpu", "eager")]
    assert resnet["batch_size"] == 16 and _medians(resnet)["latency"] == ("ms", 412.5)
    assert records[("torchbench.maml", "train", "cpu", "eager")]["error"] == "not_implemented"
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.kind == "ingest" and str(run.night) == "2026-11-20"
        assert run.torch_git_commit == USERBENCHMARK["environ"]["pytorch_git_version"]
        # Every benchmark reported; embedded, the night is judged at once (no workers sweep).
        assert run.status == "complete"
        rows = session.scalar(
            select(func.count()).select_from(Result).where(Result.run_id == run_id)
        )

    again = _invoke("import", "torchbench", str(path))
    assert again.exit_code == 0, again.output
    assert _last_json(again.stdout) == {"run": run_id, "stored": 0, "already_stored": 3}
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1
        assert session.scalar(select(func.count()).select_from(Result)) == rows


def test_import_pytest_benchmark_seconds_to_ms(database_url: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "0001_bench.json", PYTEST_BENCHMARK)
    result = _invoke("import", "torchbench", str(path))
    assert result.exit_code == 0, result.output
    run_id = _last_json(result.stdout)["run"]
    records = _records(run_id)
    bert = records[("torchbench.hf_Bert", "eval", "cpu", "eager")]
    [latency] = bert["metrics"]
    assert (latency["metric"], latency["unit"]) == ("latency", "ms")
    assert latency["median"] == pytest.approx(184.3)
    assert latency["iqr"] == pytest.approx(6.2)
    assert latency["samples"] == pytest.approx([180.1, 184.3, 192.3, 182.1, 187.4])
    assert bert["batch_size"] == 1
    assert bert["environment"]["cpu_model"] == "AMD EPYC 7B13 64-Core Processor"
    lj = records[("torchbench.lennard_jones", "train", "cpu", "eager")]
    assert lj["batch_size"] == 1000
    assert lj["metrics"][0]["samples"] == pytest.approx([5.1])  # no stats.data: the median
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and str(run.night) == "2026-11-20"  # the file's datetime
        assert run.torch_version == "2.13.0.dev20261120+cpu"


def test_export_reads_as_torchbench_reads_it_and_round_trips(
    database_url: str, tmp_path: Path
) -> None:
    imported = _invoke("import", "torchbench", str(_write(tmp_path, "in.json", USERBENCHMARK)))
    assert imported.exit_code == 0, imported.output
    run_id = _last_json(imported.stdout)["run"]
    out = tmp_path / "out.json"
    exported = _invoke("export", "torchbench", "--run", str(run_id), "--out", str(out))
    assert exported.exit_code == 0, exported.output
    doc = json.loads(out.read_text())
    assert doc["environ"]["pytorch_git_version"] == USERBENCHMARK["environ"]["pytorch_git_version"]
    configs = set()
    for key, value in doc["metrics"].items():
        model, test, device, bs, extra, metric = TB_KEY.match(key).groups()  # type: ignore[union-attr]
        configs.add((model, test, device, ast.literal_eval(bs), tuple(ast.literal_eval(extra))))
        assert isinstance(value, float | str)
    # TorchBench's names (no torchbench. prefix), bs as TorchBench writes it (None: its default).
    assert configs == {
        ("hf_Bert", "eval", "cpu", None, ()),
        ("resnet18", "train", "cpu", 16, ()),
        ("maml", "train", "cpu", None, ()),
    }
    # The values TorchBench wrote come back in its units.
    for key, value in USERBENCHMARK["metrics"].items():
        if isinstance(value, float):
            assert doc["metrics"][key] == pytest.approx(value)
    assert (
        doc["metrics"][
            "model=maml, test=train, device=cpu, bs=None, extra_args=[], metric=latencies"
        ]
        == "not_implemented"
    )

    again = _invoke("import", "torchbench", str(out))
    assert again.exit_code == 0, again.output
    second = _last_json(again.stdout)["run"]
    assert second != run_id
    first_records, second_records = _records(run_id), _records(second)
    assert set(first_records) == set(second_records)
    for bench, record in first_records.items():
        other = second_records[bench]
        for field in ("batch_size", "benchmark_version", "error"):
            assert other[field] == record[field], (bench, field)
        assert _medians(other) == {
            m: (u, pytest.approx(v)) for m, (u, v) in _medians(record).items()
        }


def test_export_to_stdout_and_by_suite(database_url: str, tmp_path: Path) -> None:
    run_id = _last_json(
        _invoke("import", "torchbench", str(_write(tmp_path, "in.json", USERBENCHMARK))).stdout
    )["run"]
    result = _invoke("export", "torchbench", "--run", str(run_id))
    assert result.exit_code == 0, result.output
    # 2 + 2 numbers; "failed" was never stored; maml one error under metric=latencies.
    assert len(json.loads(result.stdout)["metrics"]) == 5
    own = _invoke("export", "torchbench", "--run", str(run_id), "--suite", "own")
    assert own.exit_code == 0 and json.loads(own.stdout)["metrics"] == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("model=hf_Bert latency 12.5\n", "is not JSON"),
        ({"results": []}, "not a TorchBench result"),
        (
            {
                "name": "x",
                "environ": {"pytorch_git_version": "a"},
                "metrics": {"hf_Bert latency": 1.0},
            },
            "'hf_Bert latency' is in neither TorchBench dialect",
        ),
        (
            {"machine_info": {}, "benchmarks": [{"name": "test_forward[hf_Bert]", "stats": {}}]},
            "is not test_<train|eval>[<model>-<device>]",
        ),
        (
            {"name": "x", "environ": {"pytorch_git_version": "a"}, "metrics": {}},
            "holds no benchmark",
        ),
    ],
)
def test_bad_input_is_named_exits_2_and_stores_nothing(
    database_url: str, tmp_path: Path, content: Any, message: str
) -> None:
    path = _write(tmp_path, "bad.json", content)
    result = _invoke("import", "torchbench", str(path))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert "bad.json" in result.output
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0


def test_missing_file_and_unknown_run_exit_2(database_url: str, tmp_path: Path) -> None:
    missing = _invoke("import", "torchbench", str(tmp_path / "nope.json"))
    assert missing.exit_code == 2 and "cannot read" in missing.output
    unknown = _invoke("export", "torchbench", "--run", "424242")
    assert unknown.exit_code == 2 and "424242" in unknown.output
    suite = _invoke("export", "torchbench", "--run", "1", "--suite", "theirs")
    assert suite.exit_code == 2 and "--suite must be one of" in suite.output
