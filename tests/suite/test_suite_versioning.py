"""``benchmark_version``: a change of a model's source or metadata starts a new series."""

from __future__ import annotations

import shutil
from pathlib import Path

from suite.registry import MODELS_DIR, benchmark_version
from tests.suite.helpers import run_record


def _copy(tmp_path: Path, name: str, as_name: str | None = None) -> Path:
    models = tmp_path / "models"
    shutil.copytree(
        MODELS_DIR / name, models / (as_name or name), ignore=shutil.ignore_patterns("__pycache__")
    )
    return models


def test_copy_has_the_same_version_and_an_edit_changes_it(tmp_path: Path) -> None:
    models = _copy(tmp_path, "resnet18")
    original = benchmark_version("resnet18")
    assert benchmark_version("resnet18", models) == original
    source = models / "resnet18" / "__init__.py"
    source.write_text(source.read_text().replace("momentum=0.9", "momentum=0.8"))
    edited = benchmark_version("resnet18", models)
    assert edited != original
    # Caches and other non-source files do not count.
    (models / "resnet18" / "__pycache__").mkdir()
    (models / "resnet18" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (models / "resnet18" / "notes.txt").write_text("a note")
    assert benchmark_version("resnet18", models) == edited


def test_metadata_and_new_files_change_the_version(tmp_path: Path) -> None:
    models = _copy(tmp_path, "ppo")
    original = benchmark_version("ppo", models)
    meta = models / "ppo" / "metadata.yaml"
    meta.write_text(meta.read_text().replace("hidden_size: 256", "hidden_size: 128"))
    after_meta = benchmark_version("ppo", models)
    assert after_meta != original
    (models / "ppo" / "helpers.py").write_text("X = 1\n")
    assert benchmark_version("ppo", models) != after_meta


def test_records_carry_the_edited_version(tmp_path: Path) -> None:
    """End to end: a renamed copy measured through ``python -m suite run`` reports its version,
    and an edit of its source changes what the next record reports."""
    models = _copy(tmp_path, "pyhpc_isoneutral_mixing", "iso_copy")
    env = {"NIGHTBENCH_SUITE_EXTRA_MODELS": str(models)}
    proc, first = run_record("iso_copy", "eval", "--batch-size", "2", **env)
    assert proc.returncode == 0, proc.stderr
    assert first["benchmark_version"] == benchmark_version("iso_copy", models)
    source = models / "iso_copy" / "__init__.py"
    source.write_text(source.read_text().replace("SLOPE_MAX = 1e-3", "SLOPE_MAX = 2e-3"))
    proc, second = run_record("iso_copy", "eval", "--batch-size", "2", **env)
    assert proc.returncode == 0, proc.stderr
    assert second["benchmark_version"] != first["benchmark_version"]
