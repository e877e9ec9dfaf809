"""Filing an alert's confirmed regressions as issues, and reading triage back from them.

Filing (:func:`file_alert`), for one alert:

1. The reproduced regressions are grouped by cause: one group per culprit commit, one per
   inconclusive narrowed range, and the rest under the night's commit range.
2. Each group becomes an :class:`~workers.issue_render.IssueReport` built from the database
   (baseline, tonight, sample counts, machine, recent nights, environment, confirmation re-run,
   bisection probes) and is rendered; its fingerprint covers benchmarks, metrics and cause.
3. Dedup: an open :class:`~service.models.IssueRecord` with the fingerprint gets a
   "still regressed on D" comment (once per run). Without one, the tracker is asked for an open
   issue carrying the fingerprint marker, which finds an issue whose creation was not recorded
   (a crash between the tracker's answer and the commit): it is adopted, with a comment only if
   it was filed for another run. Otherwise a new issue is created.

Sync-back (:func:`sync_issues`, periodic task ``issues.sync``): for each recorded issue the
tracker reports as changed, the linked regressions move to ``expected`` (label ``expected``;
detection then restarts the series' baseline there), ``invalid`` (closed with the label
``invalid`` or as not planned), ``fixed`` (closed otherwise; ``reverted`` stays), or back to
``untriaged`` (reopened, or the ``expected`` label removed from an open issue).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InvalidInput, NotFound
from service.models import (
    Alert,
    IssueRecord,
    IssueRegression,
    Machine,
    Regression,
    Result,
    Run,
)
from service.models.base import utcnow
from service.regressions.detection import MEMORY_METRICS, Night, confirm
from service.regressions.service import history_nights, range_start, set_state
from service.results.service import series_history
from workers.bisection import CULPRIT, INCONCLUSIVE, NOT_REPRODUCED, SKIPPED, Outcome, ProbeRecord
from workers.github import IssueTracker, TrackedIssue, make_tracker
from workers.issue_render import (
    Bisection,
    Change,
    Checks,
    Commit,
    Environment,
    IssueReport,
    Probe,
    RenderedIssue,
    render_issue,
    render_recurrence,
)

log = logging.getLogger(__name__)

EXPECTED_LABEL = "expected"
INVALID_LABEL = "invalid"
TORCH_CODE_URL = "https://github.com/pytorch/pytorch"
RECENT_NIGHTS = 14
# Sync re-reads a few minutes before the newest change it has seen: GitHub's ``since`` has
# whole seconds and clocks differ; reading a change twice is harmless.
SYNC_OVERLAP = timedelta(minutes=5)
_SHA_CHARS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class BisectionInput:
    """What a bisection of the alert's commit range found, for the issues to report.

    Attributes:
        outcome: :func:`workers.bisection.outcome` of the final state.
        probes: every probe recorded (``BisectionState.probes``), in order.
        commits: the range ``[good, ..., bad]`` in first-parent order, as
            :class:`workers.commits.CommitInfo` or its ``as_json()`` dict; an ``author_login``
            key, when present, gets the author cc'd.
        repo: path of the checkout to give in the reproduction's ``nightbench bisect --repo``.
        code_url: web address of the repository, for commit links (``None``: bare shas).
        install_command: the reproduction's ``--install`` command.
    """

    outcome: Outcome
    probes: tuple[ProbeRecord, ...]
    commits: tuple[Any, ...]
    repo: str | None = None
    code_url: str | None = TORCH_CODE_URL
    install_command: str | None = None

    @classmethod
    def from_report(
        cls,
        report: Any,
        *,
        repo: str | None = None,
        code_url: str | None = TORCH_CODE_URL,
        install_command: str | None = None,
    ) -> BisectionInput:
        """From a :class:`workers.probes.BisectionReport` (what ``bisect_repository`` returns).

        Args:
            report: has ``outcome``, ``state.probes`` and ``commits`` (``CommitInfo``).
            repo, code_url, install_command: as the attributes of the same names.
        """
        return cls(
            outcome=report.outcome,
            probes=tuple(report.state.probes),
            commits=tuple(report.commits),
            repo=repo,
            code_url=code_url,
            install_command=install_command,
        )


@dataclass(frozen=True)
class FiledIssue:
    """What filing did for one group of regressions.

    Attributes:
        record_id: the :class:`~service.models.IssueRecord`.
        number: the issue number in its tracker.
        url: where to read it.
        action: ``created`` | ``commented`` (recurrence) | ``adopted`` (found by its marker,
            filed for this run by an attempt that did not get to record it).
        fingerprint: the fingerprint it carries.
        regression_ids: the regressions it now speaks for.
    """

    record_id: int
    number: int
    url: str
    action: str
    fingerprint: str
    regression_ids: tuple[int, ...]


@dataclass(frozen=True)
class SyncReport:
    """What a sync-back pass did.

    Attributes:
        seen: issues the tracker reported as changed that have a record here.
        changed: regression id -> the triage state it was moved to.
    """

    seen: int
    changed: Mapping[int, str] = field(default_factory=dict)


@dataclass
class _Group:
    outcome: str  # culprit | inconclusive | not_reproduced | not_bisected
    regressions: list[Regression]
    culprit: str | None = None
    good: str | None = None
    bad: str | None = None
    suspects: tuple[str, ...] = ()


# ----- filing -----------------------------------------------------------------------------------


def file_alert(
    session: Session,
    *,
    alert_id: int,
    settings: Settings,
    tracker: IssueTracker | None = None,
    bisection: BisectionInput | None = None,
) -> list[FiledIssue]:
    """File the reproduced regressions of alert ``alert_id``: one issue per cause.

    Safe to call again for the same alert (a retried task): issues already filed for it are
    found (in the database, or by their marker in the tracker) and neither filed nor commented
    on twice. Only flushes; the caller commits.

    Args:
        session: database session.
        alert_id: the alert.
        settings: for the tracker (when ``tracker`` is None), API links and sample windows.
        tracker: where issues go; default :func:`workers.github.make_tracker`.
        bisection: the bisection of the alert's commit range, when one ran; without it the
            regressions are reported against the night's commit range.

    Returns:
        One :class:`FiledIssue` per group; empty when nothing was reproduced.

    Raises:
        NotFound: no alert ``alert_id``.
        InfrastructureError: the tracker kept failing (nothing is recorded for the groups not
            yet filed; a retry picks up where this stopped).
    """
    alert = session.get(Alert, alert_id, with_for_update=True)
    if alert is None:
        raise NotFound(f"alert {alert_id} does not exist")
    run = session.get(Run, alert.run_id)
    if run is None:
        raise NotFound(f"run {alert.run_id} of alert {alert_id} does not exist")
    regressions = list(
        session.scalars(
            select(Regression)
            .where(
                Regression.alert_id == alert_id,
                Regression.direction == "regression",
                Regression.confirmation == "reproduced",
            )
            .order_by(Regression.id)
        )
    )
    if not regressions:
        return []
    tracker = tracker or make_tracker(settings)
    improvements = list(
        session.scalars(
            select(Regression)
            .where(Regression.run_id == run.id, Regression.direction == "improvement")
            .order_by(Regression.id)
        )
    )
    filed = []
    for group in _groups(session, run, regressions, bisection):
        report = build_report(
            session,
            run=run,
            alert=alert,
            group=group,
            improvements=improvements,
            bisection=bisection,
            settings=settings,
        )
        filed.append(
            _file_group(session, tracker=tracker, run=run, alert=alert, group=group, report=report)
        )
    alert.status = "filed"
    session.flush()
    return filed


def _file_group(
    session: Session,
    *,
    tracker: IssueTracker,
    run: Run,
    alert: Alert,
    group: _Group,
    report: IssueReport,
) -> FiledIssue:
    rendered = render_issue(report)
    record = _open_record(session, tracker, rendered.fingerprint)
    created_now = False
    if record is None:
        # Not recorded: an issue created by an attempt that crashed before its commit still
        # carries the marker; otherwise file a new one (create looks for the marker again).
        found = tracker.find_open(rendered.fingerprint)
        if found is None:
            found = tracker.create(rendered)
            created_now = found.run_id in (None, run.id)
        # A record closed here but open there (reopened) keeps its recorded state: sync-back
        # reads the reopening and moves the regressions back to untriaged.
        record = _existing_record(session, tracker, found) or _new_record(
            session, tracker=tracker, issue=found, rendered=rendered, run=run, alert=alert
        )
    if record.run_id == run.id:
        action = "created" if created_now else "adopted"
    else:
        action = "commented"
        tracker.comment(record.number, render_recurrence(report), key=f"run-{run.id}")
        log.info("run %s: commented on issue #%d (still regressed)", run.id, record.number)
    if created_now:
        log.info("alert %s: filed %s", alert.id, record.url)
    record.last_night = max(record.last_night, run.night)
    linked = _link(session, record, group.regressions)
    session.flush()
    return FiledIssue(
        record_id=record.id,
        number=record.number,
        url=record.url,
        action=action,
        fingerprint=rendered.fingerprint,
        regression_ids=linked,
    )


def _open_record(session: Session, tracker: IssueTracker, fp: str) -> IssueRecord | None:
    """The recorded open issue with fingerprint ``fp``, checked against the tracker.

    An issue closed (or gone) since the last sync is recorded as closed and not returned, so a
    regression that came back gets a fresh issue rather than a comment on a closed one.
    """
    record = session.scalar(
        select(IssueRecord)
        .where(
            IssueRecord.fingerprint == fp,
            IssueRecord.tracker == tracker.kind,
            IssueRecord.location == tracker.location,
            IssueRecord.state == "open",
        )
        .order_by(IssueRecord.id.desc())
        .limit(1)
    )
    if record is None:
        return None
    try:
        current = tracker.get(record.number)
    except NotFound:
        record.state = "closed"
        return None
    if current.state != "open":
        # Leave labels and the watermark to sync-back, which moves the regressions.
        record.state = current.state
        return None
    return record


def _existing_record(
    session: Session, tracker: IssueTracker, issue: TrackedIssue
) -> IssueRecord | None:
    return session.scalar(
        select(IssueRecord).where(
            IssueRecord.tracker == tracker.kind,
            IssueRecord.location == tracker.location,
            IssueRecord.number == issue.number,
        )
    )


def _new_record(
    session: Session,
    *,
    tracker: IssueTracker,
    issue: TrackedIssue,
    rendered: RenderedIssue,
    run: Run,
    alert: Alert,
) -> IssueRecord:
    record = IssueRecord(
        fingerprint=rendered.fingerprint,
        tracker=tracker.kind,
        location=tracker.location,
        number=issue.number,
        url=issue.url,
        title=issue.title,
        state=issue.state,
        state_reason=issue.state_reason,
        labels=list(issue.labels),
        alert_id=alert.id,
        run_id=issue.run_id if issue.run_id is not None else run.id,
        first_night=run.night,
        last_night=run.night,
        remote_updated_at=issue.updated_at,
    )
    session.add(record)
    session.flush()
    return record


def _link(
    session: Session, record: IssueRecord, regressions: Sequence[Regression]
) -> tuple[int, ...]:
    have = set(
        session.scalars(
            select(IssueRegression.regression_id).where(IssueRegression.issue_id == record.id)
        )
    )
    for regression in regressions:
        if regression.id not in have:
            session.add(IssueRegression(issue_id=record.id, regression_id=regression.id))
            have.add(regression.id)
    return tuple(sorted(have))


# ----- grouping by cause -------------------------------------------------------------------------


def _groups(
    session: Session, run: Run, regressions: Sequence[Regression], bisection: BisectionInput | None
) -> list[_Group]:
    """The regressions split by what the bisection says caused them, in a stable order."""
    night_good, night_bad = _night_range(session, run)
    if bisection is None:
        suspects = tuple(_commit_dicts(run.commit_range or [])[1:])
        return [
            _Group(
                "not_bisected",
                list(regressions),
                good=night_good,
                bad=night_bad,
                suspects=tuple(c["sha"] for c in suspects),
            )
        ]
    shas = [c["sha"] for c in _commit_dicts(bisection.commits)]
    per_benchmark = {o.benchmark: o for o in bisection.outcome.benchmarks}
    groups: dict[tuple[str, ...], _Group] = {}
    for regression in regressions:
        found = per_benchmark.get(regression.benchmark)
        if found is None:
            key: tuple[str, ...] = ("not_bisected",)
            group = _Group("not_bisected", [], good=night_good, bad=night_bad)
        elif found.status == CULPRIT and found.culprit:
            key = ("culprit", found.culprit)
            group = _Group("culprit", [], culprit=found.culprit)
        elif found.status == INCONCLUSIVE and found.range:
            first = shas.index(found.range[0]) if found.range[0] in shas else 1
            good = shas[first - 1] if first >= 1 else shas[0]
            key = ("inconclusive", good, found.range[-1])
            group = _Group(
                "inconclusive", [], good=good, bad=found.range[-1], suspects=tuple(found.range)
            )
        else:
            outcome = NOT_REPRODUCED if found.status == NOT_REPRODUCED else "not_bisected"
            key = (outcome,)
            group = _Group(outcome, [], good=shas[0], bad=shas[-1])
        groups.setdefault(key, group).regressions.append(regression)
    return list(groups.values())


def _night_range(session: Session, run: Run) -> tuple[str | None, str | None]:
    """``(good, bad)`` shas of the night: the recorded commit range, else the two builds."""
    commits = _commit_dicts(run.commit_range or [])
    if len(commits) >= 2:
        return commits[0]["sha"], commits[-1]["sha"]
    previous = range_start(session, run=run)
    good = previous.torch_git_commit if previous is not None else None
    return _sha_or_none(good), _sha_or_none(run.torch_git_commit)


def _sha_or_none(value: str | None) -> str | None:
    if value and 7 <= len(value) <= 64 and set(value) <= _SHA_CHARS:
        return value
    return None


def _commit_dicts(commits: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for c in commits:
        data = c.as_json() if hasattr(c, "as_json") else dict(c)
        if _sha_or_none(data.get("sha")):
            out.append(data)
    return out


def _commit(info: Mapping[str, Any] | None, sha: str) -> Commit:
    info = info or {}
    pr = info.get("pr_number")
    return Commit(
        sha=sha,
        title=str(info.get("title") or ""),
        author=str(info.get("author") or info.get("author_name") or ""),
        author_login=info.get("author_login") or None,
        pr_number=int(pr) if pr is not None else None,
    )


# ----- the report --------------------------------------------------------------------------------


def build_report(
    session: Session,
    *,
    run: Run,
    alert: Alert,
    group: _Group,
    improvements: Sequence[Regression],
    bisection: BisectionInput | None,
    settings: Settings,
) -> IssueReport:
    """Everything one issue says, read from the database (and the bisection, when given)."""
    results = {
        r.id: r
        for r in session.scalars(
            select(Result).where(Result.id.in_([g.result_id for g in group.regressions]))
        )
    }
    changes = tuple(
        _change(session, g, results.get(g.result_id), settings) for g in group.regressions
    )
    better = tuple(
        _change(session, g, session.get(Result, g.result_id), settings, full=False)
        for g in improvements
    )
    first = results.get(group.regressions[0].result_id)
    tonight = _environment(first.environment if first else {}, run.torch_git_commit)
    baseline_env = None
    if first is not None and first.series_key:
        history = series_history(
            session, series_key=first.series_key, night=first.night, run_id=first.run_id, limit=1
        )
        if history:
            before = session.get(Run, history[-1].run_id)
            baseline_env = _environment(
                history[-1].environment, before.torch_git_commit if before else None
            )
    commits = {c["sha"]: c for c in _commit_dicts(bisection.commits if bisection else [])}
    commits.update({c["sha"]: c for c in _commit_dicts(run.commit_range or [])})
    code_url = bisection.code_url if bisection is not None else TORCH_CODE_URL
    options: dict[str, Any] = {}
    if bisection is not None and bisection.repo:
        options["bisect_repo"] = bisection.repo
    if bisection is not None and bisection.install_command:
        options["install_command"] = bisection.install_command
    return IssueReport(
        regressions=changes,
        night=run.night,
        tonight=tonight,
        baseline=baseline_env,
        bisection=_bisection(group, bisection, commits),
        improvements=better,
        checks=_checks(session, run, group.regressions),
        code_url=code_url,
        alert_id=alert.id,
        run_id=run.id,
        labels=tuple(settings.github_labels),
        **options,
    )


def _change(
    session: Session,
    regression: Regression,
    result: Result | None,
    settings: Settings,
    *,
    full: bool = True,
) -> Change:
    tonight_samples = len(result.samples) if result is not None else None
    baseline_samples = None
    recent: tuple[float, ...] = ()
    machine = ""
    chart_url = history_url = None
    p_value, p_basis = regression.p_value, None
    if full and result is not None and result.series_key:
        p_value, p_basis = _confidence(session, regression, result, settings)
        history = series_history(
            session,
            series_key=result.series_key,
            night=result.night,
            run_id=result.run_id,
            limit=max(settings.baseline_nights, RECENT_NIGHTS - 1),
        )
        baseline_samples = sum(len(r.samples) for r in history[-settings.baseline_nights :])
        medians = [r.median for r in history[-(RECENT_NIGHTS - 1) :] if r.median is not None]
        recent = (*medians, regression.value)
        api = settings.api_base_url.rstrip("/")
        model = quote(regression.model, safe="")
        chart_url = f"{api}/api/models/{model}/history.svg?series={regression.series_key}"
        history_url = f"{api}/api/models/{model}/history?series={regression.series_key}"
    if full and result is not None and result.machine_id is not None:
        found = session.get(Machine, result.machine_id)
        if found is not None:
            machine = found.hostname or found.gpu_name or found.device_class
    return Change(
        model=regression.model,
        mode=regression.mode,
        device=regression.device,
        compiler=regression.compiler,
        metric=regression.metric,
        unit=regression.unit,
        baseline=regression.baseline,
        tonight=regression.value,
        p_value=p_value,
        p_basis=p_basis,
        baseline_samples=baseline_samples,
        tonight_samples=tonight_samples,
        machine=machine,
        chart_url=chart_url,
        history_url=history_url,
        recent=recent,
        since=(regression.first_night if result is not None and regression.first_night
               and regression.first_night < result.night else None),
    )


def _environment(env: Mapping[str, Any], torch_commit: str | None) -> Environment:
    def text(key: str) -> str | None:
        value = env.get(key)
        return str(value) if value not in (None, "") else None

    return Environment(
        torch_version=text("torch_version"),
        torch_commit=torch_commit or text("torch_git_version"),
        gpu=text("gpu_name"),
        driver=text("driver"),
        cuda=text("cuda"),
        cpu=text("cpu_model"),
        python=text("python"),
        machine=text("hostname"),
    )


def _confirm_run(session: Session, run_id: int) -> Run | None:
    return session.scalar(
        select(Run)
        .where(Run.parent_run_id == run_id, Run.kind == "confirm")
        .order_by(Run.id.desc())
        .limit(1)
    )


def _rerun(session: Session, confirm_run: Run, regression: Regression) -> Result | None:
    """The confirmation re-run's result for ``regression``'s series, if it measured."""
    rerun = session.scalar(
        select(Result).where(
            Result.run_id == confirm_run.id,
            Result.model == regression.model,
            Result.mode == regression.mode,
            Result.device == regression.device,
            Result.compiler == regression.compiler,
            Result.metric == regression.metric,
        )
    )
    if rerun is None or rerun.error is not None or not rerun.samples:
        return None
    return rerun


def _confidence(
    session: Session, regression: Regression, result: Result, settings: Settings
) -> tuple[float | None, str | None]:
    """The detector's p-value for the regression, with the nights it rests on.

    When a confirmation re-run measured the series, the p-value is the detector's own
    :func:`~service.regressions.detection.confirm` over tonight and the re-run (two nights
    against the baseline's), the judgement that let the regression through; otherwise the
    p-value stored when tonight was flagged. Peak memory has none (the detector uses an
    envelope there, not a test).
    """
    if regression.metric in MEMORY_METRICS:
        return None, "no test: above the baseline's recurring peak each night"
    history = history_nights(session, result=result, limit=settings.baseline_nights)
    confirm_run = _confirm_run(session, regression.run_id)
    rerun = _rerun(session, confirm_run, regression) if confirm_run is not None else None
    if rerun is not None and history:
        try:
            verdict = confirm(
                history,
                Night(night=len(history), samples=tuple(float(v) for v in result.samples)),
                Night(night=len(history) + 1, samples=tuple(float(v) for v in rerun.samples)),
                metric=regression.metric,
                threshold=regression.threshold,
            )
        except InvalidInput:
            verdict = None
        if verdict is not None and verdict.verdict == "regression" and verdict.p_value is not None:
            return verdict.p_value, f"tonight and its re-run vs {len(history)} nights"
    if regression.p_value is None:
        return None, None
    return regression.p_value, f"tonight vs {len(history)} nights" if history else None


def _checks(session: Session, run: Run, regressions: Sequence[Regression]) -> Checks:
    confirm_run = _confirm_run(session, run.id)
    if confirm_run is None:
        return Checks()
    parts = []
    for g in regressions:
        rerun = _rerun(session, confirm_run, g)
        if rerun is None:
            continue
        level = statistics.median(rerun.samples)
        change = (level - g.baseline) / g.baseline
        parts.append(
            f"{g.model} {g.mode} {g.device} {g.metric} {change * 100:+.1f}% "
            f"({len(rerun.samples)} samples)"
        )
    reproduced = all(g.confirmation == "reproduced" for g in regressions)
    text = (
        f"run {confirm_run.id} measured the flagged benchmarks again on the same build: "
        + ("; ".join(parts) if parts else "no samples recorded")
        + "."
    )
    return Checks(confirmation=text, confirmed=reproduced)


def _bisection(
    group: _Group, bisection: BisectionInput | None, commits: Mapping[str, Mapping[str, Any]]
) -> Bisection:
    def commit(sha: str | None) -> Commit | None:
        return _commit(commits.get(sha), sha) if sha else None

    suspects = tuple(_commit(commits.get(s), s) for s in group.suspects)
    if bisection is None or group.outcome == "not_bisected":
        return Bisection(
            outcome="not_bisected",
            good=commit(group.good),
            bad=commit(group.bad),
            commits=len(group.suspects) or None,
            suspects=suspects,
        )
    shas = [c["sha"] for c in _commit_dicts(bisection.commits)]
    names = {g.benchmark for g in group.regressions}
    probes = tuple(_probes(bisection.probes, names, commits))
    if group.outcome == "culprit" and group.culprit:
        culprit = commit(group.culprit)
        index = shas.index(group.culprit) if group.culprit in shas else -1
        parent_sha = shas[index - 1] if index >= 1 else commits.get(group.culprit, {}).get("parent")
        verified = any(
            p.sha == group.culprit and p.purpose == "verify" and p.status != SKIPPED
            for p in bisection.probes
        )
        return Bisection(
            outcome="culprit",
            good=commit(shas[0]),
            bad=commit(shas[-1]),
            commits=len(shas) - 1,
            culprit=culprit,
            culprit_parent=commit(parent_sha),
            verified=True if verified else None,
            probes=probes,
            builds=bisection.outcome.builds,
        )
    return Bisection(
        outcome=group.outcome,
        good=commit(group.good),
        bad=commit(group.bad),
        commits=len(shas) - 1,
        probes=probes,
        builds=bisection.outcome.builds,
        suspects=suspects,
    )


def _probes(
    records: Sequence[ProbeRecord], names: set[str], commits: Mapping[str, Mapping[str, Any]]
) -> list[Probe]:
    out = []
    for record in records:
        commit = _commit(commits.get(record.sha), record.sha)
        if record.status == SKIPPED:
            out.append(
                Probe(
                    commit,
                    None,
                    None,
                    purpose=record.purpose,
                    skipped=record.reason or "did not build",
                )
            )
            continue
        for verdict in record.results:
            if verdict.benchmark not in names:
                continue
            samples = verdict.samples
            out.append(
                Probe(
                    commit,
                    verdict.vs_good,
                    verdict.vs_bad,
                    side=verdict.side,
                    benchmark=verdict.benchmark,
                    purpose=record.purpose,
                    samples=len(samples),
                    median=statistics.median(samples) if samples else None,
                    unit="ms",
                    build_seconds=record.build_seconds,
                    skipped=f"not measured: {verdict.error}" if verdict.error else None,
                )
            )
    return out


# ----- sync-back ---------------------------------------------------------------------------------


def desired_state(previous: IssueRecord, issue: TrackedIssue) -> str | None:
    """The triage state the issue asks for its regressions, or ``None`` for no change.

    Args:
        previous: the issue as last recorded (state and labels before this change).
        issue: the issue as the tracker has it now.
    """
    labels = {name.lower() for name in issue.labels}
    had = {name.lower() for name in previous.labels}
    if EXPECTED_LABEL in labels:
        return "expected"
    if issue.state == "closed":
        if INVALID_LABEL in labels or issue.state_reason == "not_planned":
            return "invalid"
        return "fixed"
    if previous.state == "closed" or EXPECTED_LABEL in had:
        return "untriaged"
    return None


def sync_issues(
    session: Session, *, tracker: IssueTracker, since: datetime | None = None
) -> SyncReport:
    """Read the tracker's issue states back into the regressions they speak for.

    Args:
        session: database session (only flushed).
        tracker: the tracker the issues were filed in.
        since: look at issues changed since then; default: a few minutes before the newest
            change already seen (everything on the first pass).

    Returns:
        The issues looked at and the regressions moved.
    """
    records = {
        r.number: r
        for r in session.scalars(
            select(IssueRecord).where(
                IssueRecord.tracker == tracker.kind, IssueRecord.location == tracker.location
            )
        )
    }
    if not records:
        return SyncReport(seen=0)
    if since is None:
        seen_at = [r.remote_updated_at for r in records.values() if r.remote_updated_at]
        since = max(seen_at) - SYNC_OVERLAP if seen_at else None
    now = utcnow()
    changed: dict[int, str] = {}
    seen = 0
    for issue in tracker.updated_since(since):
        record = records.get(issue.number)
        if record is None:
            continue
        seen += 1
        state = desired_state(record, issue)
        if state is not None:
            changed.update(_apply(session, record, state))
        record.state = issue.state
        record.state_reason = issue.state_reason
        record.labels = list(issue.labels)
        record.title = issue.title
        if record.remote_updated_at is None or issue.updated_at > record.remote_updated_at:
            record.remote_updated_at = issue.updated_at
        record.synced_at = now
    session.flush()
    if changed:
        log.info("sync: %d regression(s) moved from %d issue(s)", len(changed), seen)
    return SyncReport(seen=seen, changed=changed)


def _apply(session: Session, record: IssueRecord, state: str) -> dict[int, str]:
    moved = {}
    linked = session.scalars(
        select(Regression)
        .join(IssueRegression, IssueRegression.regression_id == Regression.id)
        .where(IssueRegression.issue_id == record.id)
        .order_by(Regression.id)
    )
    for regression in linked:
        if regression.state == state or (state == "fixed" and regression.state == "reverted"):
            continue
        set_state(session, regression_id=regression.id, state=state)
        moved[regression.id] = state
    return moved


def sync_from_tracker(settings: Settings | None = None) -> SyncReport:
    """One sync-back pass against the configured tracker, committed (the periodic task's body)."""
    settings = settings or get_settings()
    tracker = make_tracker(settings)
    with session_scope() as session:
        return sync_issues(session, tracker=tracker)
