"""A pull request's A/B on GitHub, through PyGithub: the PR read, one comment, one status.

:class:`PullRequestReporter` reads what an A/B measures (the PR's head and the merge base of its
base and head, from the compare API) and reports on it: one comment, found again by the hidden
:data:`AB_MARKER` on its first line and edited in place on every re-run, and a commit status
with the context :data:`STATUS_CONTEXT` on the measured head, which branch protection can
require.

It shares :class:`~workers.issues.trackers.github.GitHubTracker`'s client, retries and error
mapping (:func:`~workers.issues.trackers.github.make_github_client`,
:func:`~workers.issues.trackers.github.github_errors`): reads and edits are retried by urllib3;
creating the comment is checked for having landed before it is sent again, so a lost answer
never yields a second comment; a status is append-only (the newest per context counts), so
sending one twice is harmless and it is simply resent.
"""

from __future__ import annotations

import logging
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from github.GithubException import UnknownObjectException
from github.GithubObject import NotSet

from service.errors import InvalidInput
from workers.issues.trackers.github import GitHubRepositoryClient, github_errors

if TYPE_CHECKING:
    from github.IssueComment import IssueComment

log = logging.getLogger(__name__)

AB_MARKER = "<!-- nightbench-ab -->"
"""The hidden first line of the A/B comment: how a re-run finds the comment to edit."""

STATUS_CONTEXT = "nightbench/ab"
"""The commit status' context: the name a repository requires in its branch protection."""

STATUS_STATES = frozenset({"success", "failure", "error", "pending"})
DESCRIPTION_LIMIT = 140  # GitHub refuses a longer status description (422)
COMMENT_LIMIT = 65536  # GitHub refuses a longer comment body (422)
_SHA = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class PullRequestInfo:
    """A pull request as an A/B needs it.

    ``merge_base`` comes from the compare API (base ``base_sha``, head ``head_sha``): the commit
    the PR's changes start from, which an A/B measures against the head. ``head_repository`` is
    ``""`` when the fork was deleted (GitHub then answers ``head.repo: null``); ``is_fork`` is
    true when the head lives anywhere but the repository itself, a deleted fork included.
    """

    number: int
    title: str
    url: str
    author: str
    state: str
    head_sha: str
    head_ref: str
    head_repository: str
    base_ref: str
    base_sha: str
    merge_base: str
    is_fork: bool


class PullRequestReporter(GitHubRepositoryClient):
    """Reads a PR and reports an A/B on it, through PyGithub.

    Args:
        repository: ``"owner/name"``, the repository of the pull requests.
        token: a token that may read pull requests and write their comments and commit statuses
            (classic: ``repo``; fine-grained: pull requests and commit statuses, read and write).
        api_url: the REST API base URL: ``https://api.github.com``, or
            ``https://HOST/api/v3`` for GitHub Enterprise Server.
        **options: :class:`~workers.issues.trackers.github.GitHubRepositoryClient`'s (retries,
            backoff, throttle, timeout, write attempts, sleep).

    Raises:
        InvalidInput: ``repository`` is not ``owner/name``, ``token`` is empty or
            ``write_attempts`` is below 1.
    """

    def __repr__(self) -> str:
        return f"PullRequestReporter(repository={self.repository!r}, api_url={self.api_url!r})"

    def pull_request(self, number: int) -> PullRequestInfo:
        """Pull request ``number`` with the merge base of its base and head (two GETs).

        Raises:
            NotFound: no pull request ``number`` (or its commits are gone).
            TrackerAccessDenied: the token is rejected, may not read the repository, or the
                repository does not exist.
            InfrastructureError: GitHub kept failing.
        """
        with self._errors(f"reading pull request #{number}", access="pull request read access"):
            repo = self._repository()
            pr = repo.get_pull(number)
            head_repo = pr.head.repo
            head_repository = head_repo.full_name if head_repo is not None else ""
            compared = repo.compare(pr.base.sha, pr.head.sha)
            return PullRequestInfo(
                number=pr.number,
                title=pr.title,
                url=pr.html_url,
                author=pr.user.login,
                state=pr.state,
                head_sha=pr.head.sha,
                head_ref=pr.head.ref,
                head_repository=head_repository,
                base_ref=pr.base.ref,
                base_sha=pr.base.sha,
                merge_base=compared.merge_base_commit.sha,
                # GitHub's names are case-insensitive; the configured one may be spelt otherwise.
                is_fork=head_repository.lower() != self.repository.lower(),
            )

    def permission(self, login: str) -> str:
        """``login``'s permission on the repository, as GitHub's legacy base role.

        Returns:
            ``"admin"``, ``"write"`` (maintainers too), ``"read"`` (triagers too) or ``"none"``;
            ``"none"`` also for a login that is not a collaborator (GitHub answers 404).

        Raises:
            InvalidInput: ``login`` is empty.
            TrackerAccessDenied: the token is rejected or may not read collaborators.
            InfrastructureError: GitHub kept failing.
        """
        if not login:
            raise InvalidInput("a GitHub login is needed to look up its permission")
        with self._errors(f"reading {login}'s permission", access="read access"):
            repo = self._repository()
            try:
                return repo.get_collaborator_permission(login)
            except UnknownObjectException:
                return "none"

    def upsert_comment(self, number: int, body: str) -> tuple[int, str]:
        """Write ``body`` as the A/B comment on pull request ``number``: edit it, or create it.

        The comment is the oldest one whose body starts with :data:`AB_MARKER` (prefixed to
        ``body`` here when missing); other comments are left alone. Creating it again after a
        failure that may have landed first looks for it, so there is never a second one.

        Args:
            number: the pull request.
            body: Markdown.

        Returns:
            ``(comment id, comment html_url)``.

        Raises:
            InvalidInput: the body is longer than GitHub takes (65,536 characters).
            NotFound: no pull request (or issue) ``number``.
            TrackerAccessDenied: the token is rejected or may not comment.
            InfrastructureError: GitHub kept failing (after ``write_attempts`` sends).
        """
        text = body if body.startswith(AB_MARKER) else f"{AB_MARKER}\n{body}"
        if len(text) > COMMENT_LIMIT:
            raise InvalidInput(
                f"the A/B comment has {len(text)} characters; GitHub takes {COMMENT_LIMIT}"
            )
        action = f"commenting on pull request #{number}"
        with self._errors(action, access="pull request write access"):
            target = self._repository().get_issue(number)

            def ours() -> IssueComment | None:
                # Listed oldest first: a duplicate left by anything else is never the one edited.
                return next(
                    (c for c in target.get_comments() if (c.body or "").startswith(AB_MARKER)),
                    None,
                )

            comment = ours()
            if comment is None:
                comment = self._write(action, lambda: target.create_comment(text), ours)
                log.info("A/B comment %d created on PR #%d", comment.id, number)
            elif comment.body != text:
                comment.edit(text)
                log.info("A/B comment %d edited on PR #%d", comment.id, number)
            return comment.id, comment.html_url

    def set_status(
        self, sha: str, *, state: str, description: str, target_url: str | None = None
    ) -> None:
        """Set the :data:`STATUS_CONTEXT` commit status on ``sha``.

        Args:
            sha: the measured head commit, 40 (or 64) hex digits.
            state: ``success`` | ``failure`` | ``error`` | ``pending``.
            description: one line; cut to GitHub's 140 characters, ending with "…" when cut.
            target_url: where the status links to (the A/B comment), or ``None``.

        Raises:
            InvalidInput: ``state`` is not one of the four, or ``sha`` is not a full sha.
            TrackerAccessDenied: the token is rejected or may not write commit statuses.
            InfrastructureError: GitHub kept failing, or does not know the commit (422).
        """
        if state not in STATUS_STATES:
            raise InvalidInput(
                f"commit status state must be one of {sorted(STATUS_STATES)}, got {state!r}"
            )
        if not _SHA.fullmatch(sha):
            raise InvalidInput(f"a commit status needs a full commit sha, got {sha!r}")
        if len(description) > DESCRIPTION_LIMIT:
            description = description[: DESCRIPTION_LIMIT - 1] + "…"
        action = f"setting the {STATUS_CONTEXT} status on {sha[:12]}"
        with self._errors(action, access="commit status write access"):
            commit = self._repository().get_commit(sha)  # lazy: no request

            def send() -> Any:
                return commit.create_status(
                    state,
                    target_url=NotSet if target_url is None else target_url,
                    description=description,
                    context=STATUS_CONTEXT,
                )

            # Resending a status that had landed only adds the same status again.
            self._write(action, send, lambda: None)

    # ----- internals -------------------------------------------------------------------------

    def _errors(self, action: str, *, access: str) -> AbstractContextManager[None]:
        where = f"{self.repository} at {self.api_url}"
        return github_errors(action, where, subject="pull request", access=access)
