"""After a night: re-check each benchmark's stability from its own recent processes.

The window of processes is read by :mod:`service.stability.recheck` (the per-process medians of
the benchmark's last K nights on its latency series, confirmation re-runs included, from the
latest real step on); the verdict is TorchBench's rule, the same functions as
``nightbench suite stability`` (:func:`suite.stability.summarize`: unstable when the max-min
spread of the medians reaches the spread allowed for their number, 7% for 5 processes scaled by
d2(n) / d2(5): :func:`suite.stability.allowed_spread`, 9.26% for 10). A window of 10 processes
judged by the 5-process 7% would darken a third of the benchmarks with a 2% process-to-process
CV (the measured verdict: a ninth), and un-darken such a benchmark on 67% of nights against 94%
(simulated: ``benchmarks/recheck_spread.py``, docs/benchmarks.md).

The re-check changes a verdict only on the evidence that can change it, so that a step in
progress never darkens a benchmark and a benchmark is not un-darkened by leaving its noise out:

- a benchmark marked unstable becomes stable (un-darkened: it alerts again) when all the
  processes of its window, at least ``min_processes``, have a spread below the threshold;
- a stable benchmark (or one never measured) becomes unstable (darkened) when the settled
  processes of its window, at least ``min_processes``, reach the threshold; a candidate step
  the detector has not settled yet is left out of that verdict;
- with fewer processes the verdict stays as it was.

Each change is stored with its source (``"nightly re-check over 9 processes, nights A..B: spread
8.1% < 8.9% allowed for 9 processes"``)
beside the measured verdict, written in the run's note, and listed in the night's report
(``stability_changes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Result, Run, RunKind
from service.regressions.rules import DEFAULT_PARAMS
from service.stability import recheck as store
from suite.stability import UNSTABLE_SPREAD, allowed_spread, full_setup_label, summarize

log = logging.getLogger(__name__)
_WORDS = {True: "unstable", False: "stable", None: "unknown"}


@dataclass(frozen=True)
class RecheckVerdict:
    """The outcome of one benchmark's re-check.

    Attributes:
        benchmark: ``model:mode:device[:compiler]``.
        previous: the verdict before (None: never judged).
        unstable: the re-check's verdict (None: too few processes).
        changed: the verdict in force changed.
        medians_ms: the per-process medians judged (ms).
        cv: their coefficient of variation; spread: their ``(max - min) / min``.
        allowed: the spread allowed for that many processes (None: too few processes).
        source: ``"nightly re-check over N processes, nights A..B: spread S% < A% allowed for N
            processes"``.
    """

    benchmark: str
    previous: bool | None
    unstable: bool | None
    changed: bool
    medians_ms: tuple[float, ...]
    cv: float | None
    spread: float | None
    allowed: float | None
    source: str

    def line(self) -> str:
        """One line for the run's note: ``"stability of X: unstable → stable (source, ...)"``."""
        return (
            f"stability of {self.benchmark}: {_WORDS[self.previous]} → "
            f"{_WORDS[self.unstable]} ({self.source}; CV {100 * (self.cv or 0):.1f}%)"
        )


def judge(
    window: store.RecheckWindow,
    previous: bool | None,
    *,
    min_processes: int,
    threshold: float = UNSTABLE_SPREAD,
) -> RecheckVerdict:
    """Judge one window against the verdict in force (pure; the rule of the module docstring).

    Args:
        window: the benchmark's processes (:func:`service.stability.recheck.recheck_window`).
        previous: the verdict in force (True: unstable, False: stable, None: none).
        min_processes: fewest processes that make a verdict.
        threshold: spread (fraction) from which a benchmark is unstable over 5 processes
            (TorchBench: 0.07); the window's n processes are allowed
            :func:`suite.stability.allowed_spread` of it.

    Returns:
        The outcome; ``changed`` only for unstable → stable on the whole window, or
        stable / none → unstable on its settled processes.

    Raises:
        ValueError: ``min_processes`` < 2 (a spread needs two processes).
    """
    if min_processes < 2:
        raise ValueError(f"min_processes must be at least 2, got {min_processes}")
    settled_only = previous is not True
    medians = window.medians(settled_only=settled_only)
    source = window.describe(settled_only=settled_only)
    if len(medians) < min_processes:
        return RecheckVerdict(
            window.benchmark,
            previous,
            None,
            False,
            tuple(medians),
            None,
            None,
            None,
            f"{source}: fewer than {min_processes}, verdict kept",
        )
    allowed = allowed_spread(len(medians), threshold)
    cv, spread, unstable = summarize(medians, allowed)
    changed = unstable is not None and bool(unstable) != bool(previous)
    return RecheckVerdict(
        window.benchmark,
        previous,
        unstable,
        changed,
        tuple(medians),
        cv,
        spread,
        allowed,
        f"{source}: {spread_text(spread, allowed, len(medians))}",
    )


def spread_text(spread: float | None, allowed: float, processes: int) -> str:
    """``"spread 8.1% < 9.3% allowed for 10 processes"`` (``>=`` when unstable)."""
    sign = ">=" if spread is not None and spread >= allowed else "<"
    return (
        f"spread {100 * (spread or 0):.1f}% {sign} {100 * allowed:.1f}% allowed for "
        f"{processes} processes"
    )


def recheck_run(session: Session, *, run: Run, settings: Settings) -> list[RecheckVerdict]:
    """Re-check the stability of every benchmark measured by ``run`` and store the outcome.

    Call it once the night is settled (after detection, and after the confirmation re-runs
    when there were any): tonight's re-runs then count as processes, and tonight's candidates
    are reproduced or dropped.

    Args:
        session: the caller's session (only flushed).
        run: a nightly or posted run.
        settings: ``stability_recheck_nights`` (K) and ``stability_recheck_min_processes``.

    Returns:
        One outcome per benchmark with a latency result tonight, by benchmark; none when
        ``settings.stability_recheck`` is off.
    """
    if not settings.stability_recheck:
        return []
    run_ids = [
        run.id,
        *session.scalars(
            select(Run.id).where(Run.parent_run_id == run.id, Run.kind == RunKind.CONFIRM)
        ),
    ]
    results = session.scalars(
        select(Result)
        .where(
            Result.run_id == run.id,
            Result.metric == "latency",
            Result.error.is_(None),
        )
        .order_by(Result.model, Result.mode, Result.device, Result.compiler)
    )
    out: list[RecheckVerdict] = []
    for result in results:
        window = store.recheck_window(
            session,
            result=result,
            run_ids=run_ids,
            nights=settings.stability_recheck_nights,
            settle_nights=DEFAULT_PARAMS.max_run,
        )
        if window is None:
            continue
        row = store.stored_verdict(session, window)
        threshold = row.threshold if row is not None and row.threshold else UNSTABLE_SPREAD
        verdict = judge(
            window,
            None if row is None else row.unstable,
            min_processes=settings.stability_recheck_min_processes,
            threshold=threshold,
        )
        store.record_recheck(
            session,
            window=window,
            run=run,
            medians_ms=verdict.medians_ms,
            cv=verdict.cv,
            spread=verdict.spread,
            unstable=verdict.unstable,
            threshold=threshold,
            allowed=verdict.allowed,
            source=verdict.source,
            applied=verdict.changed,
            setups=[full_setup_label(result.environment or {})],
        )
        if verdict.changed:
            log.info("run %s: %s", run.id, verdict.line())
            run.note = f"{run.note}\n{verdict.line()}" if run.note else verdict.line()
        out.append(verdict)
    session.flush()
    return out
