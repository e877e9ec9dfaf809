"""The cache of build environments: one directory per key, built once, evicted LRU within a budget.

Layout of the cache directory::

    <cache>/<key>/            a venv (bin/python, lib/..., nightbench-env.json, last-used)
    <cache>/<key>.lock        filelock.ReadWriteLock: write = build or evict, read = in use
    <cache>/evict.lock        filelock.FileLock: one eviction pass at a time

A directory is complete once ``nightbench-env.json`` exists (written last, atomically); one
without it is a build that died and is rebuilt. Readers hold the read lock while a suite runs, so
eviction (which needs the write lock, without waiting) never removes a venv in use. What goes
into a directory is the caller's business (``workers/builds/torch_envs.py`` builds venvs).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import filelock

from service.errors import InvalidInput

logger = logging.getLogger(__name__)

METADATA_FILE = "nightbench-env.json"
LAST_USED_FILE = "last-used"

BuildFn = Callable[[Path], dict[str, Any]]
"""Fills an empty directory; returns the metadata to record for it (JSON-ready)."""


@dataclass(frozen=True)
class CachedEnvironment:
    """One complete venv in the cache, as eviction sees it.

    Attributes:
        key: directory name under the cache root.
        path: the venv's directory.
        size_bytes: disk use in bytes, measured when the venv was built.
        last_used_ns: when it was last prepared or leased (``time.time_ns()``).
    """

    key: str
    path: Path
    size_bytes: int
    last_used_ns: int


def _disk_usage(path: Path) -> int:
    """Bytes ``path`` occupies on disk (allocated blocks; symlinks not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


class EnvironmentCache:
    """A directory of venvs, each built once under a lock and evicted least-recently-used.

    Args:
        root: the cache directory (created if missing).
        budget_bytes: disk budget in bytes; after each build the least-recently-used venvs not
            in use are removed until the cache fits (the venv just prepared always stays).
        lock_timeout_s: seconds to wait for another process building or evicting the same venv.
    """

    def __init__(self, root: Path, *, budget_bytes: int, lock_timeout_s: float = 3 * 3600) -> None:
        if budget_bytes <= 0:
            raise InvalidInput(f"env cache budget must be positive (bytes), got {budget_bytes}")
        self.root = Path(root).resolve()
        self.budget_bytes = budget_bytes
        self.lock_timeout_s = lock_timeout_s
        self.root.mkdir(parents=True, exist_ok=True)

    def _lock(self, key: str) -> filelock.ReadWriteLock:
        # Not a singleton: each acquisition gets its own SQLite connection, so a lease and an
        # eviction in one process exclude each other as they would across processes.
        return filelock.ReadWriteLock(
            self.root / f"{key}.lock", timeout=self.lock_timeout_s, is_singleton=False
        )

    def _complete(self, key: str) -> bool:
        return (self.root / key / METADATA_FILE).is_file()

    def _touch(self, key: str) -> None:
        now = time.time_ns()
        marker = self.root / key / LAST_USED_FILE
        marker.touch()
        os.utime(marker, ns=(now, now))

    def read_metadata(self, key: str) -> dict[str, Any]:
        """The metadata written when ``key`` was built (spec, identity, size, created_at)."""
        return json.loads((self.root / key / METADATA_FILE).read_text())

    @contextmanager
    def lease(self, key: str, build: BuildFn) -> Iterator[tuple[Path, bool]]:
        """Hold venv ``key``, building it first if it is missing or half-built.

        Args:
            key: directory name under the cache root.
            build: called as ``build(path)`` under the write lock to fill an empty directory;
                returns the metadata to record (JSON-ready dict).

        Yields:
            ``(path, created)``: the venv's directory and whether this call built it. While the
            context is open the venv holds a read lock, so no eviction removes it.

        Raises:
            filelock.Timeout: another process held the venv's lock past ``lock_timeout_s``.
            Whatever ``build`` raises; the half-built directory is removed first.
        """
        created = False
        while True:
            lock = self._lock(key)
            with lock.read_lock():
                if self._complete(key):
                    self._touch(key)
                    yield self.root / key, created
                    return
            with lock.write_lock():
                if not self._complete(key):
                    self._build(key, build)
                    created = True
            self.evict(keep={key})

    def _build(self, key: str, build: BuildFn) -> None:
        path = self.root / key
        if path.exists():
            logger.warning("removing half-built environment %s", path)
            shutil.rmtree(path)
        started = time.monotonic()
        try:
            record = build(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        record = {
            **record,
            "key": key,
            "created_at": datetime.now(UTC).isoformat(),
            "build_seconds": round(time.monotonic() - started, 3),
            "size_bytes": _disk_usage(path),
        }
        # Written last and atomically: its presence is what makes the venv complete.
        with tempfile.NamedTemporaryFile("w", dir=path, delete=False, suffix=".tmp") as fh:
            json.dump(record, fh, indent=2, sort_keys=True)
        os.replace(fh.name, path / METADATA_FILE)
        self._touch(key)
        logger.info("built environment %s (%d bytes)", path, record["size_bytes"])

    def entries(self) -> list[CachedEnvironment]:
        """Complete venvs in the cache, least recently used first."""
        found = []
        for path in self.root.iterdir():
            if not path.is_dir() or not (path / METADATA_FILE).is_file():
                continue
            try:
                size = int(self.read_metadata(path.name)["size_bytes"])
                last_used = (path / LAST_USED_FILE).stat().st_mtime_ns
            except (OSError, ValueError, KeyError):
                continue
            found.append(CachedEnvironment(path.name, path, size, last_used))
        return sorted(found, key=lambda entry: entry.last_used_ns)

    def total_bytes(self) -> int:
        """Disk use of the complete venvs in bytes, as measured when each was built."""
        return sum(entry.size_bytes for entry in self.entries())

    def evict(self, *, keep: Set[str] = frozenset()) -> list[str]:
        """Remove least-recently-used venvs until the cache fits its budget.

        Venvs in ``keep`` and venvs in use (read-locked) or being built stay. Directories left
        by builds that died (no metadata, no lock held) are removed as well.

        Args:
            keep: keys that must stay (the venv just prepared).

        Returns:
            The keys removed, oldest first.
        """
        removed: list[str] = []
        with filelock.FileLock(self.root / "evict.lock", timeout=self.lock_timeout_s):
            for path in self.root.iterdir():
                if path.is_dir() and path.name not in keep and not (path / METADATA_FILE).exists():
                    self._remove_if_idle(path.name, only_if_incomplete=True)
            entries = self.entries()
            total = sum(entry.size_bytes for entry in entries)
            for entry in entries:
                if total <= self.budget_bytes:
                    break
                if entry.key in keep:
                    continue
                if self._remove_if_idle(entry.key):
                    total -= entry.size_bytes
                    removed.append(entry.key)
            if total > self.budget_bytes:
                logger.warning(
                    "environment cache %s holds %d bytes, over its budget of %d, "
                    "because the rest is in use",
                    self.root,
                    total,
                    self.budget_bytes,
                )
        return removed

    def _remove_if_idle(self, key: str, *, only_if_incomplete: bool = False) -> bool:
        try:
            with self._lock(key).write_lock(blocking=False):
                if only_if_incomplete and self._complete(key):
                    return False
                logger.info("evicting environment %s", self.root / key)
                shutil.rmtree(self.root / key, ignore_errors=True)
                return True
        except filelock.Timeout:
            return False
