"""Interop with TorchBench: its result JSON both ways, and its models as an extra suite."""

from __future__ import annotations

import importlib.util
import json

import pytest

from suite.records import BenchmarkRecord, MetricRecord
from suite.torchbench import TorchBenchFormatError, from_userbenchmark, to_userbenchmark
from tests.suite.helpers import FIXTURES, metric, run_record, run_suite

GB = 1024**3
ENV = {"torch_version": "2.13.0+cu130", "torch_git_version": "cf30153c4c13", "cuda": "13.0",
       "gpu_name": "NVIDIA H100", "cpu_model": "AMD EPYC", "threads": 1}


def _metric(name: str, unit: str, value: float) -> MetricRecord:
    return MetricRecord(metric=name, unit=unit, samples=[value], median=value, iqr=None)


def _records() -> list[BenchmarkRecord]:
    return [
        BenchmarkRecord(
            model="resnet18", mode="train", device="cuda", compiler="eager", batch_size=64,
            benchmark_version="aaaa000011112222", environment=dict(ENV),
            metrics=[_metric("latency", "ms", 12.5), _metric("cpu_time", "ms", 12.0),
                     _metric("cpu_peak_mem", "bytes", 2.0 * GB),
                     _metric("cpu_peak_mem_total", "bytes", 3.5 * GB),
                     _metric("gpu_peak_mem", "bytes", 6.25 * GB)],
        ),
        BenchmarkRecord(
            model="bert", mode="eval", device="cuda", compiler="inductor", batch_size=None,
            benchmark_version="bbbb000011112222", environment=dict(ENV),
            metrics=[_metric("latency", "ms", 3.75)],
        ),
        BenchmarkRecord(
            model="dlrm", mode="train", device="cpu", compiler="eager", batch_size=1024,
            benchmark_version="cccc000011112222", environment=dict(ENV),
            error="NotImplementedError: dlrm does not support this",
        ),
    ]


def _key(r: BenchmarkRecord) -> tuple:
    return (r.model, r.mode, r.device, r.compiler)


def test_export_import_round_trip() -> None:
    records = _records()
    exported = json.loads(json.dumps(to_userbenchmark(records)))
    assert exported["name"] == "nightbench"
    assert exported["environ"]["pytorch_git_version"] == "cf30153c4c13"
    assert exported["environ"]["pytorch_version"] == "2.13.0+cu130"
    assert exported["metrics"][
        "model=resnet18, test=train, device=cuda, bs=64, extra_args=[], metric=latencies"] == 12.5
    assert exported["metrics"][
        "model=resnet18, test=train, device=cuda, bs=64, extra_args=[], metric=gpu_peak_mem"
    ] == pytest.approx(6.25)  # GB, as TorchBench writes it
    assert exported["metrics"][
        "model=bert, test=eval, device=cuda, bs=None, extra_args=['--torchdynamo', 'inductor'], "
        "metric=latencies"] == 3.75
    back = {_key(r): r for r in from_userbenchmark(exported)}
    assert set(back) == {_key(r) for r in records}
    for original in records:
        again = back[_key(original)]
        assert again.batch_size == original.batch_size
        assert again.benchmark_version == original.benchmark_version
        assert again.error == original.error
        assert again.environment == original.environment
        assert sorted((m.metric, m.unit) for m in again.metrics) == sorted(
            (m.metric, m.unit) for m in original.metrics)
        for m in original.metrics:
            assert again.metric(m.metric).median == pytest.approx(m.median)
    # Exporting the imported records gives the same document again.
    assert to_userbenchmark(from_userbenchmark(exported)) == exported


def test_import_torchbench_cpu_userbenchmark() -> None:
    data = {  # the shape of TorchBench's userbenchmark/cpu output
        "name": "cpu",
        "environ": {"pytorch_git_version": "2236df1770800ffea5697b11b0bb0d910b2e59e1"},
        "metrics": {"mobilenet_v2-eval_latency": 99.127155, "mobilenet_v2-eval_cmem": 0.25,
                    "hf_Bert-train_latency": 185.5},
    }
    records = {_key(r): r for r in from_userbenchmark(data)}
    mobilenet = records[("torchbench.mobilenet_v2", "eval", "cpu", "eager")]
    assert mobilenet.metric("latency").median == pytest.approx(99.127155)
    assert mobilenet.metric("latency").unit == "ms"
    assert mobilenet.metric("cpu_peak_mem_total").median == pytest.approx(0.25 * GB)
    assert mobilenet.environment["torch_git_version"] == data["environ"]["pytorch_git_version"]
    assert records[("torchbench.hf_Bert", "train", "cpu", "eager")].error is None


def test_import_test_bench_failures_become_error_records() -> None:
    base = "model=yolov3, test=train, device=cuda, bs=None, extra_args=[]"
    data = {"name": "test_bench", "environ": {"pytorch_git_version": "abc"},
            "metrics": {f"{base}, metric=latencies": "not_implemented",
                        f"{base}, metric=gpu_peak_mem": "not_implemented"}}
    [record] = from_userbenchmark(data)
    assert record.model == "torchbench.yolov3" and record.error == "not_implemented"
    assert record.metrics == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "metrics": {}}, "environ.pytorch_git_version"),
        ({"name": "x", "environ": {"pytorch_git_version": "a"}}, "'metrics' object"),
        ({"environ": {"pytorch_git_version": "a"}, "metrics": {"resnet50 latency": 1.0}},
         "'resnet50 latency' is in neither TorchBench dialect"),
        ({"environ": {"pytorch_git_version": "a"}, "metrics": {"m-eval_latency": [1.0]}},
         "is not a number"),
        ({"environ": {"pytorch_git_version": "a"},
          "metrics": {"model=m, test=eval, device=tpu, bs=1, extra_args=[], metric=latencies": 1}},
         "unknown test or device"),
    ],
)
def test_bad_torchbench_json_is_named(data: dict, message: str) -> None:
    with pytest.raises(TorchBenchFormatError, match=message.replace("[", r"\[")):
        from_userbenchmark(data)


needs_no_torchbench = pytest.mark.skipif(
    importlib.util.find_spec("torchbenchmark") is not None,
    reason="torchbenchmark is installed here: the skip path cannot be exercised",
)


@needs_no_torchbench
def test_torchbench_suite_is_skipped_cleanly_when_not_installed() -> None:
    proc = run_suite(["list", "--json", "--suite", "torchbench"])
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == []
    assert "torchbench suite skipped: the 'torchbenchmark' package is not importable" in proc.stderr
    proc = run_suite(["list", "--json", "--suite", "all"])
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) >= 20
    proc, record = run_record("torchbench.resnet50", "eval")
    assert proc.returncode == 1
    assert record["error"].startswith("TorchBenchUnavailable: the 'torchbenchmark' package is not")


def test_torchbench_models_run_through_the_harness() -> None:
    """A package laid out like pytorch/benchmark's ``torchbenchmark`` on PYTHONPATH: its models
    are listed as ``torchbench.<name>`` and measured by the suite's harness."""
    env = {"PYTHONPATH": str(FIXTURES / "torchbench")}
    proc = run_suite(["list", "--json", "--suite", "torchbench"], **env)
    assert proc.returncode == 0, proc.stderr
    [entry] = json.loads(proc.stdout)
    assert entry["name"] == "torchbench.tiny_mlp" and entry["suite"] == "torchbench"
    assert entry["domain"] == "recommendation"  # from the model's TorchBench task enum
    assert entry["train_batch_size"] == {"cpu": 8, "cuda": 8}
    proc, record = run_record("torchbench.tiny_mlp", "train", **env)
    assert proc.returncode == 0, proc.stderr
    assert record["batch_size"] == 8  # TorchBench's DEFAULT_TRAIN_BSIZE
    assert record["benchmark_version"] == entry["benchmark_version"]
    assert len(metric(record, "latency")["samples"]) >= 5
