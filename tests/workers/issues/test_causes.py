"""A night's bisection as its issue reads it: from the stored answer, the same as a replay.

The bisection runs for real through the Celery driver's planning (``advance``) on Postgres, each
probe measured with literal samples (a step at one commit, nothing timed); its issue then reads
``Bisection.result`` and gets the outcome and probes the driver's replay of the rows gives.
"""

from __future__ import annotations

from datetime import date

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Bisection, Probe, Run
from workers.bisect import celery_driver
from workers.bisect.search import REFERENCE, SearchConfig, outcome
from workers.issues.reports.causes import night_bisection_input, stored_outcome

GOOD_MS = (10.1, 9.9, 10.0, 10.2, 9.8, 10.05, 9.95, 10.1, 10.0, 9.9)
BAD_MS = tuple(v * 1.2 for v in GOOD_MS)
CULPRIT = 11


def _commits(n: int) -> list[dict]:
    return [
        {"sha": f"{i:040x}", "title": f"change {i}", "author": "Ada", "pr_number": 100 + i}
        for i in range(n + 1)
    ]


def _bisected(session: Session, run: Run) -> Bisection:
    bisection = celery_driver.create_bisection(
        session,
        commits=_commits(16),
        benchmarks=["bench"],
        provider={"kind": "checkout", "repo": "/nowhere", "install_command": "make"},
        config=SearchConfig(workers=2),
        run_id=run.id,
    )
    celery_driver.advance(session, bisection_id=bisection.id)
    for _ in range(30):
        for probe in session.scalars(
            select(Probe).where(Probe.bisection_id == bisection.id, Probe.status == "queued")
        ):
            probe.status, probe.build_seconds = "done", 1.0
            probe.samples = {
                n: list(BAD_MS if probe.index >= CULPRIT else GOOD_MS) for n in probe.benchmarks
            }
        session.flush()
        if celery_driver.advance(session, bisection_id=bisection.id).finished:
            break
    session.refresh(bisection)
    return bisection


def test_the_issue_reads_the_stored_answer_as_the_replay_gives_it(db: Session) -> None:
    run = Run(night=date(2026, 11, 20), torch_spec="nightly:2026-11-20", status="done")
    db.add(run)
    db.flush()
    bisection = _bisected(db, run)
    assert bisection.status == "done" and bisection.outcome == "culprit"

    probes = db.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).all()
    state = celery_driver.replay(bisection, probes)
    stored = stored_outcome(bisection.result or {})
    assert stored is not None
    assert stored == (outcome(state), tuple(state.probes))

    found = night_bisection_input(db, run_id=run.id)
    assert found is not None and found.outcome.culprits[0][0] == f"{CULPRIT:040x}"
    assert found.probes == tuple(p for p in state.probes if p.purpose != REFERENCE)
    assert (found.repo, found.install_command) == ("/nowhere", "make")
