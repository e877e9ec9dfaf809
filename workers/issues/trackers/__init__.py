"""Where issues go: GitHub through PyGithub, or Markdown files in a local outbox.

Both trackers (:class:`~workers.issues.trackers.github.GitHubTracker`,
:class:`~workers.issues.trackers.outbox.OutboxTracker`) satisfy :class:`IssueTracker`, so filing and
sync-back do not care which one the settings chose (:func:`make_tracker`). Filing is idempotent:
every issue body carries a hidden fingerprint marker (see :mod:`workers.issues.trackers.markers`), and
:meth:`IssueTracker.create` looks for an open issue carrying it before creating one, and again
after a failed create before trying anew, so a crash or a lost response between "GitHub created
the issue" and "we recorded its number" never yields a second issue.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from service.errors import InvalidInput
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.trackers.github import GitHubTracker
from workers.issues.trackers.outbox import OutboxTracker

if TYPE_CHECKING:
    from service.config import Settings


@runtime_checkable
class IssueTracker(Protocol):
    """What filing and sync-back need from an issue tracker.

    ``kind`` (``github`` | ``outbox``) and ``location`` (where its issues live) identify the
    tracker in stored issue records.
    """

    kind: str

    @property
    def location(self) -> str:
        """Where the issues live: ``owner/name@api-url``, or the outbox folder."""
        ...

    def find_open(self, fingerprint: str) -> TrackedIssue | None:
        """The open issue whose body carries ``fingerprint``'s marker, or ``None``."""
        ...

    def create(self, issue: RenderedIssue) -> TrackedIssue:
        """File ``issue``, or return the open issue already carrying its fingerprint."""
        ...

    def comment(self, number: int, body: str, *, key: str) -> None:
        """Comment on issue ``number`` once per ``key`` (a repeat with the same key is a no-op)."""
        ...

    def add_labels(self, number: int, labels: Sequence[str]) -> None:
        """Add ``labels`` to issue ``number`` (labels it already has stay)."""
        ...

    def get(self, number: int) -> TrackedIssue:
        """Issue ``number``; raises :class:`~service.errors.NotFound` if there is none."""
        ...

    def updated_since(self, since: datetime | None) -> list[TrackedIssue]:
        """Issues carrying a fingerprint, open or closed, changed at or after ``since``."""
        ...


def make_tracker(settings: Settings) -> IssueTracker:
    """The tracker the settings ask for.

    GitHub when both ``github_repository`` and ``github_token`` are set, the outbox folder when
    neither is.

    Raises:
        InvalidInput: only one of the two is set (a half-configured deployment would otherwise
            write to the outbox without anyone noticing).
    """
    repository, token = settings.github_repository, settings.github_token
    if repository and token is not None and token.get_secret_value():
        labels = list(settings.github_labels)
        return GitHubTracker(
            repository,
            token,
            api_url=settings.github_api_url,
            search_label=labels[0] if labels else None,
        )
    if repository or token is not None:
        missing = "NIGHTBENCH_GITHUB_TOKEN" if repository else "NIGHTBENCH_GITHUB_REPOSITORY"
        raise InvalidInput(
            f"{missing} is not set: set both NIGHTBENCH_GITHUB_REPOSITORY and "
            "NIGHTBENCH_GITHUB_TOKEN to file on GitHub, or neither to write to the outbox"
        )
    return OutboxTracker(settings.effective_outbox_dir)


def searchable_labels(settings: Settings, own: Sequence[str]) -> tuple[str, ...]:
    """The labels of an issue filed outside the regression report: the first of
    ``NIGHTBENCH_GITHUB_LABELS`` (the one the GitHub tracker's marker lookup lists by:
    :func:`make_tracker`; an issue without it is not found again, so neither deduplicated nor
    told anything later), then ``own``."""
    return tuple(dict.fromkeys([*settings.github_labels[:1], *own]))
