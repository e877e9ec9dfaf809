"""The pieces of an issue's Markdown: numbers with their units, sparklines, table cells, and
links to commits, commit ranges and pull requests."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from service.metrics import format_change as format_change  # the one formatter, re-exported
from service.metrics import format_value as format_value
from workers.issues.model import Bisection, Commit, Environment, IssueReport

_SPARK = "▁▂▃▄▅▆▇█"


def format_p_value(p_value: float | None) -> str:
    """``p < 0.001``, ``p = 0.012``, or ``n/a``."""
    if p_value is None or not math.isfinite(p_value):
        return "n/a"
    if p_value < 0.001:
        return "p < 0.001"
    return f"p = {p_value:.3f}"


def sparkline(values: Sequence[float]) -> str:
    """A one-line chart of ``values`` with block characters (lowest ▁ to highest █)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low <= 0:
        return _SPARK[0] * len(values)
    steps = len(_SPARK) - 1
    return "".join(_SPARK[round((v - low) / (high - low) * steps)] for v in values)


def commit_link(report: IssueReport, commit: Commit) -> str:
    """A commit's short sha, linked to the report's code repository when it has one."""
    if report.code_url:
        return f"[`{commit.short}`]({report.code_url.rstrip('/')}/commit/{commit.sha})"
    return f"`{commit.short}`"


def range_link(report: IssueReport, bisection: Bisection) -> str:
    """The bisection's commit range as a compare link (or why it is unknown)."""
    if bisection.known_range is None:
        before, after = version(report.baseline), version(report.tonight)
        return f"unknown (torch {before} → {after}, commits not recorded)"
    good, bad = bisection.known_range
    if good.sha.lower() == bad.sha.lower():
        return f"{commit_link(report, bad)} (no new commit since the previous night)"
    text = f"`{good.short}..{bad.short}`"
    if report.code_url:
        return f"[{text}]({report.code_url.rstrip('/')}/compare/{good.sha}...{bad.sha})"
    return text


def commit_table(report: IssueReport, commits: Sequence[Commit]) -> str:
    """A Markdown table of ``commits``: sha, title, author, pull request."""
    rows = ["| commit | title | author | pull request |", "| --- | --- | --- | --- |"]
    for c in commits:
        pr = pr_link(report, c.pr_number) if c.pr_number else ""
        rows.append(
            f"| {commit_link(report, c)} | {cell(shorten(c.title, 80))} | "
            f"{cell(person(c))} | {pr} |"
        )
    return "\n".join(rows)


def version(env: Environment | None) -> str:
    """The torch version of ``env``, or ``unknown``."""
    return (env.torch_version if env is not None else None) or "unknown"


def pr_link(report: IssueReport, number: int | None) -> str:
    """A pull request number, linked to the report's code repository when it has one."""
    if number is None:
        return "none named"
    if report.code_url:
        return f"[#{number}]({report.code_url.rstrip('/')}/pull/{number})"
    return f"#{number}"


def person(commit: Commit) -> str:
    """A commit's author with their GitHub login when known."""
    if commit.author and commit.author_login:
        return f"{commit.author} (@{commit.author_login})"
    if commit.author_login:
        return f"@{commit.author_login}"
    return commit.author


def sha_cell(report: IssueReport, value: str | None) -> str:
    """A torch commit for the environment table (linked), or the text as it is."""
    if not value:
        return "n/a"
    if re.fullmatch(r"[0-9a-fA-F]{7,64}", value):
        short = value[:7]
        if report.torch_url:
            return f"[`{short}`]({report.torch_url.rstrip('/')}/commit/{value})"
        return f"`{short}`"
    return cell(value)


def plain_cell(report: IssueReport, value: str | None) -> str:
    """A table cell of ``value``, or ``n/a``."""
    return cell(value) if value else "n/a"


def cell(text: str | None) -> str:
    """Text safe inside a Markdown table cell (one line, pipes escaped)."""
    if not text:
        return ""
    return " ".join(text.split()).replace("|", "\\|")


def quote(title: str) -> str:
    """A commit title quoted for a sentence, shortened."""
    return f'"{cell(shorten(title, 100))}"' if title else ""


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def count(n: int | None) -> str:
    """``n`` as text, or ``n/a``."""
    return str(n) if n is not None else "n/a"


def slug(text: str) -> str:
    """``text`` as a file-name-safe slug."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "result"
