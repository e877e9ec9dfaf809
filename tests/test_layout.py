"""The house rules that no linter here checks: no ``_private`` name imported across modules.

Complexity (ruff C90), docstrings (ruff D), formatting (``ruff format --check``), types (mypy)
and the import contracts (import-linter) run in ``make lint``. Sizes are not counted: a module
may be long when it is one job, and a split is made by interface. A name imported by another
module is part of that module's interface and is spelled without the leading underscore; a cut
that needs a sibling's ``_private`` names is the wrong cut. Tests and benchmarks are held to the
same rule: they reach a module through what it offers.

``KNOWN`` is the ratchet for what imported private names when the rule was set: it may shrink
but not grow, and an entry leaves it once the import is gone.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "workers", "suite")
CHECKED = (*PACKAGES, "tests", "benchmarks")

# "importing/module.py -> package.module._name": may only shrink.
KNOWN: frozenset[str] = frozenset(
    {
        "tests/api/test_points.py -> service.results.routes._payload",
        "tests/api/test_status_listeners.py -> workers.cli.status._tables",
        "tests/suite/test_suite_harness.py -> suite.harness._prepare_injection",
        "tests/workers/bisect/test_bisect_cli.py -> workers.cli.bisect._bisect_inputs",
        "tests/workers/test_cli_runs_change.py -> workers.cli.runs._change",
        "benchmarks/suite_harness_overhead.py -> suite.harness._timed_loop",
    }
)


def _modules() -> list[Path]:
    return [f for p in CHECKED for f in sorted((ROOT / p).rglob("*.py"))]


def private_imports(path: Path, root: Path = ROOT) -> set[str]:
    """The ``_private`` names ``path`` imports from another module of the project.

    Returns ``{"path -> package.module._name", ...}``; a module importing its own package's
    ``__init__`` names, dunder names and relative imports are not counted.
    """
    text = path.read_text()
    name = str(path.relative_to(root) if path.is_relative_to(root) else path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module.split(".")[0] not in PACKAGES:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.add(f"{name} -> {node.module}.{alias.name}")
    return found


def test_layout_sees_the_packages() -> None:
    modules = _modules()
    assert any(m.parts[-2:] == ("workers", "tasks.py") for m in modules)
    assert any(m.parts[-2:] == ("tests", "test_layout.py") for m in modules)


def test_private_imports_are_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from service.metrics import _row, metric\n"
        "from service import __version__\n"
        "from numpy import _private\n"
        "from . import _sibling\n"
    )
    assert private_imports(module, tmp_path) == {"m.py -> service.metrics._row"}


def test_no_private_name_is_imported_across_modules() -> None:
    found = set().union(*(private_imports(path) for path in _modules()))
    new = sorted(found - KNOWN)
    assert new == [], (
        "a _private name imported from another module (make it public, or cut elsewhere):\n"
        + "\n".join(new)
    )


def test_the_ratchet_lists_only_what_is_still_imported() -> None:
    found = set().union(*(private_imports(path) for path in _modules()))
    gone = sorted(KNOWN - found)
    assert gone == [], "no longer imported, remove from KNOWN:\n" + "\n".join(gone)


def test_a_deprecation_warned_from_our_code_fails_the_tests() -> None:
    with pytest.raises(DeprecationWarning, match="old API"):
        warnings.warn_explicit(
            "old API", DeprecationWarning, "service/x.py", 1, module="service.results.history"
        )
    warnings.warn_explicit(
        "a library's old API", DeprecationWarning, "lib.py", 1, module="somelibrary.sub"
    )  # ignored: not ours
