"""``nightbench bisect``'s options reach the search: the direction hunted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workers.cli.bisect import _bisect_inputs
from workers.cli.common import BuildOptions


def _two_commits(repo: Path) -> tuple[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=Ada", "-c", "user.email=ada@example.org", *args],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    repo.mkdir()
    git("init", "-q", "-b", "main")
    shas = []
    for n in range(2):
        (repo / "a.py").write_text(f"x = {n}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {n}")
        shas.append(git("rev-parse", "HEAD"))
    return shas[0], shas[1]


@pytest.mark.parametrize(("slower", "expected"), [(True, True), (False, None)])
def test_the_direction_reaches_the_search(
    tmp_path: Path, slower: bool, expected: bool | None
) -> None:
    good, bad = _two_commits(tmp_path / "repo")
    config, commits, _ = _bisect_inputs(
        tmp_path / "repo",
        good,
        bad,
        workers=1,
        samples=12,
        max_samples=48,
        min_change=0.05,
        slower=slower,
        build=BuildOptions(work_dir=tmp_path / "builds"),
    )
    assert config.slower is expected  # True: a speed-up ends not reproduced; None: either sign
    assert [c.sha for c in commits] == [good, bad]
