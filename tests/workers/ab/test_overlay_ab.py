"""A Python-only PR measured as the A/B measures it on a nightly build: the head's ``.py`` files
laid over the installed build of the merge base (the python-overlay provider), and the suite's
``tokbag`` model measured for real on both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers.ab.run import ABRequest, run_ab
from workers.builds.layered_venv import make_layered_venv
from workers.builds.overlay import PythonOverlayProvider
from workers.demo.minitok import make_package_repository
from workers.demo.run import DEMO_MODELS


def _install(repo: Path, sha: str, root: Path) -> Path:
    """An interpreter with minitok from ``sha`` installed, not editable: the 'nightly'."""
    python = make_layered_venv(root / "venv", sys.executable)
    src = root / "src"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(src), sha],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--quiet", "."],
        cwd=src,
        check=True,
        capture_output=True,
    )
    subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(src)], check=True)
    return Path(python)


@pytest.mark.slow
@pytest.mark.measured
def test_a_python_only_slowdown_laid_over_the_installed_base_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_package_repository(tmp_path / "minitok", commits=2, encode_culprit=2)
    base, head = repo.shas[1], repo.shas[2]
    installed = _install(repo.path, base, tmp_path / "nightly")
    monkeypatch.setenv("NIGHTBENCH_SUITE_EXTRA_MODELS", str(DEMO_MODELS))
    provider = PythonOverlayProvider(
        repo.path, base_sha=base, package="minitok", python=installed, work_dir=tmp_path / "b"
    )
    # The head changes tokenizer.py only: the overlay takes it (a change to pyproject.toml
    # would be refused, and the A/B would say the head does not build).
    assert {path for _, path in provider.overlay_changes(head)} == {"minitok/tokenizer.py"}
    request = ABRequest(
        base,
        head,
        benchmarks=("tokbag:eval:cpu",),
        metrics=("latency",),
        processes=5,
        samples=6,
        profile=False,
    )
    outcome = run_ab(request, provider, threshold_for=lambda metric, benchmark: 0.07)
    (row,) = outcome.rows
    assert outcome.error is None
    assert row.verdict == "regression", row
    assert row.ratio is not None and 1.12 < row.ratio < 1.6
