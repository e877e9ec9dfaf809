"""A benchmark failing night after night as an issue: its series has no point while it fails.

A benchmark whose job errors (an exception in the model, a CUDA fault, a build that cannot
import it) leaves its series without a point: a regression there goes unseen, and a torch
change that breaks a model is itself what the nightly exists to catch. On the night a
benchmark's failures reach ``FAILING_NIGHTS`` nights in a row on a machine class
(:func:`service.status.service.failing_benchmarks`), the nightly stores a ``failing`` alert
with its filing pending (:func:`note_failing`), filed like any alert through the durable
filing (:mod:`workers.issues.pending`: outbox, retry with backoff, status) by
:func:`file_failing_alert`: one issue per benchmark and streak (the fingerprint names the
benchmark, the machine class and the streak's first night, so later nights of the same streak
find the same issue), with the error, the nights, the last good night's build and the commit
range between it and the first failing night. That range is bisected to the first commit at
which the benchmark fails (:mod:`workers.issues.failing_bisect`), and the answer commented on
the issue (:func:`render_bisected`).
"""

from __future__ import annotations

import hashlib
import logging
import textwrap
from datetime import date, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import (
    Alert,
    AlertStatus,
    Bisection,
    BisectionStatus,
    Job,
    JobStatus,
    Run,
    RunKind,
)
from service.status.service import (
    FAILING_NIGHTS,
    FailingBenchmark,
    error_summary,
    failing_benchmarks,
)
from workers.bisect.failure_driver import is_failure
from workers.issues.filing_state import alert_and_run, mark_pending
from workers.issues.markers import marker, run_marker
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.tracker import IssueTracker, searchable_labels

log = logging.getLogger(__name__)
FAILING = "failing"
LABELS = ("nightbench", "benchmark-failure")
ERROR_LINES = 40  # the last lines of the error the issue quotes


def failing_fingerprint(queue: str, benchmark: str, since: date) -> str:
    """16 hex digits naming "``benchmark`` failing on ``queue`` since ``since``"."""
    return hashlib.sha256(f"{FAILING}\0{queue}\0{benchmark}\0{since}".encode()).hexdigest()[:16]


def failing_labels(settings: Settings) -> tuple[str, ...]:
    """The deployment's first label, then ``LABELS``
    (:func:`workers.issues.tracker.searchable_labels`)."""
    return searchable_labels(settings, LABELS)


def _ended(session: Session, run: Run, status: str) -> set[tuple[str, str]]:
    """``(benchmark, queue)`` of ``run``'s jobs that ended ``status``; none for a run that is
    not a night (a confirmation, a round, a replicate)."""
    if run.kind not in (RunKind.NIGHTLY, RunKind.INGEST):
        return set()
    return {
        (j.benchmark, j.queue)
        for j in session.scalars(select(Job).where(Job.run_id == run.id, Job.status == status))
    }


def newly_failing(session: Session, *, run: Run) -> list[FailingBenchmark]:
    """The benchmarks of ``run`` (a nightly or posted run) whose failures reach exactly
    ``FAILING_NIGHTS`` nights in a row with tonight's (nights up to ``run.night``)."""
    failed = _ended(session, run, JobStatus.ERROR)
    return (
        [
            f
            for f in failing_benchmarks(session, today=run.night, until=run.night)
            if (f.benchmark, f.queue) in failed and f.nights == FAILING_NIGHTS
        ]
        if failed
        else []
    )


def runs_again(session: Session, *, run: Run) -> list[FailingBenchmark]:
    """The benchmarks ``run`` (a nightly or posted run) measured after they had failed on
    ``FAILING_NIGHTS`` or more nights in a row just before (their streaks as of the night
    before ``run.night``)."""
    done = _ended(session, run, JobStatus.DONE)
    before = run.night - timedelta(days=1)
    return (
        [
            f
            for f in failing_benchmarks(session, today=run.night, until=before)
            if (f.benchmark, f.queue) in done
        ]
        if done
        else []
    )


def note_failing(session: Session, *, run: Run) -> Alert | None:
    """Store ``run``'s ``failing`` alert, its filing pending and due now, when a benchmark's
    failures reach ``FAILING_NIGHTS`` nights in a row tonight (:func:`newly_failing`) or a
    benchmark that had failed so runs again (:func:`runs_again`: its issue is told); the
    filing step or its retry files it. Idempotent. Only flushes.

    Returns:
        The alert, or None when there is nothing of the kind tonight.
    """
    fresh, again = newly_failing(session, run=run), runs_again(session, run=run)
    if not fresh and not again:
        return None
    alert = session.scalar(select(Alert).where(Alert.run_id == run.id, Alert.kind == FAILING))
    if alert is None:
        alert = Alert(run_id=run.id, kind=FAILING, status=AlertStatus.OPEN)
        session.add(alert)
    mark_pending(alert)
    parts = []
    if fresh:
        parts.append(
            f"failing {FAILING_NIGHTS} nights in a row: " + ", ".join(f.benchmark for f in fresh)
        )
    if again:
        parts.append("runs again: " + ", ".join(f.benchmark for f in again))
    alert.summary = "; ".join(parts)
    session.flush()
    log.warning("run %s: %s", run.id, alert.summary)
    return alert


def render_failing_alert(
    session: Session, *, alert_id: int, settings: Settings
) -> list[RenderedIssue]:
    """The issues the ``failing`` alert ``alert_id`` files, rendered, filing nothing (empty
    once filed).

    Raises:
        NotFound: no such alert, or its run is gone.
    """
    alert, run = alert_and_run(session, alert_id, FAILING)
    if alert.status == AlertStatus.FILED:
        return []
    return [_render(session, run, f, settings, alert.id) for f in newly_failing(session, run=run)]


def file_failing_alert(
    session: Session, *, alert_id: int, settings: Settings, tracker: IssueTracker
) -> list[TrackedIssue]:
    """File the ``failing`` alert ``alert_id``: one issue per benchmark newly failing (the
    tracker returns the open issue carrying the same fingerprint instead of filing it twice),
    and a comment on the open issue of each benchmark that runs again. Only flushes; the
    caller (:func:`workers.issues.pending.file_durably`) commits, or rolls back on failure.

    Raises:
        NotFound: no such alert, or its run is gone.
        InfrastructureError: the tracker kept failing.
    """
    issues = render_failing_alert(session, alert_id=alert_id, settings=settings)
    filed = [tracker.create(issue) for issue in issues]
    for issue in filed:
        log.warning("alert %s: failing benchmark filed as %s", alert_id, issue.url)
    alert, run = alert_and_run(session, alert_id, FAILING)
    for again in runs_again(session, run=run):
        open_issue = tracker.find_open(
            failing_fingerprint(again.queue, again.benchmark, again.since)
        )
        if open_issue is None:  # closed since, or never filed: nothing to tell
            continue
        tracker.comment(
            open_issue.number, render_runs_again(run, again), key=f"runs-again-{run.id}"
        )
        log.info("alert %s: %s runs again, told on %s", alert_id, again.benchmark, open_issue.url)
        filed.append(open_issue)
    filed.extend(_tell_bisections(session, alert, tracker, settings))
    alert.status = AlertStatus.FILED
    session.flush()
    return filed


def render_runs_again(run: Run, failing: FailingBenchmark) -> str:
    """The comment telling a failing benchmark's issue that ``run`` measured it (Markdown)."""
    return (
        f"**Runs again on {run.night}** (run {run.id}, build `{run.torch_spec}`, torch "
        f"commit {_commit(run.torch_git_commit)}): `{failing.benchmark}` was measured on "
        f"`{failing.queue}` after failing on {failing.nights} nights since {failing.since}. "
        "Close this issue if that is the fix you expected; if it fails again on two nights, "
        "a new issue is filed.\n"
    )


def _nights(session: Session, failing: FailingBenchmark, until: date) -> list[tuple[Run, Job]]:
    """The benchmark's jobs that ended (done or error) on its machine class and their runs,
    nightly and posted, on nights up to ``until``, newest first (60 at most)."""
    return list(
        session.execute(
            select(Run, Job)
            .join(Job, Job.run_id == Run.id)
            .where(
                Job.model == failing.model,
                Job.mode == failing.mode,
                Job.device == failing.device,
                Job.compiler == failing.compiler,
                Job.queue == failing.queue,
                Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)),
                Run.night <= until,
                Job.status.in_((JobStatus.DONE, JobStatus.ERROR)),
            )
            .order_by(Run.night.desc(), Job.id.desc())
            .limit(60)
        ).all()
    )


def streak_ends(
    session: Session, failing: FailingBenchmark, until: date
) -> tuple[Run | None, Run | None]:
    """``(last good night, first failing night)`` of ``failing``'s streak as of ``until``: the
    runs whose builds bound the commit range that broke it (None where not found)."""
    rows = _nights(session, failing, until)
    failed = [r for r, j in rows if r.night >= failing.since and j.status == JobStatus.ERROR]
    good = next((r for r, j in rows if j.status == JobStatus.DONE), None)
    return good, (failed[-1] if failed else None)


def _render(
    session: Session, run: Run, failing: FailingBenchmark, settings: Settings, alert_id: int
) -> RenderedIssue:
    rows = _nights(session, failing, run.night)
    failed = [(r, j) for r, j in rows if r.night >= failing.since and j.status == JobStatus.ERROR]
    good = next(((r, j) for r, j in rows if j.status == JobStatus.DONE), None)
    first_bad = failed[-1][0] if failed else run
    last_error = (failed[0][1].error if failed else None) or "no error text"
    tail = "\n".join(last_error.strip().splitlines()[-ERROR_LINES:])
    table = "\n".join(
        f"| {r.night} | {r.id} | `{r.torch_spec}` | {_commit(r.torch_git_commit)} | "
        f"{_cell(j.error)} |"
        for r, j in failed
    )
    before, span = "", ""  # a benchmark counts as failing only after it ran: good is found
    if good is not None:
        before = (
            f"It last ran on {good[0].night} (run {good[0].id}, build "
            f"`{good[0].torch_spec}`, torch commit {_commit(good[0].torch_git_commit)})."
        )
        span = _range(settings, good[0].torch_git_commit, first_bad.torch_git_commit)
        span += _bisecting(session, alert_id, failing, settings)
    body = (
        f"**`{failing.benchmark}` has failed on its last {failing.nights} nights on "
        f"`{failing.queue}`** (since {failing.since}). Without a result its series has no point, "
        f"so a regression in it goes unseen while it fails; and a build that breaks a model is "
        f"a regression of its own. {before}{span}\n\n"
        f"## Last error (night {failed[0][0].night if failed else run.night})\n\n"
        f"```\n{tail}\n```\n\n"
        f"## Nights\n\n| night | run | build | torch commit | error |\n| --- | --- | --- | --- "
        f"| --- |\n{table}\n\n"
        f"## Reproduce\n\nWith the failing build installed:\n\n```bash\n"
        f"python -m suite run --model {failing.model} --mode {failing.mode} --device "
        f"{failing.device} --compiler {failing.compiler} --out failing.json\n```\n\n"
        "---\n\n<sub>Filed by nightbench. Close this issue once the benchmark runs again; the "
        "status (`nightbench status`) lists it as a problem until it does.</sub>\n\n"
        f"{run_marker(run.id)}\n"
        f"{marker(failing_fingerprint(failing.queue, failing.benchmark, failing.since))}\n"
    )
    error_line = error_summary(last_error)
    title = textwrap.shorten(
        f"[perf] {failing.benchmark} fails on {failing.queue} since {failing.since}: {error_line}",
        200,
        placeholder="…",
    )
    return RenderedIssue(
        title=title,
        body=body,
        labels=failing_labels(settings),
        fingerprint=failing_fingerprint(failing.queue, failing.benchmark, failing.since),
    )


def _commit(sha: str | None) -> str:
    return f"`{sha[:10]}`" if sha else "unknown"


def _cell(error: str | None) -> str:
    return textwrap.shorten(error_summary(error), 120, placeholder="…").replace("|", "\\|")


def _range(settings: Settings, good: str | None, bad: str | None) -> str:
    """`` The commit range: ...`` between the last good night's build and the first failing
    night's, with a compare link when the source repository is on GitHub."""
    if not good or not bad or good == bad:
        return (
            " Its last good night and its first failing night ran the same torch commit: "
            "look at what else changed (the suite, the environment)."
            if good and bad
            else ""
        )
    text = f" The commit range to search: `{good[:10]}..{bad[:10]}`"
    if settings.source_github_repository:
        text += (
            f" ([compare](https://github.com/{settings.source_github_repository}/compare/"
            f"{good}...{bad}))"
        )
    return text + "."


def failure_bisections(session: Session, alert_id: int) -> list[Bisection]:
    """The failure bisections started for the ``failing`` alert ``alert_id``, oldest first."""
    return [
        b
        for b in session.scalars(
            select(Bisection).where(Bisection.alert_id == alert_id).order_by(Bisection.id)
        )
        if is_failure(b)
    ]


def _bisecting(
    session: Session, alert_id: int, failing: FailingBenchmark, settings: Settings
) -> str:
    """What the issue says of the search for the commit that broke the benchmark."""
    key = failing_fingerprint(failing.queue, failing.benchmark, failing.since)
    started = [b for b in failure_bisections(session, alert_id) if b.config.get("issue") == key]
    if started:
        return (
            f" Bisection {started[-1].id} searches its {len(started[-1].commits) - 1} "
            f"commit(s) on `{failing.queue}`; the first commit at which it fails will be "
            "commented here."
        )
    if not settings.bisect_provider:
        return (
            " Not bisected: no build provider is configured (`NIGHTBENCH_BISECT_PROVIDER`, "
            "with `NIGHTBENCH_SOURCE_REPO_PATH` or a wheel URL)."
        )
    return ""


def _tell_bisections(
    session: Session, alert: Alert, tracker: IssueTracker, settings: Settings
) -> list[TrackedIssue]:
    """Comment each finished failure bisection of ``alert`` on its open issue, once (a closed
    issue is not told)."""
    told = []
    for bisection in failure_bisections(session, alert.id):
        if bisection.status != BisectionStatus.DONE or not bisection.result:
            continue
        open_issue = tracker.find_open(bisection.config.get("issue", ""))
        if open_issue is None:
            continue
        tracker.comment(
            open_issue.number, render_bisected(bisection, settings), key=f"bisected-{bisection.id}"
        )
        log.info(
            "alert %s: bisection %s (%s) told on %s",
            alert.id,
            bisection.id,
            bisection.outcome,
            open_issue.url,
        )
        told.append(open_issue)
    return told


def render_bisected(bisection: Bisection, settings: Settings) -> str:
    """The comment telling a failing benchmark's issue what its bisection found (Markdown)."""
    result = bisection.result or {}
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
    quoted = _stepped_around(result, settings) + quoted
    if bisection.outcome == "culprit":
        (c,) = result["culprits"]
        pr = f" (#{c['pr_number']})" if c.get("pr_number") else ""
        return (
            f"**Bisected: `{bisection.benchmarks[0]}` fails from "
            f'{_commit_link(settings, c["sha"])} on**: "{c.get("title") or ""}"{pr} by '
            f"{c.get('author') or 'unknown'}: {answer['reason']} (bisection "
            f"{bisection.id}, {size}). To check by hand, build "
            f"{_commit_link(settings, c['sha'])} and its parent and run the command under "
            f"Reproduce with each.{quoted}"
        )
    span = answer.get("range") or []
    where = (
        f" The first failing commit lies in {_commit_link(settings, span[0])} .. "
        f"{_commit_link(settings, span[-1])} ({len(span)} commits)."
        if span and bisection.outcome == "inconclusive"
        else ""
    )
    what = (
        "did not reproduce the failure"
        if bisection.outcome == "not_reproduced"
        else "could not name one commit"
    )
    return f"**Bisection {bisection.id} {what}** ({size}): {answer['reason']}.{where}{quoted}"


def _stepped_around(result: dict[str, Any], settings: Settings) -> str:
    """The sentence naming the commits whose runs failed differently from the nights (another
    bug inside the range; counted neither way), or ``""``."""
    other = result.get("other") or []
    if not other:
        return ""
    named = "; ".join(
        f"{_commit_link(settings, o['sha'])} ({error_summary(o.get('error'))[:160]})" for o in other
    )
    return (
        f" Stepped around, failing differently from the nights: {named}; whether the "
        "nights' failure is there too cannot be told."
    )


def _commit_link(settings: Settings, sha: str) -> str:
    if settings.source_github_repository:
        return (
            f"[`{sha[:10]}`](https://github.com/{settings.source_github_repository}/commit/{sha})"
        )
    return f"`{sha[:10]}`"
