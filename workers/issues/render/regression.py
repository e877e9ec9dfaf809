"""An issue's Markdown: its title, the sections of its body, and the comment on a recurrence.

Pure: an :class:`~workers.issues.model.IssueReport` in, a
:class:`~workers.issues.model.RenderedIssue` out; no database, no network. The same text goes to
GitHub and to the local outbox. The issue is written for a maintainer who will not click
anything: every number carries its unit, tables are Markdown, and nothing is a JSON dump.

Every body ends in the hidden fingerprint marker (:mod:`workers.issues.trackers.markers`), so that a later
filing finds the open issue for the same benchmarks, metrics and culprit (or commit range) and
comments there instead of opening another.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence

from service.models import BisectionOutcome
from workers.issues.model import Bisection, Change, IssueReport, Probe, RenderedIssue
from workers.issues.render.markdown import (
    cell,
    commit_link,
    commit_table,
    count,
    format_change,
    format_p_value,
    format_value,
    person,
    plain_cell,
    pr_link,
    quote,
    range_link,
    sha_cell,
    shorten,
    slug,
    sparkline,
    version,
)
from workers.issues.render.profile import what_changed_section
from workers.issues.trackers.markers import fingerprint, marker, run_marker

_TITLE_LIMIT = 256  # GitHub rejects longer issue titles


def report_fingerprint(report: IssueReport) -> str:
    """The fingerprint of ``report``: its regressed benchmarks, metrics and culprit or range."""
    bisection = report.bisection
    benchmarks = [c.benchmark_id for c in report.regressions]
    metrics = [c.metric for c in report.regressions]
    if bisection.outcome == BisectionOutcome.CULPRIT and bisection.culprit is not None:
        return fingerprint(benchmarks, metrics, culprit=bisection.culprit.sha)
    # Without a known commit, the torch builds stand for the ends of the range.
    good = bisection.good.sha if bisection.good else f"torch:{version(report.baseline)}"
    bad = bisection.bad.sha if bisection.bad else f"torch:{version(report.tonight)}"
    return fingerprint(benchmarks, metrics, commit_range=(good, bad))


def render_issue(report: IssueReport) -> RenderedIssue:
    """Render ``report`` as a GitHub issue.

    Args:
        report: what the issue says.

    Returns:
        The title (at most 256 characters), the Markdown body ending in the fingerprint marker,
        the labels, and the fingerprint.
    """
    fp = report_fingerprint(report)
    ordered = tuple(sorted(report.regressions, key=lambda c: c.relative, reverse=True))
    sections = [
        _lead(report, ordered),
        _summary_section(ordered),
        _culprit_section(report),
        what_changed_section(report),
        _history_section(ordered),
        _environment_section(report),
        _reproduce_section(report, ordered),
        _checks_section(report),
        _improvements_section(report.improvements),
        _footer(report, fp),
    ]
    body = "\n\n".join(s for s in sections if s) + "\n"
    return RenderedIssue(
        title=_title(report, ordered),
        body=body,
        labels=tuple(dict.fromkeys(report.labels)),
        fingerprint=fp,
    )


def render_recurrence(report: IssueReport, *, issue_number: int | None = None) -> str:
    """The comment left on the open issue when the same regression shows up another night.

    Args:
        report: tonight's report carrying the same fingerprint as the issue.
        issue_number: the issue commented on, only for the wording of the note.

    Returns:
        Markdown: ``Still regressed on D`` and tonight's summary table.
    """
    ordered = tuple(sorted(report.regressions, key=lambda c: c.relative, reverse=True))
    where = f" (run {report.run_id})" if report.run_id is not None else ""
    torch = report.tonight.torch_version or "unknown torch"
    lines = [
        f"**Still regressed on {report.night.isoformat()}**{where}, torch {torch}.",
        "",
        _summary_table(ordered),
    ]
    return "\n".join(lines) + "\n"


def _title(report: IssueReport, ordered: Sequence[Change]) -> str:
    worst = ordered[0]
    what = f"{worst.benchmark} {worst.metric} {format_change(worst.relative)}"
    if len(ordered) > 1:
        what += f" and {len(ordered) - 1} more"
    bisection = report.bisection
    if bisection.outcome == BisectionOutcome.CULPRIT and bisection.culprit is not None:
        tail = f"since {bisection.culprit.short}"
        commit_title = shorten(bisection.culprit.title, 80)
        if commit_title:
            tail += f" ({commit_title})"
    elif bisection.outcome == BisectionOutcome.INCONCLUSIVE and bisection.known_range is not None:
        good, bad = bisection.known_range
        tail = f"in {good.short}..{bad.short}"
        if bisection.commits:
            tail += f" ({bisection.commits} commits)"
    else:
        tail = f"on {report.night.isoformat()}"
        if bisection.known_range is not None:
            good, bad = bisection.known_range
            same = good.sha.lower() == bad.sha.lower()
            tail += f" (at {bad.short})" if same else f" ({good.short}..{bad.short})"
        elif report.tonight.torch_version:
            tail += f" (torch {report.tonight.torch_version})"
    return shorten(f"[perf] {what} {tail}", _TITLE_LIMIT)


def _lead(report: IssueReport, ordered: Sequence[Change]) -> str:
    worst = ordered[0]
    bisection = report.bisection
    sentence = (
        f"**{worst.benchmark} {worst.metric} went from {format_value(worst.baseline, worst.unit)} "
        f"to {format_value(worst.tonight, worst.unit)} ({format_change(worst.relative)})** "
        f"on the night of {report.night.isoformat()}"
    )
    if worst.machine:
        sentence += f" on `{worst.machine}`"
    if len(ordered) > 1:
        sentence += f"; {len(ordered) - 1} more series regressed with it"
    sentence += "."
    lines = [sentence]
    if bisection.outcome == BisectionOutcome.CULPRIT and bisection.culprit is not None:
        c = bisection.culprit
        who = person(c)
        text = f"The bisection names {commit_link(report, c)}"
        if c.title:
            text += f" {quote(c.title)}"
        if who:
            text += f" by {who}"
        if c.pr_number is not None:
            text += f", {pr_link(report, c.pr_number)}"
        lines.append(text + " as the first bad commit.")
    elif bisection.outcome == BisectionOutcome.INCONCLUSIVE:
        lines.append(
            f"The bisection left the cause in the range {range_link(report, bisection)} "
            "without singling out one commit: "
            + (
                f"{bisection.reason}."
                if bisection.reason
                else "the measurements there were too close to call."
            )
        )
    elif bisection.outcome == BisectionOutcome.NOT_REPRODUCED:
        lines.append(
            "Bisection did not reproduce the change between "
            f"{range_link(report, bisection)}: "
            + (f"{bisection.reason}. " if bisection.reason else "the endpoints measured alike. ")
            + "That does not clear the nights above: a bisection measures each endpoint in a "
            "few processes, and a real step of the threshold's size still ends so in 3 to 24 "
            "nightly bisections in a hundred, by the benchmark's noise (docs/benchmarks.md, "
            '"The endpoint check under process noise").'
        )
    else:
        lines.append(
            f"The night's commit range is {range_link(report, bisection)}; "
            "it has not been bisected."
        )
    culprit = bisection.culprit if bisection.outcome == BisectionOutcome.CULPRIT else None
    if culprit is not None and culprit.author_login:
        lines.append(f"cc @{culprit.author_login}")
    return "\n\n".join(lines)


def _summary_table(ordered: Sequence[Change]) -> str:
    rows = [
        "| benchmark | metric | baseline → tonight | change | confidence "
        "| samples (baseline / tonight) | machine |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in ordered:
        samples = f"{count(c.baseline_samples)} / {count(c.tonight_samples)}"
        rows.append(
            f"| {c.benchmark} | {c.metric} | {format_value(c.baseline, c.unit)} → "
            f"{format_value(c.tonight, c.unit)} | **{format_change(c.relative)}**"
            f"{f' since {c.since}' if c.since else ''} | "
            f"{_confidence_cell(c)} | {samples} | {cell(c.machine) or 'n/a'} |"
        )
    return "\n".join(rows)


def _confidence_cell(change: Change) -> str:
    if change.p_value is None:
        return cell(change.p_basis) or "n/a"
    text = format_p_value(change.p_value)
    if change.p_basis:
        text += f" ({cell(change.p_basis)})"
    return text


def _summary_section(ordered: Sequence[Change]) -> str:
    return "## Summary\n\n" + _summary_table(ordered)


def _culprit_section(report: IssueReport) -> str:
    bisection = report.bisection
    parts: list[str] = []
    if bisection.outcome == BisectionOutcome.CULPRIT and bisection.culprit is not None:
        c = bisection.culprit
        rows = [
            "| | |",
            "| --- | --- |",
            f"| commit | {commit_link(report, c)} |",
            f"| title | {cell(c.title) or 'n/a'} |",
            f"| author | {cell(person(c)) or 'n/a'} |",
            f"| pull request | {pr_link(report, c.pr_number) if c.pr_number else 'none named'} |",
        ]
        if bisection.culprit_parent is not None:
            rows.append(f"| parent | {commit_link(report, bisection.culprit_parent)} |")
        parts.append("## Culprit\n\n" + "\n".join(rows))
    elif bisection.outcome == BisectionOutcome.INCONCLUSIVE:
        text = (
            "## Commit range\n\n"
            f"No single culprit: the cause lies in {range_link(report, bisection)}"
            + (
                f" ({bisection.reason})."
                if bisection.reason
                else ", where the probes could not tell the commits apart even with extra samples."
            )
        )
        if bisection.suspects:
            text += " The commits to read:\n\n" + commit_table(report, bisection.suspects)
        parts.append(text)
    else:
        text = f"## Commit range\n\n{range_link(report, bisection)}"
        text += f", {bisection.commits} commits." if bisection.commits else "."
        if bisection.suspects:
            text += "\n\n" + commit_table(report, bisection.suspects)
        parts.append(text)
    if bisection.probes:
        parts.append(_probe_table(report, bisection))
    return "\n\n".join(parts)


def _probe_table(report: IssueReport, bisection: Bisection) -> str:
    head = "### Bisection"
    facts = []
    if bisection.commits:
        floor = math.ceil(math.log2(bisection.commits + 1))
        facts.append(f"{bisection.commits} commits in range")
        if bisection.builds is not None:
            facts.append(f"{bisection.builds} builds (binary-search floor {floor})")
    elif bisection.builds is not None:
        facts.append(f"{bisection.builds} builds")
    show_benchmark = len({p.benchmark for p in bisection.probes if p.benchmark}) > 1
    header = "| # | commit | title |" + (" benchmark |" if show_benchmark else "")
    header += " vs good | vs bad | reading | samples | median | build |"
    rule = "|" + " --- |" * (header.count("|") - 1)
    rows = [header, rule]
    for i, p in enumerate(bisection.probes, start=1):
        median = format_value(p.median, p.unit) if p.median is not None else "n/a"
        build = f"{p.build_seconds:.0f} s" if p.build_seconds is not None else "n/a"
        reading = p.reading if p.skipped is None else f"skipped: {cell(p.skipped)}"
        cells = [str(i), commit_link(report, p.commit), cell(shorten(p.commit.title, 60))]
        if show_benchmark:
            cells.append(p.benchmark)
        cells += [
            _verdict_cell(p, p.verdict_good),
            _verdict_cell(p, p.verdict_bad),
            f"**{reading}**",
            count(p.samples),
            median,
            build,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    text = head + "\n\n"
    if facts:
        text += "; ".join(facts) + ". "
    text += (
        "Each probe's samples are compared with the good and the bad endpoint's; "
        "a verdict is `different`, `same` or `unknown` (too close to call).\n\n"
    )
    return text + "\n".join(rows)


def _verdict_cell(probe: Probe, verdict: str | None) -> str:
    if probe.skipped is not None:
        return ""
    return verdict or "(endpoint)"


def _history_section(ordered: Sequence[Change]) -> str:
    blocks = []
    for c in ordered:
        lines = [f"**{c.benchmark} {c.metric}**"]
        if c.noise:
            lines.append(c.noise)
        if c.sensitivity:
            lines.append(c.sensitivity)
        if c.work:
            lines.append(c.work)
        if c.chart_url:
            lines.append(f"![{c.benchmark} {c.metric} history]({c.chart_url})")
        if c.recent:
            values = ", ".join(format_value(v, c.unit) for v in c.recent)
            lines.append(
                f"Last {len(c.recent)} nights, oldest first: `{sparkline(c.recent)}` {values}"
            )
        if c.history_url:
            lines.append(f"History API: {c.history_url}")
        if len(lines) > 1:
            blocks.append("\n\n".join(lines))
    if not blocks:
        return ""
    return "## History\n\n" + "\n\n".join(blocks)


def _environment_section(report: IssueReport) -> str:
    rows_spec = [
        ("torch", "torch_version"),
        ("torch commit", "torch_commit"),
        ("GPU", "gpu"),
        ("driver", "driver"),
        ("CUDA", "cuda"),
        ("CPU", "cpu"),
        ("Python", "python"),
        ("machine", "machine"),
        ("allocator", "allocator"),
    ]
    base = report.baseline
    if base is not None:
        rows = ["| | baseline | tonight |", "| --- | --- | --- |"]
    else:
        rows = ["| | tonight |", "| --- | --- |"]
    for label, attr in rows_spec:
        tonight = getattr(report.tonight, attr)
        before = getattr(base, attr) if base is not None else None
        if tonight is None and before is None:
            continue
        fmt = sha_cell if attr == "torch_commit" else plain_cell
        if base is not None:
            rows.append(f"| {label} | {fmt(report, before)} | {fmt(report, tonight)} |")
        else:
            rows.append(f"| {label} | {fmt(report, tonight)} |")
    moved = "".join(f"\n- {line}" for line in report.build_changes)
    if moved:
        moved = "\n\n**Build identity changed** between the baseline nights and tonight:" + moved
    return "## Environment\n\n" + "\n".join(rows) + moved


def _reproduce_section(report: IssueReport, ordered: Sequence[Change]) -> str:
    lines = []
    seen: set[str] = set()
    for c in ordered:
        if c.benchmark_id in seen:
            continue
        seen.add(c.benchmark_id)
        command = (
            f"python -m suite run --model {shlex.quote(c.model)} --mode {c.mode} "
            f"--device {c.device}"
        )
        if c.compiler != "eager":
            command += f" --compiler {c.compiler}"
        lines.append(command + f" --out {slug(c.benchmark_id)}.json")
    bisection = report.bisection
    pair: tuple[str, str] | None = None
    if (
        bisection.outcome == BisectionOutcome.CULPRIT
        and bisection.culprit
        and bisection.culprit_parent
    ):
        # The culprit and its parent are the narrowest pair that shows the change.
        pair = (bisection.culprit_parent.sha, bisection.culprit.sha)
    elif bisection.known_range is not None and bisection.good != bisection.bad:
        pair = (bisection.known_range[0].sha, bisection.known_range[1].sha)
    if pair is not None:
        benchmark_flags = " ".join(f"--benchmark {b}" for b in sorted(seen))
        lines.append(
            f"nightbench bisect --repo {report.bisect_repo} --good {pair[0]} --bad {pair[1]} "
            f"{benchmark_flags} --direction slower --install {shlex.quote(report.install_command)}"
        )
    intro = (
        "With tonight's build installed, measure the benchmark"
        + (", then bisect on your own checkout" if pair is not None else "")
        + " (each `--out` file holds the raw samples, in ms per iteration):"
    )
    return "## Reproduce\n\n" + intro + "\n\n```bash\n" + "\n".join(lines) + "\n```"


def _checks_section(report: IssueReport) -> str:
    items = []
    checks = report.checks
    if checks.confirmation:
        verdict = {True: "reproduced", False: "did not reproduce", None: "no verdict"}[
            checks.confirmed
        ]
        items.append(f"- Confirmation re-run ({verdict}): {checks.confirmation}")
    else:
        items.append("- Confirmation re-run: not run.")
    bisection = report.bisection
    if bisection.outcome == BisectionOutcome.CULPRIT:
        if bisection.verified is True:
            parent = bisection.culprit_parent
            parent_text = f" ({commit_link(report, parent)})" if parent is not None else ""
            items.append(
                f"- Culprit verification: passed; the parent{parent_text} measures as good and "
                "the culprit as bad."
            )
        elif bisection.verified is False:
            items.append(
                "- Culprit verification: **failed**; "
                "treat the named commit as a lead, not a verdict."
            )
        else:
            items.append("- Culprit verification: not run.")
    elif bisection.outcome == BisectionOutcome.INCONCLUSIVE:
        items.append("- Culprit verification: not applicable, no single culprit was named.")
    skipped = [p for p in bisection.probes if p.skipped is not None]
    if skipped:
        names = ", ".join(f"`{p.commit.short}` ({cell(p.skipped)})" for p in skipped)
        items.append(f"- Skipped commits (did not build): {names}")
    return "## What was checked\n\n" + "\n".join(items)


def _improvements_section(improvements: Sequence[Change]) -> str:
    if not improvements:
        return ""
    rows = [
        "## Improvements\n",
        "The same night also got better here (no action needed):\n",
        "| benchmark | metric | baseline → tonight | change |",
        "| --- | --- | --- | --- |",
    ]
    for c in sorted(improvements, key=lambda c: c.relative):
        rows.append(
            f"| {c.benchmark} | {c.metric} | {format_value(c.baseline, c.unit)} → "
            f"{format_value(c.tonight, c.unit)} | {format_change(c.relative)} |"
        )
    return "\n".join(rows)


def _footer(report: IssueReport, fp: str) -> str:
    where = []
    if report.alert_id is not None:
        where.append(f"alert {report.alert_id}")
    if report.run_id is not None:
        where.append(f"run {report.run_id}")
    source = f" ({', '.join(where)})" if where else ""
    return (
        "---\n\n"
        f"<sub>Filed by nightbench{source}. Triage here: close this issue once fixed; close it "
        "with the label `invalid` (or as not planned) if it is noise; add the label `expected` to "
        "accept the new level as the baseline. Recurrences are added as comments, and so is "
        "the night the series is back at its level from before the regression.</sub>\n\n"
        + (run_marker(report.run_id) + "\n" if report.run_id is not None else "")
        + marker(fp)
    )
