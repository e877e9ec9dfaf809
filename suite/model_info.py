"""What the suite's registry and the TorchBench adapter both need: a model's listing entry, the
``torchbench.`` name prefix, and the source hash behind ``benchmark_version``.

Kept apart so that :mod:`suite.registry` may import :mod:`suite.torchbench` (to resolve
``torchbench.<name>``) without the adapter importing the registry back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TORCHBENCH_PREFIX = "torchbench."
COUNT_SETTINGS = "count_settings"
"""The metadata key of the settings a count series builds a model with (``cpu_instructions``,
:meth:`suite.model.BenchmarkModel.count_settings`)."""
_SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".json"}


@dataclass(frozen=True)
class ModelInfo:
    """What ``python -m suite list --json`` prints for one model."""

    name: str
    domain: str
    task: str
    modes: list[str]
    devices: list[str]
    train_batch_size: dict[str, int]
    eval_batch_size: dict[str, int]
    benchmark_version: str
    compilers: list[str] = field(default_factory=lambda: ["eager", "inductor"])
    suite: str = "nightbench"
    metadata: dict[str, Any] = field(default_factory=dict)
    available: bool = True
    reason: str | None = None  # why it is not available (a missing requirement, say)
    not_implemented: list[str] = field(default_factory=list)  # "test:device" ruled out
    not_offered: dict[str, str] = field(default_factory=dict)  # "test:device" -> why
    checked: bool = True  # False: a TorchBench model whose import was not checked here yet

    @property
    def status(self) -> str:
        """``available``, ``not checked`` or ``unavailable``, as the text listing prints it."""
        if self.available:
            return "available"
        return "unavailable" if self.checked else "not checked"

    def as_json(self) -> dict[str, Any]:
        """The listing's JSON object for this model (``metadata`` left out)."""
        return {
            "name": self.name,
            "domain": self.domain,
            "task": self.task,
            "modes": self.modes,
            "devices": self.devices,
            "compilers": self.compilers,
            "train_batch_size": self.train_batch_size,
            "eval_batch_size": self.eval_batch_size,
            "benchmark_version": self.benchmark_version,
            "suite": self.suite,
            "available": self.available,
            "reason": self.reason,
            "not_implemented": self.not_implemented,
            "not_offered": self.not_offered,
            "checked": self.checked,
        }


def hash_folder(folder: Path, digest: Any | None = None) -> Any:
    """Feed the sources (``.py``, ``.yaml``, ``.yml``, ``.json``) under ``folder`` into a digest.

    Files are taken in sorted order with their relative path, so a rename counts as a change.
    """
    digest = digest if digest is not None else hashlib.sha256()
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in _SOURCE_SUFFIXES and "__pycache__" not in p.parts
    )
    for path in files:
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest
