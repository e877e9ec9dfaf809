"""What an A/B says on its pull request: one comment (Markdown) and one commit status.

Pure: an :class:`ABView` in, text out. The comment leads with the verdict, then the table
(benchmark, metric, base, head, change with its 95% interval, p-value, verdict; flagged rows
first, then by the size of the change), what changed in each profiled regression (the profile
diff's top rows), and how it was measured and how to reproduce it. The status is ``failure``
when a row is flagged or the A/B could not measure (a build failed), naming what; ``success``
otherwise; ``error`` when the A/B was refused (a fork).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.metrics import format_change, format_value
from workers.ab.github import AB_MARKER
from workers.ab.verdicts import AB_ALPHA, FAILS_ON_HEAD, INTERVAL_ALPHA, ABRow
from workers.issues.render.markdown import cell, format_p_value
from workers.issues.render.profile import TOP_ROWS, diff_table, explained_line

STATUS_LIMIT = 140
"""GitHub's longest commit status description."""


@dataclass(frozen=True)
class ABView:
    """What the report needs of a stored A/B.

    Attributes:
        ab_id: the A/B's id.
        base_sha, head_sha: the commits measured.
        rows: the judged rows, flagged first.
        error: why it could not be measured (a build failed, a fork refused).
        refused: the A/B was refused rather than failed (a fork, no permission).
        options: the request's options (processes, samples, provider spec, build seconds).
        profiles: per profiled benchmark ``{"metric", "diff"}`` or ``{"metric", "reason"}``.
        pr_number: the pull request.
        current_head: the PR's head when reporting (a push during the run moves it).
        code_url: ``https://github.com/OWNER/NAME`` for commit links (None: plain shas).
        api_url: the nightbench API's base URL (for the A/B's address).
    """

    ab_id: int
    base_sha: str
    head_sha: str
    rows: Sequence[ABRow]
    error: str | None = None
    refused: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pr_number: int | None = None
    current_head: str | None = None
    code_url: str | None = None
    api_url: str | None = None

    @property
    def flagged(self) -> list[ABRow]:
        """The rows that fail the check."""
        return [r for r in self.rows if r.flagged]


def status_of(view: ABView) -> tuple[str, str]:
    """The commit status: ``(state, description)``, the description at most 140 characters.

    ``failure`` names the regressed (and broken) benchmarks with their changes, or the build
    that failed; ``error`` a refusal; ``success`` how many benchmark metrics were compared.
    """
    if view.error:
        state = "error" if view.refused else "failure"
        return state, _cut(view.error)
    flagged = view.flagged
    if flagged:
        parts = [
            f"{r.benchmark} fails on head"
            if r.verdict == FAILS_ON_HEAD
            else f"{r.benchmark} {r.metric} {format_change((r.ratio or 1.0) - 1)}"
            for r in flagged
        ]
        return "failure", _cut(f"{len(flagged)} regressed: " + ", ".join(parts))
    threshold = min((r.threshold for r in view.rows), default=0.07)
    return "success", _cut(
        f"no regression: {len(view.rows)} benchmark metric(s) compared, threshold {threshold:.0%}"
    )


def _cut(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= STATUS_LIMIT else line[: STATUS_LIMIT - 1] + "…"


def comment_body(view: ABView) -> str:
    """The pull request comment (Markdown, starting with the A/B marker)."""
    parts = [AB_MARKER, f"## nightbench A/B: {_headline(view)}", "", _builds_line(view)]
    moved = _moved_note(view)
    if moved:
        parts += ["", moved]
    if view.error:
        parts += ["", f"**{'Not run' if view.refused else 'Not measured'}:** {cell(view.error)}"]
    if view.rows:
        parts += ["", _table(view)]
        parts += ["", _legend(view)]
    for benchmark, answer in view.profiles.items():
        parts += ["", _what_changed(benchmark, answer)]
    parts += ["", _measured(view)]
    return "\n".join(parts).rstrip() + "\n"


def _headline(view: ABView) -> str:
    if view.error:
        return "not run" if view.refused else "not measured"
    flagged = view.flagged
    if not flagged:
        return f"no regression ({len(view.rows)} benchmark metric(s) compared)"
    names = sorted({r.benchmark for r in flagged})
    return f"{len(flagged)} regression(s) in {', '.join(f'`{n}`' for n in names)}"


def _sha(view: ABView, sha: str) -> str:
    if view.code_url:
        return f"[`{sha[:10]}`]({view.code_url.rstrip('/')}/commit/{sha})"
    return f"`{sha[:10]}`"


def _builds_line(view: ABView) -> str:
    processes = view.options.get("processes")
    samples = view.options.get("samples")
    how = (
        f"{processes} processes a side, interleaved, {samples} timed iterations each"
        if processes
        else ""
    )
    line = f"Base {_sha(view, view.base_sha)} (the merge base) against head {_sha(view, view.head_sha)}"
    return f"{line}; A/B {view.ab_id}" + (f"; {how}." if how else ".")


def _moved_note(view: ABView) -> str:
    if not view.current_head or view.current_head == view.head_sha:
        return ""
    return (
        f"> The PR's head is now {_sha(view, view.current_head)}, pushed during this run: these "
        f"figures are of {_sha(view, view.head_sha)}. Comment `/nightbench run` (or re-add the "
        "label) to measure the new head."
    )


def _change(row: ABRow) -> str:
    if row.ratio is None:
        return "—"
    text = format_change(row.ratio - 1)
    if row.low is not None and row.high is not None:
        text += f" ({format_change(row.low - 1)} to {format_change(row.high - 1)})"
    return text


def _table(view: ABView) -> str:
    out = [
        "| | benchmark | metric | base | head | change (95% interval) | p | verdict |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in view.rows:
        mark = "❌" if r.flagged else ("✅" if r.verdict == "improvement" else "")
        verdict = r.verdict
        if r.error:
            verdict += f": {cell(_short(r.error, 160))}"
        out.append(
            f"| {mark} | `{r.benchmark}` | {r.metric} | {format_value(r.base, r.unit)} "
            f"| {format_value(r.head, r.unit)} | {_change(r)} | {format_p_value(r.p_value)} "
            f"| {verdict} |"
        )
    return "\n".join(out)


def _legend(view: ABView) -> str:
    thresholds = sorted({r.threshold for r in view.rows})
    shown = ", ".join(f"{t:.0%}" for t in thresholds)
    again = sorted(view.options.get("remeasured") or ())
    remeasured = (
        " Measured again with as many processes more, its first ones leaving the change past "
        f"the threshold but not significant: {', '.join(f'`{b}`' for b in again)}."
        if again
        else ""
    )
    return (
        remeasured.strip()
        + ("\n\n" if again else "")
        + (
            f"A row regresses when head is slower (or larger) by more than the threshold ({shown}) "
            f"and the Mann–Whitney test over processes gives p < {AB_ALPHA}; the interval is the "
            f"Hodges–Lehmann {1 - 2 * INTERVAL_ALPHA:.0%} interval of the change. Values are "
            "medians of the processes' medians (peaks for memory, counted steps for instructions)."
        )
    )


def _what_changed(benchmark: str, answer: Mapping[str, Any]) -> str:
    head = f"### What changed in `{benchmark}` ({answer.get('metric', 'latency')})"
    diff = answer.get("diff")
    if not diff:
        return f"{head}\n\nNot profiled: {cell(str(answer.get('reason') or 'no reason'))}."
    rows = list(diff.get("rows") or [])[:TOP_ROWS]
    lines = [head, ""]
    if rows:
        lines += [diff_table(rows, str(diff["unit"])), ""]
    lines.append(explained_line(diff, shown=len(rows)))
    return "\n".join(lines)


def _measured(view: ABView) -> str:
    options = view.options
    spec = options.get("provider") or {}
    seconds = options.get("build_seconds") or {}
    builds = ", ".join(f"{side} {float(s):.0f} s" for side, s in seconds.items())
    lines = ["<details><summary>How this was measured, and how to reproduce it</summary>", ""]
    kind = spec.get("kind") if isinstance(spec, Mapping) else None
    if kind:
        lines.append(f"Builds: the `{kind}` provider" + (f" ({builds})." if builds else "."))
    lines += ["", "```sh", reproduce_command(view), "```"]
    if view.api_url:
        lines += ["", f"Every process: {view.api_url.rstrip('/')}/api/ab/{view.ab_id}"]
    lines += ["", "</details>"]
    return "\n".join(lines)


def reproduce_command(view: ABView) -> str:
    """The ``nightbench ab`` command that measures the same on a local clone."""
    options = view.options
    spec = options.get("provider") or {}
    args = ["nightbench", "ab", "--repo", "PATH/TO/CLONE", "--base", view.base_sha]
    args += ["--head", view.head_sha]
    for benchmark in options.get("benchmarks") or ():
        args += ["--benchmark", benchmark]
    for command in options.get("commands") or ():
        args += ["--command", command]
    for metric in options.get("metrics") or ():
        args += ["--metric", metric]
    if isinstance(spec, Mapping) and spec.get("kind"):
        args += ["--provider", str(spec["kind"])]
        if spec.get("install_command"):
            args += ["--install", str(spec["install_command"])]
        if spec.get("package"):
            args += ["--package", str(spec["package"])]
    if options.get("processes"):
        args += ["--processes", str(options["processes"])]
    return " ".join(shlex.quote(a) for a in args)


def _short(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
