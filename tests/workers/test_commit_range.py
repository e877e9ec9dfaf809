"""The night's commit range is read from a local clone and stored with the run."""

from __future__ import annotations

import subprocess
from datetime import date
from pathlib import Path

import pytest

from service.config import get_settings
from service.db import session_scope
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from workers import nightly


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _make_repo(path: Path, n: int) -> list[str]:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "dev@example.com")
    _git(path, "config", "user.name", "Dev")
    shas = []
    for i in range(n):
        (path / "f.py").write_text(f"X = {i}\n")
        _git(path, "add", "f.py")
        _git(path, "commit", "-q", "-m", f"change {i} (#{100 + i})")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas


def _stored_night(day: int, commit: str) -> int:
    with session_scope() as session:
        run = runs.create_run(session, night=date(2026, 9, day),
                              benchmarks=[BenchmarkSpec(model="resnet18", mode="eval")])
        run.torch_git_commit = commit
        runs.finish_run(session, run=run, status="complete")
        return run.id


def test_range_from_local_clone(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shas = _make_repo(tmp_path / "src", 6)
    monkeypatch.setenv("NIGHTBENCH_SOURCE_REPO_PATH", str(tmp_path / "src"))
    get_settings.cache_clear()
    _stored_night(1, shas[1])
    tonight = _stored_night(2, shas[4])
    commit_range = nightly.resolve_commit_range(tonight)
    assert commit_range is not None
    assert [c["sha"] for c in commit_range] == shas[1:5]
    assert commit_range[-1]["pr_number"] == 104
    with session_scope() as session:
        assert runs.get_run(session, tonight).commit_range == commit_range


def test_no_range_without_an_earlier_commit(database_url: str) -> None:
    tonight = _stored_night(3, "a" * 40)
    assert nightly.resolve_commit_range(tonight) is None
    with session_scope() as session:
        assert "no earlier night" in (runs.get_run(session, tonight).note or "")
