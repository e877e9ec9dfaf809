"""Bisections on Celery workers: the search's state in Postgres, one task per probe.

The search itself is pure (:mod:`workers.bisect.search`); this module keeps its inputs and every
probe in the ``bisections`` and ``probes`` tables and moves it along:

- :func:`step` (task ``bisect.advance``): under a row lock on the bisection, replay the
  recorded rounds into a :class:`~workers.bisect.search.BisectionState`; if the last round has
  ended, ask :func:`~workers.bisect.search.next_probes` for the next one, insert a ``Probe`` row per
  commit, commit, then enqueue one ``bisect.probe`` task per row. With no probe left it stores
  the outcome and hands the night back to filing.
- :func:`measure_probe` (task ``bisect.probe``): build the commit with the configured provider,
  measure the requested benchmarks on that build, store the samples. The probe that ends its
  round returns the bisection id, and the task enqueues ``bisect.advance``.

Tasks are delivered at least once (``acks_late``): a probe already ``done`` or ``skipped`` is
not measured again, a probe left ``running`` by a worker that died is claimed again by the
redelivered task, and a round is planned once (the row lock, and a round already planned is
never planned twice). Replaying is deterministic, so the answer does not depend on which worker
ran what or how often.

:func:`bisect_for_night` is the hook the night's triage step calls: it starts a bisection of the
night's commit range for the reproduced latency regressions of the run's alert, and once that is
done gives filing its outcome.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InvalidInput, NotFound
from service.metrics import BISECT_METRICS, INSTRUCTIONS, bisect_once
from service.models import (
    PROBE_ENDED,
    Alert,
    AlertKind,
    Bisection,
    BisectionStatus,
    Confirmation,
    Job,
    Probe,
    ProbeStatus,
    Regression,
    Run,
)
from service.models.base import utcnow
from workers.bisect import failure_driver
from workers.bisect.counts import COUNT_SAMPLES, CommandCountMeasurer, SuiteCountMeasurer
from workers.bisect.local_driver import run_probe
from workers.bisect.measure import CommandMeasurer, Measurer, SuiteMeasurer
from workers.bisect.report import commit_info, outcome_json
from workers.bisect.search import (
    BisectionState,
    ProbeRequest,
    ProbeResult,
    SearchConfig,
    next_probes,
    outcome,
    record_round,
    start,
)
from workers.builds.registry import KINDS, BuildProvider, provider_from_spec, spec_from_settings
from workers.commits import CommitInfo
from workers.enqueue import Step, send

log = logging.getLogger(__name__)


# ----- creating ------------------------------------------------------------------------------


def create_bisection(
    session: Session,
    *,
    commits: Sequence[CommitInfo | Mapping[str, Any]],
    benchmarks: Sequence[str],
    provider: Mapping[str, Any],
    config: SearchConfig | None = None,
    commands: Mapping[str, str] | None = None,
    repo: str | None = None,
    run_id: int | None = None,
    alert_id: int | None = None,
    regression_ids: Sequence[int] = (),
    queue: str = "cpu",
    metric: str = "latency",
) -> Bisection:
    """Record a new bisection (flushes; the caller commits, then calls :func:`step`).

    Args:
        session: database session.
        commits: the range ``[good, ..., bad]`` in first-parent order.
        benchmarks: suite benchmarks (``model:mode:device``), or the names of ``commands``.
        provider: the build provider: ``{"kind": "checkout", "repo": PATH, "install_command":
            CMD}``, ``{"kind": "wheel", "wheel_url": URL}`` or ``{"kind": "python-overlay",
            "repo": PATH, "package": NAME, "base_sha": SHA}``.
        config: search settings; its ``measure_once`` is set from ``metric``'s row of the
            metric table (an exact count: each build counted once, its count reused).
        commands: benchmark name → shell command, to measure with commands instead of the suite.
        repo: the repository, for reports.
        run_id: the night the bisection is for (None for one started by hand).
        alert_id: the alert it is for.
        regression_ids: the regressions it is for.
        queue: the Celery queue of the probes.
        metric: what each probe measures: ``latency`` or ``cpu_instructions`` (counted).

    Returns:
        The :class:`~service.models.Bisection` row.

    Raises:
        InvalidInput: fewer than two commits, no benchmark, a command missing for a benchmark,
            or a provider the settings cannot make.
    """
    rows: list[dict[str, Any]] = [
        c.as_json() if isinstance(c, CommitInfo) else dict(c) for c in commits
    ]
    config = dataclasses.replace(config or SearchConfig(), measure_once=bisect_once(metric))
    start([r["sha"] for r in rows], benchmarks, config)  # validates the range and names
    if commands is not None and set(commands) != set(benchmarks):
        raise InvalidInput("every benchmark of a command bisection needs its command")
    if provider.get("kind") not in KINDS:
        raise InvalidInput(f"provider: unknown build provider {provider.get('kind')!r}")
    bisection = Bisection(
        run_id=run_id,
        alert_id=alert_id,
        status=BisectionStatus.RUNNING,
        repo=repo,
        good=rows[0]["sha"],
        bad=rows[-1]["sha"],
        commits=rows,
        benchmarks=list(benchmarks),
        regression_ids=list(regression_ids),
        config={
            "search": dataclasses.asdict(config),
            "measure": {
                **({"commands": dict(commands)} if commands else {"suite": True}),
                "metric": metric,
            },
        },
        provider=dict(provider),
        queue=queue,
    )
    session.add(bisection)
    session.flush()
    return bisection


# ----- replaying -----------------------------------------------------------------------------


def search_config(bisection: Bisection) -> SearchConfig:
    """The bisection's :class:`SearchConfig`."""
    return SearchConfig(**bisection.config["search"])


def replay(bisection: Bisection, probes: Sequence[Probe]) -> BisectionState:
    """The search's state from the rows: every round whose probes have all ended, in order.

    Args:
        bisection: the bisection row.
        probes: its probe rows (any order).

    Returns:
        The state after the last complete round.
    """
    state = start(
        [c["sha"] for c in bisection.commits], bisection.benchmarks, search_config(bisection)
    )
    by_round: dict[int, list[Probe]] = {}
    for p in probes:
        by_round.setdefault(p.round, []).append(p)
    for number in sorted(by_round):
        rows = sorted(by_round[number], key=lambda p: p.index)
        if number != state.round or any(p.status not in PROBE_ENDED for p in rows):
            break
        state = record_round(state, [_result(p) for p in rows], seconds=_round_seconds(rows))
    return state


def _round_seconds(rows: Sequence[Probe]) -> float:
    """A round's wall time (s): its first probe's start to its last probe's end (0 if unknown)."""
    starts = [p.started_at for p in rows if p.started_at is not None]
    ends = [p.finished_at for p in rows if p.finished_at is not None]
    if not starts or not ends:
        return 0.0
    return max(0.0, (max(ends) - min(starts)).total_seconds())


def _result(p: Probe) -> ProbeResult:
    if p.status == ProbeStatus.SKIPPED:
        return ProbeResult(
            p.sha, p.purpose, skipped=p.reason or "did not build", build_seconds=p.build_seconds
        )
    return ProbeResult(
        p.sha,
        p.purpose,
        {name: tuple(values) for name, values in (p.samples or {}).items()},
        build_seconds=p.build_seconds,
        errors=dict(p.errors or {}),
    )


def probes_of(session: Session, bisection_id: int) -> list[Probe]:
    """The bisection's probe rows in the order they were planned (round, then index)."""
    return list(
        session.scalars(
            select(Probe)
            .where(Probe.bisection_id == bisection_id)
            .order_by(Probe.round, Probe.index)
        )
    )


# ----- advancing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Advance:
    """What one :func:`advance` did.

    Attributes:
        probes: ``(probe_id, queue)`` inserted for the next round, to enqueue after commit.
        finished: True when the search ended now (the outcome was stored).
    """

    probes: tuple[tuple[int, str], ...] = ()
    finished: bool = False


def advance(session: Session, *, bisection_id: int) -> Advance:
    """Plan the next round if the last one has ended, or store the outcome (flushes only).

    Args:
        session: database session (the bisection row is locked until it commits).
        bisection_id: the bisection.

    Returns:
        The probes to enqueue, and whether the bisection finished now.

    Raises:
        NotFound: no such bisection.
    """
    bisection = session.get(Bisection, bisection_id, with_for_update=True)
    if bisection is None:
        raise NotFound(f"bisection {bisection_id} does not exist")
    if bisection.status != BisectionStatus.RUNNING:
        return Advance()
    probes = probes_of(session, bisection_id)
    if failure_driver.is_failure(bisection):
        rows, finished = failure_driver.advance_failures(session, bisection, probes)
        return Advance(tuple((row.id, bisection.queue) for row in rows), finished)
    state = replay(bisection, probes)
    if any(p.round >= state.round for p in probes):
        return Advance()  # this round is planned already and still running
    requests = next_probes(state)
    if not requests:
        final = outcome(state)
        assert final is not None
        info = {c["sha"]: commit_info(c) for c in bisection.commits}
        bisection.result = outcome_json(state, final, info)
        bisection.outcome = final.kind
        bisection.builds, bisection.rounds = final.builds, final.rounds
        bisection.status = BisectionStatus.DONE
        bisection.finished_at = utcnow()
        session.flush()
        return Advance(finished=True)
    rows = [_probe_row(bisection_id, state.round, r) for r in requests]
    session.add_all(rows)
    session.flush()
    return Advance(probes=tuple((row.id, bisection.queue) for row in rows))


def _probe_row(bisection_id: int, round_: int, request: ProbeRequest) -> Probe:
    return Probe(
        bisection_id=bisection_id,
        round=round_,
        sha=request.sha,
        index=request.index,
        purpose=request.purpose,
        benchmarks=list(request.benchmarks),
        samples_wanted=request.samples,
        status=ProbeStatus.QUEUED,
        attempts=0,
    )


def fail_probe(probe_id: int, *, reason: str) -> int | None:
    """End a probe whose task failed for good as skipped, so the search goes on without it.

    Returns:
        The bisection id when this ended the probe's round, else None (also when the probe had
        already ended).
    """
    with session_scope() as session:
        probe = session.get(Probe, probe_id)
        if probe is None or probe.status in PROBE_ENDED:
            return None
        session.get(Bisection, probe.bisection_id, with_for_update=True)
        session.refresh(probe, with_for_update=True)
        if probe.status in PROBE_ENDED:
            return None
        probe.status, probe.reason, probe.finished_at = ProbeStatus.SKIPPED, reason, utcnow()
        session.flush()
        return _round_ended(session, probe)


def _round_ended(session: Session, probe: Probe) -> int | None:
    open_ = [
        p
        for p in session.scalars(
            select(Probe).where(
                Probe.bisection_id == probe.bisection_id, Probe.round == probe.round
            )
        )
        if p.status not in PROBE_ENDED
    ]
    return None if open_ else probe.bisection_id


def probe_step(probe_id: int, queue: str) -> Step:
    """The ``bisect.probe`` step of one probe row, on the bisection's queue."""
    return Step("bisect.probe", (probe_id,), queue)


def advance_step(bisection_id: int) -> Step:
    """The ``bisect.advance`` step of a bisection whose round may have ended."""
    return Step("bisect.advance", (bisection_id,))


def step(bisection_id: int) -> list[Step]:
    """Advance the bisection in its own transaction; return what comes next.

    Returns:
        One ``bisect.probe`` step per probe of the next round; when the search ended, a night's
        bisection goes to its profile probe (``bisect.profile`` on its queue,
        :mod:`workers.bisect.profile_probe`, which then hands the night to filing), or with
        ``profile_regressions`` off the builds this host made are removed and the night goes to
        filing (``night.file``, :func:`workers.night.triage.file_night`); a failure bisection
        hands its outcome to its issue (``issues.tell_bisected``,
        :func:`workers.issues.failing_bisect.tell_bisected`); otherwise nothing.
    """
    with session_scope() as session:
        result = advance(session, bisection_id=bisection_id)
        bisection = session.get(Bisection, bisection_id)
        assert bisection is not None
        run_id, failure = bisection.run_id, failure_driver.is_failure(bisection)
        queue = bisection.queue
    steps = [probe_step(probe_id, queue) for probe_id, queue in result.probes]
    if not result.finished:
        return steps
    settings = get_settings()
    if not failure and run_id is not None and settings.profile_regressions:
        # The profile probe runs where the builds are; it removes them and files the night.
        return [*steps, Step("bisect.profile", (bisection_id,), queue)]
    shutil.rmtree(work_dir(settings, bisection_id), ignore_errors=True)
    if failure:
        steps.append(Step("issues.tell_bisected", (bisection_id,)))
    elif run_id is not None:
        steps.append(Step("night.file", (run_id,)))
    return steps


def resume(bisection_id: int) -> int:
    """Re-enqueue the probes of a running bisection that are not done (after an outage).

    Returns:
        How many probe tasks were sent. A probe whose first task still runs is harmless to
        send again: the second delivery finds it done, or claims it if its worker died.
    """
    with session_scope() as session:
        bisection = session.get(Bisection, bisection_id)
        if bisection is None:
            raise NotFound(f"bisection {bisection_id} does not exist")
        pending = (
            [
                (p.id, bisection.queue)
                for p in probes_of(session, bisection_id)
                if p.status not in PROBE_ENDED
            ]
            if bisection.status == BisectionStatus.RUNNING
            else []
        )
    send(
        [probe_step(probe_id, queue) for probe_id, queue in pending]
        if pending
        else step(bisection_id)
    )
    return len(pending)


# ----- measuring -----------------------------------------------------------------------------


def work_dir(settings: Settings, bisection_id: int) -> Path:
    """Where this host builds a bisection's commits."""
    root = settings.bisect_work_dir or settings.data_dir / "bisect"
    return Path(root).resolve() / str(bisection_id)


def provider_for(bisection: Bisection, settings: Settings) -> BuildProvider:
    """The build provider a bisection row names.

    Raises:
        InvalidInput: the provider's options are incomplete.
    """
    return provider_from_spec(bisection.provider, work_dir=work_dir(settings, bisection.id))


def measurer_for(bisection: Bisection, settings: Settings) -> Measurer:
    """The measurer a bisection row names: its commands, or the suite; timed, or counted
    (``config["measure"]["metric"] == "cpu_instructions"``: :mod:`workers.bisect.counts`)."""
    measure = bisection.config.get("measure", {})
    commands = measure.get("commands")
    if measure.get("metric") == INSTRUCTIONS:
        if commands:
            return CommandCountMeasurer(commands, timeout_s=settings.count_process_timeout_s)
        return SuiteCountMeasurer(
            timeout_s=settings.count_process_timeout_s, warmup_steps=settings.count_warmup_steps
        )
    if commands:
        return CommandMeasurer(commands, timeout_s=settings.suite_timeout_s)
    return SuiteMeasurer(timeout_s=settings.suite_timeout_s, threads=settings.suite_threads or 1)


def measure_probe(probe_id: int, *, worker: str) -> int | None:
    """Build and measure one probe, and store what it gave.

    Args:
        probe_id: the probe row.
        worker: who runs it (recorded).

    Returns:
        The bisection id when this probe ended its round (the caller enqueues
        ``bisect.advance``), else None. A probe already ended is left alone (None).

    Raises:
        NotFound: no such probe.
    """
    settings = get_settings()
    with session_scope() as session:
        probe = session.get(Probe, probe_id, with_for_update=True)
        if probe is None:
            raise NotFound(f"probe {probe_id} does not exist")
        if probe.status in PROBE_ENDED:
            log.info("probe %s already %s; nothing to do", probe_id, probe.status)
            return None
        probe.status, probe.worker = ProbeStatus.RUNNING, worker
        probe.attempts += 1
        probe.started_at = utcnow()
        bisection = session.get(Bisection, probe.bisection_id)
        assert bisection is not None
        request = ProbeRequest(
            probe.sha, probe.index, tuple(probe.benchmarks), probe.samples_wanted, probe.purpose
        )
        bisection_id = bisection.id
        provider = provider_for(bisection, settings)
        measurer = measurer_for(bisection, settings)
        runner = (
            failure_driver.run_failure_probe if failure_driver.is_failure(bisection) else run_probe
        )
    result = runner(request, build=provider.prepare, measurer=measurer)
    with session_scope() as session:
        # The bisection's lock orders the probes of a round: exactly one sees the round end.
        session.get(Bisection, bisection_id, with_for_update=True)
        probe = session.get(Probe, probe_id, with_for_update=True)
        assert probe is not None
        if probe.status in PROBE_ENDED:
            return None  # a second delivery finished first
        probe.status = ProbeStatus.SKIPPED if result.skipped is not None else ProbeStatus.DONE
        probe.reason = result.skipped
        probe.build_seconds = result.build_seconds
        probe.samples = {k: list(v) for k, v in result.samples.items()}
        probe.errors = dict(result.errors)
        probe.finished_at = utcnow()
        session.flush()
        return _round_ended(session, probe)


# ----- the night's hook ------------------------------------------------------------------------


@dataclass(frozen=True)
class NightBisection:
    """Where a night's bisection stands, for the triage step.

    Attributes:
        pending: a bisection of the night runs; its end sends ``night.file``.
        steps: the steps that start it, when it was created now (empty for one already
            running).
    """

    pending: bool = False
    steps: tuple[Step, ...] = ()


def bisect_for_night(run_id: int, *, settings: Settings | None = None) -> NightBisection:
    """Start, or report on, the bisection of a night's confirmed regressions, by counting when
    an instruction count regressed, else by latency (:func:`bisected_by`).

    Nothing is bisected (``NightBisection()``) without a stored commit range of two or more
    commits, without reproduced latency or count regressions, or without a configured build provider
    (``NIGHTBENCH_BISECT_PROVIDER`` with ``NIGHTBENCH_SOURCE_REPO_PATH`` or a wheel URL); the
    reason goes to the run's note.

    Args:
        run_id: the night.
        settings: the settings (default: the process's).

    Returns:
        ``pending=True`` while a bisection of the night runs (with its first steps when it
        was created now), else ``NightBisection()``: nothing to wait for, file now.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFound(f"run {run_id} does not exist")
        regressions = list(
            session.scalars(
                select(Regression)
                .join(Alert, Regression.alert_id == Alert.id)
                .where(
                    Regression.run_id == run_id,
                    Alert.kind == AlertKind.REGRESSION,
                    Regression.direction == "regression",
                    Regression.confirmation == Confirmation.REPRODUCED,
                    Regression.metric.in_(BISECT_METRICS),
                )
                .order_by(Regression.id)
            )
        )
        if not regressions:
            return NightBisection()
        commits = run.commit_range or []
        if len(commits) < 2:
            return NightBisection()
        provider = spec_from_settings(settings)
        if provider is None:
            _note(
                run,
                "bisection: none (no build provider configured: set "
                "NIGHTBENCH_BISECT_PROVIDER and NIGHTBENCH_SOURCE_REPO_PATH)",
            )
            return NightBisection()
        existing = session.scalar(
            select(Bisection)
            .where(Bisection.run_id == run_id)
            .order_by(Bisection.id.desc())
            .limit(1)
        )
        if existing is not None:
            return NightBisection(pending=existing.status == BisectionStatus.RUNNING)
        if provider["kind"] == "python-overlay":
            provider["base_sha"] = commits[0]["sha"]
        metric, regressions = bisected_by(regressions)
        benchmarks = sorted({r.benchmark for r in regressions})
        jobs = {
            j.benchmark: j.queue for j in session.scalars(select(Job).where(Job.run_id == run_id))
        }
        bisection = create_bisection(
            session,
            commits=commits,
            benchmarks=benchmarks,
            provider=provider,
            config=night_search_config(settings, metric),
            repo=provider.get("repo"),
            run_id=run_id,
            alert_id=regressions[0].alert_id,
            regression_ids=[r.id for r in regressions],
            queue=jobs.get(benchmarks[0], "cpu"),
            metric=metric,
        )
        _note(
            run,
            f"bisection {bisection.id}: {len(commits) - 1} commit(s), "
            f"{len(benchmarks)} benchmark(s), by {metric}",
        )
        bisection_id = bisection.id
    log.info(
        "run %s: bisecting %d benchmark(s) over %d commit(s) in bisection %s",
        run_id,
        len(benchmarks),
        len(commits) - 1,
        bisection_id,
    )
    return NightBisection(pending=True, steps=tuple(step(bisection_id)))


def bisected_by(regressions: Sequence[Regression]) -> tuple[str, list[Regression]]:
    """What a night's bisection measures, and the regressions it is for.

    A reproduced instruction-count regression is bisected by counting, which a busy host does
    not move; a latency regression of the same benchmark goes with it (the work per step moved
    with the time). Without one, the latency regressions are bisected by latency. A latency
    regression of another benchmark, whose count did not move, is left to the range then.

    Args:
        regressions: the night's reproduced regressions of the metrics a bisection measures.

    Returns:
        ``(metric, regressions)``: ``cpu_instructions`` or ``latency``, and those it covers.
    """
    counted = {r.benchmark for r in regressions if r.metric == INSTRUCTIONS}
    if not counted:
        return "latency", [r for r in regressions if r.metric == "latency"]
    return INSTRUCTIONS, [r for r in regressions if r.benchmark in counted]


def night_search_config(settings: Settings, metric: str = "latency") -> SearchConfig:
    """The search settings of a night's bisection: its regressions are slowdowns, so the bad
    endpoint must measure higher (``SearchConfig.slower``); a counted bisection takes
    :data:`COUNT_SAMPLES`."""
    first, most = (
        COUNT_SAMPLES
        if metric == INSTRUCTIONS
        else (settings.bisect_samples, max(settings.bisect_max_samples, settings.bisect_samples))
    )
    return SearchConfig(
        workers=settings.bisect_workers, initial_samples=first, max_samples=most, slower=True
    )


def _note(run: Run, text: str) -> None:
    run.note = f"{run.note}\n{text}" if run.note else text
