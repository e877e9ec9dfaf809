"""Operator coverage of the suite: which distinct operators the models exercise.

Method: the operator-coverage measure of the TorchBench paper (Hao et al., "TorchBench:
Benchmarking PyTorch with High API Surface Coverage", arXiv:2304.14226, section 3): run the
models under a :class:`torch.utils._python_dispatch.TorchDispatchMode` that records every
operator reaching the dispatcher, and count the distinct ones. Here a model contributes one
training iteration (forward, loss, backward, optimizer step) and one inference iteration on CPU,
each built as the harness builds it (metadata batch size, seeded). An operator is counted once per
overload packet, named with its namespace (``aten::add`` for ``aten.add.Tensor`` and
``aten.add.Scalar``); operators of other namespaces (``quantized::linear_dynamic``) are kept and
counted apart, so that the ``aten`` count stays comparable with the paper's.

The dispatch mode sees what the dispatcher runs below autograd: backward kernels
(``aten::tanh_backward``), optimizer kernels (``aten::_foreach_add_``) and the operators a
TorchScript interpreter calls all count; Python-level helpers that never reach the dispatcher do
not. Construction (weights, inputs, quantization, scripting) is outside the recorded region.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from suite.model import TESTS, BenchmarkModel
from suite.registry import load_model_class

ATEN = "aten"


class OperatorRecorder(TorchDispatchMode):
    """A dispatch mode that records the overload packet of every operator it sees.

    Attributes:
        operators: the qualified names seen so far (``namespace::name``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.operators: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.operators.add(operator_name(func))
        return func(*args, **(kwargs or {}))


def operator_name(func: Any) -> str:
    """``namespace::name`` of the overload packet of ``func`` (an ``OpOverload``).

    Args:
        func: the operator overload the dispatcher hands to ``__torch_dispatch__``.

    Returns:
        For example ``"aten::add"`` for ``torch.ops.aten.add.Tensor``.
    """
    packet = getattr(func, "overloadpacket", func)
    qualified = getattr(packet, "_qualified_op_name", None)
    if qualified:
        return str(qualified)
    return str(packet).replace(".", "::", 1)


def record_operators(step: Callable[[], object]) -> set[str]:
    """The distinct operators one call of ``step`` sends to the dispatcher.

    Args:
        step: a callable such as a model's ``train`` or ``eval``.

    Returns:
        Qualified overload-packet names (``aten::mm``, ``quantized::linear_dynamic``).
    """
    recorder = OperatorRecorder()
    with recorder:
        step()
    return recorder.operators


@dataclass
class ModelCoverage:
    """The operators of one model, or why it could not be measured.

    Attributes:
        model: the suite model name.
        operators: qualified names over the modes that ran.
        modes: the modes that ran (a mode the model marks unsupported is skipped).
        skipped: mode -> reason, for modes the model does not support.
        error: why the model failed to build or run (empty when it did not fail).
    """

    model: str
    operators: set[str] = field(default_factory=set)
    modes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def aten(self) -> set[str]:
        """The ``aten::`` operators only."""
        return {op for op in self.operators if op.startswith(f"{ATEN}::")}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping: sorted operator list, counts, modes, skips, error."""
        return {
            "model": self.model,
            "operators": sorted(self.operators),
            "count": len(self.operators),
            "aten_count": len(self.aten),
            "modes": list(self.modes),
            "skipped": dict(self.skipped),
            "error": self.error,
        }


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _declared_modes(cls: type[BenchmarkModel]) -> list[str]:
    return [m for m in TESTS if m in cls.metadata.get("modes", list(TESTS))]


def model_coverage(
    name: str, *, device: str = "cpu", batch_size: int | None = None
) -> ModelCoverage:
    """Record the operators of one train and one eval iteration of model ``name``.

    Each mode is built fresh (the harness's way); a mode the model marks unsupported (not in its
    metadata's ``modes``, or ``NotImplementedError`` at build) is skipped with the reason. Any
    other failure is recorded in ``error`` and never raised.

    Args:
        name: a suite model name.
        device: ``"cpu"`` (the measure's device) or ``"cuda"``.
        batch_size: overrides the metadata's batch size (tests use small ones).

    Returns:
        The model's coverage; ``operators`` holds the union over the modes that ran.
    """
    result = ModelCoverage(model=name)
    try:
        cls = load_model_class(name)
        modes = _declared_modes(cls)
        for mode in TESTS:
            if mode not in modes:
                result.skipped[mode] = f"{name} does not support test {mode!r}"
                continue
            try:
                bench = cls(mode, device, batch_size=batch_size)
            except NotImplementedError as exc:
                result.skipped[mode] = str(exc)
                continue
            result.operators |= record_operators(bench.train if mode == "train" else bench.eval)
            result.modes.append(mode)
    except Exception as exc:  # noqa: BLE001 - a model that fails is reported, not a crash
        result.error = _describe(exc)
    return result


def suite_coverage(
    names: Sequence[str], *, device: str = "cpu", batch_size: int | None = None
) -> list[ModelCoverage]:
    """:func:`model_coverage` of each model in ``names``, in order.

    Args:
        names: suite model names.
        device: the device to run on.
        batch_size: overrides every model's batch size.

    Returns:
        One entry per name; failures carry their ``error``.
    """
    return [model_coverage(n, device=device, batch_size=batch_size) for n in names]


def union(coverages: Iterable[ModelCoverage]) -> set[str]:
    """The set union of the models' operators.

    Args:
        coverages: per-model results.

    Returns:
        Every qualified operator name seen by at least one model.
    """
    out: set[str] = set()
    for cov in coverages:
        out |= cov.operators
    return out


def coverage_json(coverages: Sequence[ModelCoverage], *, device: str = "cpu") -> dict[str, Any]:
    """The JSON document of ``python -m suite coverage --json``.

    Args:
        coverages: per-model results.
        device: the device they ran on.

    Returns:
        ``{"method", "device", "torch", "models": [...], "union": [...], "union_count",
        "union_aten_count", "failed": [...]}``; counts are numbers of distinct operators.
    """
    all_ops = union(coverages)
    return {
        "method": "TorchDispatchMode overload packets, one train and one eval iteration",
        "device": device,
        "torch": torch.__version__,
        "models": [c.to_json() for c in coverages],
        "union": sorted(all_ops),
        "union_count": len(all_ops),
        "union_aten_count": sum(op.startswith(f"{ATEN}::") for op in all_ops),
        "failed": [c.model for c in coverages if c.error],
    }


__all__ = [
    "ModelCoverage",
    "OperatorRecorder",
    "coverage_json",
    "model_coverage",
    "operator_name",
    "record_operators",
    "suite_coverage",
    "union",
]
