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


def _commit_link(report: IssueReport, commit: Commit) -> str:
    if report.code_url:
        return f"[`{commit.short}`]({report.code_url.rstrip('/')}/commit/{commit.sha})"
    return f"`{commit.short}`"


def _range_link(report: IssueReport, bisection: Bisection) -> str:
    if bisection.known_range is None:
        before, after = _version(report.baseline), _version(report.tonight)
        return f"unknown (torch {before} → {after}, commits not recorded)"
    good, bad = bisection.known_range
    if good.sha.lower() == bad.sha.lower():
        return f"{_commit_link(report, bad)} (no new commit since the previous night)"
    text = f"`{good.short}..{bad.short}`"
    if report.code_url:
        return f"[{text}]({report.code_url.rstrip('/')}/compare/{good.sha}...{bad.sha})"
    return text


def _commit_table(report: IssueReport, commits: Sequence[Commit]) -> str:
    rows = ["| commit | title | author | pull request |", "| --- | --- | --- | --- |"]
    for c in commits:
        pr = _pr_link(report, c.pr_number) if c.pr_number else ""
        rows.append(
            f"| {_commit_link(report, c)} | {_cell(_shorten(c.title, 80))} | "
            f"{_cell(_person(c))} | {pr} |"
        )
    return "\n".join(rows)


def _version(env: Environment | None) -> str:
    return (env.torch_version if env is not None else None) or "unknown"


def _pr_link(report: IssueReport, number: int | None) -> str:
    if number is None:
        return "none named"
    if report.code_url:
        return f"[#{number}]({report.code_url.rstrip('/')}/pull/{number})"
    return f"#{number}"


def _person(commit: Commit) -> str:
    if commit.author and commit.author_login:
        return f"{commit.author} (@{commit.author_login})"
    if commit.author_login:
        return f"@{commit.author_login}"
    return commit.author


def _sha_cell(report: IssueReport, value: str | None) -> str:
    if not value:
        return "n/a"
    if re.fullmatch(r"[0-9a-fA-F]{7,64}", value):
        short = value[:7]
        if report.torch_url:
            return f"[`{short}`]({report.torch_url.rstrip('/')}/commit/{value})"
        return f"`{short}`"
    return _cell(value)


def _plain_cell(report: IssueReport, value: str | None) -> str:
    return _cell(value) if value else "n/a"


def _cell(text: str | None) -> str:
    """Text safe inside a Markdown table cell (one line, pipes escaped)."""
    if not text:
        return ""
    return " ".join(text.split()).replace("|", "\\|")


def _quote(title: str) -> str:
    return f'"{_cell(_shorten(title, 100))}"' if title else ""


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _count(n: int | None) -> str:
    return str(n) if n is not None else "n/a"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "result"
