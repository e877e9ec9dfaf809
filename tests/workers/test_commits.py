"""Commit ranges from a local clone (GitPython) and from GitHub's compare API (PyGithub)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import github
import pytest

from service.errors import InvalidInput
from tests.github_server import FakeGitHub, _HttpError
from workers.commits import (
    changed_files,
    github_commit_range,
    local_commit_range,
    parse_pr_number,
)


def git(repo: Path, *args: str, when: int = 0) -> str:
    stamp = f"2026-11-0{1 + when // 24}T{when % 24:02d}:00:00+00:00"
    env = {
        **os.environ,
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
        "GIT_AUTHOR_NAME": "Ada Moreno",
        "GIT_AUTHOR_EMAIL": "ada@example.org",
        "GIT_COMMITTER_NAME": "Merge Bot",
        "GIT_COMMITTER_EMAIL": "bot@example.org",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> dict[str, Any]:
    """main: c0 - c1 - c2 - M(c2, s2) - c4; side branch from c1: s1 - s2."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas: dict[str, str] = {}

    def commit(name: str, path: str, message: str, when: int) -> None:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(f"{name}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message, when=when)
        shas[name] = git(repo, "rev-parse", "HEAD")

    commit("c0", "pkg/a.py", "Initial import", 0)
    commit("c1", "pkg/a.py", "Speed up the loader (#101)", 1)
    git(repo, "checkout", "-q", "-b", "side")
    commit("s1", "pkg/side.py", "Side work one", 2)
    commit("s2", "docs/side.md", "Side work two", 3)
    git(repo, "checkout", "-q", "main")
    commit(
        "c2",
        "pkg/b.py",
        "Add b\n\nSummary.\n\nPull Request resolved: https://github.com/org/proj/pull/202",
        4,
    )
    git(repo, "merge", "-q", "--no-ff", "side", "-m", "Merge side work (#303)", when=5)
    shas["m"] = git(repo, "rev-parse", "HEAD")
    commit("c4", "pkg/c.py", "Add c", 6)
    return {"repo": repo, "shas": shas}


def test_first_parent_range_from_a_local_clone(history: dict[str, Any]) -> None:
    repo, shas = history["repo"], history["shas"]
    commits = local_commit_range(repo, shas["c1"], shas["c4"])
    # The merge is one step; the side branch's commits are not walked.
    assert [c.sha for c in commits] == [shas["c1"], shas["c2"], shas["m"], shas["c4"]]
    c1, c2, merge, c4 = commits
    assert c1.title == "Speed up the loader (#101)" and c1.pr_number == 101
    assert c2.title == "Add b" and c2.pr_number == 202
    assert c2.files == ("pkg/b.py",) and c2.parent == shas["c1"]
    assert merge.pr_number == 303
    assert set(merge.files) == {"pkg/side.py", "docs/side.md"}  # against the first parent
    assert c4.pr_number is None and c4.author_name == "Ada Moreno"
    assert c4.author_email == "ada@example.org"
    assert c4.date.isoformat() == "2026-11-01T06:00:00+00:00"
    assert c4.as_json()["sha"] == shas["c4"] and c4.short == shas["c4"][:10]


def test_abbreviated_and_symbolic_revisions_resolve(history: dict[str, Any]) -> None:
    repo, shas = history["repo"], history["shas"]
    commits = local_commit_range(repo, shas["c2"][:8], "main")
    assert [c.sha for c in commits] == [shas["c2"], shas["m"], shas["c4"]]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("s1", "c4", "not on the first-parent history"),
        ("c4", "c1", "not on the first-parent history"),
        ("c2", "c2", "same commit"),
    ],
)
def test_a_range_that_is_not_first_parent_is_refused(
    history: dict[str, Any], good: str, bad: str, message: str
) -> None:
    shas = history["shas"]
    with pytest.raises(InvalidInput, match=message):
        local_commit_range(history["repo"], shas[good], shas[bad])


def test_unknown_revisions_and_paths_are_refused(history: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a commit"):
        local_commit_range(history["repo"], "deadbeef" * 5, "main")
    with pytest.raises(InvalidInput, match="not a git repository"):
        local_commit_range(tmp_path / "nowhere", "a", "b")
    with pytest.raises(InvalidInput, match="starts with '-'"):
        local_commit_range(history["repo"], "--all", "main")


def test_changed_files_between_two_commits(history: dict[str, Any]) -> None:
    shas = history["shas"]
    changes = changed_files(history["repo"], shas["c0"], shas["c4"])
    assert dict((p, s) for s, p in changes) == {
        "pkg/b.py": "A",
        "pkg/side.py": "A",
        "docs/side.md": "A",
        "pkg/c.py": "A",
        "pkg/a.py": "M",
    }


@pytest.mark.parametrize(
    ("message", "number"),
    [
        ("Fix x (#123)", 123),
        ("Fix x (#123)\n\nPull Request resolved: https://github.com/pytorch/pytorch/pull/456", 456),
        ('Revert "Fix y (#9)"\n\nThis reverts commit abc.', None),
        ("Fix (#12) in the title only\n", None),
        ("", None),
    ],
)
def test_parse_pr_number(message: str, number: int | None) -> None:
    assert parse_pr_number(message) == number


# ----- GitHub's compare API -----------------------------------------------------------------


ACCOUNTS = {"ada@example.org": "ada-moreno"}  # author e-mail -> GitHub login


class CompareGitHub(FakeGitHub):
    """The shared GitHub stand-in plus ``compare`` and ``commits/{sha}``, answered from a real
    local repository in GitHub's response shapes."""

    def __init__(self, source: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source

    def _commit_json(self, sha: str, *, files: bool) -> dict[str, Any]:
        fmt = "%H%n%P%n%an%n%ae%n%aI%n%cn%n%ce%n%cI%n%B"
        out = git(self.source, "show", "-s", f"--format={fmt}", sha).split("\n", 8)
        full, parents, an, ae, ad, cn, ce, cd, message = out
        api = f"{self.base_url}{self.repo_path}"
        data: dict[str, Any] = {
            "sha": full,
            "node_id": "C_" + full[:8],
            "url": f"{api}/commits/{full}",
            "html_url": f"{self.origin}/{self.owner}/{self.repo}/commit/{full}",
            "commit": {
                "message": message.rstrip("\n"),
                "author": {"name": an, "email": ae, "date": ad.replace("+00:00", "Z")},
                "committer": {"name": cn, "email": ce, "date": cd.replace("+00:00", "Z")},
                "tree": {"sha": "0" * 40, "url": f"{api}/git/trees/{'0' * 40}"},
                "url": f"{api}/git/commits/{full}",
                "comment_count": 0,
            },
            # GitHub links a commit to the account owning its author e-mail (else null).
            "author": (
                {**self._user(), "login": ACCOUNTS[ae], "id": 2} if ae in ACCOUNTS else None
            ),
            "committer": None,
            "parents": [{"sha": p, "url": f"{api}/commits/{p}"} for p in parents.split()],
        }
        if files:
            first = parents.split()[0] if parents.split() else None
            names = git(
                self.source,
                "diff-tree",
                "--no-commit-id",
                "--name-only",
                "-r",
                *([first, full] if first else ["--root", full]),
            )
            data["files"] = [
                {
                    "sha": "0" * 40,
                    "filename": n,
                    "status": "modified",
                    "additions": 1,
                    "deletions": 0,
                    "changes": 1,
                }
                for n in names.splitlines()
            ]
        return data

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any):  # type: ignore[override]
        base = self.repo_path
        found = re.fullmatch(re.escape(base) + r"/compare/([0-9a-f]+)\.\.\.([0-9a-f]+)", path)
        if method == "GET" and found:
            good, bad = found.groups()
            ahead = git(self.source, "rev-list", f"{good}..{bad}").split()
            behind = git(self.source, "rev-list", f"{bad}..{good}").split()
            status = (
                "identical"
                if not ahead and not behind
                else ("ahead" if not behind else "behind" if not ahead else "diverged")
            )
            merge_base = git(self.source, "merge-base", good, bad)
            ordered = git(
                self.source, "rev-list", "--reverse", "--topo-order", f"{good}..{bad}"
            ).split()
            return (
                200,
                {},
                {
                    "url": f"{self.base_url}{path}",
                    "status": status,
                    "ahead_by": len(ahead),
                    "behind_by": len(behind),
                    "total_commits": len(ordered),
                    "base_commit": self._commit_json(good, files=False),
                    "merge_base_commit": self._commit_json(merge_base, files=False),
                    "commits": [self._commit_json(s, files=False) for s in ordered],
                    "files": [],
                },
            )
        found = re.fullmatch(re.escape(base) + r"/commits/([0-9a-f]+)", path)
        if method == "GET" and found:
            try:
                return 200, {}, self._commit_json(found.group(1), files=True)
            except subprocess.CalledProcessError as exc:
                raise _HttpError(422, "No commit found for SHA") from exc
        return super()._route(method, path, query, body)


@pytest.fixture
def compare_server(history: dict[str, Any]):
    with CompareGitHub(history["repo"], owner="org", repo="proj") as server:
        yield server


def _repository(server: CompareGitHub):
    client = github.Github(
        base_url=server.base_url, auth=github.Auth.Token(server.token), retry=None
    )
    return client.get_repo("org/proj")


def test_range_from_github_compare_matches_the_local_one(
    history: dict[str, Any], compare_server: CompareGitHub
) -> None:
    shas = history["shas"]
    remote = github_commit_range(_repository(compare_server), shas["c1"], shas["c4"])
    local = local_commit_range(history["repo"], shas["c1"], shas["c4"])
    assert [c.sha for c in remote] == [c.sha for c in local]
    for r, loc in zip(remote, local, strict=True):
        assert (r.title, r.pr_number, r.author_name, r.author_email, r.parent) == (
            loc.title,
            loc.pr_number,
            loc.author_name,
            loc.author_email,
            loc.parent,
        )
        assert r.date == loc.date
        assert set(r.files) == set(loc.files)
        # Only GitHub knows the author's account; the issue cc's it.
        assert (r.author_login, loc.author_login) == ("ada-moreno", None)
    assert compare_server.requests_to(
        "GET", f"{compare_server.repo_path}/compare/{shas['c1']}...{shas['c4']}"
    )


def test_github_range_without_files_asks_once(
    history: dict[str, Any], compare_server: CompareGitHub
) -> None:
    shas = history["shas"]
    repo = _repository(compare_server)
    before = len(compare_server.requests)
    commits = github_commit_range(repo, shas["c2"], shas["c4"], with_files=False)
    assert [c.sha for c in commits] == [shas["c2"], shas["m"], shas["c4"]]
    assert all(c.files == () for c in commits)
    assert len(compare_server.requests) - before == 1


def test_github_range_refuses_a_bad_that_is_behind(
    history: dict[str, Any], compare_server: CompareGitHub
) -> None:
    shas = history["shas"]
    with pytest.raises(InvalidInput, match="not ahead"):
        github_commit_range(_repository(compare_server), shas["c4"], shas["c1"])
