"""Bisections on Celery: state in Postgres, one task per probe, a killed probe redelivered."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Bisection, Probe
from tests.conftest import WorkerPool, wait_until
from workers.bisect import celery_driver as bisecting
from workers.bisect.search import SearchConfig, outcome
from workers.demo.minitok import ENCODE, INSTALL_COMMAND, make_package_repository
from workers.enqueue import send

GOOD_MS = (10.1, 9.9, 10.0, 10.2, 9.8, 10.05, 9.95, 10.1, 10.0, 9.9)
BAD_MS = tuple(v * 1.2 for v in GOOD_MS)


def _commits(n: int) -> list[dict]:
    return [
        {
            "sha": f"{i:040x}",
            "title": f"change {i} (#{100 + i})",
            "author": "Ada",
            "author_email": "ada@example.org",
            "date": "2026-11-01T00:00:00+00:00",
            "pr_number": 100 + i,
        }
        for i in range(n + 1)
    ]


def _measure_literally(session: Session, probe: Probe, culprit: int) -> None:
    """Stand in for a worker: the samples a step at ``culprit`` gives (literal, not timed)."""
    probe.status = "done"
    probe.build_seconds = 1.0
    probe.samples = {
        name: list(BAD_MS if probe.index >= culprit else GOOD_MS) for name in probe.benchmarks
    }
    session.flush()


def test_a_night_bisects_a_slowdown_with_its_settings() -> None:
    config = bisecting.night_search_config(
        Settings(bisect_workers=2, bisect_samples=16, bisect_max_samples=8)
    )
    assert config.slower is True  # a night's latency regressions: the bad end must be slower
    assert (config.workers, config.initial_samples, config.max_samples) == (2, 16, 16)
    # Stored with the bisection and read back as it was.
    assert SearchConfig(**dataclasses.asdict(config)) == config


def test_rounds_are_planned_once_and_the_state_replays_from_the_rows(session: Session) -> None:
    bisection = bisecting.create_bisection(
        session,
        commits=_commits(16),
        benchmarks=["bench"],
        provider={"kind": "checkout", "repo": "/nowhere", "install_command": ""},
        config=SearchConfig(workers=2),
    )
    first = bisecting.advance(session, bisection_id=bisection.id)
    assert len(first.probes) == 2 and not first.finished
    # Planning again while the round runs (a duplicate advance task) adds nothing.
    assert bisecting.advance(session, bisection_id=bisection.id).probes == ()
    rounds = 0
    while True:
        pending = session.scalars(
            select(Probe).where(Probe.bisection_id == bisection.id, Probe.status == "queued")
        ).all()
        for probe in pending:
            _measure_literally(session, probe, culprit=11)
        result = bisecting.advance(session, bisection_id=bisection.id)
        rounds += 1
        if result.finished:
            break
        # W = 2 commits per round, but the verification's four (both endpoints, parent and
        # candidate, already built) are measured in one round.
        assert 1 <= len(result.probes) <= 4
        assert rounds < 30
    session.refresh(bisection)
    assert bisection.status == "done" and bisection.outcome == "culprit"
    (culprit,) = bisection.result["culprits"]
    assert culprit["sha"] == f"{11:040x}" and culprit["pr_number"] == 111
    assert bisection.builds == len({p["sha"] for p in bisection.result["probes"]})
    # The state is a pure function of the rows.
    probes = session.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).all()
    state = bisecting.replay(bisection, probes)
    final = outcome(state)
    assert final is not None and final.culprits[0][0] == f"{11:040x}"
    assert state.round == bisection.rounds
    # Once done, advancing does nothing.
    assert bisecting.advance(session, bisection_id=bisection.id) == bisecting.Advance()


@pytest.mark.usefixtures("database_url")
def test_a_probe_that_ended_is_not_measured_again() -> None:
    with session_scope() as session:
        bisection = bisecting.create_bisection(
            session,
            commits=_commits(4),
            benchmarks=["bench"],
            provider={"kind": "checkout", "repo": "/nowhere", "install_command": ""},
        )
        bisecting.advance(session, bisection_id=bisection.id)
        probe = session.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).first()
        assert probe is not None
        _measure_literally(session, probe, culprit=2)
        probe_id = probe.id
    # A second delivery of the task returns at once: no build, no new samples.
    assert bisecting.measure_probe(probe_id, worker="w9@test") is None
    with session_scope() as session:
        probe = session.get(Probe, probe_id)
        assert probe is not None and probe.attempts == 0 and probe.worker is None
        assert probe.samples == {"bench": list(GOOD_MS)}


def test_bad_bisection_input_is_refused(session: Session) -> None:
    from service.errors import InvalidInput

    with pytest.raises(InvalidInput, match="good and a bad"):
        bisecting.create_bisection(
            session, commits=_commits(0), benchmarks=["b"], provider={"kind": "checkout"}
        )
    with pytest.raises(InvalidInput, match="unknown build provider"):
        bisecting.create_bisection(
            session, commits=_commits(3), benchmarks=["b"], provider={"kind": "docker"}
        )
    with pytest.raises(InvalidInput, match="needs its command"):
        bisecting.create_bisection(
            session,
            commits=_commits(3),
            benchmarks=["b"],
            provider={"kind": "checkout"},
            commands={"c": "true"},
        )


@pytest.mark.measured
@pytest.mark.slow
def test_a_probe_killed_mid_way_is_retried_and_the_answer_stands(
    celery_workers: WorkerPool,
    tmp_path: Path,
    configure,  # type: ignore[no-untyped-def]
) -> None:
    # A probe here (a venv, `pip install -e .`, two short processes) takes 1-5 s on a busy 2-core
    # host: limits well above that, so the killed probe comes back 30 s after it was taken.
    configure(
        suite_timeout_s=25, task_soft_time_limit_s=27, task_time_limit_s=29, visibility_timeout_s=30
    )
    repo = make_package_repository(tmp_path / "minitok", commits=8, encode_culprit=5)
    from workers.commits import local_commit_range

    with session_scope() as session:
        bisection = bisecting.create_bisection(
            session,
            commits=local_commit_range(repo.path, repo.good, repo.bad),
            benchmarks=[ENCODE],
            commands={ENCODE: ENCODE},
            repo=str(repo.path),
            provider={
                "kind": "checkout",
                "repo": str(repo.path),
                "install_command": INSTALL_COMMAND,
            },
        )
        bisection_id = bisection.id
    w0 = celery_workers.start("cpu", "control", log_dir=tmp_path, name="w0")
    send(bisecting.step(bisection_id))

    def probes() -> list[Probe]:
        with session_scope() as session:
            return list(
                session.scalars(
                    select(Probe).where(Probe.bisection_id == bisection_id).order_by(Probe.id)
                )
            )

    def running_on_w0() -> bool:
        return any(p.status == "running" and (p.worker or "").startswith("w0@") for p in probes())

    wait_until(running_on_w0, timeout=120, interval=0.1, what="a probe running on w0")
    victim = next(p for p in probes() if p.status == "running")
    celery_workers.kill(w0)
    celery_workers.start("cpu", "control", log_dir=tmp_path, name="w1")

    def done() -> bool:
        with session_scope() as session:
            return session.get(Bisection, bisection_id).status == "done"  # type: ignore[union-attr]

    wait_until(done, timeout=420, interval=1, what="the bisection to finish after the kill")
    with session_scope() as session:
        finished = session.get(Bisection, bisection_id)
        assert finished is not None, "bisection vanished"
        planted = repo.culprits[ENCODE]
        # On a loaded machine a probe may stay `unknown`: an inconclusive, narrowed range is an
        # allowed answer; a wrong commit never is.
        assert finished.outcome in ("culprit", "inconclusive"), finished.result
        if finished.outcome == "culprit":
            assert [c["sha"] for c in finished.result["culprits"]] == [planted]
        else:
            assert not finished.result.get("culprits"), finished.result
            order = [c.sha for c in local_commit_range(repo.path, repo.good, repo.bad)]
            for entry in finished.result["benchmarks"]:
                span = [order.index(sha) for sha in entry["range"]]
                assert span and min(span) <= order.index(planted) <= max(span), entry
    rows = {p.id: p for p in probes()}
    assert rows[victim.id].status == "done"
    assert rows[victim.id].attempts >= 2, "the killed probe was not redelivered"
    assert rows[victim.id].worker.startswith("w1@")
    # One row per commit and round: the redelivery did not add probes or samples twice.
    keys = [(p.round, p.sha) for p in rows.values()]
    assert len(keys) == len(set(keys))
    assert all(len(p.samples[ENCODE]) == p.samples_wanted for p in rows.values())


@pytest.mark.usefixtures("database_url")
def test_bisect_resume_sends_a_stuck_round_again(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from workers.bisect.failure_driver import create_failure_bisection
    from workers.cli import app
    from workers.commits import local_commit_range

    repo = make_package_repository(tmp_path / "minitok", commits=4)
    with session_scope() as session:
        bisection = create_failure_bisection(
            session,
            commits=local_commit_range(repo.path, repo.good, repo.bad),
            benchmark="dqn:eval:cpu",
            provider={"kind": "checkout", "repo": str(repo.path), "install_command": "exit 3"},
        )
        planned = bisecting.advance(session, bisection_id=bisection.id)
        assert len(planned.probes) == 2  # round 0: both endpoints, never sent (an outage)
        bisection_id = bisection.id
    result = CliRunner().invoke(app, ["bisect-resume", str(bisection_id)])
    assert result.exit_code == 0, result.output
    assert f"bisection {bisection_id}: 2 probe task(s) sent again" in result.output
    # Embedded, they ran here: no commit builds (the install fails), so both endpoints were
    # skipped and the search ended.
    with session_scope() as session:
        done = session.get(Bisection, bisection_id)
        assert done is not None and done.status == "done" and done.outcome == "not_reproduced"
        assert "did not build" in done.result["benchmarks"][0]["reason"]
    again = CliRunner().invoke(app, ["bisect-resume", "999999"])
    assert again.exit_code != 0 and "bisection 999999 does not exist" in again.output
