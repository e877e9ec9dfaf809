"""Every suite model runs a real forward and backward (train) and a forward (eval) on CPU."""

from __future__ import annotations

import pytest
import torch

from suite.registry import list_models, load_model_class

MODELS = [m.name for m in list_models()]
# A model whose metadata lists no train mode (quantized inference) is checked to refuse it.
TRAINED = [m.name for m in list_models() if "train" in m.modes]
EVAL_ONLY = [m.name for m in list_models() if "train" not in m.modes]
SMALL_BATCH = 3
# The dimension of the first eval output that holds the batch (0 unless listed).
BATCH_DIM = {"pyhpc_isoneutral_mixing": 1}  # (components, x, y, z): the batch is the x extent


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def _trained_tensors(bench: object) -> list[torch.Tensor]:
    optimizer = getattr(bench, "optimizer", None)
    assert optimizer is not None, "train mode must set self.optimizer"
    return [p for group in optimizer.param_groups for p in group["params"]]


def _flatten(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for item in out for t in _flatten(item)]
    return []


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """Quantized weights compare by their integers and scales, sparse tensors densely."""
    if t.layout != torch.strided:
        return t.to_dense()
    if t.is_quantized:
        scales = (
            t.q_per_channel_scales()
            if t.qscheme() in (torch.per_channel_affine, torch.per_channel_affine_float_qparams)
            else torch.tensor([t.q_scale()])
        )
        return torch.cat([t.int_repr().flatten().double(), scales.double()])
    return t


def _state_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor of the state dict, packed quantized parameters unpacked."""
    out: list[torch.Tensor] = []
    for value in module.state_dict().values():
        if isinstance(value, torch.Tensor):
            out.append(_comparable(value))
        elif isinstance(value, tuple | list):
            out += [_comparable(t) for t in _flatten(value)]
    return out


@pytest.mark.parametrize("name", EVAL_ONLY)
def test_eval_only_model_refuses_train(name: str) -> None:
    with pytest.raises(NotImplementedError, match="train"):
        load_model_class(name)("train", "cpu", batch_size=SMALL_BATCH)


@pytest.mark.parametrize("name", TRAINED)
def test_train_step_updates_what_it_trains(name: str) -> None:
    cls = load_model_class(name)
    bench = cls("train", "cpu", batch_size=SMALL_BATCH)
    assert bench.batch_size == SMALL_BATCH
    module, inputs = bench.get_module()
    assert isinstance(module, torch.nn.Module) and isinstance(inputs, tuple)
    tensors = _trained_tensors(bench)
    before = [t.detach().clone() for t in tensors]
    bench.train()
    bench.train()
    grads = [t.grad for t in tensors if t.grad is not None]
    assert grads, f"{name}: train() left no gradient on the optimized tensors"
    grad_values = [g.coalesce().values() if g.is_sparse else g for g in grads]
    assert all(torch.isfinite(g).all() for g in grad_values), f"{name}: non-finite gradient"
    changed = sum(not torch.equal(b, t.detach()) for b, t in zip(before, tensors, strict=True))
    assert changed > 0, f"{name}: the optimizer step changed nothing"


@pytest.mark.parametrize("name", MODELS)
def test_eval_forward_is_finite_and_batched(name: str) -> None:
    cls = load_model_class(name)
    bench = cls("eval", "cpu", batch_size=SMALL_BATCH)
    outputs = _flatten(bench.eval())
    assert outputs, f"{name}: eval() returned no tensor"
    for out in outputs:
        assert not out.requires_grad, f"{name}: eval must run under no_grad"
        if out.is_floating_point():
            assert torch.isfinite(out).all(), f"{name}: non-finite eval output"
    assert outputs[0].shape[BATCH_DIM.get(name, 0)] == SMALL_BATCH, name


@pytest.mark.parametrize("name", MODELS)
def test_model_is_seeded(name: str) -> None:
    """Two builds give the same weights and inputs: results are reproducible across processes."""
    cls = load_model_class(name)
    a, b = cls("eval", "cpu", batch_size=1), cls("eval", "cpu", batch_size=1)
    for pa, pb in zip(_state_tensors(a.model), _state_tensors(b.model), strict=True):
        assert torch.equal(pa, pb)
    for ia, ib in zip(_flatten(a.example_inputs), _flatten(b.example_inputs), strict=True):
        assert torch.equal(_comparable(ia), _comparable(ib))


def test_cuda_request_without_cuda_is_not_implemented() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(NotImplementedError, match="cuda"):
        load_model_class("resnet18")("train", "cuda")


def test_lstm_lm_runs_the_resized_cuda_batches() -> None:
    """On CUDA, lstm_lm's default batches are the ones measured steady from process to process
    on an H200 (train 512, eval 1024: spread 0.2-0.4%, against 6-13% at 128 and 256;
    docs/benchmarks.md, "GPU measurement setup"); CPU keeps its own."""
    cls = load_model_class("lstm_lm")
    assert cls.default_batch_size("train", "cuda") == 512
    assert cls.default_batch_size("eval", "cuda") == 1024
    assert (cls.default_batch_size("train", "cpu"), cls.default_batch_size("eval", "cpu")) == (
        8,
        16,
    )


def test_unknown_compiler_is_not_implemented() -> None:
    bench = load_model_class("lstm_lm")("eval", "cpu", batch_size=1)
    with pytest.raises(NotImplementedError, match="compiler"):
        bench.set_compiler("tensorrt")


def test_a_count_builds_style_transfer_jit_at_its_count_image_and_the_timed_run_keeps_its_own() -> (
    None
):
    """style_transfer_jit's count steps a 32-pixel image (its metadata's ``count_settings``);
    outside the count, and after a count that failed, the model is built at its own 96 pixels."""
    cls = load_model_class("style_transfer_jit")
    with cls.count_settings() as settings:
        counted = cls("eval", "cpu", batch_size=2)
    assert settings == {"image_size": {"cpu": 32, "cuda": 32}}
    assert tuple(counted.example_inputs[0].shape) == (2, 3, 32, 32)
    assert tuple(counted.eval()[0].shape) == (2, 3, 32, 32)
    with pytest.raises(RuntimeError, match="the count failed"), cls.count_settings():
        raise RuntimeError("the count failed")
    assert tuple(cls("eval", "cpu", batch_size=2).example_inputs[0].shape) == (2, 3, 96, 96)


def test_a_model_without_count_settings_counts_as_it_runs() -> None:
    cls = load_model_class("dqn")
    with cls.count_settings() as settings:
        assert settings == {}
        assert cls.metadata.get("count_settings") is None
