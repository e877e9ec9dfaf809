"""``python -m suite coverage``: distinct operators per model and in union, the own suite's
breadth against issue 12's target, and the paper paths (torch.distributions, quantized CPU
inference, TorchScript, sparse, FFT, linear algebra) of the models that exercise them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from suite.coverage import ModelCoverage, coverage_json, record_operators, suite_coverage, union
from suite.registry import load_model_class, model_names
from tests.suite.helpers import run_suite

SMALL_BATCH = 3
# Issue 12: the own suite exercises at least this many distinct operators on CPU.
OPERATOR_TARGET = 250
CoverageOf = Callable[[str], ModelCoverage]


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


@pytest.fixture(scope="module")
def own_suite() -> dict[str, ModelCoverage]:
    """Every own model's coverage (one train and one eval step at batch 3), measured once."""
    torch.set_num_threads(1)
    return {cov.model: cov for cov in suite_coverage(model_names(), batch_size=SMALL_BATCH)}


@pytest.fixture
def coverage_of(own_suite: dict[str, ModelCoverage]) -> CoverageOf:
    """The measured coverage of one model, which must have built and run."""

    def get(name: str) -> ModelCoverage:
        cov = own_suite[name]
        assert not cov.error, cov.error
        return cov

    return get


def test_own_suite_reaches_the_operator_target(own_suite: dict[str, ModelCoverage]) -> None:
    """The union of ``python -m suite coverage``, here at batch 3 (the operators a step sends do
    not depend on the batch size for these models)."""
    assert [c.model for c in own_suite.values() if c.error] == []
    ops = union(own_suite.values())
    assert len(ops) >= OPERATOR_TARGET, len(ops)
    assert all(c.operators for c in own_suite.values())


def test_sac_runs_torch_distributions(coverage_of: CoverageOf) -> None:
    cov = coverage_of("sac")
    assert cov.modes == ["train", "eval"]
    # rsample (normal_), the tanh squashing, its log-det (softplus), log_prob (log, exp/pow)
    assert {
        "aten::normal_",
        "aten::tanh",
        "aten::softplus",
        "aten::softplus_backward",
        "aten::log",
        "aten::exp",
        "aten::tanh_backward",
        "aten::_foreach_addcdiv_",
    } <= cov.operators


def test_deepar_samples_and_scores_a_negative_binomial(coverage_of: CoverageOf) -> None:
    cov = coverage_of("deepar")
    # log_prob (lgamma, and digamma in its backward); sample (gamma-Poisson)
    assert {
        "aten::lgamma",
        "aten::digamma",
        "aten::_standard_gamma",
        "aten::poisson",
    } <= cov.operators


def test_quantized_lstm_runs_quantized_kernels_eval_only(coverage_of: CoverageOf) -> None:
    cov = coverage_of("quantized_lstm")
    assert cov.modes == ["eval"] and "train" in cov.skipped
    assert {"quantized::linear_dynamic", "aten::quantized_lstm"} <= cov.operators
    assert any(op.startswith("quantized::embedding") for op in cov.operators)


def test_style_transfer_runs_torchscript(coverage_of: CoverageOf) -> None:
    for mode in ("train", "eval"):
        bench = load_model_class("style_transfer_jit")(mode, "cpu", batch_size=1)
        assert isinstance(bench.model, torch.jit.ScriptModule), mode
    cov = coverage_of("style_transfer_jit")
    assert cov.modes == ["train", "eval"]
    assert {
        "aten::reflection_pad2d_backward",
        "aten::upsample_nearest2d_backward",
        "aten::_fused_adam_",
        "aten::to_mkldnn",
    } <= cov.operators


def test_gcn_runs_sparse_matmul(coverage_of: CoverageOf) -> None:
    cov = coverage_of("gcn")
    assert cov.modes == ["train", "eval"]
    assert {
        "aten::_sparse_addmm",
        "aten::_sparse_coo_tensor_with_dims_and_tensors",
    } <= cov.operators


def test_fno_runs_fft_and_complex_kernels(coverage_of: CoverageOf) -> None:
    cov = coverage_of("fno")
    assert cov.modes == ["train", "eval"]
    assert {"aten::_fft_r2c", "aten::_fft_c2r"} <= cov.operators
    assert "aten::view_as_real" in cov.operators or "aten::_conj" in cov.operators


def test_faster_rcnn_samples_regions_and_normalizes_groups(coverage_of: CoverageOf) -> None:
    cov = coverage_of("faster_rcnn")
    assert cov.modes == ["train", "eval"]
    # RoIAlign through affine_grid + grid_sample, GroupNorm, hardswish/SE, Fast NMS (triu)
    assert {
        "aten::affine_grid_generator",
        "aten::grid_sampler_2d",
        "aten::grid_sampler_2d_backward",
        "aten::native_group_norm_backward",
        "aten::hardswish_backward",
        "aten::hardsigmoid_backward",
        "aten::triu",
    } <= cov.operators


def test_glow_runs_determinants_and_inverses(coverage_of: CoverageOf) -> None:
    cov = coverage_of("glow")
    # slogdet and its backward (an LU solve); sampling inverts the 1x1 convolutions
    assert {
        "aten::_linalg_slogdet",
        "aten::linalg_lu_solve",
        "aten::linalg_inv_ex",
        "aten::pixel_unshuffle",
        "aten::pixel_shuffle",
    } <= cov.operators


def test_deep_kernel_gp_runs_cholesky_and_triangular_solves(coverage_of: CoverageOf) -> None:
    cov = coverage_of("deep_kernel_gp")
    assert {
        "aten::_cdist_forward",
        "aten::_cdist_backward",
        "aten::linalg_cholesky_ex",
        "aten::cholesky_solve",
        "aten::linalg_solve_triangular",
    } <= cov.operators


def test_nsnet2_runs_stft_and_istft(coverage_of: CoverageOf) -> None:
    cov = coverage_of("nsnet2")
    # stft (reflect padding, real FFT), istft (inverse FFT, overlap-add as unfold_backward)
    assert {
        "aten::_fft_r2c",
        "aten::_fft_c2r",
        "aten::reflection_pad1d_backward",
        "aten::unfold_backward",
        "aten::angle",
        "aten::polar",
    } <= cov.operators


def test_two_tower_runs_weighted_bags_and_sparse_adagrad(coverage_of: CoverageOf) -> None:
    cov = coverage_of("two_tower")
    assert {
        "aten::_embedding_bag",
        "aten::bucketize",
        "aten::_coalesce",
        "aten::sparse_mask",
    } <= cov.operators


def test_schnet_differentiates_a_backward(coverage_of: CoverageOf) -> None:
    cov = coverage_of("schnet")
    # neighbour sums; softplus's double backward (sigmoid_backward: schnet has no sigmoid)
    assert {
        "aten::index_select",
        "aten::index_add",
        "aten::softplus_backward",
        "aten::sigmoid_backward",
    } <= cov.operators
