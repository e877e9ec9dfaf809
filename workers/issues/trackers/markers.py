"""An issue's identity: its fingerprint, and the hidden markers that carry it.

Every issue body ends in ``<!-- nightbench:fingerprint=<hex> -->`` so that a later filing finds
the open issue for the same benchmarks, metrics and culprit (or commit range) and comments there
instead of opening another. ``<!-- nightbench:run=<id> -->`` names the run an issue was filed
for, and ``<!-- nightbench:comment=<key> -->`` makes a comment findable, so that it is left once
per key. Both trackers read them back (:mod:`workers.issues.trackers.github`,
:mod:`workers.issues.trackers.outbox`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from service.errors import InvalidInput

MARKER_PREFIX = "nightbench:fingerprint="
_MARKER_RE = re.compile(r"<!--\s*nightbench:fingerprint=([0-9a-f]{8,64})\s*-->")
_RUN_MARKER_RE = re.compile(r"<!--\s*nightbench:run=(\d+)\s*-->")
COMMENT_MARKER_PREFIX = "nightbench:comment="
_COMMENT_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def fingerprint(
    benchmarks: Iterable[str],
    metrics: Iterable[str],
    *,
    culprit: str | None = None,
    commit_range: tuple[str, str] | None = None,
) -> str:
    """A stable identity for "these benchmarks regressed in these metrics because of X".

    Order and repetition of ``benchmarks`` and ``metrics`` do not matter; shas compare
    case-insensitively.

    Args:
        benchmarks: benchmark ids such as ``"hf_Bert:train:cuda"``.
        metrics: metric names such as ``"latency"``.
        culprit: the culprit's full sha, when the bisection named one.
        commit_range: ``(good_sha, bad_sha)`` when there is no single culprit.

    Returns:
        16 lowercase hex digits (the start of a SHA-256 over a canonical JSON form).

    Raises:
        InvalidInput: no benchmark or metric, or not exactly one of ``culprit`` and
            ``commit_range``.
    """
    names = sorted({b.strip() for b in benchmarks if b.strip()})
    kinds = sorted({m.strip() for m in metrics if m.strip()})
    if not names:
        raise InvalidInput("fingerprint needs at least one benchmark")
    if not kinds:
        raise InvalidInput("fingerprint needs at least one metric")
    if (culprit is None) == (commit_range is None):
        raise InvalidInput("fingerprint needs exactly one of culprit and commit_range")
    cause = (
        {"culprit": culprit.lower()}
        if culprit is not None
        else {"range": [commit_range[0].lower(), commit_range[1].lower()]}  # type: ignore[index]
    )
    canonical = json.dumps({"benchmarks": names, "metrics": kinds, **cause}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def marker(fp: str) -> str:
    """The hidden HTML comment that carries ``fp`` in an issue body."""
    return f"<!-- {MARKER_PREFIX}{fp} -->"


def run_marker(run_id: int) -> str:
    """The hidden HTML comment naming the run an issue was filed for."""
    return f"<!-- nightbench:run={run_id} -->"


def find_fingerprint(body: str | None) -> str | None:
    """The fingerprint in an issue body's marker, or ``None`` if it carries none."""
    if not body:
        return None
    found = _MARKER_RE.search(body)
    return found.group(1) if found else None


def find_run_id(body: str | None) -> int | None:
    """The run id in an issue body's run marker, or ``None``."""
    if not body:
        return None
    found = _RUN_MARKER_RE.search(body)
    return int(found.group(1)) if found else None


def comment_marker(key: str) -> str:
    """The hidden HTML comment that makes a comment findable by ``key``."""
    return f"<!-- {COMMENT_MARKER_PREFIX}{key} -->"


def check_key(key: str) -> str:
    """``key`` when it is a valid comment key (letters, digits, ``_.:-``, 1 to 128).

    Raises:
        InvalidInput: it is not.
    """
    if not _COMMENT_KEY_RE.fullmatch(key):
        raise InvalidInput(
            f"comment key must be 1-128 characters of letters, digits and _.:-, got {key!r}"
        )
    return key


def with_comment_marker(body: str, key: str) -> str:
    """``body`` ending in the hidden marker of comment ``key`` (a repeat finds it)."""
    return f"{body.rstrip()}\n\n{comment_marker(key)}\n"
