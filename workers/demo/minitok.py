"""A small real Python package, ``minitok``, and a git history of it with known culprits.

``minitok`` is a WordPiece-style tokenizer in pure Python (greedy longest-match sub-words over a
seeded vocabulary): ``Tokenizer.encode`` and ``Tokenizer.decode`` are its hot paths, and
``bench.py`` at the repository root measures them the way ``nightbench bisect --command`` wants::

    python bench.py encode    # last line: {"samples": [ms, ...]}

:func:`make_package_repository` writes a repository of N + 1 commits: a first commit, then N
ordinary commits (changelog entries, docs, helpers off the hot path, tests, version bumps), one
of which may add redundant validity checks in ``encode``'s loops (the kind of slowdown PyTorch
PR #61056 was about: a check that was already guaranteed, run on every call; about +30%),
another a bounds check in ``decode``'s loop (about +25%), another an extra aten operator in
``minitok.tensors.pool`` (a transposed copy of the whole embedding table on every call: the
``aten::copy_`` of a ``.contiguous()`` nobody needed), and others may break the package's
build (an invalid ``pyproject.toml``). ``minitok.tensors`` is the package's one tensor
function (imported on its own, so that the tokenizer's hot paths never import torch): the suite
model ``tokbag`` pools its embedding table through it. The bisection tests,
``benchmarks/bisection.py`` and ``nightbench demo`` all use it, so the culprit is known and the
slowdown is real.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from service.errors import InvalidInput

if TYPE_CHECKING:
    import git

INSTALL_COMMAND = "pip install --no-deps --no-build-isolation --no-index -e ."
"""Installs a checkout of ``minitok`` into the probe's environment, offline."""

ENCODE = "python bench.py encode"
DECODE = "python bench.py decode"
POOL = "python bench.py pool"
VOCAB_SIZE = 3000
"""Pieces in the vocabulary ``build_vocab()`` makes by default (``vocab_size`` changes it)."""

AUTHORS = (
    ("Ada Moreno", "ada@example.org"),
    ("Bo Lindqvist", "bo@example.org"),
    ("Chidi Okafor", "chidi@example.org"),
    ("Dana Weiss", "dana@example.org"),
    ("Emeka Hart", "emeka@example.org"),
)
HISTORY_START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
"""The history's first commit date; commit ``k`` is ``k`` hours later, by ``AUTHORS[k % len(AUTHORS)]``."""
_LETTER_PIECES = 1 + 2 * 26
"""``[UNK]``, then each letter and its ``##`` continuation: the vocabulary's first pieces."""


@dataclass(frozen=True)
class _Tree:
    """What the package looks like at one commit."""

    version: int = 0
    vocab_size: int = VOCAB_SIZE
    pool_copy: bool = False
    encode_check: bool = False
    word_scan: bool = False
    per_lookup: bool = False
    decode_check: bool = False
    decode_per_lookup: bool = False
    broken: bool = False
    unfinished: bool = False
    crash: bool = False
    helpers: int = 0
    changelog: tuple[str, ...] = ()
    doc_notes: int = 0
    tests: int = 1


def _pyproject(t: _Tree) -> str:
    # An unquoted version is invalid TOML: the build fails, as a bad packaging edit would.
    version = f"0.1.{t.version}" if t.broken else f'"0.1.{t.version}"'
    return f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "minitok"
version = {version}
description = "A small WordPiece-style tokenizer in pure Python"
requires-python = ">=3.9"

[tool.setuptools]
packages = ["minitok"]
"""


_VOCAB = '''"""A seeded vocabulary of sub-word pieces (no download: built from a fixed seed)."""

import random

LETTERS = "abcdefghijklmnopqrstuvwxyz"
UNK = "[UNK]"


def build_vocab(size={size}, seed=0):
    """Return {piece: id}: single letters, their "##" continuations, then seeded pieces."""
    rng = random.Random(seed)
    vocab = {UNK: 0}
    for c in LETTERS:
        vocab[c] = len(vocab)
        vocab["##" + c] = len(vocab)
    while len(vocab) < size:
        piece = "".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 6)))
        vocab.setdefault(piece if rng.random() < 0.5 else "##" + piece, len(vocab))
    return vocab


def sample_text(words=600, seed=1):
    """Deterministic lower-case text of ``words`` words."""
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 12))) for _ in range(words)
    )
'''


# minitok/tensors.py; the field is the planted copy (empty when off).
_TENSORS = '''"""Tensor helpers for models that embed minitok's ids (this module imports torch)."""

from torch.nn import functional as F


def pool(table, ids, offsets):
    """The mean embedding of each text.

    ``table`` is [pieces, dim], ``ids`` the texts' ids end to end, ``offsets`` where each text
    starts (EmbeddingBag's layout); returns [texts, dim].
    """
{copy}    return F.embedding_bag(ids, table, offsets, mode="mean")
'''


def _tensors(t: _Tree) -> str:
    # The planted operator: the whole table copied column-major on every call (an
    # aten::contiguous of its transpose, i.e. aten::clone and aten::copy_), then viewed back.
    copy = "    table = table.t().contiguous().t()\n" if t.pool_copy else ""
    return _TENSORS.format(copy=copy)


# minitok/tokenizer.py; the fields are the planted checks (empty when off) and the notes.
_TOKENIZER = '''"""Greedy longest-match sub-word tokenization (WordPiece style).
{notes}"""

from minitok.vocab import UNK


class Tokenizer:
    """Encode text to ids and back with a fixed vocabulary."""

    def __init__(self, vocab):
        self.vocab = dict(vocab)
        self.inverse = [None] * len(self.vocab)
        for piece, i in self.vocab.items():
            self.inverse[i] = piece
        self.max_len = {max_len}
        self.unk = self.vocab[{unk}]

    def _check_word(self, word):
        if not all(c.isalpha() and c.islower() for c in word):
            raise ValueError("not a lower-case word: " + word)

    def _check_piece(self, piece):
        body = piece[2:] if piece.startswith("##") else piece
        if not body or not all(c.isalpha() and c.islower() for c in body):
            raise ValueError("not a piece: " + piece)

    def encode(self, text):
        """Return the ids of ``text``'s pieces."""
        ids = []
        vocab = self.vocab
        for word in text.lower().split():
{word_check}            start, n = 0, len(word)
            while start < n:
                end = min(n, start + self.max_len)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
{lookup_check}                    if piece in vocab:
{piece_check}                        ids.append(vocab[piece])
                        break
                    end -= 1
                else:
                    ids.append(self.unk)
                    end = start + 1
                start = end
        return ids

    def decode(self, ids):
        """Return the text of ``ids`` (pieces joined, "##" continuations glued on)."""
        out = []
        inverse = self.inverse
        for i in ids:
{id_check}            piece = inverse[i]
            if piece.startswith("##"):
                out.append(piece[2:])
            else:
                out.append(" ")
                out.append(piece)
        return "".join(out).strip()
'''


def _tokenizer(t: _Tree) -> str:
    notes = "".join(
        f"\nNote {i + 1}: pieces are matched greedily, longest first.\n" for i in range(t.doc_notes)
    )
    word_check = (
        "            self._check_word(word)\n"
        if t.encode_check
        # One scan of each word, in C but per character: about +8%.
        else (
            "            if not all(map(str.isalpha, word)):\n"
            '                raise ValueError("not a word: " + word)\n'
            if t.word_scan
            else ""
        )
    )
    piece_check = (
        "                        if self.inverse[vocab[piece]] != piece:\n"
        '                            raise ValueError("vocabulary is inconsistent at " + piece)\n'
        "                        if not (piece[2:] if start else piece).islower():\n"
        '                            raise ValueError("not a lower-case piece: " + piece)\n'
        if t.encode_check
        else ""
    )
    lookup_check = (
        # The same checks again at every vocabulary lookup: word and piece re-validated.
        "                    self._check_word(word)\n                    self._check_piece(piece)\n"
        if t.per_lookup
        else ""
    )
    id_check = (
        "            if not 0 <= i < len(inverse):\n"
        '                raise ValueError("id out of range: %d" % i)\n'
        if t.decode_check
        else ""
    ) + (
        # The piece re-validated, and looked up again, at every id.
        "            self._check_piece(inverse[i])\n"
        "            if self.vocab[inverse[i]] != i:\n"
        '                raise ValueError("vocabulary is inconsistent at %d" % i)\n'
        if t.decode_per_lookup
        else ""
    )
    # The crash: the longest piece itself instead of its length (``encode`` then adds a str to
    # an int, a TypeError on its first word), as a careless simplification would.
    max_len = "max(self.vocab, key=len)" if t.crash else "max(len(p) for p in self.vocab)"
    return _TOKENIZER.format(
        unk="UNKNOWN" if t.unfinished else "UNK",
        notes=notes,
        word_check=word_check,
        lookup_check=lookup_check,
        piece_check=piece_check,
        id_check=id_check,
        max_len=max_len,
    )


def _extras(t: _Tree) -> str:
    body = '"""Helpers around the tokenizer, off its hot path."""\n'
    for i in range(t.helpers):
        body += f'''

def helper_{i}(text):
    """Collapse whitespace and lower-case (variant {i})."""
    return " ".join(text.split()).lower()
'''
    return body


_INIT = '''"""minitok: a small WordPiece-style tokenizer."""

from minitok.tokenizer import Tokenizer
from minitok.vocab import build_vocab, sample_text

__all__ = ["Tokenizer", "build_vocab", "sample_text"]
'''

_BENCH = '''"""Latency of minitok's hot paths.

python bench.py encode|decode|pool prints {"samples": [ms, ...]} on its last line. Each sample is the
median of INNER timed calls, so one disturbed call does not move it, and each call is timed in
CPU time of this thread (time.thread_time): on a shared machine wall time also counts the time
other processes held the core, which says nothing about this code.
"""

import json
import os
import statistics
import sys
import time

import minitok

INNER = int(os.environ.get("MINITOK_INNER", "5"))


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "encode"
    count = int(os.environ.get("NIGHTBENCH_SAMPLES", "15"))
    tok = minitok.Tokenizer(minitok.build_vocab())
    text = minitok.sample_text(words=600)
    ids = tok.encode(text) * 3
    if which == "pool":
        import torch
        from minitok.tensors import pool

        table = torch.randn(len(tok.vocab), 32, generator=torch.Generator().manual_seed(0))
        flat, offsets = torch.tensor(ids), torch.tensor([0, len(ids) // 2])

        def call():
            pool(table, flat, offsets)
    elif which == "encode":
        def call():
            tok.encode(text)
    elif which == "decode":
        def call():
            tok.decode(ids)
    else:
        raise SystemExit("usage: python bench.py encode|decode|pool")
    for _ in range(3):
        call()
    samples = []
    for _ in range(count):
        times = []
        for _ in range(INNER):
            start = time.thread_time()
            call()
            times.append((time.thread_time() - start) * 1e3)
        samples.append(statistics.median(times))
    print(json.dumps({"samples": samples}))


if __name__ == "__main__":
    main()
'''


def _tests(t: _Tree) -> str:
    body = """from minitok import Tokenizer, build_vocab


def test_round_trip():
    tok = Tokenizer(build_vocab())
    assert tok.decode(tok.encode("hello world")) == "hello world"
"""
    for i in range(1, t.tests):
        body += f"""

def test_words_{i}():
    tok = Tokenizer(build_vocab())
    assert len(tok.encode("abc " * {i + 1})) >= {i + 1}
"""
    return body


def _files(t: _Tree) -> dict[str, str]:
    return {
        "pyproject.toml": _pyproject(t),
        "README.md": "# minitok\n\nA small WordPiece-style tokenizer in pure Python.\n\n"
        "    python bench.py encode\n",
        "CHANGELOG.md": "# Changelog\n\n" + "".join(f"- {line}\n" for line in t.changelog),
        "bench.py": _BENCH,
        "minitok/__init__.py": _INIT,
        "minitok/vocab.py": _VOCAB.replace("{size}", str(t.vocab_size)),
        "minitok/tensors.py": _tensors(t),
        "minitok/tokenizer.py": _tokenizer(t),
        "minitok/extras.py": _extras(t),
        "tests/test_tokenizer.py": _tests(t),
    }


@dataclass(frozen=True)
class PackageRepository:
    """A generated ``minitok`` repository.

    Attributes:
        path: the work tree.
        shas: every commit, oldest first (``shas[0]`` is the first commit, the good endpoint of
            a bisection over the whole history).
        culprits: ``benchmark command -> sha`` of the commit that slowed it (``ENCODE``,
            ``DECODE``, ``POOL``).
        broken: shas of commits whose build fails.
        crash: sha of the commit from which ``encode`` raises (every benchmark using it fails).
    """

    path: Path
    shas: tuple[str, ...]
    culprits: dict[str, str]
    broken: tuple[str, ...]
    crash: str | None = None

    @property
    def good(self) -> str:
        """The first commit's sha (before the slowdown)."""
        return self.shas[0]

    @property
    def bad(self) -> str:
        """The last commit's sha (after the slowdown)."""
        return self.shas[-1]


def _write(path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def _ordinary(k: int, t: _Tree) -> tuple[_Tree, str]:
    kind = k % 5
    if kind == 0:
        return replace(
            t, changelog=(*t.changelog, f"Internal clean-up {k}")
        ), f"Tidy the changelog for release work ({k})"
    if kind == 1:
        return replace(t, helpers=t.helpers + 1), f"Add helper_{t.helpers} for text clean-up"
    if kind == 2:
        return replace(t, doc_notes=t.doc_notes + 1), "Document greedy matching in tokenizer"
    if kind == 3:
        return replace(t, tests=t.tests + 1), f"Test longer inputs ({t.tests + 1} words)"
    return replace(t, version=t.version + 1), f"Bump version to 0.1.{t.version + 1}"


def make_package_repository(
    path: str | Path,
    *,
    commits: int = 32,
    encode_culprit: int | None = None,
    decode_culprit: int | None = None,
    broken: Iterable[int] = (),
    per_lookup: bool = False,
    crash_culprit: int | None = None,
    unfinished: Iterable[int] = (),
    light: bool = False,
    pool_culprit: int | None = None,
    vocab_size: int = VOCAB_SIZE,
) -> PackageRepository:
    """Write a ``minitok`` git repository with ``commits`` commits after the first.

    Commit k (1 ≤ k ≤ ``commits``) is an ordinary change unless it is a culprit or broken. A
    broken commit's ``pyproject.toml`` is invalid (its build fails); the next commit repairs it.

    Args:
        path: an empty or missing directory.
        commits: N, the commits after the first one.
        encode_culprit: k of the commit that adds redundant checks to ``encode``'s loops
            (about 30% slower), or None.
        decode_culprit: k of the commit that adds a bounds check to ``decode``'s loop (about
            25% slower), or None.
        broken: k of commits whose build fails.
        per_lookup: the encode culprit also re-validates the word and the piece at every
            vocabulary lookup (about 7 times slower instead of 30%), and the decode culprit
            re-validates the piece of every id (several times slower instead of 25%).
        crash_culprit: k of the commit from which ``encode`` raises a TypeError (a careless
            simplification of ``max_len``; no later commit repairs it), or None.
        unfinished: k of commits whose tokenizer raises a NameError when made (``UNKNOWN`` for
            ``UNK``, a rename half done); the next commit repairs it. Not the crash's failure.
        light: the encode culprit only checks once that each word is alphabetic (about +8%,
            a Python-level slowdown near the detection threshold) instead of its checks.
        pool_culprit: k of the commit that makes ``minitok.tensors.pool`` copy its table
            column-major on every call (``table.t().contiguous().t()``: one extra
            ``aten::copy_`` of [vocab_size, dim] floats per call), or None.
        vocab_size: pieces in the default vocabulary (``build_vocab()``), from the first
            commit on: the rows of the table a model pools, so the size of the planted copy
            (400,000 pieces of 32 floats: 51 MB, a few seconds to build the vocabulary).

    Returns:
        The :class:`PackageRepository`.

    Raises:
        InvalidInput: an index outside 1..N, a commit given two roles, a vocabulary smaller
            than its 53 letter pieces, or a non-empty path.
        git.GitCommandError: git refused a command; its message names the command line and
            quotes git's stderr.
    """
    import git  # GitPython, as workers/commits.py; imported here to keep imports cheap

    root = Path(path)
    broken, unfinished = tuple(sorted(set(broken))), tuple(sorted(set(unfinished)))
    _check_arguments(
        root,
        commits,
        encode_culprit,
        decode_culprit,
        broken,
        crash_culprit,
        unfinished,
        pool_culprit=pool_culprit,
    )
    if vocab_size < _LETTER_PIECES:
        raise InvalidInput(f"vocab_size must be at least {_LETTER_PIECES}, got {vocab_size}")
    root.mkdir(parents=True, exist_ok=True)

    planted = {
        encode_culprit: (
            (dict(word_scan=True), "Check that words are alphabetic while encoding")
            if light
            else (
                dict(encode_check=True, per_lookup=per_lookup),
                "Validate words and pieces while encoding",
            )
        ),
        decode_culprit: (
            dict(decode_check=True, decode_per_lookup=per_lookup),
            "Check id bounds in decode",
        ),
        crash_culprit: (dict(crash=True), "Simplify how the tokenizer finds its longest piece"),
        pool_culprit: (dict(pool_copy=True), "Keep the embedding table column-major when pooling"),
    }
    with git.Repo.init(root, initial_branch="main") as repo:
        repo.git.config("commit.gpgsign", "false")
        shas = _write_history(repo, commits, planted, broken, unfinished, vocab_size=vocab_size)
    culprits = {
        name: shas[k]
        for name, k in ((ENCODE, encode_culprit), (DECODE, decode_culprit), (POOL, pool_culprit))
        if k is not None
    }
    return PackageRepository(
        root,
        tuple(shas),
        culprits,
        tuple(shas[k] for k in broken),
        shas[crash_culprit] if crash_culprit is not None else None,
    )


def _write_history(
    repo: git.Repo,
    commits: int,
    planted: dict[int | None, tuple[dict, str]],
    broken: tuple[int, ...],
    unfinished: tuple[int, ...] = (),
    *,
    vocab_size: int = VOCAB_SIZE,
) -> list[str]:
    """Commit 0..``commits`` (a planted change where ``planted`` names one, else a plain one);
    their shas."""
    tree, shas = _Tree(vocab_size=vocab_size), []
    for k in range(commits + 1):
        if k in planted:
            fields, message = planted[k]
            tree = replace(tree, broken=False, unfinished=False, **fields)
        else:
            tree, message = _plain_change(k, tree, k in broken, k in unfinished)
        shas.append(_commit(repo, k, tree, message))
    return shas


def _check_arguments(
    root: Path,
    commits: int,
    encode_culprit: int | None,
    decode_culprit: int | None,
    broken: tuple[int, ...],
    crash_culprit: int | None = None,
    unfinished: tuple[int, ...] = (),
    *,
    pool_culprit: int | None = None,
) -> None:
    """Raise InvalidInput naming the first argument of make_package_repository that is wrong."""
    if commits < 1:
        raise InvalidInput(f"commits must be at least 1, got {commits}")
    for name, k in (
        ("encode_culprit", encode_culprit),
        ("decode_culprit", decode_culprit),
        ("crash_culprit", crash_culprit),
        ("pool_culprit", pool_culprit),
        *(("broken", b) for b in broken),
        *(("unfinished", u) for u in unfinished),
    ):
        if k is not None and not 1 <= k <= commits:
            raise InvalidInput(f"{name} must lie in 1..{commits}, got {k}")
    culprits = {encode_culprit, decode_culprit, crash_culprit, pool_culprit}
    if culprits & {*broken, *unfinished} or set(broken) & set(unfinished):
        raise InvalidInput("a commit cannot be two of: a culprit, broken, unfinished")
    if root.exists() and any(root.iterdir()):
        raise InvalidInput(f"path: {root} is not empty")


def _plain_change(k: int, tree: _Tree, breaks: bool, unfinished: bool) -> tuple[_Tree, str]:
    """The tree and message of commit k when it is not a culprit: import, break, repair or ordinary."""
    if k == 0:
        return tree, "Initial import of minitok"
    if breaks:
        tree = replace(tree, version=tree.version + 1, broken=True)
        return tree, f"Bump version to 0.1.{tree.version}"
    if unfinished:
        return replace(tree, unfinished=True), "Rename the unknown-piece marker"
    if tree.broken:
        return replace(tree, broken=False), "Fix pyproject.toml: quote the version"
    if tree.unfinished:
        return replace(tree, unfinished=False), "Finish the rename: keep UNK"
    return _ordinary(k, tree)


def _commit(repo: git.Repo, k: int, tree: _Tree, message: str) -> str:
    """Write ``tree`` and commit it as commit k (author and date by k, a PR reference); its sha."""
    pr = 1001 + k
    if k % 3 == 1:
        message += f"\n\nPull Request resolved: https://github.com/example/minitok/pull/{pr}"
    elif k > 0:
        message += f" (#{pr})"
    name, email = AUTHORS[k % len(AUTHORS)]
    when = (HISTORY_START + timedelta(hours=k)).isoformat()
    # Over this process's environment (GitPython's ``env``): the identity and the date fixed.
    identity = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": when,
    }
    _write(Path(str(repo.working_tree_dir)), _files(tree))
    repo.git.add("-A")
    repo.git.commit("--quiet", "--allow-empty", "-m", message, env=identity)
    return str(repo.head.commit.hexsha)
