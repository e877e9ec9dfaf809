"""Everything one issue says, read from stored results (:func:`build_report`).

For each regression of a group: baseline and tonight with their sample counts, the detector's
confidence, the machine, the recent nights and links to the series' history; for the issue: the
environment of tonight and of the baseline, how the build's identity moved between the baseline
nights and tonight (the night report's :func:`service.runs.report.environment_changes`, against
the series' latest baseline night and the night before), the confirmation re-run, and the
bisection's commits and probes (:mod:`workers.issues.reports.causes`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import InvalidInput
from service.metrics import INSTRUCTIONS, exact_levels, format_change, format_value, host_bound
from service.models import Alert, Confirmation, Machine, Regression, Result, Run, RunKind
from service.regressions import paired
from service.regressions.detection import confirm
from service.regressions.rules import DEFAULT_PARAMS
from service.regressions.sensitivity import (
    POWER,
    RUN_NIGHTS,
    is_coarse,
    series_smallest_change,
    window_noise_of,
)
from service.regressions.service import (
    history_nights,
    process_count,
    result_night,
    unstable_spreads,
)
from service.regressions.unstable import alerts_from
from service.runs.report import environment_changes, run_environment_changes
from service.series import series_history
from workers.issues.model import Change, Checks, Environment, IssueReport, WhatChanged
from workers.issues.reports.causes import (
    BisectionInput,
    CauseGroup,
    cause_groups,
    commit_dicts,
    issue_bisection,
)

RECENT_NIGHTS = 14
BUILD_MOVED = (
    "the build changed too, so part of the change may be the environment's, not a commit's"
)


@dataclass(frozen=True)
class GroupReport:
    """One issue of a regression alert: the regressions sharing a cause, and what it says."""

    group: CauseGroup
    report: IssueReport


def reproduced(session: Session, alert_id: int) -> list[Regression]:
    """The alert's regressions that the confirmation re-run reproduced, oldest first."""
    return list(
        session.scalars(
            select(Regression)
            .where(
                Regression.alert_id == alert_id,
                Regression.direction == "regression",
                Regression.confirmation == Confirmation.REPRODUCED,
            )
            .order_by(Regression.id)
        )
    )


def improvements(session: Session, run: Run) -> list[Regression]:
    """The run's improvements, oldest first (its issues list them beside the regressions)."""
    return list(
        session.scalars(
            select(Regression)
            .where(Regression.run_id == run.id, Regression.direction == "improvement")
            .order_by(Regression.id)
        )
    )


def group_reports(
    session: Session,
    *,
    alert: Alert,
    run: Run,
    bisection: BisectionInput | None,
    settings: Settings,
) -> list[GroupReport]:
    """One report per cause of the alert's reproduced regressions (:func:`cause_groups`).

    Returns:
        Empty when nothing was reproduced.
    """
    regressions = reproduced(session, alert.id)
    if not regressions:
        return []
    better = improvements(session, run)
    return [
        GroupReport(
            group,
            build_report(
                session,
                run=run,
                alert=alert,
                group=group,
                improvements=better,
                bisection=bisection,
                settings=settings,
            ),
        )
        for group in cause_groups(session, run, regressions, bisection)
    ]


def build_report(
    session: Session,
    *,
    run: Run,
    alert: Alert,
    group: CauseGroup,
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
    baseline_env, build_changes = _baseline(session, run, first)
    commits = {c["sha"]: c for c in commit_dicts(bisection.commits if bisection else [])}
    commits.update({c["sha"]: c for c in commit_dicts(run.commit_range or [])})
    # Links follow the source repository only (Settings.source_repository): a bisection's as
    # its provider recorded it, else the settings'; without one the shas stand bare.
    code_url = bisection.code_url if bisection is not None else settings.source_code_url
    options: dict[str, Any] = {
        "bisect_repo": _clone_placeholder(settings),
        "install_command": settings.bisect_install_command,
    }
    if bisection is not None and bisection.repo:
        options["bisect_repo"] = bisection.repo
    if bisection is not None and bisection.install_command:
        options["install_command"] = bisection.install_command
    return IssueReport(
        regressions=changes,
        night=run.night,
        tonight=tonight,
        baseline=baseline_env,
        bisection=issue_bisection(group, bisection, commits),
        improvements=better,
        checks=_checks(session, run, group.regressions),
        code_url=code_url,
        alert_id=alert.id,
        run_id=run.id,
        labels=tuple(settings.github_labels),
        build_changes=build_changes,
        what_changed=what_changed(group, bisection, settings),
        **options,
    )


def _clone_placeholder(settings: Settings) -> str:
    """Where a maintainer's own clone of the source repository is, for a Reproduce without a
    bisection of its own: ``~/<name>`` of the source repository on GitHub (``~/pytorch``) or
    of the deployment's local clone (``source_repo_path``), else ``PATH/TO/CLONE``."""
    repository = settings.source_repository
    if repository:
        return f"~/{repository.rsplit('/', 1)[-1]}"
    if settings.source_repo_path is not None:
        return f"~/{settings.source_repo_path.name}"
    return "PATH/TO/CLONE"


def what_changed(
    group: CauseGroup, bisection: BisectionInput | None, settings: Settings
) -> tuple[WhatChanged, ...]:
    """The profile probe's answers that concern ``group``, with their API addresses.

    An answer concerns the group when it profiled one of the group's benchmarks, or the same
    pair of builds the group's cause names (its culprit, or its range's ends).
    """
    if bisection is None:
        return ()
    by_benchmark = {r.benchmark: r for r in group.regressions}
    api = settings.api_base_url.rstrip("/")
    found = []
    for answer in bisection.profiles:
        regression = by_benchmark.get(answer.benchmark)
        same_cause = (group.culprit is not None and answer.after == group.culprit) or (
            group.culprit is None and (answer.before, answer.after) == (group.good, group.bad)
        )
        if regression is None and not same_cause:
            continue
        regression = regression or group.regressions[0]
        url = f"{api}/api/regressions/{regression.id}/profile"
        found.append(
            dataclasses.replace(
                answer,
                diff_url=url if answer.diff is not None else None,
                trace_urls=(f"{url}/trace/before", f"{url}/trace/after") if answer.traced else (),
            )
        )
    return tuple(found)


def _baseline(
    session: Session, run: Run, first: Result | None
) -> tuple[Environment | None, tuple[str, ...]]:
    """The environment of the latest baseline night of ``first``'s series, and how the build's
    identity moved since: against that night and against the night before ``run``, each line
    once (:func:`service.runs.report.environment_changes`)."""
    changes = run_environment_changes(session, run=run, meaning=BUILD_MOVED)
    if first is None or not first.series_key:
        return None, tuple(changes)
    history = series_history(
        session, series_key=first.series_key, night=first.night, run_id=first.run_id, limit=1
    )
    if not history:
        return None, tuple(changes)
    before = session.get(Run, history[-1].run_id)
    changes += environment_changes(history[-1].environment, first.environment, meaning=BUILD_MOVED)
    return (
        _environment(history[-1].environment, before.torch_git_commit if before else None),
        tuple(dict.fromkeys(changes)),
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
    chart_url = history_url = sensitivity = None
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
        sensitivity = sensitivity_line(
            [r.median for r in history if r.median is not None],
            regression.threshold,
            memory=exact_levels(regression.metric),
        )
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
        since=(
            regression.first_night
            if result is not None
            and regression.first_night
            and regression.first_night < result.night
            else None
        ),
        noise=_noise(session, regression) if full else None,
        sensitivity=sensitivity,
        work=work_per_step(session, regression) if full else None,
    )


def sensitivity_line(levels: Sequence[float], threshold: float, *, memory: bool) -> str | None:
    """The sentence on the smallest change a series could have seen before tonight
    (:func:`service.regressions.sensitivity.series_smallest_change`), or None without a
    baseline.

    Args:
        levels: the night levels before tonight, oldest first (ms, or bytes).
        threshold: the series' relative threshold (0.07).
        memory: exact levels (peak memory).
    """
    smallest = series_smallest_change(levels, threshold, memory=memory)
    if smallest is None:
        return None
    noise, nights = window_noise_of(levels, memory=memory)
    blind = (
        f"; a step between +{threshold:.0%} and that size may take longer or pass unraised"
        if is_coarse(smallest, threshold)
        else ""
    )
    return (
        f"At its night-to-night noise ({math.expm1(noise):.1%} over {nights} nights), this "
        f"series sees a step of {smallest:+.1%} or more within {RUN_NIGHTS} nights "
        f"({POWER:.0%} of the time){blind}."
    )


WORK_NIGHTS = 7
"""Earlier nights of a count series whose median a latency regression's count is compared with."""


def work_per_step(session: Session, regression: Regression) -> str | None:
    """The sentence on the work per step beside a regression in time (``Change.work``).

    The night's ``cpu_instructions`` of the same benchmark, when it was counted: a count that
    regressed too says what each step executes changed (and the bisection counts); one within
    the threshold of the median of its last :data:`WORK_NIGHTS` nights says the time moved for
    another reason. None for a metric the host does not move, or a night that counted nothing.
    """
    if not host_bound(regression.metric):
        return None
    count = session.scalar(
        select(Result).where(
            Result.run_id == regression.run_id,
            Result.model == regression.model,
            Result.mode == regression.mode,
            Result.device == regression.device,
            Result.compiler == regression.compiler,
            Result.metric == INSTRUCTIONS,
            Result.error.is_(None),
        )
    )
    if count is None or count.median is None or not count.series_key:
        return None
    moved = session.scalar(
        select(Regression).where(
            Regression.run_id == regression.run_id,
            Regression.series_key == count.series_key,
            Regression.direction == "regression",
        )
    )
    if moved is not None:
        return (
            f"The work per step moved too: {INSTRUCTIONS} "
            f"{format_value(moved.baseline, moved.unit)} → {format_value(count.median, count.unit)} "
            f"({format_change(count.median / moved.baseline - 1)}): each step executes more, "
            "and the bisection counts instructions."
        )
    history = series_history(
        session,
        series_key=count.series_key,
        night=count.night,
        run_id=count.run_id,
        limit=WORK_NIGHTS,
    )
    levels = [r.median for r in history if r.median]
    if not levels:
        return None
    before = statistics.median(levels)
    return (
        f"The work per step did not change: {INSTRUCTIONS} {format_value(before, count.unit)} → "
        f"{format_value(count.median, count.unit)} ({format_change(count.median / before - 1)}); "
        "the time moved for another reason (threading, caches, memory layout, the allocator)."
    )


def _noise(session: Session, regression: Regression) -> str | None:
    """The sentence on a latency regression of a benchmark marked unstable (``Change.noise``),
    None otherwise (the verdict judges latency; peak memory alerts as on any benchmark)."""
    result = session.get(Result, regression.result_id)
    key = (
        regression.model,
        regression.mode,
        regression.device,
        regression.compiler,
        result.machine_id if result is not None else None,
    )
    spreads = unstable_spreads(session, by_machine=True) if host_bound(regression.metric) else {}
    if key not in spreads:
        return None
    spread, beyond = spreads[key], DEFAULT_PARAMS.unstable_beyond
    bar = alerts_from(spread, regression.threshold)
    if spread is None or bar is None:
        return "The benchmark is marked unstable (its processes spread too far to alert on)."
    cleared = (
        f"which this change ({regression.change:+.1%}) cleared"
        if regression.change >= bar
        else f"which this change ({regression.change:+.1%}, raised before the verdict) did not"
    )
    return (
        f"The benchmark is marked unstable: its processes' medians spread {spread:.1%}, so "
        f"it alerts only from {bar:+.1%} ({beyond:g} times that spread), {cleared}."
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
        allocator=_allocator(env.get("measurement_setup")),
    )


def _allocator(setup: Any) -> str | None:
    """The allocator of a record's ``measurement_setup`` (``suite/cpu_setup.py``), as verified."""
    if not isinstance(setup, Mapping) or not setup.get("allocator"):
        return None
    name = str(setup["allocator"])
    if name == "glibc" and setup.get("glibc_tunables"):
        name += " + GLIBC_TUNABLES"
    return name + (" (setup off)" if setup.get("setup") == "off" else "")


def _confirm_run(session: Session, run_id: int) -> Run | None:
    return session.scalar(
        select(Run)
        .where(Run.parent_run_id == run_id, Run.kind == RunKind.CONFIRM)
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
    if exact_levels(regression.metric):
        return None, "no test: above the baseline's recurring peak each night"
    history = history_nights(session, result=result, limit=settings.baseline_nights)
    confirm_run = _confirm_run(session, regression.run_id)
    rerun = _rerun(session, confirm_run, regression) if confirm_run is not None else None
    if rerun is not None and confirm_run is not None and history:
        # Judged as the confirmation judged it: beside the previous night's build when paired.
        again, _ = paired.judged_rerun(
            session,
            confirm_run=confirm_run,
            regression=regression,  # type: ignore[arg-type]
            rerun=result_night(session, result=rerun, position=len(history) + 1, rerun=True),
            processes=process_count(session, result=rerun),
        )
        try:
            verdict = confirm(
                history,
                result_night(session, result=result, position=len(history)),
                again,
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
        beside = (
            paired.previous_build_level(session, confirm_run=confirm_run, regression=g)
            if host_bound(g.metric)
            else None
        )
        if beside:  # both builds as the confirmation judged them: medians of process medians
            tonight = statistics.median(
                result_night(session, result=rerun, position=0, rerun=True).samples
            )
        parts.append(
            f"{g.model} {g.mode} {g.device} {g.metric} {change * 100:+.1f}% "
            f"({len(rerun.samples)} samples"
            + (
                f"; {(tonight / beside[0] - 1) * 100:+.1f}% against the previous night's build "
                f"measured beside it, {beside[1]} process(es)"
                if beside
                else ""
            )
            + ")"
        )
    reproduced = all(g.confirmation == Confirmation.REPRODUCED for g in regressions)
    text = (
        f"run {confirm_run.id} measured the flagged benchmarks again on the same build: "
        + ("; ".join(parts) if parts else "no samples recorded")
        + "."
    )
    return Checks(confirmation=text, confirmed=reproduced)
