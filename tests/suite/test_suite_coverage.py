"""``python -m suite coverage``: distinct operators per model and in union, and the paper paths
(torch.distributions, quantized CPU inference, TorchScript, sparse, FFT) of the models that
exercise them."""

from __future__ import annotations

import json

import pytest
import torch

from suite.coverage import ModelCoverage, coverage_json, model_coverage, record_operators, union
from suite.registry import load_model_class
from tests.suite.helpers import run_suite

SMALL_BATCH = 3


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_recorder_names_overload_packets() -> None:
    x = torch.ones(3)
    ops = record_operators(lambda: (x + x, x + 1, torch.tanh(x)))
    assert {"aten::add", "aten::tanh"} <= ops
    assert not any(".Tensor" in op or ".Scalar" in op for op in ops)


def test_coverage_command_reports_models_and_their_union() -> None:
    proc = run_suite(["coverage", "--json", "--models", "ppo", "pyhpc_equation_of_state"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    models = {m["model"]: m for m in doc["models"]}
    assert set(models) == {"ppo", "pyhpc_equation_of_state"}
    for m in models.values():
        assert m["operators"] and m["count"] == len(m["operators"]), m["model"]
        assert m["modes"] == ["train", "eval"] and not m["error"]
        assert all("::" in op for op in m["operators"])
    expected = set(models["ppo"]["operators"]) | set(models["pyhpc_equation_of_state"]["operators"])
    assert set(doc["union"]) == expected and doc["union_count"] == len(expected)
    assert doc["union_aten_count"] == sum(op.startswith("aten::") for op in expected)
    assert doc["failed"] == []


def test_coverage_table_and_a_failing_model_is_reported() -> None:
    proc = run_suite(["coverage", "--models", "ppo", "no_such_model"])
    assert proc.returncode == 1
    assert "union" in proc.stdout and "ppo" in proc.stdout
    assert "no_such_model: UnknownModelError" in proc.stderr


def test_union_is_the_set_union() -> None:
    a = ModelCoverage("a", operators={"aten::add", "aten::mm"})
    b = ModelCoverage("b", operators={"aten::mm", "quantized::linear_dynamic"})
    failed = ModelCoverage("c", error="RuntimeError: boom")
    assert union([a, b, failed]) == {"aten::add", "aten::mm", "quantized::linear_dynamic"}
    doc = coverage_json([a, b, failed])
    assert (doc["union_count"], doc["union_aten_count"], doc["failed"]) == (3, 2, ["c"])


def _coverage(name: str) -> ModelCoverage:
    cov = model_coverage(name, batch_size=SMALL_BATCH)
    assert not cov.error, cov.error
    return cov


def test_sac_runs_torch_distributions() -> None:
    cov = _coverage("sac")
    assert cov.modes == ["train", "eval"]
    # rsample (normal_), the tanh squashing, its log-det (softplus), log_prob (log, exp/pow)
    assert {"aten::normal_", "aten::tanh", "aten::softplus", "aten::softplus_backward",
            "aten::log", "aten::exp", "aten::tanh_backward", "aten::_foreach_addcdiv_"
            } <= cov.operators


def test_deepar_samples_and_scores_a_negative_binomial() -> None:
    cov = _coverage("deepar")
    # log_prob (lgamma, and digamma in its backward); sample (gamma-Poisson)
    assert {"aten::lgamma", "aten::digamma", "aten::_standard_gamma",
            "aten::poisson"} <= cov.operators


def test_quantized_lstm_runs_quantized_kernels_eval_only() -> None:
    cov = _coverage("quantized_lstm")
    assert cov.modes == ["eval"] and "train" in cov.skipped
    assert {"quantized::linear_dynamic", "aten::quantized_lstm"} <= cov.operators
    assert any(op.startswith("quantized::embedding") for op in cov.operators)


def test_style_transfer_runs_torchscript() -> None:
    for mode in ("train", "eval"):
        bench = load_model_class("style_transfer_jit")(mode, "cpu", batch_size=1)
        assert isinstance(bench.model, torch.jit.ScriptModule), mode
    cov = _coverage("style_transfer_jit")
    assert cov.modes == ["train", "eval"]
    assert {"aten::reflection_pad2d_backward", "aten::upsample_nearest2d_backward",
            "aten::_fused_adam_", "aten::to_mkldnn"} <= cov.operators


def test_gcn_runs_sparse_matmul() -> None:
    cov = _coverage("gcn")
    assert cov.modes == ["train", "eval"]
    assert {"aten::_sparse_addmm", "aten::_sparse_coo_tensor_with_dims_and_tensors"} <= cov.operators


def test_fno_runs_fft_and_complex_kernels() -> None:
    cov = _coverage("fno")
    assert cov.modes == ["train", "eval"]
    assert {"aten::_fft_r2c", "aten::_fft_c2r"} <= cov.operators
    assert "aten::view_as_real" in cov.operators or "aten::_conj" in cov.operators
