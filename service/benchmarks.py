"""A benchmark's identity and its one name format: ``model:mode:device[:compiler]``.

A *benchmark* is one model measured in one mode (``train``/``eval``) on one device
(``cpu``/``cuda``) with one compiler (``eager``/``inductor``); see the glossary in docs/architecture.md.
Its name leaves out the default compiler, so ``resnet18:eval:cpu`` and
``resnet18:eval:cuda:inductor``. Every part of the service and the workers builds and parses
names here.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import InvalidInput

MODES = ("train", "eval")
DEVICES = ("cpu", "cuda")
COMPILERS = ("eager", "inductor")
DEFAULT_COMPILER = "eager"


def benchmark_name(model: str, mode: str, device: str, compiler: str = DEFAULT_COMPILER) -> str:
    """``model:mode:device``, with ``:compiler`` unless it is the default (``eager``)."""
    name = f"{model}:{mode}:{device}"
    return name if compiler == DEFAULT_COMPILER else f"{name}:{compiler}"


@dataclass(frozen=True, order=True)
class BenchmarkKey:
    """One benchmark: model, mode, device and compiler.

    Attributes:
        model: the suite model (``python -m suite list``), or ``torchbench.<name>``.
        mode: one of :data:`MODES`.
        device: one of :data:`DEVICES`.
        compiler: one of :data:`COMPILERS`.
    """

    model: str
    mode: str
    device: str = "cpu"
    compiler: str = DEFAULT_COMPILER

    @property
    def name(self) -> str:
        """The benchmark's name (:func:`benchmark_name`)."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)

    @classmethod
    def parse(cls, name: str) -> BenchmarkKey:
        """The key of ``model:mode:device[:compiler]`` (also ``model:mode``: on the CPU).

        Raises:
            InvalidInput: not two to four non-empty parts, or a mode, device or compiler
                outside :data:`MODES`, :data:`DEVICES`, :data:`COMPILERS`.
        """
        parts = name.split(":")
        if not 2 <= len(parts) <= 4 or not all(parts):
            raise InvalidInput(f"benchmark {name!r}: expected model:mode:device[:compiler]")
        model, mode, device, compiler = (parts + ["cpu", DEFAULT_COMPILER][len(parts) - 2 :])[:4]
        for what, value, allowed in (
            ("mode", mode, MODES),
            ("device", device, DEVICES),
            ("compiler", compiler, COMPILERS),
        ):
            if value not in allowed:
                raise InvalidInput(
                    f"benchmark {name!r}: {what} must be one of {', '.join(allowed)}, got {value!r}"
                )
        return cls(model, mode, device, compiler)
