"""A confirmation re-run judged beside the previous night's build (the paired confirmation).

A night and its confirmation re-run are measured on one host minutes apart, so a host slow for
the whole evening reproduces its own step: on real public histories with re-runs drawn from the
next night, precision fell from 0.82 to 0.49 (docs/benchmarks.md, "Confirmation re-runs on the
real histories"). So the nightly measures the previous night's build beside the re-run, in turns
on the same queue (``paired`` replicate runs of the confirmation run,
:func:`service.runs.rounds.create_paired_round`), and judges the re-run's latency on the ratio
of the two builds measured that evening: the re-run enters detection as

    baseline level × (tonight's build / previous night's build)

with each side the median of its per-process medians (the process is the unit of repetition:
Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013). Whatever the host did
to both builds that evening cancels; the re-run is then judged by the same rule as before
(:func:`service.regressions.detection.confirm`). Peak memory is judged unpaired: a host's speed
does not move it, and the paired side would only add its own modes.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.metrics import host_bound
from service.models import Regression, Result, Run, RunKind
from service.regressions.detection import Night
from service.series import is_paired_round


def code_identity(environment: dict[str, Any]) -> tuple[str, float] | None:
    """The code a result measured: ``(build_fingerprint, injected_work)``.

    ``build_fingerprint`` is the suite's :func:`suite.environment.build_fingerprint` (torch's
    version, commit and directory, the installed distributions, the source trees on the path);
    ``injected_work`` the fraction of a step the harness planted (0.0: none). None when the
    record has no fingerprint (records from before it, or from another tool): its code is
    unknown.
    """
    fingerprint = environment.get("build_fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        return None
    return fingerprint, float(environment.get("injected_work") or 0.0)


def same_code(
    session: Session,
    *,
    previous: Run,
    tonight: Run,
    benchmarks: Iterable[tuple[str, str, str, str]],
) -> str | None:
    """The build fingerprint both nights measured ``benchmarks`` with, when they ran the same
    code; None when they did not, or when either side's code is unknown.

    Two nights on ``current`` (the worker's own interpreter) name no build in their spec; their
    records do (:func:`code_identity`). They ran the same code when
    every one of ``benchmarks`` (``(model, mode, device, compiler)``, at least one) has measured
    results on both nights and all of them carry one identity, and tonight's run was not given a
    commit range of its own (a night planned with its commits, as ``nightbench demo`` plans its
    last, says its code changed).
    """
    if tonight.commit_range and len(tonight.commit_range) > 1:
        return None
    wanted = set(benchmarks)
    if not wanted:
        return None
    identities: dict[int, dict[tuple[str, str, str, str], set[Any]]] = {
        previous.id: {},
        tonight.id: {},
    }
    stmt = select(
        Result.run_id, Result.model, Result.mode, Result.device, Result.compiler, Result.environment
    ).where(Result.run_id.in_(identities), Result.error.is_(None))
    for run_id, model, mode, device, compiler, environment in session.execute(stmt):
        key = (model, mode, device, compiler)
        if key in wanted:
            identities[run_id].setdefault(key, set()).add(code_identity(environment or {}))
    seen = set()
    for key in wanted:
        for run_id in identities:
            seen |= identities[run_id].get(key, {None})
    if len(seen) != 1 or None in seen:
        return None
    ((fingerprint, _injected),) = seen
    return str(fingerprint)


def paired_results(session: Session, *, confirm_run: Run, regression: Regression) -> list[Result]:
    """The previous night's build's processes measured beside ``confirm_run`` for the benchmark
    and metric of ``regression``: one result per paired round that measured it, errors and
    empty results left out, in round order."""
    stmt = (
        select(Result, Run.options)
        .join(Run, Run.id == Result.run_id)
        .where(
            Run.parent_run_id == confirm_run.id,
            Run.kind == RunKind.REPLICATE,
            Result.model == regression.model,
            Result.mode == regression.mode,
            Result.device == regression.device,
            Result.compiler == regression.compiler,
            Result.metric == regression.metric,
            Result.error.is_(None),
        )
        .order_by(Result.run_id)
    )
    return [r for r, options in session.execute(stmt) if is_paired_round(options) and r.samples]


def previous_build_level(
    session: Session,
    *,
    confirm_run: Run,
    regression: Regression,
) -> tuple[float, int] | None:
    """The previous night's build's level beside ``confirm_run`` for ``regression``'s benchmark
    and metric: ``(median of its per-process medians, processes)`` (ms or bytes), or None when
    nothing of it was measured."""
    results = paired_results(session, confirm_run=confirm_run, regression=regression)
    if not results:
        return None
    medians = [float(statistics.median(r.samples)) for r in results]
    return float(statistics.median(medians)), len(medians)


def judged_rerun(
    session: Session,
    *,
    confirm_run: Run,
    regression: Regression,
    rerun: Night,
    processes: int,
) -> tuple[Night, str]:
    """The re-run as detection judges it, and the words for the regression's reason.

    Args:
        session: an open session.
        confirm_run: the confirmation run; paired when ``options["paired_spec"]`` is set.
        regression: the candidate being confirmed (its ``baseline`` level, ms, and metric).
        rerun: the re-run's night: raw samples (ms) with one process, else per-process medians.
        processes: how many processes the re-run's night stands on.

    Returns:
        ``(night, words)``: for a paired latency re-run, ``rerun`` with every sample times
        ``baseline / previous build's level`` and a sentence giving both levels, their change
        and process counts; unpaired (no paired spec, or a memory metric) ``rerun`` and ``""``;
        paired but without a measurement of the previous build, ``rerun`` and a sentence
        saying it was judged unpaired.
    """
    spec = (confirm_run.options or {}).get("paired_spec")
    if not spec or not host_bound(regression.metric) or not rerun.samples:
        return rerun, ""
    previous = previous_build_level(session, confirm_run=confirm_run, regression=regression)
    if previous is None:
        return rerun, (
            f" The previous night's build ({spec}) could not be measured beside the "
            "re-run; it was judged unpaired."
        )
    before, beside = previous
    tonight = float(statistics.median(rerun.samples))
    scale = regression.baseline / before
    fingerprint = (confirm_run.options or {}).get("paired_fingerprint")
    named = f"{spec}, the same code as tonight's: build {fingerprint}" if fingerprint else spec
    words = (
        f" The previous night's build ({named}) was measured beside the re-run, in turns: "
        f"tonight's build {tonight:.2f} ms ({_count(processes)}) against {before:.2f} ms "
        f"({_count(beside)}), {tonight / before - 1:+.1%}; the re-run was judged at "
        f"the baseline's {regression.baseline:.2f} ms times that ratio, so what the host "
        "did to both builds that evening cancels."
    )
    return dataclasses.replace(rerun, samples=tuple(v * scale for v in rerun.samples)), words


def _count(processes: int) -> str:
    return f"{processes} process" + ("es" if processes != 1 else "")
