"""After a run's last job: detect regressions, confirm candidates with a re-run, hand to triage.

``night.finish`` runs :func:`finish` for a nightly (or posted) run: it assesses every series,
records the regressions, and creates the confirmation run for tonight's candidates, whose
jobs are the next steps; a confirmation run's own ``night.finish`` applies its verdicts to the
parent run. With ``NIGHTBENCH_NIGHT_PROCESSES`` k > 1, a nightly or confirmation run is
measured in k rounds before that (:mod:`service.runs.rounds`): each round's ``night.finish``
sends the next. Reproduced regressions go on to ``night.triage`` (:mod:`workers.night.triage`).
Once the night is settled (detection with nothing to re-run, or the confirmation applied), the
stability of each benchmark is re-checked from its own recent processes
(:mod:`workers.night.recheck`), for the next nights' detection. Detection also records the
regressions whose series is back (:mod:`service.regressions.back`, told on their issues) and the
benchmarks failing night after night (:mod:`workers.issues.failing`, filed as issues).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.config import Settings, get_settings
from service.db import session_scope
from service.models import RUN_OPEN, Alert, Confirmation, Run, RunKind
from service.regressions import back
from service.regressions import service as regressions
from service.regressions.paired import same_code
from service.runs import rounds
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from service.series import is_count_round, is_night_round, is_paired_round
from workers.app import queue_for
from workers.builds.torch_envs import CURRENT
from workers.enqueue import Step
from workers.issues import failing
from workers.issues.filing_state import reopen
from workers.night.plan import job_steps
from workers.night.recheck import recheck_run

log = logging.getLogger(__name__)


def threshold_for(settings: Settings) -> Callable[[str, str], float]:
    """``(metric, benchmark) -> relative threshold`` from the settings (0.07 = 7%)."""
    return lambda metric, benchmark: settings.threshold_for(metric, benchmark)


def finish(run_id: int, *, settings: Settings | None = None) -> list[Step]:
    """The step after a run's last job: detect (nightly) or apply the confirmation (confirm).

    With ``night_processes`` k > 1 a nightly or confirmation run is first measured in k
    rounds (:mod:`service.runs.rounds`): its own jobs, then one replicate run after another;
    the round's ``night.finish`` sends the next round, and the last one's goes on to detection
    (or the confirmation). Posted results (``ingest``) have no build here to measure again.

    Returns:
        What comes next: the next round's or the confirmation run's ``bench.run`` steps,
        ``night.triage``, or nothing when the run is complete (or a round is still measuring).
    """
    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        kind, parent_id = run.kind, run.parent_run_id
        round_of = (
            parent_id
            if kind == RunKind.REPLICATE
            and (
                is_night_round(run.options)
                or is_paired_round(run.options)
                or is_count_round(run.options)
            )
            else None
        )
        if round_of is not None:
            runs.finish_run(session, run=run)
    if round_of is not None:
        # One round of a night's (or a re-run's, or its paired build's) processes ended: the
        # next round, or verdicts.
        return _settle(round_of, settings)
    if (kind == RunKind.CONFIRM and parent_id is not None) or kind == RunKind.NIGHTLY:
        return _settle(run_id, settings)
    if kind == RunKind.INGEST:
        return _detect(run_id, settings)
    # Any other run (a replicate run: more processes of a night, for a comparison) only closes.
    with session_scope() as session:
        runs.finish_run(session, run=runs.get_run(session, run_id))
    return []


def sent(run_id: int) -> None:
    """The run's ``night.finish`` ran and its next steps were sent: the sweep stops re-sending
    it (:func:`workers.night.deadline.resend_lost`)."""
    with session_scope() as session:
        runs.finish_sent(session, run_id=run_id)


def _settle(run_id: int, settings: Settings) -> list[Step]:
    """A nightly or confirmation run whose latest round ended: send its next round while it has
    fewer processes per benchmark than its queue's (``Settings.processes_for``), else detect
    or confirm.

    Rounds are sent under the run's row lock, so a ``night.finish`` delivered twice sends no
    round twice; while a round is still measuring there is nothing to do.
    """
    created: list[int] = []
    swap = False
    with session_scope() as session:
        run = rounds.lock_run(session, run_id=run_id)
        kind, parent_id = run.kind, run.parent_run_id
        wanted = (run.options or {}).get("processes") or settings.processes_for(
            rounds.run_queue(session, run_id=run_id)
        )
        left = rounds.rounds_left(session, run_id=run_id, processes=wanted)
        if left is None:
            return []
        counting = rounds.count_round(session, run_id=run_id) if left == 0 else None
        if counting is not None and counting.status in RUN_OPEN:
            return []  # the count pass is still counting
        if left > 0:
            created.append(
                rounds.create_round(
                    session, parent=run, rounds=wanted, deadline_s=settings.night_deadline_s
                ).id
            )
            paired_spec = (run.options or {}).get("paired_spec")
            if paired_spec:
                paired = rounds.create_paired_round(
                    session,
                    parent=run,
                    torch_spec=paired_spec,
                    rounds=wanted,
                    deadline_s=settings.night_deadline_s,
                )
                created.append(paired.id)
                swap = paired.options["round"] % 2 == 0
        else:
            note = rounds.rounds_note(session, run=run)
            if note and note not in (run.note or ""):
                run.note = f"{run.note}\n{note}" if run.note else note
            if counting is None and kind in (RunKind.NIGHTLY, RunKind.CONFIRM):
                queue = rounds.run_queue(session, run_id=run_id)
                count = rounds.create_count_round(
                    session,
                    parent=run,
                    models=lambda model: settings.counts_on(queue, model),
                    deadline_s=settings.night_deadline_s,
                    budget_s=settings.count_budget_s,
                    batch=settings.count_batch,
                )
                if count is not None:  # the timed processes have all ended: count, then judge
                    created.append(count.id)
    if created:
        log.info("run %s: round of processes in run(s) %s", run_id, created)
        # A paired round's jobs go out beside the re-run's, in turns: which build goes first
        # alternates from round to round.
        return interleaved(*(job_steps(c) for c in created), swap=swap)
    if kind == RunKind.CONFIRM and parent_id is not None:
        return _after_confirmation(parent_id, run_id, settings)
    return _detect(run_id, settings)


def _detect(run_id: int, settings: Settings) -> list[Step]:
    with session_scope() as session:
        run = runs.get_run(session, run_id)
        assessed = regressions.assess_run(
            session,
            run=run,
            threshold_for=threshold_for(settings),
            baseline_nights=settings.baseline_nights,
            unstable=unstable_benchmarks(session),
        )
        regressions.record_regressions(
            session, run=run, assessed=assessed, threshold_for=threshold_for(settings)
        )
        # News for filed issues (a series back), or a benchmark failing night after night:
        # the filing retry tells or files it now.
        file_now = bool(_note_back(session, run=run, assessed=assessed))
        failing_alert = failing.note_failing(session, run=run)
        file_now |= failing_alert is not None
        pending = regressions.pending_regressions(session, run_id=run_id)
        if run.kind == RunKind.INGEST:
            # Results posted by runners: no re-run here; the next night confirms instead.
            for r in pending:
                r.confirmation = Confirmation.NOT_POSSIBLE
                r.reason += " No confirmation re-run for posted results; the next night decides."
            pending = []
        benchmarks = sorted({(r.model, r.mode, r.device, r.compiler) for r in pending})
        persisted = regressions.reproduced_regressions(session, run_id=run_id)
        confirm_id = None
        if benchmarks:
            jobs = {j.benchmark: j for j in runs.list_jobs(session, run_id=run_id)}
            specs = []
            for model, mode, device, compiler in benchmarks:
                spec = BenchmarkSpec(model=model, mode=mode, device=device, compiler=compiler)
                queue = jobs[spec.name].queue if spec.name in jobs else queue_for(device)
                specs.append(
                    BenchmarkSpec(
                        model=model, mode=mode, device=device, compiler=compiler, queue=queue
                    )
                )
            confirm_id, paired_id = _create_confirmation(
                session, run=run, specs=specs, settings=settings
            )
        else:  # nothing to re-run: the night is settled
            recheck_run(session, run=run, settings=settings)
            if not persisted:
                runs.finish_run(session, run=run)
    tell_steps = [Step("issues.retry_filing", ())] if file_now else []
    if failing_alert is not None:  # the commits that broke them, searched beside
        tell_steps.insert(0, Step("issues.bisect_failing", (failing_alert.id,)))
    if confirm_id is not None:
        log.info(
            "run %s: %d benchmark(s) flagged; confirming in run %s%s",
            run_id,
            len(benchmarks),
            confirm_id,
            f", paired with the previous night's build in run {paired_id}" if paired_id else "",
        )
        if paired_id is None:
            return job_steps(confirm_id) + tell_steps
        return interleaved(job_steps(confirm_id), job_steps(paired_id)) + tell_steps
    if persisted:
        # Steps that already persisted over earlier nights need no re-run: straight to triage.
        return [triage_step(run_id), *tell_steps]
    return tell_steps


def _note_back(session: Session, *, run: Run, assessed: list[regressions.Assessed]) -> list[int]:
    """Record the regressions whose series is back tonight (:mod:`service.regressions.back`)
    and make their filed alerts pending again, so the filing retry tells their issues
    (:func:`workers.issues.filing_state.reopen`). Returns the alerts made pending."""
    reopened = []
    for regression in back.note_back(session, run=run, assessed=assessed):
        log.info(
            "run %s: %s %s is back at its level from before the regression of %s",
            run.id,
            regression.benchmark,
            regression.metric,
            regression.first_night,
        )
        alert = session.get(Alert, regression.alert_id) if regression.alert_id else None
        if alert is not None and reopen(alert):
            reopened.append(alert.id)
    return reopened


def _create_confirmation(
    session: Session, *, run: Run, specs: list[BenchmarkSpec], settings: Settings
) -> tuple[int, int | None]:
    """The confirmation run of ``run``'s candidates ``specs``, and its first paired round (None
    when unpaired: :func:`paired_build`). A paired one is measured in at least
    ``settings.paired_confirmation_processes`` rounds a build (``options["processes"]``)."""
    paired_spec, fingerprint = paired_build(session, run=run, settings=settings, benchmarks=specs)
    options: dict[str, Any] | None = None
    processes = settings.processes_for(specs[0].queue)
    if paired_spec:
        processes = max(processes, settings.paired_confirmation_processes)
        options = {"paired_spec": paired_spec, "processes": processes}
        if fingerprint:
            options["paired_fingerprint"] = fingerprint
    confirm = runs.create_run(
        session,
        night=run.night,
        benchmarks=specs,
        torch_spec=run.torch_spec,
        kind=RunKind.CONFIRM,
        parent_run_id=run.id,
        deadline_s=settings.night_deadline_s,
        options=options,
    )
    if not paired_spec:
        return confirm.id, None
    paired = rounds.create_paired_round(
        session,
        parent=confirm,
        torch_spec=paired_spec,
        rounds=processes,
        deadline_s=settings.night_deadline_s,
    )
    return confirm.id, paired.id


def paired_build(
    session: Session,
    *,
    run: Run,
    settings: Settings,
    benchmarks: Sequence[BenchmarkSpec],
) -> tuple[str | None, str | None]:
    """The torch spec of the previous night's build, to measure beside ``run``'s confirmation
    re-run of ``benchmarks`` (:mod:`service.regressions.paired`), and, for a build on
    ``current``, the fingerprint of its code; ``(None, None)`` when the re-run goes unpaired.

    A pinned spec (``torch==X``, a wheel, a checkout) names its build. ``current`` (the worker's
    own interpreter, as ``make nightly`` runs) names none: it is paired only when both nights are
    on ``current`` and their records of ``benchmarks`` show the same code
    (:func:`service.regressions.paired.same_code`: torch, the installed distributions, the source
    trees on the path, the planted work). Then no step between the two nights can be the build's,
    and the pair measures that build twice, as a pinned spec repeated night after night does.

    Unpaired when ``settings.paired_confirmation`` is off, when there is no previous night, when
    the previous night was on ``current`` and tonight's is pinned, or when the two nights on
    ``current`` ran different or unknown code (the worker holds tonight's build only).
    """
    if not settings.paired_confirmation or run.previous_run_id is None:
        return None, None
    previous = session.get(Run, run.previous_run_id)
    if previous is None:
        return None, None
    if previous.torch_spec.strip() != CURRENT:
        return previous.torch_spec, None
    if run.torch_spec.strip() != CURRENT:
        return None, None
    fingerprint = same_code(
        session,
        previous=previous,
        tonight=run,
        benchmarks=[(b.model, b.mode, b.device, b.compiler) for b in benchmarks],
    )
    return (CURRENT, fingerprint) if fingerprint else (None, None)


def interleaved(*step_lists: list[Step], swap: bool = False) -> list[Step]:
    """The steps of several lists in turns (``a1, b1, a2, b2, ...``; ``b1, a1, ...`` with
    ``swap``), so that two builds' jobs queue side by side; what is left of a longer list last."""
    lists = list(reversed(step_lists)) if swap else list(step_lists)
    out: list[Step] = []
    for i in range(max((len(s) for s in lists), default=0)):
        out.extend(s[i] for s in lists if i < len(s))
    return out


def _after_confirmation(parent_id: int, confirm_id: int, settings: Settings) -> list[Step]:
    with session_scope() as session:
        parent = runs.get_run(session, parent_id)
        confirm_run = runs.get_run(session, confirm_id)
        regressions.apply_confirmation(
            session,
            parent=parent,
            confirm_run=confirm_run,
            threshold_for=threshold_for(settings),
            baseline_nights=settings.baseline_nights,
        )
        runs.finish_run(session, run=confirm_run)
        recheck_run(session, run=parent, settings=settings)
    return [triage_step(parent_id)]


def triage_step(run_id: int) -> Step:
    """The ``night.triage`` step of a run whose regressions are confirmed."""
    return Step("night.triage", (run_id,))


def unstable_benchmarks(  # type: ignore[no-untyped-def]
    session,
) -> dict[tuple[str, int | None], float | None]:
    """The benchmarks marked unstable (by ``nightbench suite stability`` or the nightly
    re-check), each on the machine its verdict was measured on: ``{(benchmark name,
    machine_id): spread}`` (a fraction; None: not stored). A series is shown, and alerted only
    on a regression beyond ``DetectorParams.unstable_beyond`` times its spread, where its own
    machine's verdict says unstable; the same benchmark on another machine alerts as any."""
    from service.regressions.service import unstable_spreads

    return {
        (benchmark_name(*key[:4]), key[4]): spread
        for key, spread in unstable_spreads(session, by_machine=True).items()
    }
