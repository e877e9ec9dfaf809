"""A failing benchmark's issue, and the comments on it: it runs again, its bisection's answer.

Pure: the :mod:`workers.issues.model` dataclasses in, Markdown out.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from service.models import BisectionOutcome
from service.regressions.failing import error_summary
from workers.issues.model import (
    FailingReport,
    FailureBisected,
    RenderedIssue,
    RunsAgain,
)
from workers.issues.trackers.markers import marker, run_marker

ERROR_LINES = 40  # the last lines of the error the issue quotes


def render_failing(
    report: FailingReport, *, fingerprint: str, labels: Sequence[str]
) -> RenderedIssue:
    """The issue of a benchmark failing night after night.

    Args:
        report: the benchmark, its failing nights, its last good night, its bisection.
        fingerprint: the issue's fingerprint (its hidden marker).
        labels: the issue's labels.
    """
    failed, run = report.failed, report.run
    first_bad = failed[-1].run if failed else run
    last_error = (failed[0].error if failed else None) or "no error text"
    tail = "\n".join(last_error.strip().splitlines()[-ERROR_LINES:])
    table = "\n".join(
        f"| {f.run.night} | {f.run.id} | `{f.run.torch_spec}` | {commit(f.run.torch_git_commit)} "
        f"| {error_cell(f.error)} |"
        for f in failed
    )
    before, span = "", ""  # a benchmark counts as failing only after it ran: good is found
    good = report.last_good
    if good is not None:
        before = (
            f"It last ran on {good.night} (run {good.id}, build "
            f"`{good.torch_spec}`, torch commit {commit(good.torch_git_commit)})."
        )
        span = commit_range(
            report.source_repository, good.torch_git_commit, first_bad.torch_git_commit
        )
        span += _bisecting(report)
    body = (
        f"**`{report.benchmark}` has failed on its last {report.nights} nights on "
        f"`{report.queue}`** (since {report.since}). Without a result its series has no point, "
        f"so a regression in it goes unseen while it fails; and a build that breaks a model is "
        f"a regression of its own. {before}{span}\n\n"
        f"## Last error (night {failed[0].run.night if failed else run.night})\n\n"
        f"```\n{tail}\n```\n\n"
        f"## Nights\n\n| night | run | build | torch commit | error |\n| --- | --- | --- | --- "
        f"| --- |\n{table}\n\n"
        f"## Reproduce\n\nWith the failing build installed:\n\n```bash\n"
        f"python -m suite run --model {report.model} --mode {report.mode} --device "
        f"{report.device} --compiler {report.compiler} --out failing.json\n```\n\n"
        "---\n\n<sub>Filed by nightbench. Close this issue once the benchmark runs again; the "
        "status (`nightbench status`) lists it as a problem until it does.</sub>\n\n"
        f"{run_marker(run.id)}\n"
        f"{marker(fingerprint)}\n"
    )
    title = textwrap.shorten(
        f"[perf] {report.benchmark} fails on {report.queue} since {report.since}: "
        f"{error_summary(last_error)}",
        200,
        placeholder="…",
    )
    return RenderedIssue(title=title, body=body, labels=tuple(labels), fingerprint=fingerprint)


def render_runs_again(again: RunsAgain) -> str:
    """The comment telling a failing benchmark's issue that a run measured it (Markdown)."""
    run = again.run
    return (
        f"**Runs again on {run.night}** (run {run.id}, build `{run.torch_spec}`, torch "
        f"commit {commit(run.torch_git_commit)}): `{again.benchmark}` was measured on "
        f"`{again.queue}` after failing on {again.nights} nights since {again.since}. "
        "Close this issue if that is the fix you expected; if it fails again on two nights, "
        "a new issue is filed.\n"
    )


def render_bisected(bisected: FailureBisected) -> str:
    """The comment telling a failing benchmark's issue what its bisection found (Markdown)."""
    result, repo = bisected.result, bisected.source_repository
    (answer,) = result.get("benchmarks") or [{"range": [], "reason": "no answer"}]
    size = f"{result.get('builds')} builds, {result.get('rounds')} rounds"
    error = result.get("error")
    quoted = (
        (
            "\n\nIts error there:\n\n```\n"
            + "\n".join(error.strip().splitlines()[-ERROR_LINES:])
            + "\n```\n"
        )
        if error
        else "\n"
    )
    quoted = _stepped_around(result, repo) + quoted
    if bisected.outcome == BisectionOutcome.CULPRIT:
        (c,) = result["culprits"]
        pr = f" (#{c['pr_number']})" if c.get("pr_number") else ""
        return (
            f"**Bisected: `{bisected.benchmark}` fails from "
            f'{commit_link(repo, c["sha"])} on**: "{c.get("title") or ""}"{pr} by '
            f"{c.get('author') or 'unknown'}: {answer['reason']} (bisection "
            f"{bisected.id}, {size}). To check by hand, build "
            f"{commit_link(repo, c['sha'])} and its parent and run the command under "
            f"Reproduce with each.{quoted}"
        )
    span = answer.get("range") or []
    where = (
        f" The first failing commit lies in {commit_link(repo, span[0])} .. "
        f"{commit_link(repo, span[-1])} ({len(span)} commits)."
        if span and bisected.outcome == BisectionOutcome.INCONCLUSIVE
        else ""
    )
    what = (
        "did not reproduce the failure"
        if bisected.outcome == BisectionOutcome.NOT_REPRODUCED
        else "could not name one commit"
    )
    return f"**Bisection {bisected.id} {what}** ({size}): {answer['reason']}.{where}{quoted}"


def commit(sha: str | None) -> str:
    """A torch commit as a table names it: its first 10 hex digits quoted, or ``unknown``."""
    return f"`{sha[:10]}`" if sha else "unknown"


def error_cell(error: str | None) -> str:
    """The line of ``error`` that says what failed, shortened for a table cell."""
    return textwrap.shorten(error_summary(error), 120, placeholder="…").replace("|", "\\|")


def commit_range(repository: str | None, good: str | None, bad: str | None) -> str:
    """`` The commit range to search: ...`` between the last good night's build and the first
    failing night's, with a compare link when the source repository is on GitHub."""
    if not good or not bad or good == bad:
        return (
            " Its last good night and its first failing night ran the same torch commit: "
            "look at what else changed (the suite, the environment)."
            if good and bad
            else ""
        )
    text = f" The commit range to search: `{good[:10]}..{bad[:10]}`"
    if repository:
        text += f" ([compare](https://github.com/{repository}/compare/{good}...{bad}))"
    return text + "."


def commit_link(repository: str | None, sha: str) -> str:
    """A commit's short sha, linked when the source repository is on GitHub."""
    if repository:
        return f"[`{sha[:10]}`](https://github.com/{repository}/commit/{sha})"
    return f"`{sha[:10]}`"


def _bisecting(report: FailingReport) -> str:
    """What the issue says of the search for the commit that broke the benchmark."""
    if report.bisection_id is not None:
        return (
            f" Bisection {report.bisection_id} searches its {report.bisection_commits} "
            f"commit(s) on `{report.queue}`; the first commit at which it fails will be "
            "commented here."
        )
    if not report.bisect_provider:
        return (
            " Not bisected: no build provider is configured (`NIGHTBENCH_BISECT_PROVIDER`, "
            "with `NIGHTBENCH_SOURCE_REPO_PATH` or a wheel URL)."
        )
    return ""


def _stepped_around(result: dict[str, Any], repository: str | None) -> str:
    """The sentence naming the commits whose runs failed differently from the nights (another
    bug inside the range; counted neither way), or ``""``."""
    other = result.get("other") or []
    if not other:
        return ""
    named = "; ".join(
        f"{commit_link(repository, o['sha'])} ({error_summary(o.get('error'))[:160]})"
        for o in other
    )
    return (
        f" Stepped around, failing differently from the nights: {named}; whether the "
        "nights' failure is there too cannot be told."
    )
