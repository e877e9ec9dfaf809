"""Issues as Markdown files in a local folder, for running without GitHub.

:class:`OutboxTracker` satisfies :class:`~workers.issues.trackers.IssueTracker`: filing writes a
file, and sync-back reads the state and labels a person edited in its front matter.

The folder is storage that can fail (a full disk, a read-only mount): a write that fails raises
:class:`~service.errors.InfrastructureError` (filing records it on the alert and retries) and
leaves no partial file behind; a file that cannot be read (one a crash cut short, or a person
broke) is skipped with a warning, so it never blocks the filings after it.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from service.errors import InfrastructureError, InvalidInput, NotFound
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.trackers.markers import (
    check_key,
    comment_marker,
    find_fingerprint,
    find_run_id,
    with_comment_marker,
)

log = logging.getLogger(__name__)


class OutboxTracker:
    """Issues as Markdown files in a folder, for running without GitHub.

    Each issue is ``issue-NNNN.md``: a YAML front matter (number, title, state, labels,
    fingerprint, times) between ``---`` lines, then ``# <title>`` and the rendered body as it
    would go to GitHub; comments are appended below a rule. Editing ``state: closed`` or the
    ``labels`` in the front matter triages the issue locally, and sync-back reads it like a
    GitHub issue.

    Args:
        directory: the outbox folder (created if missing).
    """

    _NAME = re.compile(r"issue-(\d{4,})\.md")

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable(self.directory, exc) from exc

    kind = "outbox"

    def __repr__(self) -> str:
        return f"OutboxTracker(directory={str(self.directory)!r})"

    @property
    def location(self) -> str:
        """The outbox folder, resolved."""
        return str(self.directory.resolve())

    def path(self, number: int) -> Path:
        """The file of issue ``number``."""
        return self.directory / f"issue-{number:04d}.md"

    def find_open(self, fingerprint: str) -> TrackedIssue | None:
        """The newest open outbox issue carrying ``fingerprint``, or ``None``."""
        for number in sorted(self._numbers(), reverse=True):
            issue = self._readable(number)
            if issue is not None and issue.state == "open" and issue.fingerprint == fingerprint:
                return issue
        return None

    def create(self, issue: RenderedIssue) -> TrackedIssue:
        """Write ``issue`` to a new file, or return the open one carrying its fingerprint."""
        existing = self.find_open(issue.fingerprint)
        if existing is not None:
            return existing
        now = _utcnow_text()
        number = max(self._numbers(), default=0) + 1
        while True:
            front = {
                "number": number,
                "title": issue.title,
                "state": "open",
                "state_reason": None,
                "labels": list(issue.labels),
                "fingerprint": issue.fingerprint,
                "created_at": now,
                "updated_at": now,
            }
            if self._write_new(number, _compose(front, f"# {issue.title}\n\n{issue.body}")):
                break
            number += 1
        log.info("wrote issue %d to the outbox: %s", number, self.path(number))
        return self._tracked(number)

    def comment(self, number: int, body: str, *, key: str) -> None:
        """Append a comment to issue ``number`` unless one with ``key`` is there already.

        Raises:
            InvalidInput: a malformed ``key``.
            NotFound: no outbox file for ``number``.
        """
        mark = comment_marker(check_key(key))
        front, text = self._read(number)
        if mark in text:
            return
        now = _utcnow_text()
        front["updated_at"] = now
        text = (
            text.rstrip("\n")
            + f"\n\n---\n\n### Comment, {now}\n\n"
            + with_comment_marker(body, key)
        )
        self._replace(number, front, text)

    def mark_filed(self, number: int, url: str) -> None:
        """Close outbox issue ``number`` as filed elsewhere, at ``url`` (a no-op the second time).

        The outbox keeps an issue while the tracker cannot be reached; once the retry files it,
        the file says where it went (``state: closed``, ``state_reason: filed``,
        ``filed_url``), so nobody files it by hand as well.

        Raises:
            NotFound: no outbox file for ``number``.
        """
        front, text = self._read(number)
        if front.get("filed_url") == url and front.get("state") == "closed":
            return
        now = _utcnow_text()
        front.update(state="closed", state_reason="filed", filed_url=url, updated_at=now)
        text = text.rstrip("\n") + f"\n\n---\n\n### Filed, {now}\n\nFiled as {url}\n"
        self._replace(number, front, text)
        log.info("outbox issue %d was filed as %s", number, url)

    def add_labels(self, number: int, labels: Sequence[str]) -> None:
        """Add ``labels`` to issue ``number``'s front matter.

        Raises:
            NotFound: no outbox file for ``number``.
        """
        front, text = self._read(number)
        merged = list(dict.fromkeys([*(front.get("labels") or []), *[n for n in labels if n]]))
        if merged != list(front.get("labels") or []):
            front["labels"] = merged
            front["updated_at"] = _utcnow_text()
            self._replace(number, front, text)

    def get(self, number: int) -> TrackedIssue:
        """Issue ``number``.

        Raises:
            NotFound: no outbox file for ``number``.
        """
        return self._tracked(number)

    def updated_since(self, since: datetime | None) -> list[TrackedIssue]:
        """Outbox issues changed at or after ``since`` (front matter time or file time)."""
        if since is not None and since.tzinfo is None:
            raise InvalidInput("since must be timezone-aware")
        found = [i for i in map(self._readable, self._numbers()) if i is not None]
        if since is not None:
            found = [i for i in found if i.updated_at >= since]
        return sorted(found, key=lambda i: (i.updated_at, i.number))

    # ----- internals -------------------------------------------------------------------------

    def _numbers(self) -> list[int]:
        return [
            int(m.group(1))
            for p in self.directory.iterdir()
            if (m := self._NAME.fullmatch(p.name)) is not None
        ]

    def _write_new(self, number: int, text: str) -> bool:
        """Write issue ``number``'s file unless it exists (False then); all of it or nothing.

        Raises:
            InfrastructureError: the folder cannot be written (the part written is removed).
        """
        path = self.path(number)
        try:
            # "x" refuses an existing file, so two writers never share a number.
            handle = path.open("x", encoding="utf-8")
        except FileExistsError:
            return False
        except OSError as exc:
            raise _unwritable(self.directory, exc) from exc
        try:
            with handle:
                handle.write(text)
        except OSError as exc:
            path.unlink(missing_ok=True)  # a full disk cut it short: no partial issue
            raise _unwritable(self.directory, exc) from exc
        return True

    def _readable(self, number: int) -> TrackedIssue | None:
        """Issue ``number``, or None (logged) when its file cannot be read as an issue."""
        try:
            return self._tracked(number)
        except (InvalidInput, NotFound, OSError) as exc:
            log.warning("outbox: skipping %s: %s", self.path(number), exc)
            return None

    def _read(self, number: int) -> tuple[dict[str, Any], str]:
        path = self.path(number)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise NotFound(f"outbox issue {number} does not exist ({path})") from exc
        if not raw.startswith("---\n") or "\n---\n" not in raw[4:]:
            raise InvalidInput(f"outbox issue {path} has no front matter between '---' lines")
        head, text = raw[4:].split("\n---\n", 1)
        try:
            front = yaml.safe_load(head) or {}
        except yaml.YAMLError as exc:
            raise InvalidInput(f"outbox issue {path}: front matter is not YAML: {exc}") from exc
        if not isinstance(front, dict):
            raise InvalidInput(f"outbox issue {path} front matter is not a mapping")
        return front, text.lstrip("\n")

    def _replace(self, number: int, front: dict[str, Any], text: str) -> None:
        # Write beside the file, then rename over it: a crash leaves the old or the new file.
        target = self.path(number)
        try:
            handle, temp = tempfile.mkstemp(dir=self.directory, prefix=".issue-", suffix=".tmp")
        except OSError as exc:
            raise _unwritable(self.directory, exc) from exc
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(_compose(front, text))
            os.replace(temp, target)
        except OSError as exc:
            Path(temp).unlink(missing_ok=True)
            raise _unwritable(self.directory, exc) from exc
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def _tracked(self, number: int) -> TrackedIssue:
        front, text = self._read(number)
        path = self.path(number)
        updated = _parse_time(front.get("updated_at"))
        modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        # A person editing the file by hand changes its mtime, not the front matter's time.
        if updated is None or modified > updated:
            updated = modified
        state = str(front.get("state") or "open").strip().lower()
        if state not in ("open", "closed"):
            raise InvalidInput(f"outbox issue {path} has state {state!r}; use open or closed")
        return TrackedIssue(
            number=number,
            url=str(path),
            title=str(front.get("title") or ""),
            state=state,
            labels=tuple(str(n) for n in (front.get("labels") or [])),
            fingerprint=front.get("fingerprint") or find_fingerprint(text),
            updated_at=updated,
            state_reason=front.get("state_reason"),
            run_id=find_run_id(text),
        )


def _unwritable(directory: Path, exc: OSError) -> InfrastructureError:
    return InfrastructureError(f"the outbox {directory} cannot be written: {exc}")


def _compose(front: dict[str, Any], text: str) -> str:
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=1000)
    return f"---\n{head}---\n\n{text}"


def _utcnow_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None
