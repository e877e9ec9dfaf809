"""Interop with TorchBench (pytorch/benchmark): its result JSON, and its models as an extra suite.

Result JSON (TorchBench's userbenchmark and pytest-benchmark formats, both ways) lives in
:mod:`suite.torchbench_results`, which needs no torch; its functions are re-exported here.

TorchBench's models. With a checkout (``NIGHTBENCH_TORCHBENCH_PATH``, or ``torchbenchmark``
importable), ``torchbench.<name>`` runs ``torchbenchmark.models.<name>.Model`` through the
suite's harness (:func:`adapter_class`), train and eval through TorchBench's own ``invoke()``;
listing reads the checkout's files only (:mod:`suite.torchbench_checkout`). Without one, every
entry point raises :class:`TorchBenchUnavailable` with the reason, and ``python -m suite list
--suite torchbench`` prints it and lists nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from suite import torchbench_checkout as checkout
from suite.foreign_code import register_foreign_code
from suite.model import COMPILERS, DEVICES, TESTS, BenchmarkModel
from suite.model_info import TORCHBENCH_PREFIX, ModelInfo
from suite.torchbench_checkout import TorchBenchUnavailable
from suite.torchbench_results import (  # noqa: F401  (re-exported)
    INDUCTOR_ARGS,
    TorchBenchFormatError,
    from_pytest_benchmark,
    from_torchbench,
    from_userbenchmark,
    to_userbenchmark,
)

# ---------------------------------------------------------------------------------------------
# TorchBench's models as an extra suite
# ---------------------------------------------------------------------------------------------


def _import_torchbenchmark() -> Any:
    try:
        root = checkout.put_on_path()
    except checkout.InvalidCheckout as exc:
        raise TorchBenchUnavailable(str(exc)) from exc
    # A failure inside the checkout is TorchBench's own (a model's bug on this device).
    register_foreign_code(root / "torchbenchmark", "TorchBench")
    try:
        return importlib.import_module("torchbenchmark")
    except Exception as exc:  # noqa: BLE001 - any import failure means the suite is unavailable
        raise TorchBenchUnavailable(f"importing 'torchbenchmark' failed: {exc}") from exc


def available() -> bool:
    """Whether TorchBench's models can be run here."""
    try:
        _import_torchbenchmark()
    except TorchBenchUnavailable:
        return False
    return True


def model_names() -> list[str]:
    """Names of TorchBench's models (folders of ``torchbenchmark/models`` with an ``__init__.py``).

    Raises:
        TorchBenchUnavailable: no checkout configured or importable.
    """
    try:
        return checkout.model_names()
    except checkout.InvalidCheckout as exc:
        raise TorchBenchUnavailable(str(exc)) from exc


def _tb_model_class(name: str) -> type:
    _import_torchbenchmark()
    checkout.model_dir(name)  # LookupError for an unknown model
    module = importlib.import_module(f"torchbenchmark.models.{name}")
    cls = getattr(module, "Model", None)
    if not isinstance(cls, type):
        raise TypeError(f"torchbenchmark.models.{name} has no class Model")
    return cls


def _suite_contract() -> bytes:
    return (Path(__file__).parent / "model.py").read_bytes()


def benchmark_version(name: str) -> str:
    """The version of a TorchBench model's series (:func:`suite.torchbench_checkout.benchmark_version`).

    Raises:
        TorchBenchUnavailable: no checkout configured or importable.
        LookupError: no such TorchBench model.
    """
    try:
        return checkout.benchmark_version(name, _suite_contract())
    except checkout.InvalidCheckout as exc:
        raise TorchBenchUnavailable(str(exc)) from exc


def list_models(*, check_imports: bool = False) -> list[ModelInfo]:
    """Listing entries of TorchBench's models: read from files (no model is imported here), then
    as this environment's import check has them (:mod:`suite.torchbench_check`): a model is
    available only once its import passed, "not checked" before, and lists the tests and batch
    sizes TorchBench's construction decided; one whose TorchBench setup FAILED here (as
    ``nightbench torchbench install`` recorded it: data or weights never downloaded) is not
    available either. With ``check_imports`` the models not checked yet are checked now (a
    subprocess per batch) and cached.

    Raises:
        TorchBenchUnavailable: no checkout configured or importable.
        suite.torchbench_checkout.InvalidCheckout: the configured path is not a checkout.
        OSError: the import check's cache cannot be written.
    """
    from suite import torchbench_check

    entries = checkout.list_models(_suite_contract())
    names = [e.name[len(TORCHBENCH_PREFIX) :] for e in entries if e.available]
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    identity, found = torchbench_check.checks(names, devices=devices, run=check_imports)
    failed = torchbench_check.failed_setups(identity)
    out = []
    for entry in entries:
        name = entry.name[len(TORCHBENCH_PREFIX) :]
        checked = torchbench_check.apply(entry, found.get(name))
        if checked.available and name in failed:
            checked = replace(checked, available=False, reason=failed[name])
        out.append(checked)
    return out


class TorchBenchAdapter(BenchmarkModel):
    """A TorchBench model through the suite's harness; :func:`adapter_class` makes one subclass
    per model, setting ``tb_cls`` (its ``Model``) and ``tb_metadata`` (its metadata.yaml)."""

    tb_cls: type
    tb_metadata: dict[str, Any] = {}

    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        if test not in TESTS or device not in DEVICES:
            raise NotImplementedError(f"unsupported test {test!r} or device {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("device 'cuda' requested but CUDA is not available")
        ruled_out = checkout.unsupported(self.tb_metadata, test, device)
        if ruled_out:
            raise NotImplementedError(ruled_out)
        self.test = test
        self.device = device
        self.batch_size = batch_size  # type: ignore[assignment]  # TorchBench's default if None
        self.optimizer = None
        self.inner: Any = None

    def set_compiler(self, compiler: str) -> None:
        """Build TorchBench's model, with ``--torchdynamo inductor`` for the inductor compiler."""
        if compiler not in COMPILERS:
            raise NotImplementedError(f"compiler must be one of {COMPILERS}, got {compiler!r}")
        extra = INDUCTOR_ARGS if compiler == "inductor" else []
        self.inner = self.tb_cls(
            test=self.test, device=self.device, batch_size=self.batch_size, extra_args=list(extra)
        )
        self.batch_size = getattr(self.inner, "batch_size", self.batch_size)

    def _built(self) -> Any:
        if self.inner is None:
            self.set_compiler("eager")
        return self.inner

    def get_module(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        """TorchBench's ``get_module()``: the module and its example inputs."""
        return self._built().get_module()

    # TorchBench's own invoke(): its run contexts (eval under no_grad, as TorchBench measures
    # it) and the staged train step (forward, backward, optimizer_step) of the models that have
    # no train().
    def train(self) -> None:
        """One train step, as TorchBench's ``invoke()`` runs it."""
        self._built().invoke()

    def eval(self) -> Any:
        """One eval step, as TorchBench's ``invoke()`` runs it."""
        return self._built().invoke()


def adapter_class(name: str) -> type[BenchmarkModel]:
    """A suite model class that runs ``torchbenchmark.models.<name>.Model``.

    TorchBench's model is built in :meth:`TorchBenchAdapter.set_compiler` (the harness calls it
    right after construction, before the memory baseline), because TorchBench takes the
    compiler as an extra argument at construction (``--torchdynamo inductor``). A configuration
    its metadata.yaml marks ``not_implemented``, and TorchBench's own ``NotImplementedError``,
    are unsupported configurations (``NotImplementedError``).

    Raises:
        TorchBenchUnavailable: no checkout configured or importable.
        LookupError: no such TorchBench model.
    """
    tb_cls = _tb_model_class(name)
    domain, task, _, _ = checkout.describe(name)
    return type(
        f"TorchBench_{name}",
        (TorchBenchAdapter,),
        {
            "__doc__": f"TorchBench's {name} through the suite's harness.",
            "tb_cls": tb_cls,
            "tb_metadata": checkout.read_metadata(name),
            "name": TORCHBENCH_PREFIX + name,
            "metadata": {"domain": domain, "task": task, "suite": "torchbench"},
        },
    )
