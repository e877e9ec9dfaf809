"""TorchBench's model contract.

Every benchmark model lives in ``suite/models/<name>/__init__.py`` as
``class Model(BenchmarkModel)``
next to a ``metadata.yaml``. The contract follows pytorch/benchmark
(``torchbenchmark/util/model.py`` and ``torchbenchmark/models/ADDING_MODELS.md``):

- ``__init__(test, device, batch_size=None)`` builds the module and example inputs with random
  weights from code or configs (never downloaded), seeded, on ``device``;
- ``get_module()`` returns ``(module, example_inputs)``;
- ``train()`` runs one training iteration (forward, loss, backward, optimizer step);
- ``eval()`` runs one inference forward under ``torch.no_grad()`` and returns its outputs;
- an unsupported configuration raises ``NotImplementedError`` with the reason.

``metadata.yaml`` keys read here: ``modes``, ``devices``, ``compilers`` (default: all),
``train_batch_size`` and ``eval_batch_size`` (``{cpu: n, cuda: n}``); model-specific sizes are read
with :meth:`BenchmarkModel.setting`, which accepts a scalar or a ``{cpu: .., cuda: ..}`` mapping.
``count_settings`` (optional) gives settings the instruction count builds the model with instead
of its own (:meth:`BenchmarkModel.count_settings`): a smaller image for a model whose full-size
step costs too long under valgrind.

Precision: fp32 everywhere. On CUDA the TF32 switches are left at PyTorch's defaults (matmul
``torch.backends.cuda.matmul`` in full fp32, cuDNN convolutions allowed to use TF32); the harness
records them in the environment so that a change of default starts a new series.

Subclasses keep the module in ``self.model``, the inputs in ``self.example_inputs`` and, for
training, the optimizer in ``self.optimizer``; ``train``/``eval`` must go through ``self.model``
so that :meth:`BenchmarkModel.set_compiler` can wrap it with ``torch.compile``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from suite.model_info import COUNT_SETTINGS

SEED = 1337
TESTS = ("train", "eval")
DEVICES = ("cpu", "cuda")
COMPILERS = ("eager", "inductor")


def set_seed(seed: int = SEED) -> None:
    """Seed Python, torch (CPU and CUDA) so that weights and inputs are reproducible."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is optional for the suite
        pass


class BenchmarkModel:
    """Base class of every suite model (TorchBench's ``BenchmarkModel``).

    Attributes:
        name: the model's folder name, set by the registry.
        metadata: the parsed ``metadata.yaml`` (domain, batch sizes per device and mode, ...).
        test: ``"train"`` or ``"eval"``.
        device: ``"cpu"`` or ``"cuda"``.
        batch_size: the batch size in use (from the argument, else the metadata).
    """

    name: ClassVar[str] = ""
    metadata: ClassVar[dict[str, Any]] = {}

    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        if test not in TESTS:
            raise NotImplementedError(f"test must be one of {TESTS}, got {test!r}")
        if device not in DEVICES:
            raise NotImplementedError(f"device must be one of {DEVICES}, got {device!r}")
        supported = self.metadata.get("devices", list(DEVICES))
        if device not in supported:
            raise NotImplementedError(f"{self.name} does not support device {device!r}")
        modes = self.metadata.get("modes", list(TESTS))
        if test not in modes:
            raise NotImplementedError(f"{self.name} does not support test {test!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError(
                "device 'cuda' requested but torch.cuda.is_available() is False"
            )
        self.test = test
        self.device = device
        self.batch_size = (
            batch_size if batch_size is not None else self.default_batch_size(test, device)
        )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self.model: torch.nn.Module
        self.example_inputs: tuple[Any, ...]
        self.optimizer: torch.optim.Optimizer | None = None
        set_seed()

    @classmethod
    def default_batch_size(cls, test: str, device: str) -> int:
        """The metadata's batch size for ``test`` on ``device``.

        Read from ``{test}_batch_size: {device: n}``; a missing device falls back to ``cpu``.

        Raises:
            NotImplementedError: the metadata gives no batch size for ``test``.
        """
        sizes = cls.metadata.get(f"{test}_batch_size", {})
        if device in sizes:
            return int(sizes[device])
        if "cpu" in sizes:
            return int(sizes["cpu"])
        raise NotImplementedError(
            f"{cls.name}: metadata.yaml gives no {test}_batch_size for {device}"
        )

    @classmethod
    def setting(cls, key: str, device: str, default: Any = None) -> Any:
        """A metadata value for ``device``: ``key: v`` or ``key: {cpu: v1, cuda: v2}``.

        A per-device mapping without an entry for ``device`` falls back to its ``cpu`` entry.
        """
        value = cls.metadata.get(key, default)
        if isinstance(value, dict):
            return value.get(device, value.get("cpu", default))
        return value

    @classmethod
    @contextmanager
    def count_settings(cls) -> Iterator[dict[str, Any]]:
        """While open, :meth:`setting` reads the metadata's ``count_settings`` over the model's
        own settings: what the instruction count (``suite/counting.py``) builds and steps the
        model with.

        A count runs each step under valgrind, about a thousand times slower than natively for
        some kernels (style_transfer_jit's convolution backward: 441 s of CPU a step at its
        96-pixel image, docs/benchmarks.md); the framework and Python work a count watches does
        not grow with the input, so such a model counts a smaller one. The overrides are part
        of the model's ``metadata.yaml``, so of its benchmark version, and the count record
        carries them (``environment["counter"]["settings"]``).

        Yields:
            The settings overridden, ``{}`` when the metadata has none.
        """
        overrides = dict(cls.metadata.get(COUNT_SETTINGS) or {})
        if not overrides:
            yield {}
            return
        own = cls.metadata
        cls.metadata = {**own, **overrides}
        try:
            yield overrides
        finally:
            cls.metadata = own

    def get_module(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        """Return ``(module, example_inputs)`` as TorchBench does."""
        return self.model, self.example_inputs

    def set_compiler(self, compiler: str) -> None:
        """Wrap ``self.model`` for the compiler axis: ``eager`` (no-op) or ``inductor``.

        Raises:
            NotImplementedError: for an unknown compiler name.
        """
        supported = self.metadata.get("compilers", list(COMPILERS))
        if compiler in COMPILERS and compiler not in supported:
            raise NotImplementedError(f"{self.name} does not support compiler {compiler!r}")
        if compiler == "eager":
            return
        if compiler == "inductor":
            self.model = torch.compile(self.model, backend="inductor")  # type: ignore[assignment]
            return
        raise NotImplementedError(f"compiler must be one of {COMPILERS}, got {compiler!r}")

    def train(self) -> None:
        """One training iteration: forward, loss, backward, optimizer step."""
        raise NotImplementedError(f"{self.name} does not implement train")

    def eval(self) -> Any:
        """One inference forward under ``torch.no_grad()``; returns the outputs."""
        raise NotImplementedError(f"{self.name} does not implement eval")
