"""The house rules that no linter here checks: no module over 500 lines, no function over 60.

Complexity (ruff C90), docstrings (ruff D), types (mypy) and the import contracts
(import-linter) run in ``make lint``; sizes are counted here, over ``service``, ``workers`` and
``suite`` (the suite's model zoo excepted: those modules are the code being measured, kept
close to the originals they stand for).

``OVERSIZE`` is the ratchet for what was over the limits when they were set: a listed module or
function may shrink but not grow, and leaves the list once it fits; anything new over a limit
fails.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "workers", "suite")
EXCLUDED = (ROOT / "suite" / "models", ROOT / "suite" / "demo_models")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

# "path" -> lines of a module, "path::function" -> lines of a function; may only go down.
OVERSIZE: dict[str, int] = {
}


def _modules() -> list[Path]:
    files = [f for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py"))]
    return [f for f in files if not any(f.is_relative_to(e) for e in EXCLUDED)]


def _sizes(path: Path) -> dict[str, int]:
    """Lines of the module (key: its path) and of each function (key: ``path::name``)."""
    text = path.read_text()
    name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    sizes = {name: text.count("\n")}
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            key = f"{name}::{node.name}"
            sizes[key] = max(length, sizes.get(key, 0))
    return sizes


def _too_long(path: Path) -> dict[str, int]:
    """What in ``path`` is over its limit, as key -> lines."""
    return {key: lines for key, lines in _sizes(path).items()
            if lines > (MAX_FUNCTION_LINES if "::" in key else MAX_MODULE_LINES)}


def test_layout_sees_the_packages() -> None:
    modules = _modules()
    assert any(m.parts[-2:] == ("workers", "tasks.py") for m in modules)
    assert not any(m.is_relative_to(ROOT / "suite" / "models") for m in modules)


def test_too_long_counts_lines(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_module = tmp_path / "long.py"
    long_module.write_text(f"def f() -> None:\n{body}\n" + "\n" * MAX_MODULE_LINES)
    found = _too_long(long_module)
    assert found == {str(long_module): MAX_MODULE_LINES + 61, f"{long_module}::f": 61}, found
    short = tmp_path / "short.py"
    short.write_text("def g() -> int:\n    return 1\n")
    assert _too_long(short) == {}


def test_nothing_new_is_too_long_and_nothing_listed_grew() -> None:
    found = {key: lines for path in _modules() for key, lines in _too_long(path).items()}
    new = [f"{key}: {lines} lines" for key, lines in found.items() if key not in OVERSIZE]
    grew = [f"{key}: {lines} lines, listed at {OVERSIZE[key]}"
            for key, lines in found.items() if key in OVERSIZE and lines > OVERSIZE[key]]
    assert new == [], "over the limit (module 500, function 60 lines):\n" + "\n".join(new)
    assert grew == [], "grew past its ratchet:\n" + "\n".join(grew)


def test_the_ratchet_lists_only_what_is_still_too_long() -> None:
    found = {key for path in _modules() for key in _too_long(path)}
    fixed = sorted(set(OVERSIZE) - found)
    assert fixed == [], "fits now, remove from OVERSIZE:\n" + "\n".join(fixed)


def test_a_deprecation_warned_from_our_code_fails_the_tests() -> None:
    with pytest.raises(DeprecationWarning, match="old API"):
        warnings.warn_explicit("old API", DeprecationWarning, "service/x.py", 1,
                               module="service.results.history")
    warnings.warn_explicit("a library's old API", DeprecationWarning, "lib.py", 1,
                           module="somelibrary.sub")  # ignored: not ours
