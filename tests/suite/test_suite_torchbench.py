"""Interop with TorchBench: its result JSON both ways, and its models as an extra suite."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from suite.records import BenchmarkRecord, MetricRecord
from suite.torchbench import TorchBenchFormatError, from_userbenchmark, to_userbenchmark
from tests.suite.helpers import FIXTURES, metric, run_record, run_suite

GB = 1024**3
ENV = {
    "torch_version": "2.13.0+cu130",
    "torch_git_version": "cf30153c4c13",
    "cuda": "13.0",
    "gpu_name": "NVIDIA H100",
    "cpu_model": "AMD EPYC",
    "threads": 1,
}


def _metric(name: str, unit: str, value: float) -> MetricRecord:
    return MetricRecord(metric=name, unit=unit, samples=[value], median=value, iqr=None)


def _records() -> list[BenchmarkRecord]:
    return [
        BenchmarkRecord(
            model="resnet18",
            mode="train",
            device="cuda",
            compiler="eager",
            batch_size=64,
            benchmark_version="aaaa000011112222",
            environment=dict(ENV),
            metrics=[
                _metric("latency", "ms", 12.5),
                _metric("cpu_time", "ms", 12.0),
                _metric("cpu_peak_mem", "bytes", 2.0 * GB),
                _metric("cpu_peak_mem_total", "bytes", 3.5 * GB),
                _metric("gpu_peak_mem", "bytes", 6.25 * GB),
            ],
        ),
        BenchmarkRecord(
            model="bert",
            mode="eval",
            device="cuda",
            compiler="inductor",
            batch_size=None,
            benchmark_version="bbbb000011112222",
            environment=dict(ENV),
            metrics=[_metric("latency", "ms", 3.75)],
        ),
        BenchmarkRecord(
            model="dlrm",
            mode="train",
            device="cpu",
            compiler="eager",
            batch_size=1024,
            benchmark_version="cccc000011112222",
            environment=dict(ENV),
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
    assert (
        exported["metrics"][
            "model=resnet18, test=train, device=cuda, bs=64, extra_args=[], metric=latencies"
        ]
        == 12.5
    )
    assert exported["metrics"][
        "model=resnet18, test=train, device=cuda, bs=64, extra_args=[], metric=gpu_peak_mem"
    ] == pytest.approx(6.25 * GB / 1e9)  # GB (10**9 bytes), as TorchBench writes it
    assert (
        exported["metrics"][
            "model=bert, test=eval, device=cuda, bs=None, extra_args=['--torchdynamo', 'inductor'], "
            "metric=latencies"
        ]
        == 3.75
    )
    back = {_key(r): r for r in from_userbenchmark(exported)}
    assert set(back) == {_key(r) for r in records}
    for original in records:
        again = back[_key(original)]
        assert again.batch_size == original.batch_size
        assert again.benchmark_version == original.benchmark_version
        assert again.error == original.error
        assert again.environment == original.environment
        assert sorted((m.metric, m.unit) for m in again.metrics) == sorted(
            (m.metric, m.unit) for m in original.metrics
        )
        for m in original.metrics:
            assert again.metric(m.metric).median == pytest.approx(m.median)
    # Exporting the imported records gives the same document again.
    assert to_userbenchmark(from_userbenchmark(exported)) == exported


def test_import_torchbench_cpu_userbenchmark() -> None:
    data = {  # the shape of TorchBench's userbenchmark/cpu output
        "name": "cpu",
        "environ": {"pytorch_git_version": "2236df1770800ffea5697b11b0bb0d910b2e59e1"},
        # _cmem: psutil's memory_percent() * total / 10**9 in TorchBench: 0.5% of 64e9 B -> 32.0
        "metrics": {
            "mobilenet_v2-eval_latency": 99.127155,
            "mobilenet_v2-eval_cmem": 32.0,
            "hf_Bert-train_latency": 185.5,
        },
    }
    records = {_key(r): r for r in from_userbenchmark(data)}
    mobilenet = records[("torchbench.mobilenet_v2", "eval", "cpu", "eager")]
    assert mobilenet.metric("latency").median == pytest.approx(99.127155)
    assert mobilenet.metric("latency").unit == "ms"
    assert mobilenet.metric("cpu_peak_mem_total").median == pytest.approx(0.005 * 64e9)
    assert mobilenet.environment["torch_git_version"] == data["environ"]["pytorch_git_version"]
    assert records[("torchbench.hf_Bert", "train", "cpu", "eager")].error is None


def test_import_test_bench_failures_become_error_records() -> None:
    base = "model=yolov3, test=train, device=cuda, bs=None, extra_args=[]"
    data = {
        "name": "test_bench",
        "environ": {"pytorch_git_version": "abc"},
        "metrics": {
            f"{base}, metric=latencies": "not_implemented",
            f"{base}, metric=gpu_peak_mem": "not_implemented",
        },
    }
    [record] = from_userbenchmark(data)
    assert record.model == "torchbench.yolov3" and record.error == "not_implemented"
    assert record.metrics == []


def test_import_test_bench_a_failed_metric_leaves_only_that_metric_out() -> None:
    # A real CPU test_bench file: no GPU, so gpu_peak_mem is "failed" in every configuration.
    configs = [
        f"model={m}, test={t}, device=cpu, bs=None, extra_args=[]"
        for m in ("BERT_pytorch", "dcgan")
        for t in ("train", "eval")
    ]
    metrics: dict = {}
    for i, base in enumerate(configs):
        metrics[f"{base}, metric=latencies"] = 10.0 + i
        metrics[f"{base}, metric=cpu_peak_mem"] = 0.5
        metrics[f"{base}, metric=gpu_peak_mem"] = "failed"
    records = from_userbenchmark(
        {"name": "test_bench", "environ": {"pytorch_git_version": "a"}, "metrics": metrics}
    )
    assert len(records) == 4 and all(r.error is None for r in records)
    assert all(r.metric("gpu_peak_mem") is None for r in records)
    dcgan = next(r for r in records if (r.model, r.mode) == ("torchbench.dcgan", "eval"))
    assert dcgan.metric("latency").median == 13.0
    # TorchBench's cpu_peak_mem is memory_percent() * total / 10**9: 0.5 means 5e6 bytes.
    assert dcgan.metric("cpu_peak_mem_total").median == pytest.approx(0.5 * 1e7)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "metrics": {}}, "environ.pytorch_git_version"),
        ({"name": "x", "environ": {"pytorch_git_version": "a"}}, "'metrics' object"),
        (
            {"environ": {"pytorch_git_version": "a"}, "metrics": {"resnet50 latency": 1.0}},
            "'resnet50 latency' is in neither TorchBench dialect",
        ),
        (
            {"environ": {"pytorch_git_version": "a"}, "metrics": {"m-eval_latency": [1.0]}},
            "is not a number",
        ),
        (
            {
                "environ": {"pytorch_git_version": "a"},
                "metrics": {
                    "model=m, test=eval, device=tpu, bs=1, extra_args=[], metric=latencies": 1
                },
            },
            "unknown device 'tpu'",
        ),
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


CHECKOUT = FIXTURES / "torchbench"  # laid out like pytorch/benchmark: torchbenchmark/models/...


def _listing(*args: str, **env: str) -> dict[str, dict]:
    proc = run_suite(["list", "--json", "--suite", "torchbench", *args], **env)
    assert proc.returncode == 0, proc.stderr
    return {e["name"]: e for e in json.loads(proc.stdout)}


def test_torchbench_models_run_through_the_harness() -> None:
    """A checkout given by PYTHONPATH (an importable ``torchbenchmark``): its models are listed
    as ``torchbench.<name>`` and measured by the suite's harness."""
    env = {"PYTHONPATH": str(CHECKOUT)}
    entry = _listing("--check-imports", **env)["torchbench.tiny_mlp"]
    assert entry["suite"] == "torchbench" and entry["available"]
    assert entry["domain"] == "recommendation"  # from the model's TorchBench task enum
    assert entry["train_batch_size"] == {"cpu": 8, "cuda": 8}
    proc, record = run_record("torchbench.tiny_mlp", "train", **env)
    assert proc.returncode == 0, proc.stderr
    assert record["batch_size"] == 8  # TorchBench's DEFAULT_TRAIN_BSIZE
    assert record["benchmark_version"] == entry["benchmark_version"]
    assert len(metric(record, "latency")["samples"]) >= 5


def test_listing_reads_metadata_and_never_imports_a_model() -> None:
    proc = run_suite(["list", "--json", "--suite", "torchbench", "--torchbench", str(CHECKOUT)])
    assert proc.returncode == 0, proc.stderr
    models = {e["name"]: e for e in json.loads(proc.stdout)}
    assert set(models) == {
        f"torchbench.{m}"
        for m in ("cpu_unsupported", "needs_tensorboardx", "staged_mlp", "tiny_mlp")
    }
    # Importing it would fail; listing reads its requirements instead and says what is missing.
    missing = models["torchbench.needs_tensorboardx"]
    assert not missing["available"]
    assert missing["reason"] == (
        "missing requirement(s): nightbench-fixture-tensorboardx-not-installed; "
        "missing module(s): nightbench_fixture_tensorboardx_not_installed"
    )
    assert "torchbench.needs_tensorboardx unavailable: missing requirement" in proc.stderr
    staged = models["torchbench.staged_mlp"]
    assert (staged["domain"], staged["task"]) == ("nlp", "language_modeling")
    # Per device: the class default on the CPU, metadata.yaml's GPU batch size on CUDA.
    assert staged["eval_batch_size"] == {"cpu": 8, "cuda": 64}
    assert staged["train_batch_size"] == {"cpu": 4, "cuda": 32}
    cpu_only_not = models["torchbench.cpu_unsupported"]
    assert cpu_only_not["devices"] == ["cuda"]  # "NVIDIA A10G" concerns that GPU, not cuda
    assert cpu_only_not["not_implemented"] == ["train:cpu", "eval:cpu"]
    # --suite all keeps the suite's own models beside them.
    proc = run_suite(["list", "--json", "--suite", "all"], NIGHTBENCH_TORCHBENCH_PATH=str(CHECKOUT))
    names = [e["name"] for e in json.loads(proc.stdout)]
    assert len(names) >= 24 and "torchbench.tiny_mlp" in names and "resnet18" in names
    # `own`, as `nightbench nightly --suite` names the suite's own models, lists only those.
    proc = run_suite(["list", "--json", "--suite", "own"], NIGHTBENCH_TORCHBENCH_PATH=str(CHECKOUT))
    own = [e["name"] for e in json.loads(proc.stdout)]
    assert "resnet18" in own and not any(n.startswith("torchbench.") for n in own)


def test_staged_train_and_no_grad_eval_go_through_torchbench_s_invoke() -> None:
    env = {"NIGHTBENCH_TORCHBENCH_PATH": str(CHECKOUT)}
    for mode, batch in (("train", 4), ("eval", 8)):
        # The staged model has no train(); its eval() asserts that autograd is off.
        proc, record = run_record("torchbench.staged_mlp", mode, **env)
        assert proc.returncode == 0, proc.stderr
        assert record["error"] is None and record["batch_size"] == batch


def test_metadata_not_implemented_is_an_unsupported_configuration() -> None:
    proc, record = run_record(
        "torchbench.cpu_unsupported", "eval", NIGHTBENCH_TORCHBENCH_PATH=str(CHECKOUT)
    )
    assert proc.returncode == 1
    assert record["error"].startswith(
        "NotImplementedError: TorchBench's metadata.yaml marks eval on cpu as not_implemented"
    )


def test_a_path_that_is_not_a_checkout_is_a_bad_argument(tmp_path: Path) -> None:
    proc = run_suite(["list", "--suite", "torchbench", "--torchbench", str(tmp_path)])
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        f"NIGHTBENCH_TORCHBENCH_PATH={tmp_path} is not a pytorch/benchmark checkout" in proc.stderr
    )


def _checkout_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_var: str) -> Path:
    """A writable copy of the fixture checkout, configured as the checkout to use."""
    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    monkeypatch.setenv(env_var, str(copy))
    return copy


def test_the_version_covers_shared_framework_code_and_library_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suite import torchbench_checkout as checkout

    copy = _checkout_copy(tmp_path, monkeypatch, checkout.ENV_VAR)
    before = {m: checkout.benchmark_version(m, b"contract") for m in ("staged_mlp", "tiny_mlp")}
    factory = copy / "torchbenchmark" / "util" / "framework" / "factory.py"
    factory.write_text(factory.read_text().replace("HIDDEN = 64", "HIDDEN = 16"))
    after = {m: checkout.benchmark_version(m, b"contract") for m in before}
    assert after["staged_mlp"] != before["staged_mlp"]  # a new series, not a regression
    assert after["tiny_mlp"] != before["tiny_mlp"]  # util/ is shared by every model


def _add_model(copy: Path, name: str, source: str) -> None:
    folder = copy / "torchbenchmark" / "models" / name
    folder.mkdir()
    (folder / "__init__.py").write_text(source)


def _versions_with(monkeypatch: pytest.MonkeyPatch, checkout, models, **versions: str):
    real = checkout._installed
    monkeypatch.setattr(checkout, "_installed", lambda d: versions.get(d) or real(d))
    try:
        return {m: checkout.benchmark_version(m, b"contract") for m in models}
    finally:
        monkeypatch.setattr(checkout, "_installed", real)


def test_the_version_covers_only_the_framework_libraries_a_model_can_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suite import torchbench_checkout as checkout

    copy = _checkout_copy(tmp_path, monkeypatch, checkout.ENV_VAR)
    _add_model(
        copy,
        "hf_tiny",
        "from torchbenchmark.util.framework.huggingface.model_factory import build\n",
    )
    _add_model(
        copy,
        "dynamic_tiny",
        "import importlib\n\n\ndef load(name):\n    return importlib.import_module(name)\n",
    )
    models = ("tiny_mlp", "staged_mlp", "hf_tiny", "dynamic_tiny", "needs_tensorboardx")
    assert checkout.framework_libraries("tiny_mlp") == ([], [])
    assert checkout.framework_libraries("hf_tiny") == (["transformers"], [])
    libraries, why = checkout.framework_libraries("dynamic_tiny")
    assert libraries == list(checkout.FRAMEWORK_LIBRARIES)
    assert why == ["torchbenchmark/models/dynamic_tiny/__init__.py: dynamic import of name"]
    base = _versions_with(monkeypatch, checkout, models)
    # Another transformers: only the models that can reach it start a new series.
    moved = _versions_with(monkeypatch, checkout, models, transformers="99.0")
    assert {m for m in models if moved[m] != base[m]} == {"hf_tiny", "dynamic_tiny"}
    # Another torchvision: no fixture model imports it, so only the dynamic import's model moves.
    moved = _versions_with(monkeypatch, checkout, models, torchvision="99.0")
    assert {m for m in models if moved[m] != base[m]} == {"dynamic_tiny"}
    # A requirements.txt entry stays versioned, whatever the closure reaches.
    moved = _versions_with(monkeypatch, checkout, models, numpy="0.0.1")
    assert {m for m in models if moved[m] != base[m]} == {"needs_tensorboardx"}


def test_the_import_closure_reads_what_static_analysis_can_see(tmp_path: Path) -> None:
    from suite.torchbench_imports import import_closure

    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    models = copy / "torchbenchmark" / "models"

    def closure(name: str, source: str):
        folder = models / name
        folder.mkdir()
        (folder / "__init__.py").write_text(source)
        return import_closure(copy, folder)

    staged = import_closure(copy, models / "staged_mlp")
    assert "torchbenchmark/util/framework/factory.py" in staged.files  # relative imports
    assert "torchbenchmark/util/model.py" in staged.files
    assert staged.third_party == {"torch"} and staged.open == []
    # A constant import_module is an import; a guarded import of a missing file cannot load.
    found = closure(
        "constant",
        "import importlib\nimportlib.import_module('timm')\ntry:\n"
        "    from torchbenchmark.util.fb.installer import x\nexcept ImportError:\n"
        "    x = None\n",
    )
    assert found.third_party == {"timm"} and found.open == []
    missing = closure("missing", "from torchbenchmark.util.fb.installer import install_data\n")
    assert missing.open == [
        "torchbenchmark/models/missing/__init__.py: "
        "torchbenchmark.util.fb.installer is no file of the checkout"
    ]
    assert closure("dunder", "__import__('x' + suffix)\n").open


# Models laid out as TorchBench's fail or limit themselves: a framework library missing behind
# TorchBench's own util/framework code (detectron2's models), a library that raises at import
# (transformers after a huggingface-hub it cannot use), a torchvision built for another torch,
# no train batch size (llama), a train() that always raises (pyhpc_*), a batch size the model's
# __init__ overrides on the CPU (BERT_pytorch), a train batch size only TorchBench's
# construction can tell is missing (a framework base class without one).
PLANTED_FILES = {
    "util/framework/detectron2/__init__.py": "from detectron2.config import get_cfg  # noqa\n",
    "util/framework/generation.py": (
        "from ..model import BenchmarkModel\n\n\nclass GenerationModel(BenchmarkModel):\n"
        "    DEFAULT_EVAL_BSIZE = 2\n"
    ),
    "models/d2_model/__init__.py": "from ...util.framework.detectron2 import get_cfg  # noqa\n",
    "models/hub_broken/__init__.py": "import nightbench_fixture_hub  # noqa\n",
    "models/vision_broken/__init__.py": "import torchvision  # noqa\n",
    "models/eval_only/__init__.py": (
        "import torch\n\nfrom ...util.model import BenchmarkModel\n\n\n"
        "class Model(BenchmarkModel):\n    DEFAULT_EVAL_BSIZE = 4\n\n"
        "    def __init__(self, test, device, batch_size=None, extra_args=None):\n"
        "        super().__init__(test, device, batch_size, extra_args)\n"
        "        self.model = torch.nn.Linear(8, 1)\n"
        "        self.example_inputs = (torch.randn(self.batch_size, 8),)\n\n"
        "    def eval(self):\n        return (self.model(*self.example_inputs),)\n"
    ),
    "models/train_raises/__init__.py": (
        "from ...util.model import BenchmarkModel\n\n\nclass Model(BenchmarkModel):\n"
        "    DEFAULT_TRAIN_BSIZE = 4\n    DEFAULT_EVAL_BSIZE = 4\n\n    def train(self):\n"
        '        raise NotImplementedError("Training not supported")\n'
    ),
    "models/bsize_override/__init__.py": (
        "from ..tiny_mlp import Model as Tiny\n\n\nclass Model(Tiny):\n"
        "    def __init__(self, test, device, batch_size=None, extra_args=None):\n"
        '        if device == "cpu":\n'
        "            self.DEFAULT_EVAL_BSIZE = max(1, int(self.DEFAULT_EVAL_BSIZE / 8))\n"
        "        super().__init__(test, device, batch_size, extra_args)\n"
    ),
    "models/generate_only/__init__.py": (
        "from ...util.framework.generation import GenerationModel\n\n\n"
        "class Model(GenerationModel):\n    pass\n"
    ),
}
# Installed libraries that fail at import, on the check's PYTHONPATH.
PLANTED_LIBRARIES = {
    "nightbench_fixture_hub/__init__.py": (
        "raise ImportError(\"cannot import name 'is_offline_mode' from 'huggingface_hub'\")\n"
    ),
    "torchvision/__init__.py": 'raise RuntimeError("operator torchvision::nms does not exist")\n',
}


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the fixture checkout with :data:`PLANTED_FILES`, and a folder of
    :data:`PLANTED_LIBRARIES` to put on PYTHONPATH."""
    copy, site = tmp_path / "benchmark", tmp_path / "site"
    shutil.copytree(CHECKOUT, copy)
    for files, base in ((PLANTED_FILES, copy / "torchbenchmark"), (PLANTED_LIBRARIES, site)):
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    return copy, site


def test_available_means_its_import_passed_here_and_is_cached(tmp_path: Path) -> None:
    copy, _ = _planted(tmp_path)
    env = {"NIGHTBENCH_TORCHBENCH_PATH": str(copy)}
    before = _listing(**env)["torchbench.tiny_mlp"]
    assert not before["available"] and not before["checked"]
    assert before["reason"].startswith("not checked: its import has not been checked")
    text = run_suite(["list", "--suite", "torchbench"], **env).stdout
    assert [ln.split()[1:3] for ln in text.splitlines() if "tiny_mlp" in ln] == [["not", "checked"]]
    checked = _listing("--check-imports", **env)
    assert checked["torchbench.tiny_mlp"]["available"]
    # The cache answers the next listing; a change to the model's files asks again.
    assert _listing(**env)["torchbench.tiny_mlp"]["available"]
    text = run_suite(["list", "--suite", "torchbench"], **env).stdout
    assert [ln.split()[1] for ln in text.splitlines() if "tiny_mlp" in ln] == ["available"]
    init = copy / "torchbenchmark" / "models" / "tiny_mlp" / "__init__.py"
    init.write_text(init.read_text() + "\n# edited\n")
    assert not _listing(**env)["torchbench.tiny_mlp"]["checked"]


def test_each_import_failure_and_unoffered_test_is_named(tmp_path: Path) -> None:
    copy, site = _planted(tmp_path)
    env = {"NIGHTBENCH_TORCHBENCH_PATH": str(copy), "PYTHONPATH": str(site)}
    models = _listing("--check-imports", **env)
    reasons = {n.removeprefix("torchbench."): e["reason"] for n, e in models.items()}
    assert reasons["d2_model"] == (
        "missing framework library detectron2: ModuleNotFoundError: No module named 'detectron2'"
    )
    assert reasons["hub_broken"] == (
        "runtime import error in nightbench_fixture_hub: ImportError: cannot import name "
        "'is_offline_mode' from 'huggingface_hub'"
    )
    assert reasons["vision_broken"].startswith(
        "broken torchvision: RuntimeError: operator torchvision::nms does not exist (a "
        "torchvision build that does not match this torch"
    )
    for name in ("d2_model", "hub_broken", "vision_broken"):
        assert not models[f"torchbench.{name}"]["available"], name
    # No train batch size (read from the class), a train() that always raises: eval only.
    # One that only TorchBench's construction can tell (on this CPU) is not offered on the CPU.
    for name, why in (
        ("eval_only", "TorchBench gives no train batch size on cpu (DEFAULT_TRAIN_BSIZE unset)"),
        ("train_raises", "TorchBench's Model.train() raises NotImplementedError: Training not"),
        ("generate_only", "NotImplementedError: Model's DEFAULT_TRAIN_BSIZE is not implemented."),
    ):
        entry = models[f"torchbench.{name}"]
        assert entry["available"], (name, entry)
        assert entry["not_offered"]["train:cpu"].startswith(why), (name, entry)
        assert "train:cpu" in entry["not_implemented"]
        assert entry["modes"] == (["train", "eval"] if name == "generate_only" else ["eval"])
    # The batch size listed is the one the model's __init__ makes TorchBench run with.
    # (Its class sets no size of its own: the files alone could not tell any; CUDA is not
    # checked on this CPU machine.)
    override = models["torchbench.bsize_override"]
    assert override["eval_batch_size"] == {"cpu": 2}
    assert override["train_batch_size"] == {"cpu": 8}
    assert models["torchbench.generate_only"]["eval_batch_size"]["cpu"] == 2
    proc, record = run_record("torchbench.bsize_override", "eval", **env)
    assert proc.returncode == 0, proc.stderr
    assert record["batch_size"] == 2


def test_a_hanging_import_times_out_and_a_crash_ends_only_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suite import torchbench_check

    copy, _ = _planted(tmp_path)
    for name, source in (
        ("hangs", "import time\n\ntime.sleep(600)\n"),
        ("crashes", "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n"),
    ):
        (copy / "torchbenchmark" / "models" / name).mkdir()
        (copy / "torchbenchmark" / "models" / name / "__init__.py").write_text(source)
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(copy))
    found = torchbench_check.run_checks(
        ["tiny_mlp", "hangs", "crashes", "staged_mlp"], timeout_s=2, batch=4
    )
    assert found["hangs"].cause == "import check timed out after 2 s"
    assert found["crashes"].cause == "import check the check process exited with code -9"
    assert found["tiny_mlp"].imported and found["staged_mlp"].imported  # after the crash
    assert found["tiny_mlp"].configs["eval:cpu"] == {"batch_size": 16}


REAL_CHECKOUT = os.environ.get("NIGHTBENCH_TORCHBENCH_PATH")


@pytest.mark.skipif(
    not REAL_CHECKOUT, reason="set NIGHTBENCH_TORCHBENCH_PATH to a real pytorch/benchmark checkout"
)
def test_a_real_torchbench_checkout_lists_and_runs() -> None:
    assert REAL_CHECKOUT is not None
    env = {"NIGHTBENCH_TORCHBENCH_PATH": REAL_CHECKOUT}
    proc = run_suite(["list", "--json", "--suite", "torchbench", "--check-imports"], **env)
    assert proc.returncode == 0, proc.stderr
    models = {e["name"]: e for e in json.loads(proc.stdout)}
    assert len(models) >= 90  # pytorch/benchmark has ~100 models
    assert all(e["available"] or e["reason"] for e in models.values())
    assert not any(e["reason"] and e["reason"].startswith("not checked") for e in models.values())
    lj = models["torchbench.lennard_jones"]
    if not lj["available"]:  # TorchBench's requirements (psutil, ...) are not installed here
        assert lj["reason"].startswith(("missing module", "missing requirement")), lj["reason"]
        pytest.skip(f"torchbench.lennard_jones does not import here: {lj['reason']}")
    proc, record = run_record("torchbench.lennard_jones", "eval", **env)
    assert proc.returncode == 0, proc.stderr
    assert record["benchmark_version"] == lj["benchmark_version"]


@pytest.mark.skipif(
    not REAL_CHECKOUT, reason="set NIGHTBENCH_TORCHBENCH_PATH to a real pytorch/benchmark checkout"
)
def test_a_real_checkout_s_models_reach_the_framework_libraries_they_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from suite import torchbench_checkout as checkout

    assert REAL_CHECKOUT is not None
    monkeypatch.setenv(checkout.ENV_VAR, REAL_CHECKOUT)
    for name in ("lennard_jones", "soft_actor_critic"):
        assert checkout.framework_libraries(name) == ([], []), name
    assert checkout.framework_libraries("resnet50") == (["torchvision"], [])
    assert "transformers" in checkout.framework_libraries("hf_Bert")[0]


def test_export_writes_torchbench_names_and_reads_them_back() -> None:
    ours = BenchmarkRecord(
        model="torchbench.hf_Bert",
        mode="eval",
        device="cuda",
        compiler="inductor",
        batch_size=None,
        benchmark_version="dddd",
        environment=dict(ENV),
        metrics=[_metric("latency", "ms", 7.5)],
    )
    doc = json.loads(json.dumps(to_userbenchmark([ours])))
    assert list(doc["metrics"]) == [
        "model=hf_Bert, test=eval, device=cuda, bs=None, "
        "extra_args=['--torchdynamo', 'inductor'], metric=latencies"
    ]
    [back] = from_userbenchmark(doc)
    assert (back.model, back.compiler, back.batch_size, back.benchmark_version) == (
        "torchbench.hf_Bert",
        "inductor",
        None,
        "dddd",
    )
    clash = BenchmarkRecord(
        model="hf_Bert",
        mode="eval",
        device="cuda",
        compiler="inductor",
        metrics=[_metric("latency", "ms", 1.0)],
    )
    with pytest.raises(TorchBenchFormatError, match="export the suite's own models"):
        to_userbenchmark([ours, clash])


def test_a_failed_setup_outlasts_a_package_installed_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchBench's setup outcomes are kept by environment and checkout, not by the package set:
    a model whose input data never downloaded stays unavailable after the user installs
    something else (which changes the import checks' identity and so re-checks imports)."""
    from suite import torchbench_check

    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(copy))
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_CACHE", str(tmp_path / "cache"))
    installed = {"prefix": "/venv", "python": "CPython 3.11.7", "packages": "a" * 16, "id": "1"}
    torchbench_check.store_setups(installed, {"tiny_mlp": ("FAIL", "ConnectionError: no data")})
    later = {**installed, "packages": "b" * 16, "id": "2"}  # one more package installed
    assert torchbench_check.failed_setups(later) == {
        "tiny_mlp": "TorchBench's setup FAILED here: ConnectionError: no data"
    }
    # Another environment, or another checkout, has its own outcomes.
    assert torchbench_check.failed_setups({**installed, "prefix": "/other-venv"}) == {}
    other = tmp_path / "other-benchmark"
    shutil.copytree(CHECKOUT, other)
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(other))
    assert torchbench_check.failed_setups(later) == {}
    # A setup recorded again replaces the outcome; a changed model's outcome is stale.
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(copy))
    torchbench_check.store_setups(later, {"tiny_mlp": ("OK", None)})
    assert torchbench_check.failed_setups(installed) == {}
    torchbench_check.store_setups(later, {"tiny_mlp": ("FAIL", "ConnectionError: no data")})
    init = copy / "torchbenchmark" / "models" / "tiny_mlp" / "__init__.py"
    init.write_text(init.read_text() + "\n# edited\n")
    assert torchbench_check.failed_setups(installed) == {}


LONG_LOG_SOFTMAX = '''"""A model whose train step hits a kernel torch has no CPU implementation of (as
cm3leon_generate's train on CPU: log_softmax of a Long tensor)."""

import torch

from ..tiny_mlp import Model as _Tiny


class Model(_Tiny):
    def train(self):
        tokens = torch.zeros(self.batch_size, 4, dtype=torch.long)
        return torch.log_softmax(tokens, dim=-1)
'''


def test_a_failure_in_torchbench_s_own_code_is_named_as_torchbench_s(tmp_path: Path) -> None:
    """A TorchBench model that is offered train on the CPU and then fails inside its own code:
    the error record says it is TorchBench's code, with the file under the checkout."""
    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    _add_model(copy, "long_log_softmax", LONG_LOG_SOFTMAX)
    env = {"NIGHTBENCH_TORCHBENCH_PATH": str(copy)}
    assert "train" in _listing("--check-imports", **env)["torchbench.long_log_softmax"]["modes"]
    proc, record = run_record("torchbench.long_log_softmax", "train", **env)
    assert record["error"].endswith(
        "(in TorchBench's code at torchbenchmark/models/long_log_softmax/__init__.py:12 in train)"
    ), record["error"]
    assert "not implemented for 'Long'" in record["error"]


HF_CONFIGS = """HUGGINGFACE_MODELS = {
    "tiny_hf": (128, 128, 'AutoConfig.from_pretrained("nightbench-fixture/not-cached")', "AutoModel"),
    "tiny_hf_cached": (128, 128, 'AutoConfig.from_pretrained("nightbench-fixture/cached")', "AutoModel"),
    "tiny_hf_code": (128, 128, "BertConfig(num_hidden_layers=1)", "AutoModel"),
}
"""
HF_MODEL = """from ..tiny_mlp import Model as _Tiny


class Model(_Tiny):
    HF_MODEL = True
"""


def test_a_huggingface_model_whose_config_never_downloaded_is_unavailable(tmp_path: Path) -> None:
    """TorchBench's HuggingFace models read their config with ``from_pretrained`` when they are
    built, after the batch size the import check stops at: one whose config is not in the local
    cache (hf_T5_generate, which has no install.py of its own) is unavailable with what it
    needs, not listed available to fail every night at the download; a cached config, or one
    built from code, leaves the model available."""
    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    framework = copy / "torchbenchmark" / "util" / "framework" / "huggingface"
    (framework / "basic_configs.py").write_text(HF_CONFIGS)
    for name in ("tiny_hf_generate", "tiny_hf_cached", "tiny_hf_code"):
        _add_model(copy, name, HF_MODEL)
    hf_home = tmp_path / "hf"
    snapshot = hf_home / "hub" / "models--nightbench-fixture--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    env = {"NIGHTBENCH_TORCHBENCH_PATH": str(copy), "HF_HOME": str(hf_home)}
    models = _listing("--check-imports", **env)
    generate = models["torchbench.tiny_hf_generate"]
    assert not generate["available"] and generate["checked"]
    assert generate["reason"] == (
        "needs huggingface.co: the config of 'nightbench-fixture/not-cached' is not in the local "
        "HuggingFace cache (TorchBench downloads it when the model is built; `nightbench "
        "torchbench install` with network caches it)"
    )
    assert models["torchbench.tiny_hf_cached"]["available"]
    assert models["torchbench.tiny_hf_code"]["available"]
    assert models["torchbench.tiny_mlp"]["available"]
