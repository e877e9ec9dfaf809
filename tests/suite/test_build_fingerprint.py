"""The code under test, as a record names it: the same in every process of one build, different
when torch, an installed distribution, a source tree on the path or the planted work changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from suite.environment import code_under_test, source_tree_state
from tests.suite.helpers import ROOT, run_record, suite_env

PRINT = "from suite.environment import build_fingerprint; print(build_fingerprint())"


def _fingerprint(**env: str) -> str:
    """:func:`suite.environment.build_fingerprint` in a fresh process with ``env``."""
    proc = subprocess.run(
        [sys.executable, "-c", PRINT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=suite_env(**env),
        check=True,
    )
    return proc.stdout.strip()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _package_repo(root: Path) -> Path:
    """A git work tree holding one package, ``pkg``, with one commit; and an ignored folder."""
    repo = root / "tree"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "ignored").mkdir()
    (repo / ".gitignore").write_text("ignored/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_two_processes_of_one_build_give_one_fingerprint_and_a_record_carries_it() -> None:
    first, second = _fingerprint(), _fingerprint()
    assert first == second and len(first) == 16
    proc, record = run_record("dqn", "eval")
    assert proc.returncode == 0, proc.stderr
    assert record["environment"]["build_fingerprint"] == first
    assert "injected_work" not in record["environment"]  # nothing planted


def test_the_code_on_the_path_changes_the_fingerprint(tmp_path: Path) -> None:
    repo = _package_repo(tmp_path)
    path = f"{repo}{':' + suite_env()['PYTHONPATH']}"
    plain = _fingerprint()
    at_first = _fingerprint(PYTHONPATH=path)
    assert at_first != plain  # a tree put first on the path is code under test
    assert _fingerprint(PYTHONPATH=path) == at_first
    (repo / "pkg" / "__init__.py").write_text("VALUE = 2\n")  # uncommitted
    edited = _fingerprint(PYTHONPATH=path)
    assert edited != at_first
    _git(repo, "commit", "-q", "-am", "second")  # the same files, now committed
    committed = _fingerprint(PYTHONPATH=path)
    assert committed not in (at_first, edited)


def test_a_source_tree_state_reads_git_only_where_the_folder_is_tracked(tmp_path: Path) -> None:
    repo = _package_repo(tmp_path)
    state = source_tree_state(repo)
    assert state["path"] == str(repo)
    assert state["commit"] is not None and len(state["commit"]) == 40
    assert state["changes"] is None
    (repo / "pkg" / "__init__.py").write_text("VALUE = 3\n")
    assert source_tree_state(repo)["changes"] is not None
    # An ignored folder inside a repository (a virtual environment, say) is not its code.
    assert source_tree_state(repo / "ignored") == {
        "path": str(repo / "ignored"),
        "commit": None,
        "changes": None,
    }
    plain = tmp_path / "plain"
    plain.mkdir()
    assert source_tree_state(plain)["commit"] is None


def test_the_fingerprint_names_torch_and_the_installed_distributions() -> None:
    code = code_under_test()
    import torch

    assert code["torch_version"] == torch.__version__
    assert code["torch_path"] == str(Path(torch.__file__).resolve().parent)
    assert any(d.startswith("torch==") for d in code["distributions"])
    assert code["source_trees"][0]["path"] == code["torch_path"]


def test_planted_work_is_recorded_in_the_environment() -> None:
    proc, record = run_record("dqn", "eval", NIGHTBENCH_SUITE_INJECT_WORK="dqn:eval=0.25")
    assert proc.returncode == 0, proc.stderr
    assert record["environment"]["injected_work"] == 0.25
