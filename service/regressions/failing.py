"""The failing-streak rule: a benchmark whose job failed on its last nights in a row.

A benchmark that errors leaves its series without a point, so a regression there goes unseen,
and a torch change that breaks a model is itself what the nightly exists to catch. The rule
(:func:`failing_benchmarks`) is read by the status (a problem to tell) and by the nightly (a
``failing`` alert filed as an issue, ``workers/issues/``). Queries only; no tracker, no worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.models import Job, JobStatus, Run, RunKind

FAILING_NIGHTS = 2  # a benchmark failing this many nights in a row is a problem to tell
FAILING_LOOKBACK = timedelta(days=90)  # nights searched for the streak and the good night


@dataclass(frozen=True)
class FailingBenchmark:
    """A benchmark that ran on machine class ``queue`` and whose job then failed on each of
    its last ``nights`` nights there (nightly and posted runs; a night it was not measured on
    does not break the streak), since night ``since``: its series has no point since, so a
    regression there goes unseen. ``error``: what its last error says failed
    (:func:`error_summary`)."""

    benchmark: str
    queue: str
    nights: int
    since: date
    error: str
    model: str = ""
    mode: str = ""
    device: str = ""
    compiler: str = "eager"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def error_summary(error: str | None) -> str:
    """The line of an error text that says what failed: the last line naming an exception
    (``RuntimeError: ...``; a traceback ends with it), else the first non-empty line."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return named[-1] if named else (lines[0] if lines else "no error text")


def failing_benchmarks(
    session: Session, *, today: date, at_least: int = FAILING_NIGHTS, until: date | None = None
) -> list[FailingBenchmark]:
    """Benchmarks whose job failed (``error``) on each of their last ``at_least`` or more nights
    on a machine class, among the nightly and posted runs of the ``FAILING_LOOKBACK`` before
    ``today`` (nights after ``until`` left out when given: a night judged as it stood).

    A night's job that ended ``done`` ends the streak; one ``missing`` (never reported) or
    still open is skipped. Only a benchmark that ran (``done``) before its streak counts: one
    that never ran on the machine class in the lookback (a configuration it does not support, a
    TorchBench model whose requirements are missing) is in each night's report, and would
    otherwise be a problem, and an issue, from its second night on. Longest streak first.
    """
    rows = session.execute(
        select(
            Job.model,
            Job.mode,
            Job.device,
            Job.compiler,
            Job.queue,
            Job.status,
            Job.error,
            Run.night,
        )
        .join(Run, Run.id == Job.run_id)
        .where(
            Run.kind.in_((RunKind.NIGHTLY, RunKind.INGEST)),
            Run.night >= today - FAILING_LOOKBACK,
            Run.night <= (until or date.max),
            Job.status.in_((JobStatus.DONE, JobStatus.ERROR)),
        )
        .order_by(Run.night.desc(), Job.id.desc())
    ).all()
    streaks: dict[tuple[str, str, str, str, str], list[tuple[date, str]]] = {}
    ended: set[tuple[str, str, str, str, str]] = set()
    for model, mode, device, compiler, queue, status, error, night in rows:
        key = (model, mode, device, compiler, queue)
        if key in ended:
            continue
        if status == JobStatus.DONE:
            ended.add(key)
            continue
        nights = streaks.setdefault(key, [])
        if not nights or nights[-1][0] != night:  # one failed job a night counts once
            nights.append((night, error_summary(error)))
    out = [
        FailingBenchmark(
            benchmark=benchmark_name(*key[:4]),
            queue=key[4],
            nights=len(n),
            since=n[-1][0],
            error=n[0][1],
            model=key[0],
            mode=key[1],
            device=key[2],
            compiler=key[3],
        )
        for key, n in streaks.items()
        if len(n) >= at_least and key in ended
    ]
    return sorted(out, key=lambda f: (-f.nights, f.queue, f.benchmark))


def ended_jobs(session: Session, run: Run, status: str) -> set[tuple[str, str]]:
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
    failed = ended_jobs(session, run, JobStatus.ERROR)
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
    done = ended_jobs(session, run, JobStatus.DONE)
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


def streak_nights(
    session: Session, failing: FailingBenchmark, until: date
) -> list[tuple[Run, Job]]:
    """The benchmark's jobs that ended (done or error) on its machine class and their runs,
    nightly and posted, on nights up to ``until``, newest first (60 at most)."""
    return [
        (run, job)
        for run, job in session.execute(
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
    ]


def streak_ends(
    session: Session, failing: FailingBenchmark, until: date
) -> tuple[Run | None, Run | None]:
    """``(last good night, first failing night)`` of ``failing``'s streak as of ``until``: the
    runs whose builds bound the commit range that broke it (None where not found)."""
    rows = streak_nights(session, failing, until)
    failed = [r for r, j in rows if r.night >= failing.since and j.status == JobStatus.ERROR]
    good = next((r for r, j in rows if j.status == JobStatus.DONE), None)
    return good, (failed[-1] if failed else None)
