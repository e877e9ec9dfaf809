"""Running detection over a run, applying confirmation re-runs, and triage states."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.errors import InvalidInput, NotFound
from service.metrics import ALERT_METRICS, host_bound
from service.models import (
    TRIAGE_STATES,
    Alert,
    AlertKind,
    AlertStatus,
    BenchmarkStability,
    Confirmation,
    Regression,
    Result,
    Run,
    RunKind,
)
from service.regressions import paired
from service.regressions.detection import Assessment, Night, assess_night, confirm
from service.series import (
    night_processes,
    night_samples,
    round_results,
    series_history,
)

ThresholdFor = Callable[[str, str], float]


def _night(
    result: Result,
    position: int,
    expected: bool = False,
    rerun: bool = False,
    rounds: Sequence[Result] = (),
) -> Night:
    """``result``'s night as detection input; with ``rounds`` (its night's further processes)
    its samples are the per-process medians (:func:`service.series.night_samples`)."""
    return Night(
        night=position,
        samples=night_samples(result, rounds),
        expected=expected,
        rerun=rerun,
        date=result.night,
    )


def result_night(session: Session, *, result: Result, position: int, rerun: bool = False) -> Night:
    """``result``'s night as detection input at ordinal ``position``, with its run's rounds of
    processes (``NIGHTBENCH_NIGHT_PROCESSES``) when it has any."""
    return _night(result, position, rerun=rerun, rounds=_rounds_of(session, result))


def _rounds_of(session: Session, result: Result) -> list[Result]:
    """The results of ``result``'s series measured by its run's rounds."""
    if result.series_key is None:
        return []
    rounds = round_results(session, run_ids=[result.run_id], series_key=result.series_key)
    return rounds.get((result.run_id, result.series_key), [])


def process_count(session: Session, *, result: Result) -> int:
    """How many processes ``result``'s night level stands on: 1, or 1 plus its run's rounds."""
    return len(night_processes(result, _rounds_of(session, result))) or 1


def _expected_results(session: Session, series_keys: set[str]) -> set[int]:
    """Result ids at which a maintainer marked a step ``expected`` (the baseline resets there)."""
    if not series_keys:
        return set()
    # At the step's first night at the new level, where it began (tonight's when unknown).
    rows = session.scalars(
        select(func.coalesce(Regression.first_result_id, Regression.result_id)).where(
            Regression.series_key.in_(series_keys), Regression.state == "expected"
        )
    )
    return set(rows)


class Assessed(NamedTuple):
    """One result's verdict, with the result on the first night of the step it raises."""

    result: Result
    assessment: Assessment
    first_result: Result | None = None
    processes: int = 1
    back_result: Result | None = None  # first night of the raised step the series is back from


def _history(session: Session, *, result: Result, limit: int) -> tuple[list[Night], list[Result]]:
    """Earlier nights of ``result``'s series as detection input, and their results; oldest
    first, a night's position in the list as its ordinal."""
    assert result.series_key is not None
    history = series_history(
        session, series_key=result.series_key, night=result.night, run_id=result.run_id, limit=limit
    )
    expected = _expected_results(session, {result.series_key})
    kinds = (
        dict(
            session.execute(
                select(Run.id, Run.kind).where(Run.id.in_({r.run_id for r in history}))
            ).all()
        )
        if history
        else {}
    )
    rounds = round_results(
        session, run_ids={r.run_id for r in history}, series_key=result.series_key
    )
    nights = [
        _night(
            r,
            i,
            r.id in expected,
            kinds.get(r.run_id) == RunKind.CONFIRM,
            rounds.get((r.run_id, result.series_key), ()),
        )
        for i, r in enumerate(history)
    ]
    return nights, history


def history_nights(session: Session, *, result: Result, limit: int) -> list[Night]:
    """Earlier nights of ``result``'s series as detection input, oldest first."""
    return _history(session, result=result, limit=limit)[0]


def _first_result(
    assessment: Assessment, nights: list[Night], results: list[Result], i: int | None = None
) -> Result | None:
    """The result of the step's first night (``assessment.first_night``, or ``i``: an ordinal
    into ``nights``/``results``, which end with tonight and, for a confirmation, its re-run).

    A re-run stands for the night it re-ran (same build); None when nothing was raised.
    """
    i = assessment.first_night if i is None else i
    if i is None or not 0 <= i < len(results):
        return None
    while i > 0 and nights[i].rerun:
        i -= 1
    return results[i]


def unstable_spreads(
    session: Session,
    *,
    by_machine: bool = False,
) -> dict[tuple[Any, ...], float | None]:
    """The spread of each benchmark's verdicts in force that are ``unstable``.

    Args:
        session: an open database session.
        by_machine: key each verdict by its machine too. A benchmark noisy on one machine class
            may be steady on another, and each series is judged by its own machine's verdict.

    Returns:
        ``{(model, mode, device, compiler): spread}``: the largest spread ((max - min) / min of
        the processes' medians, a fraction) of its unstable verdicts on any machine, or with
        ``by_machine`` ``{(model, mode, device, compiler, machine_id): spread}``, one per
        verdict; None when no spread was stored. The detector alerts an unstable benchmark
        only on a regression beyond a multiple of it (``DetectorParams.unstable_beyond``).
    """
    out: dict[tuple[Any, ...], float | None] = {}
    for m, mo, d, c, machine, spread in session.execute(
        select(
            BenchmarkStability.model,
            BenchmarkStability.mode,
            BenchmarkStability.device,
            BenchmarkStability.compiler,
            BenchmarkStability.machine_id,
            BenchmarkStability.spread,
        ).where(BenchmarkStability.unstable.is_(True))
    ):
        key = (m, mo, d, c, machine) if by_machine else (m, mo, d, c)
        known = [s for s in (out.get(key), spread) if s is not None]
        out[key] = max(known) if known else None
    return out


def assess_run(
    session: Session,
    *,
    run: Run,
    threshold_for: ThresholdFor,
    baseline_nights: int,
    unstable: Mapping[tuple[str, int | None], float | None] | None = None,
) -> list[Assessed]:
    """Assess every alertable metric of every successful result of ``run`` against its baseline.

    Args:
        session: an open database session.
        run: the run whose results are assessed.
        threshold_for: ``(metric, "model:mode") -> relative threshold``.
        baseline_nights: how many earlier nights the baseline may use.
        unstable: the series marked unstable, ``{(benchmark, machine_id): spread}``
            (``workers.night.finish.unstable_benchmarks``): each result is judged by its own
            machine's verdict; the spread is a fraction (None: not known, never alerted),
            ``assess_night``'s ``unstable_spread``. Their latency is shown, and alerted only
            beyond their noise; the verdict judges latency: their peak memory alerts as any.

    Tonight's night is the run's result with its rounds of processes, when it has some
    (``NIGHTBENCH_NIGHT_PROCESSES``): the level is then the median of the per-process medians.

    Returns:
        ``(result, assessment, first_result, processes, back_result)`` in a stable order;
        ``first_result`` is the result of the raised step's first night at the new level
        (tonight's for a candidate); ``processes`` is how many processes tonight's level stands
        on; ``back_result`` the first night's result of a raised step the series came back
        from tonight (:mod:`service.regressions.back`), else None.
    """
    results = session.scalars(
        select(Result)
        .where(Result.run_id == run.id, Result.error.is_(None), Result.metric.in_(ALERT_METRICS))
        .order_by(Result.model, Result.mode, Result.device, Result.compiler, Result.metric)
    )
    out: list[Assessed] = []
    dark = unstable or {}
    rounds = round_results(session, run_ids=[run.id])
    for result in results:
        nights, history = _history(session, result=result, limit=baseline_nights)
        mine = rounds.get((run.id, result.series_key or ""), [])
        tonight = _night(result, len(nights), rounds=mine)
        key = (result.benchmark, result.machine_id)
        assessment = assess_night(
            nights,
            tonight,
            metric=result.metric,
            threshold=threshold_for(result.metric, f"{result.model}:{result.mode}"),
            # The verdict judges the host-bound metric (latency: its processes' medians); peak
            # memory and instruction counts alert as anywhere (``service.metrics.KindRule``).
            unstable=host_bound(result.metric) and key in dark,
            unstable_spread=dark.get(key),
        )
        every = [*nights, tonight], [*history, result]
        first = _first_result(assessment, *every) if assessment.confirmed else result
        back = (
            None
            if assessment.back_from is None
            else _first_result(assessment, *every, i=assessment.back_from)
        )
        out.append(
            Assessed(result, assessment, first, len(night_processes(result, mine)) or 1, back)
        )
    return out


def record_regressions(
    session: Session,
    *,
    run: Run,
    assessed: list[Assessed],
    threshold_for: ThresholdFor,
) -> Alert | None:
    """Store regressions and improvements of ``run``; group alertable regressions in one alert.

    Idempotent: a series already recorded for this run is not recorded again.

    Returns:
        The run's regression alert, or None when nothing is alertable.
    """
    known = set(session.scalars(select(Regression.series_key).where(Regression.run_id == run.id)))
    alert = session.scalar(
        select(Alert).where(Alert.run_id == run.id, Alert.kind == AlertKind.REGRESSION)
    )
    for result, a, first, processes, _back in assessed:
        if a.verdict not in ("regression", "improvement") or result.series_key in known:
            continue
        first = first or result
        assert a.baseline is not None and a.change is not None and result.series_key is not None
        regression = Regression(
            run_id=run.id,
            result_id=result.id,
            series_key=result.series_key,
            model=result.model,
            mode=result.mode,
            device=result.device,
            compiler=result.compiler,
            metric=result.metric,
            unit=result.unit,
            direction=a.verdict,
            baseline=a.baseline,
            value=a.value,
            change=a.change,
            p_value=a.p_value,
            threshold=threshold_for(result.metric, f"{result.model}:{result.mode}"),
            alertable=a.alertable,
            reason=a.reason + _processes_words(processes),
            first_result_id=first.id,
            first_night=first.night,
            state="improvement" if a.verdict == "improvement" else "untriaged",
            # A step the detector saw persist over earlier nights needs no re-run.
            confirmation=(Confirmation.REPRODUCED if a.confirmed else Confirmation.PENDING)
            if a.alertable
            else Confirmation.NOT_POSSIBLE,
        )
        if a.alertable:
            if alert is None:
                alert = Alert(run_id=run.id, kind=AlertKind.REGRESSION, status=AlertStatus.OPEN)
                session.add(alert)
                session.flush()
            regression.alert_id = alert.id
        session.add(regression)
    session.flush()
    if alert is not None:
        _refresh_alert(session, alert, run)
    return alert


def _processes_words(processes: int, what: str = "Tonight") -> str:
    """`` Tonight: median of 3 processes.`` for a level of several processes, else nothing."""
    return f" {what}: median of {processes} processes." if processes > 1 else ""


def pending_regressions(session: Session, *, run_id: int) -> list[Regression]:
    """Alertable regressions of the run still waiting for their confirmation re-run."""
    return list(
        session.scalars(
            select(Regression)
            .where(
                Regression.run_id == run_id,
                Regression.alertable.is_(True),
                Regression.direction == "regression",
                Regression.confirmation == Confirmation.PENDING,
            )
            .order_by(Regression.id)
        )
    )


def reproduced_regressions(session: Session, *, run_id: int) -> list[Regression]:
    """Alertable regressions of the run whose persistence is established."""
    return list(
        session.scalars(
            select(Regression)
            .where(
                Regression.run_id == run_id,
                Regression.alertable.is_(True),
                Regression.direction == "regression",
                Regression.confirmation == Confirmation.REPRODUCED,
            )
            .order_by(Regression.id)
        )
    )


def apply_confirmation(
    session: Session,
    *,
    parent: Run,
    confirm_run: Run,
    threshold_for: ThresholdFor,
    baseline_nights: int,
) -> list[Regression]:
    """Judge each pending regression of ``parent`` with the re-run's samples (same build); a
    latency re-run measured beside the previous night's build is judged on their ratio
    (:mod:`service.regressions.paired`).

    A regression the re-run does not reproduce is marked ``not_reproduced``, stops being
    alertable and leaves the run's alert (a one-night blip; an alert left empty is deleted);
    one whose re-run failed or is missing is ``not_possible`` and waits for the next night.
    Returns the regressions that were reproduced.
    """
    reproduced: list[Regression] = []
    for regression in pending_regressions(session, run_id=parent.id):
        original = session.get(Result, regression.result_id)
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
        if original is None or rerun is None or rerun.error is not None or not rerun.samples:
            regression.confirmation = Confirmation.NOT_POSSIBLE
            regression.reason += " Confirmation re-run failed; waiting for the next night."
            continue
        nights, history = _history(session, result=original, limit=baseline_nights)
        tonight = result_night(session, result=original, position=len(nights))
        again = result_night(session, result=rerun, position=len(nights) + 1, rerun=True)
        processes = process_count(session, result=rerun)
        again, paired_words = paired.judged_rerun(
            session,
            confirm_run=confirm_run,
            regression=regression,
            rerun=again,
            processes=processes,
        )
        verdict = confirm(
            nights,
            tonight,
            again,
            metric=regression.metric,
            threshold=threshold_for(regression.metric, f"{regression.model}:{regression.mode}"),
        )
        regression.reason += _processes_words(processes, "Confirmation re-run") + paired_words
        if verdict.verdict == "regression":
            regression.confirmation = Confirmation.REPRODUCED
            # With its re-run the step may reach back to earlier nights (a week-long run).
            first = _first_result(verdict, [*nights, tonight, again], [*history, original, rerun])
            if first is not None:
                regression.first_result_id, regression.first_night = first.id, first.night
            reproduced.append(regression)
        else:
            regression.confirmation = Confirmation.NOT_REPRODUCED
            regression.alertable = False
            # A blip is kept (reported, queryable) but is no longer part of the run's alert.
            regression.alert_id = None
            regression.reason += f" Not reproduced by the confirmation re-run ({verdict.reason})."
    session.flush()
    for alert in session.scalars(
        select(Alert).where(
            Alert.run_id == parent.id,
            Alert.kind == AlertKind.REGRESSION,
            Alert.status == AlertStatus.OPEN,
        )
    ):
        _refresh_alert(session, alert, parent)
    return reproduced


def _refresh_alert(session: Session, alert: Alert, run: Run) -> None:
    """Write the alert's summary from the regressions it holds; delete it when it holds none."""
    count = session.scalar(
        select(func.count()).select_from(Regression).where(Regression.alert_id == alert.id)
    )
    if count:
        alert.summary = f"{count} regression(s) in run {run.id} ({run.night})"
    else:
        session.delete(alert)
    session.flush()


def range_start(session: Session, *, run: Run) -> Run | None:
    """The run whose build starts the commit range to search for ``run``'s regressions.

    The previous night when every step began tonight. A step raised once it persisted over
    several nights began on its first night at the new level, and its culprit lies between
    the build before that night and that night's; but that night is located from noisy
    nights: the night before the step may come out high and be taken for its first (the range
    is then one night longer than needed, still holding the culprit), or the step's own first
    night may come out low and the next one be named (the range would then miss the
    culprit). So for such steps the range starts two nights before the earliest first night:
    one more night of commits, about one more build in a bisection. A first night measured by
    a confirmation re-run stands for the night it re-ran. None when there is no earlier night.
    """
    steps = _reproduced_steps(session, run=run)
    firsts = [
        session.get(Run, first.run_id)
        for first in (session.get(Result, r.first_result_id) for r in steps if r.first_result_id)
        if first is not None
    ]
    nights = [
        session.get(Run, r.parent_run_id) if r.kind == RunKind.CONFIRM and r.parent_run_id else r
        for r in firsts
        if r is not None
    ]
    earliest = min((r for r in nights if r is not None), key=lambda r: (r.night, r.id), default=run)
    steps_back = 2
    if earliest.night >= run.night:
        earliest, steps_back = run, 1
    start = earliest
    for _ in range(steps_back):
        previous = session.get(Run, start.previous_run_id) if start.previous_run_id else None
        if previous is None:
            break
        start = previous
    # A series measured only some nights (a count pass in rotation, service.runs.count_plan):
    # its culprit lies after the night of its point before the step, however many nights back.
    gap = _night_before_step(session, steps=steps, night=run.night)
    while gap is not None and start.night > gap and start.previous_run_id:
        previous = session.get(Run, start.previous_run_id)
        if previous is None:
            break
        start = previous
    return None if start is earliest else start


def _reproduced_steps(session: Session, *, run: Run) -> list[Regression]:
    """``run``'s alertable regressions (not improvements) that its confirmation reproduced."""
    return list(
        session.scalars(
            select(Regression)
            .where(
                Regression.run_id == run.id,
                Regression.direction == "regression",
                Regression.alertable.is_(True),
                Regression.confirmation == Confirmation.REPRODUCED,
            )
            .order_by(Regression.id)
        )
    )


def _night_before_step(
    session: Session, *, steps: Sequence[Regression], night: date
) -> date | None:
    """The earliest, over ``steps``, of the night of the series' last point before the step's
    first night (``night`` when it has none; a result without error); None when none has one."""
    nights = []
    for r in steps:
        before = session.scalar(
            select(func.max(Result.night)).where(
                Result.series_key == r.series_key,
                Result.metric == r.metric,
                Result.model == r.model,
                Result.mode == r.mode,
                Result.device == r.device,
                Result.compiler == r.compiler,
                Result.error.is_(None),
                Result.night < (r.first_night or night),
            )
        )
        if before is not None:
            nights.append(before)
    return min(nights, default=None)


def get_regression(session: Session, regression_id: int) -> Regression:
    """The regression with ``regression_id``. Raises NotFound."""
    regression = session.get(Regression, regression_id)
    if regression is None:
        raise NotFound(f"regression {regression_id} does not exist")
    return regression


def set_state(session: Session, *, regression_id: int, state: str) -> Regression:
    """Change a regression's triage state.

    Marking ``expected`` resets the series' baseline at this night (detection starts a new
    baseline segment there).

    Raises:
        NotFound: no such regression.
        InvalidInput: ``state`` is not a triage state.
    """
    if state not in TRIAGE_STATES:
        raise InvalidInput(f"state must be one of {', '.join(TRIAGE_STATES)}, got {state!r}")
    regression = get_regression(session, regression_id)
    regression.state = state
    session.flush()
    return regression


def list_alert_regressions(session: Session, *, alert_id: int) -> list[Regression]:
    """The regressions of an alert, in id order.

    Raises:
        NotFound: no such alert.
    """
    if session.get(Alert, alert_id) is None:
        raise NotFound(f"alert {alert_id} does not exist")
    return list(
        session.scalars(
            select(Regression).where(Regression.alert_id == alert_id).order_by(Regression.id)
        )
    )
