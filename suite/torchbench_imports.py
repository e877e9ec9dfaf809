"""The third-party libraries a TorchBench model's code can reach, read with ``ast`` only.

A static import closure over a pytorch/benchmark checkout: it starts from every ``.py`` file of
the model's folder, follows imports of the checkout's own modules (``torchbenchmark.*``, relative
imports, top-level modules that are files of the checkout such as its ``utils``, and the parent
packages an import runs) into their files, and collects the top-level names of everything else
imported anywhere in those files (function-level imports included: whatever could run counts),
plus constant ``importlib.import_module("name")`` calls. Nothing is imported or executed.

Where the closure cannot see, it says so instead of guessing: an ``importlib.import_module`` /
``__import__`` call with a non-constant name, an unguarded import of a ``torchbenchmark``
module that names no file of the checkout, or a file that does not parse makes the result
*open* (``ImportClosure.open`` lists why); callers then assume the model can reach every
library. An import of a missing file inside a ``try`` that catches ImportError is not open: it
fails and is handled, so it loads nothing (TorchBench's ``util/framework/fb`` installers).

Two reviewed tables, checked against pytorch/benchmark 0e83c440, keep the base class every
model imports from opening every closure: ``REVIEWED_DYNAMIC_IMPORTS`` (dynamic-import sites
known by their exact argument text; any other text, e.g. after an upstream edit, is open again)
and ``MODULE_LEVEL_ONLY`` (files whose functions run only in TorchBench's own runner or for
options nightbench never passes, read for their module-level imports).
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

PACKAGE = "torchbenchmark"
# Dynamic imports of TorchBench's own code that load the model being measured (by its name) or
# run only for options nightbench never passes: (file under torchbenchmark/, the argument as
# ast.unparse writes it) -> why the closure may pass over it.
REVIEWED_DYNAMIC_IMPORTS = {
    ("models/__init__.py", "self.module_name"): "the lazy loader of a model by its name",
    (
        "util/model.py",
        "self.dargs.distributed_wrap_fn[:pos]",
    ): "only with --distributed_wrap_fn, which nightbench never passes",
}
# Files read for their module-level imports only (path under torchbenchmark/ -> why): their
# functions run only in TorchBench's own runner or for options nightbench never passes (it
# passes ``--torchdynamo <backend>`` alone), yet every model's base class imports them.
MODULE_LEVEL_ONLY = {
    "__init__.py": "TorchBench's runner (load_model_by_name, ModelTask, the extended "
    "HuggingFace / timm listings); models take constants and add_path from it",
    "util/fx_int8.py": "--precision fx_int8 only (imports transformers for hf_* models)",
    "util/backends/trt.py": "--backend trt only (imports transformers for hf_* models)",
}
_IMPORTERS = {"import_module", "__import__"}


@dataclass
class ImportClosure:
    """What a model's import closure reaches.

    ``files``: checkout files in it (paths relative to the checkout root); ``third_party``:
    top-level module names imported from outside the checkout (stdlib left out); ``open``: why
    the closure may miss something (empty when it is complete).
    """

    files: set[str] = field(default_factory=set)
    third_party: set[str] = field(default_factory=set)
    open: list[str] = field(default_factory=list)


def _module_name(root: Path, path: Path) -> tuple[str, str]:
    """``(module, package)`` dotted names of a checkout file."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _find(root: Path, dotted: str) -> Path | None:
    """The checkout file of a dotted module name (a package's ``__init__.py``), or None."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _resolve_relative(package: str, level: int, module: str | None) -> str | None:
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else []))


_CATCH_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_error(node: ast.Try | ast.TryStar) -> bool:
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(
            k is None or (isinstance(k, ast.Name) and k.id in _CATCH_IMPORT_ERROR) for k in kinds
        ):
            return True
    return False


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _nodes(node: ast.AST, guarded: bool, module_level: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node`` with whether a ``try`` that catches ImportError encloses it;
    with ``module_level`` the bodies of functions are left out."""
    for child in ast.iter_child_nodes(node):
        if module_level and isinstance(child, _FUNCTIONS):
            continue
        yield child, guarded
        if isinstance(child, (ast.Try, ast.TryStar)) and _catches_import_error(child):
            parts = [(s, True) for s in child.body] + [
                (s, guarded) for s in (*child.handlers, *child.orelse, *child.finalbody)
            ]
            for part, inside in parts:
                if not (module_level and isinstance(part, _FUNCTIONS)):
                    yield part, inside
                    yield from _nodes(part, inside, module_level)
        else:
            yield from _nodes(child, guarded, module_level)


def _dynamic(node: ast.Call, package: str) -> tuple[str | None, str | None]:
    """``(module, None)`` for an import call with a constant name, ``(None, argument)`` else."""
    arg = node.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None, ast.unparse(arg)
    level = len(arg.value) - len(arg.value.lstrip("."))
    anchor = (
        node.args[1]
        if len(node.args) > 1
        else next((k.value for k in node.keywords if k.arg == "package"), None)
    )
    if (
        level
        and anchor is not None
        and not (isinstance(anchor, ast.Name) and anchor.id in ("__name__", "__package__"))
    ):
        return None, f"{arg.value} relative to {ast.unparse(anchor)}"
    name = _resolve_relative(package, level, arg.value.lstrip(".") or None) if level else arg.value
    return (name, None) if name else (None, arg.value)


def _imports(
    tree: ast.AST, package: str, module_level: bool
) -> tuple[list[tuple[str, bool]], list[str]]:
    """Imported dotted names, each with whether a missing checkout file leaves the closure open
    (False for a ``from M import name`` whose ``name`` may be an attribute, and for imports a
    ``try`` catching ImportError guards: they fail and are handled), and the arguments of
    dynamic imports."""
    names: list[tuple[str, bool]] = []
    dynamic: list[str] = []
    for node, guarded in _nodes(tree, False, module_level):
        if isinstance(node, ast.Import):
            names.extend((alias.name, not guarded) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = (
                node.module
                if node.level == 0
                else _resolve_relative(package, node.level, node.module)
            )
            if module is None:
                dynamic.append(f"from {'.' * node.level}{node.module or ''} (outside the tree)")
                continue
            names.append((module, not guarded))
            names.extend((f"{module}.{alias.name}", False) for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr in _IMPORTERS)
                or (isinstance(node.func, ast.Name) and node.func.id in _IMPORTERS)
            )
        ):
            name, arg = _dynamic(node, package)
            if name is not None:
                names.append((name, not guarded))
            if arg is not None:
                dynamic.append(arg)
    return names, dynamic


@lru_cache(maxsize=8192)
def _file_imports(
    path: str, stamp: tuple[int, int], package: str, module_level: bool
) -> tuple[list[tuple[str, bool]], list[str]] | str:
    """:func:`_imports` of one file, cached by its (mtime, size) ``stamp``: the real checkout's
    ~100 models share ~30 files of ``util/``. The parse error as text where it does not parse."""
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (SyntaxError, ValueError) as exc:
        return str(exc)
    return _imports(tree, package, module_level)


def _local_roots(root: Path) -> set[str]:
    """Top-level module names that are files of the checkout (``torchbenchmark``, ``utils``)."""
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in root.iterdir()
        if (p.suffix == ".py" and p.is_file()) or (p / "__init__.py").is_file()
    }


def import_closure(root: Path, model_folder: Path) -> ImportClosure:
    """The static import closure of a model (see the module docstring).

    Args:
        root: the checkout root (holds ``torchbenchmark/``).
        model_folder: ``torchbenchmark/models/<name>`` under it.

    Raises:
        OSError: a file cannot be read. A file that does not parse makes the closure open.
    """
    local = _local_roots(root)
    out = ImportClosure()
    todo = sorted(model_folder.rglob("*.py"))
    while todo:
        path = todo.pop()
        rel = path.relative_to(root).as_posix()
        if rel in out.files:
            continue
        out.files.add(rel)
        under = rel.removeprefix(f"{PACKAGE}/")
        stat = path.stat()
        parsed = _file_imports(
            str(path),
            (stat.st_mtime_ns, stat.st_size),
            _module_name(root, path)[1],
            under in MODULE_LEVEL_ONLY,
        )
        if isinstance(parsed, str):
            out.open.append(f"{rel}: does not parse ({parsed})")
            continue
        names, dynamic = parsed
        out.open.extend(
            f"{rel}: dynamic import of {arg}"
            for arg in dynamic
            if (under, arg) not in REVIEWED_DYNAMIC_IMPORTS
        )
        for name, fatal in names:
            top = name.split(".")[0]
            if top not in local:
                if top not in sys.stdlib_module_names:
                    out.third_party.add(top)
                continue
            found = _find(root, name)
            if found is not None:
                todo.append(found)
                # Importing a.b.c runs a/__init__.py and a/b/__init__.py as well.
                parents = name.split(".")[:-1]
                todo.extend(
                    f
                    for i in range(1, len(parents) + 1)
                    if (f := _find(root, ".".join(parents[:i]))) is not None
                )
            elif fatal and top == PACKAGE:
                out.open.append(f"{rel}: {name} is no file of the checkout")
    return out


@lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    try:
        return importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - a broken distribution's metadata: fall back to names
        return {}


def distributions(modules: set[str]) -> set[str]:
    """Distribution names of top-level import names (``PIL`` -> ``pillow``), lower-cased; a name
    no installed distribution provides stands for itself (``importlib.metadata``)."""
    mapping = _distributions()
    out: set[str] = set()
    for name in modules:
        out.update(d.lower() for d in mapping.get(name, [name]))
    return out
