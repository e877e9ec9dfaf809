"""The error tree: every error class of the project is drawn in ``service/errors.py`` with its
HTTP status, and defined there (other modules import it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import service.errors as errors
from service.errors import NightbenchError

ROOT = Path(__file__).resolve().parents[2]


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_every_error_class_is_drawn_with_its_status() -> None:
    doc = errors.__doc__ or ""
    drawn = dict(re.findall(r"(\w+) \((\d{3})\)", doc))
    classes = {
        c
        for c in _subclasses(NightbenchError) | {NightbenchError}
        if c.__module__ == "service.errors"
    }
    assert {c.__name__ for c in classes} == set(drawn)
    for c in classes:
        assert int(drawn[c.__name__]) == c.status_code, c.__name__


def test_no_error_class_is_defined_outside_the_tree() -> None:
    names = {c.__name__ for c in _subclasses(NightbenchError)} | {"NightbenchError"}
    outside = []
    for package in ("service", "workers", "suite"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "service" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in names for b in node.bases
                ):
                    outside.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert outside == []
