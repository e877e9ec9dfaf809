"""The issue's "What changed" section: the profile probe's diff of the builds either side.

Pure: the :class:`~workers.issues.model.WhatChanged` answers of a report in, Markdown out. For
each benchmark profiled: the top rows of the diff (operator or function, before, after, change,
share of the step's change), the line saying how much of the step's change they explain, and the
addresses of the full diff and the two Chrome traces; a probe that failed is one line saying
why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.metrics import format_change
from service.profiles import RowStatus, format_profile_value
from workers.issues.model import IssueReport, WhatChanged
from workers.issues.render.markdown import cell

TOP_ROWS = 8
"""Rows of each diff the issue shows (the API serves them all)."""

_WHAT = {
    "latency": "`torch.profiler`: self CPU time per step of each aten operator and Python function",
    "cpu_instructions": "callgrind: self instructions per step of each function",
}
_PYTHON_WHAT = (
    "Python functions, by the bytecodes each ran itself per step (`sys.settrace`; callgrind "
    "sees the interpreter's C functions, below, not Python's)"
)


def what_changed_section(report: IssueReport) -> str:
    """``## What changed`` for ``report``; empty when no profile probe concerns it."""
    if not report.what_changed:
        return ""
    blocks = [_answer(report, answer) for answer in report.what_changed]
    return "## What changed\n\n" + "\n\n".join(blocks)


def _answer(report: IssueReport, answer: WhatChanged) -> str:
    builds = (
        f"{_sha(report, answer.before)} (the culprit's parent) and "
        f"{_sha(report, answer.after)} (the culprit)"
        if answer.culprit
        else f"{_sha(report, answer.before)} and {_sha(report, answer.after)} (the range's ends)"
    )
    head = f"**{answer.benchmark}** {answer.metric}, profiled on {builds}"
    if answer.diff is None:
        return f"{head}: not profiled: {cell(answer.failed) or 'no reason was recorded'}."
    diff = answer.diff
    lines = [f"{head}; {_WHAT.get(answer.metric, answer.metric)}."]
    python = diff.get("python")
    if isinstance(python, Mapping) and python.get("rows"):
        # A Python-level change reads first: its C rows are the interpreter running it.
        lines += ["", f"{_PYTHON_WHAT}:", *_block(python), "", "C functions, by instructions:"]
    lines += _block(diff)
    links = []
    if answer.diff_url:
        links.append(f"Full diff: {answer.diff_url}")
    if answer.trace_urls:
        links.append("Chrome traces (open in Perfetto): " + ", ".join(answer.trace_urls))
    if links:
        lines += ["", ". ".join(links)]
    return "\n".join(lines)


def _block(diff: Mapping[str, Any]) -> list[str]:
    """The top rows of one diff and the line saying how much they explain."""
    rows = list(diff.get("rows") or [])[:TOP_ROWS]
    table = ["", diff_table(rows, str(diff["unit"]))] if rows else []
    return [*table, "", explained_line(diff, shown=len(rows))]


def diff_table(rows: list[Mapping[str, Any]], unit: str) -> str:
    """A Markdown table of a profile diff's rows (``diff_json``'s ``rows``) in ``unit``."""
    out = [
        "| operator or function | before | after | change | share of the step's change |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        status = r.get("status")
        relative = (
            " (new)"
            if status == RowStatus.NEW
            else " (gone)"
            if status == RowStatus.GONE
            else f" ({format_change(r['change'] / r['before'])})"
            if r.get("before")
            else ""
        )
        share = "—" if r.get("share") is None else f"{r['share']:.0%}"
        out.append(
            f"| `{cell(str(r['name'])).replace('`', '')}` "
            f"| {format_profile_value(float(r['before']), unit)} "
            f"| {format_profile_value(float(r['after']), unit)} "
            f"| {format_profile_value(float(r['change']), unit, signed=True)}{relative} "
            f"| {share} |"
        )
    return "\n".join(out)


def explained_line(diff: Mapping[str, Any], *, shown: int) -> str:
    """How much of the profiled step's change the first ``shown`` rows of ``diff`` explain."""
    unit = str(diff["unit"])
    step = (
        f"{format_profile_value(float(diff['total_before']), unit)} → "
        f"{format_profile_value(float(diff['total_after']), unit)} per step"
    )
    rows = list(diff.get("rows") or [])
    if not rows:
        return (
            f"No operator or function moved above the noise ({diff.get('compared', 0)} compared, "
            f"threshold {format_profile_value(float(diff.get('threshold', 0.0)), unit)}); the "
            f"profiled step went {step}."
        )
    explained = sum(float(r["change"]) for r in rows[:shown])
    total = float(diff["total_change"])
    part = f"{explained / total:.0%}" if total else "none"
    more = f" ({len(rows) - shown} more rows in the full diff)" if len(rows) > shown else ""
    return (
        f"These rows explain {part} of the profiled step's change "
        f"({format_profile_value(total, unit, signed=True)}: {step}){more}."
    )


def _sha(report: IssueReport, sha: str) -> str:
    if report.code_url:
        return f"[`{sha[:7]}`]({report.code_url.rstrip('/')}/commit/{sha})"
    return f"`{sha[:7]}`"
