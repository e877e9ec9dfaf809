"""Code of another suite the harness runs, and whose it is (a TorchBench checkout).

A failure raised in such code is that suite's own (a TorchBench model's bug on this device),
and its error text says so (:func:`suite.harness.describe_failure`). Kept apart from the
harness so that the suites which register their code need not import the harness.
"""

from __future__ import annotations

import os
from pathlib import Path

_FOREIGN_CODE: dict[str, str] = {}  # real path of a root -> whose code it is


def register_foreign_code(root: Path, owner: str) -> None:
    """Name failures raised in the code under ``root`` as ``owner``'s own, e.g. a TorchBench
    checkout: ``"... (in TorchBench's code at torchbenchmark/models/x/__init__.py:50 in train)"``
    (see :func:`suite.harness.describe_failure`), so that a bug of that suite on this device
    reads as TorchBench's, not as the build's under test nor nightbench's."""
    _FOREIGN_CODE[os.path.realpath(root)] = owner


def foreign_owner(filename: str) -> tuple[str, str] | None:
    """``(owner, path relative to the root's parent)`` when ``filename`` lies under registered
    foreign code (:func:`register_foreign_code`), else None."""
    real = os.path.realpath(filename)
    for root, owner in _FOREIGN_CODE.items():
        if real.startswith(root + os.sep):
            return owner, os.path.relpath(real, os.path.dirname(root))
    return None
