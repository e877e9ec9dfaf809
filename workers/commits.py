"""The commit range of a night: the commits between two builds, oldest first, in first-parent order.

Two sources give the same :class:`CommitInfo` records:

- :func:`local_commit_range` reads a local git clone through GitPython;
- :func:`github_commit_range` asks GitHub's compare API through PyGithub
  (``repo.compare(base, head)``), for a nightly whose clone is not at hand.

First-parent order is the order in which commits landed on the branch: a merge is one step, its
side branch is not walked. That is the order ``git bisect --first-parent`` searches, and the one
in which a nightly build's commit range is meaningful.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from service.errors import InvalidInput

if TYPE_CHECKING:  # pragma: no cover
    from github import Github
    from github.Repository import Repository

    from service.config import Settings

# PyTorch's merge bot writes "Pull Request resolved: https://github.com/pytorch/pytorch/pull/N";
# squash merges on GitHub end the title with "(#N)".
_PR_RESOLVED = re.compile(r"^Pull Request resolved:\s*\S*/pull/(\d+)\s*$", re.MULTILINE)
_PR_TITLE = re.compile(r"\(#(\d+)\)\s*$")


@dataclass(frozen=True)
class CommitInfo:
    """One commit of a commit range.

    Attributes:
        sha: full 40-hex commit id.
        title: first line of the message.
        author_name: author's name as recorded in the commit.
        author_email: author's e-mail as recorded in the commit.
        date: author date (timezone-aware).
        pr_number: the pull request the message names, or None.
        files: paths changed relative to the first parent (all paths for a root commit).
        parent: first parent's sha, or None for a root commit.
        author_login: the author's GitHub login when GitHub links the commit to an account
            (compare API), else None (a local clone knows only name and e-mail).
    """

    sha: str
    title: str
    author_name: str
    author_email: str
    date: datetime
    pr_number: int | None
    files: tuple[str, ...]
    parent: str | None
    author_login: str | None = None

    @property
    def short(self) -> str:
        """The first 10 hex digits of ``sha``."""
        return self.sha[:10]

    def as_json(self) -> dict[str, object]:
        """A JSON-ready dict (``date`` in ISO 8601)."""
        return {
            "sha": self.sha,
            "title": self.title,
            "author": self.author_name,
            "author_email": self.author_email,
            "date": self.date.isoformat(),
            "pr_number": self.pr_number,
            "files": list(self.files),
            "parent": self.parent,
            "author_login": self.author_login,
        }


def parse_pr_number(message: str) -> int | None:
    """The pull request number a commit message names, or None.

    ``Pull Request resolved: https://github.com/OWNER/REPO/pull/N`` (PyTorch's merge bot, ghstack)
    wins over a title ending in ``(#N)`` (GitHub squash merges), because a title may quote another
    pull request.

    Args:
        message: the full commit message.

    Returns:
        The number N, or None when the message names no pull request.
    """
    resolved = _PR_RESOLVED.findall(message)
    if resolved:
        return int(resolved[-1])
    title = message.strip().splitlines()[0] if message.strip() else ""
    match = _PR_TITLE.search(title)
    return int(match.group(1)) if match else None


def _title(message: str) -> str:
    stripped = message.strip()
    return stripped.splitlines()[0] if stripped else ""


def _check_ref(name: str, value: str) -> None:
    if not value or not value.strip():
        raise InvalidInput(f"{name}: a commit id is required, got an empty string")
    if value.startswith("-"):
        raise InvalidInput(f"{name}: {value!r} is not a commit id (starts with '-')")


def local_commit_range(repo_path: str | Path, good: str, bad: str) -> list[CommitInfo]:
    """The commits from ``good`` to ``bad`` in a local clone, in first-parent order.

    Args:
        repo_path: a git work tree or bare repository.
        good: the last known good commit (any revision git understands: sha, tag, branch).
        bad: the first known bad commit.

    Returns:
        ``[good, c1, ..., bad]``, oldest first: ``good`` at index 0, then every commit on the
        first-parent chain from ``good`` (exclusive) to ``bad`` (inclusive). Length N + 1 for a
        range of N commits.

    Raises:
        InvalidInput: the path is not a git repository, a revision does not resolve to a commit,
            ``good`` equals ``bad``, or ``good`` is not on ``bad``'s first-parent chain.
    """
    import git  # GitPython; imported here so that importing this module stays cheap

    _check_ref("good", good)
    _check_ref("bad", bad)
    try:
        repo = git.Repo(str(repo_path))
    except (git.NoSuchPathError, git.InvalidGitRepositoryError) as exc:
        raise InvalidInput(f"repo: {repo_path} is not a git repository") from exc
    try:
        good_commit = repo.commit(good)
        bad_commit = repo.commit(bad)
    except (git.BadName, ValueError, git.GitCommandError) as exc:
        raise InvalidInput(f"{exc}: not a commit in {repo_path}") from exc
    if good_commit.hexsha == bad_commit.hexsha:
        raise InvalidInput(f"good and bad are the same commit {good_commit.hexsha}")
    chain = list(repo.iter_commits(f"{good_commit.hexsha}..{bad_commit.hexsha}", first_parent=True))
    # The range is only meaningful when good is an ancestor on bad's first-parent chain:
    # otherwise "good..bad" silently drops commits reachable from good.
    if not chain or (chain[-1].parents[:1] and chain[-1].parents[0].hexsha != good_commit.hexsha):
        raise InvalidInput(
            f"good {good_commit.hexsha[:10]} is not on the first-parent history of "
            f"bad {bad_commit.hexsha[:10]}"
        )
    chain.reverse()
    return [_local_info(repo, c) for c in [good_commit, *chain]]


def _local_info(repo, commit) -> CommitInfo:
    parent = commit.parents[0].hexsha if commit.parents else None
    if parent is not None:
        names = repo.git.diff_tree(
            "--no-commit-id", "--name-only", "-r", "--no-renames", parent, commit.hexsha
        )
    else:
        names = repo.git.ls_tree("-r", "--name-only", commit.hexsha)
    message = commit.message if isinstance(commit.message, str) else commit.message.decode()
    return CommitInfo(
        sha=commit.hexsha,
        title=_title(message),
        author_name=commit.author.name or "",
        author_email=commit.author.email or "",
        date=commit.authored_datetime,
        pr_number=parse_pr_number(message),
        files=tuple(n for n in names.splitlines() if n),
        parent=parent,
    )


def changed_files(repo_path: str | Path, base: str, head: str) -> list[tuple[str, str]]:
    """The files that differ between two commits, as ``(status, path)`` pairs.

    Args:
        repo_path: a git work tree.
        base: the older commit.
        head: the newer commit.

    Returns:
        ``("A" | "M" | "D" | "T", path)`` per changed path (renames are a delete and an add).

    Raises:
        InvalidInput: a revision does not resolve.
    """
    import git

    repo = git.Repo(str(repo_path))
    try:
        out = repo.git.diff("--name-status", "--no-renames", base, head)
    except git.GitCommandError as exc:
        raise InvalidInput(
            f"cannot diff {base}..{head} in {repo_path}: {exc.stderr.strip()}"
        ) from exc
    pairs = []
    for line in out.splitlines():
        status, _, path = line.partition("\t")
        if path:
            pairs.append((status[:1], path))
    return pairs


def github_commit_range(
    repository: Repository, good: str, bad: str, *, with_files: bool = True
) -> list[CommitInfo]:
    """The commits from ``good`` to ``bad`` through GitHub's compare API, in first-parent order.

    The compare API lists every commit reachable from ``bad`` and not from ``good``; the
    first-parent chain is recovered by walking ``parents[0]`` from ``bad`` back to ``good``, so
    commits of merged side branches are left out, as in :func:`local_commit_range`.

    Args:
        repository: a PyGithub ``Repository`` (its base URL may point at GitHub Enterprise or at a
            local server speaking GitHub's REST shapes).
        good: the last known good commit sha.
        bad: the first known bad commit sha.
        with_files: also fetch each commit's changed files (one request per commit).

    Returns:
        ``[good, c1, ..., bad]`` as in :func:`local_commit_range`; ``good``'s record has the
        fields GitHub gives for the comparison's base commit.

    Raises:
        InvalidInput: ``good`` is not an ancestor of ``bad`` (``status`` is not ``ahead``), or
            ``good`` is not on ``bad``'s first-parent chain.
        github.GithubException: the API answered with an error (unknown sha, auth, rate limit).
    """
    _check_ref("good", good)
    _check_ref("bad", bad)
    comparison = repository.compare(good, bad)
    if comparison.status != "ahead":
        raise InvalidInput(
            f"bad {bad[:10]} is not ahead of good {good[:10]} on GitHub "
            f"(status {comparison.status!r})"
        )
    by_sha = {c.sha: c for c in comparison.commits}
    base = comparison.base_commit
    chain = []
    sha: str | None = bad if len(bad) == 40 else repository.get_commit(bad).sha
    while sha is not None and sha != base.sha:
        commit = by_sha.get(sha)
        if commit is None:
            raise InvalidInput(
                f"good {base.sha[:10]} is not on the first-parent history of bad {bad[:10]}"
            )
        chain.append(commit)
        parents = commit.parents
        sha = parents[0].sha if parents else None
    if sha is None:
        raise InvalidInput(
            f"good {base.sha[:10]} is not on the first-parent history of bad {bad[:10]}"
        )
    chain.reverse()
    return [_github_info(c, with_files) for c in [base, *chain]]


def _github_info(commit, with_files: bool) -> CommitInfo:
    git_commit = commit.commit
    message = git_commit.message or ""
    author = git_commit.author
    parents = commit.parents
    files: Sequence[str] = [f.filename for f in commit.files] if with_files else ()
    return CommitInfo(
        sha=commit.sha,
        title=_title(message),
        author_name=author.name if author else "",
        author_email=author.email if author else "",
        date=author.date if author else datetime.fromtimestamp(0).astimezone(),
        pr_number=parse_pr_number(message),
        files=tuple(files),
        parent=parents[0].sha if parents else None,
        # The GitHub account behind the commit (``author`` of the REST shape), when linked.
        author_login=commit.author.login if commit.author is not None else None,
    )


def github_client(settings: Settings, *, retries: int = 5, backoff_factor: float = 1.0) -> Github:
    """A PyGithub client for reading commits (``source_github_repository``).

    The configured API URL and token (anonymous without one), a 30 s timeout, and PyGithub's
    retry policy (``GithubRetry``: exponential backoff on 5xx and connection errors, rate limits
    waited out), as the issue tracker has (:mod:`workers.issues.trackers.github`); reads only, so every
    request may be repeated.

    Args:
        settings: where the API URL and token come from.
        retries: attempts after the first, per request.
        backoff_factor: seconds; waits grow as ``backoff_factor * 2**n``.
    """
    import github
    from github.GithubRetry import GithubRetry

    token = settings.github_token
    auth = github.Auth.Token(token.get_secret_value()) if token is not None else None
    retry = GithubRetry(total=retries, backoff_factor=backoff_factor)
    return github.Github(base_url=settings.github_api_url, auth=auth, timeout=30, retry=retry)


def commit_range(settings: Settings, good: str, bad: str) -> list[CommitInfo] | None:
    """The commits ``good..bad`` (``good`` first) from where the settings say the source is: a
    local clone (``source_repo_path``) when configured, else GitHub's compare API
    (``source_github_repository``); None when neither is configured.

    Raises:
        InvalidInput, ValueError, GithubException, OSError: the range cannot be read (an
            unknown commit, the service unreachable).
    """
    if settings.source_repo_path is not None:
        return local_commit_range(settings.source_repo_path, good, bad)
    if settings.source_github_repository:
        repo = github_client(settings).get_repo(settings.source_github_repository)
        return github_commit_range(repo, good, bad, with_files=False)
    return None
