"""A benchmark failing night after night is filed as an issue, once, durably."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.bisections.routes import read_bisection
from service.bisections.schemas import BisectionRead
from service.config import Settings, get_settings
from service.db import session_scope
from service.models import Alert, Bisection, FilingState, Probe, Run
from service.runs.service import BenchmarkSpec
from service.status.service import system_status
from tests.conftest import WorkerPool, wait_until
from tests.github_server import FakeGitHub
from tests.nights import posted_night
from tests.workers.issues.conftest import TOKEN
from workers.bisect.failure_driver import replay_failures
from workers.demo.minitok import PackageRepository
from workers.demo.run import DEMO_MODE, DEMO_MODEL
from workers.issues import pending

BOOM = (
    'Traceback (most recent call last):\n  File "suite/harness.py", line 256, in run\n'
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x512 and 256x10)"
)


@pytest.fixture
def github(configure: Callable[..., None], fake: FakeGitHub) -> FakeGitHub:
    configure(
        github_repository="octo-org/perf",
        github_token=TOKEN,
        github_api_url=fake.base_url,
        source_github_repository="pytorch/pytorch",
    )
    return fake


def _night(day: int, rng: random.Random, *, error: str | None = None) -> int:
    return posted_night(date(2026, 10, day), 10.0, rng, error=error)


def test_a_benchmark_failing_two_nights_in_a_row_is_filed_once(github: FakeGitHub) -> None:
    rng = random.Random(3)
    for day in (1, 2, 3):
        _night(day, rng)
    _night(4, rng, error=BOOM)
    assert github.issues == {}  # one failed night is not yet a streak
    second = _night(5, rng, error=BOOM)
    (issue,) = github.issues.values()
    assert issue["title"].startswith("[perf] dqn:eval:cpu fails on ")
    assert issue["title"].endswith(
        "since 2026-10-04: RuntimeError: mat1 and mat2 shapes cannot "
        "be multiplied (4x512 and 256x10)"
    ), issue["title"]
    body = issue["body"]
    assert "has failed on its last 2 nights" in body and "It last ran on 2026-10-03" in body
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in body
    assert body.count("| RuntimeError: mat1 and mat2") == 2  # the two failed nights' row
    assert "python -m suite run --model dqn --mode eval --device cpu --compiler eager" in body
    assert "Not bisected: no build provider is configured" in body
    with session_scope() as session:
        assert session.scalars(select(Bisection)).all() == []
    assert f"nightbench:run={second}" in body
    with session_scope() as session:
        alert = session.scalar(select(Alert).where(Alert.run_id == second, Alert.kind == "failing"))
        assert alert is not None and alert.filing_state == FilingState.FILED
        now = datetime(2026, 10, 6, tzinfo=UTC)
        assert any(
            p.startswith("benchmark dqn:eval:cpu on ") and "2 nights in a row" in p
            for p in system_status(session, now=now).problems
        )
    _night(6, rng, error=BOOM)  # the same streak: no second issue, no new alert
    assert len(github.issues) == 1 and github.comments[1] == []
    again = _night(7, rng)  # runs again: the issue is told, once
    (told,) = github.comments[1]
    assert told["body"].startswith(f"**Runs again on 2026-10-07** (run {again}, build ")
    assert "after failing on 3 nights since 2026-10-04" in told["body"], told["body"]
    with session_scope() as session:
        assert system_status(session, now=datetime(2026, 10, 8, tzinfo=UTC)).failing == []
    _night(8, rng, error=BOOM)
    _night(9, rng, error=BOOM)  # a new streak: a new issue
    assert len(github.issues) == 2
    assert "since 2026-10-08" in list(github.issues.values())[-1]["title"]


def test_a_failing_benchmark_waits_in_the_outbox_while_github_refuses(
    github: FakeGitHub,
) -> None:
    rng = random.Random(4)
    for day in (1, 2):
        _night(day, rng)
    _night(3, rng, error=BOOM)
    github.token = "ghp_rotated_token_not_ours"
    run_id = _night(4, rng, error=BOOM)
    assert github.issues == {}
    with session_scope() as session:
        alert = session.scalar(select(Alert).where(Alert.run_id == run_id, Alert.kind == "failing"))
        assert alert is not None and alert.filing_state == FilingState.FAILED_RETRYING
        status = system_status(session, now=datetime(2026, 10, 5, tzinfo=UTC))
        assert [f.kind for f in status.pending_filings] == ["failing"]
        assert any("failing-benchmark issue failed" in p for p in status.problems)
    kept = list(get_settings().effective_outbox_dir.glob("*.md"))
    assert len(kept) == 1 and "dqn:eval:cpu` has failed on its last 2 nights" in kept[0].read_text()
    github.token = TOKEN
    pending.retry_pending(force=True)
    pending.retry_pending(force=True)
    assert len(github.issues) == 1
    assert "filed_url" in kept[0].read_text()  # the outbox copy says where it went


def test_the_commit_range_links_the_builds_either_side_of_the_first_failure() -> None:
    from workers.issues.render.failing import commit_range

    linked = commit_range("pytorch/pytorch", "a" * 40, "b" * 40)
    assert f"`{'a' * 10}..{'b' * 10}`" in linked
    assert f"https://github.com/pytorch/pytorch/compare/{'a' * 40}...{'b' * 40}" in linked
    assert "compare" not in commit_range(None, "a" * 40, "b" * 40)
    assert "same torch commit" in commit_range(None, "a" * 40, "a" * 40)
    assert commit_range(None, None, "b" * 40) == ""


def test_a_benchmark_that_never_ran_is_not_filed(github: FakeGitHub) -> None:
    # A configuration it does not support fails from its first night: each night's report
    # says so; it is not a benchmark that broke.
    rng = random.Random(5)
    for day in (1, 2, 3):
        _night(day, rng, error="NotImplementedError: eval on cpu is not supported")
    assert github.issues == {}
    with session_scope() as session:
        status = system_status(session, now=datetime(2026, 10, 4, tzinfo=UTC))
        assert status.failing == [] and status.problems == []


CRASH = (
    'Traceback (most recent call last):\n  File "minitok/tokenizer.py", line 38\n'
    "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
)


def _breaking_repository(
    minitok_deployment: Callable[..., PackageRepository],
    fake: FakeGitHub,
    history: dict[str, Any] | None = None,
    **settings: object,
) -> PackageRepository:
    """A real package (minitok) standing in for torch: its commit 4 of 6 makes the tokenizer
    raise (``history``: other arguments of ``make_package_repository``), and the suite's tokbag
    model, mostly minitok's tokenization, fails from there on. Bisections build it with the
    checkout provider (``tests/conftest.py``'s ``minitok_deployment``)."""
    return minitok_deployment(fake, history or {"commits": 6, "crash_culprit": 4}, **settings)


def _tokbag_nights(
    repo: PackageRepository, between: Callable[[int], None] = lambda _: None
) -> None:
    """Three good nights at the repository's first commit, then two failing at its last;
    ``between(run_id)`` after each."""
    rng, tokbag = random.Random(5), BenchmarkSpec(model=DEMO_MODEL, mode=DEMO_MODE)
    for day in range(1, 6):
        good = day <= 3
        between(
            posted_night(
                date(2026, 10, day),
                10.0 if good else None,
                rng,
                error=None if good else CRASH,
                commit=repo.good if good else repo.bad,
                spec=tokbag,
            )
        )


@pytest.mark.slow
@pytest.mark.usefixtures("celery_workers")
def test_real_workers_bisect_a_failing_benchmark_and_tell_its_issue(
    minitok_deployment: Callable[..., PackageRepository],
    fake: FakeGitHub,
    tmp_path: Path,
    celery_workers: WorkerPool,
) -> None:
    # The distributed path: the nights' steps, the bisection's probes and the filing run in a
    # real worker process, through Redis; GitHub refuses the token until the search has ended.
    repo = _breaking_repository(minitok_deployment, fake)
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    fake.token = "ghp_rotated_token_not_ours"

    def settled(run_id: int) -> None:
        def done() -> bool:
            with session_scope() as session:
                run = session.get(Run, run_id)
                return run is not None and run.status != "detecting"

        wait_until(done, timeout=120, interval=0.5, what=f"run {run_id} to be detected")

    _tokbag_nights(repo, settled)

    def searched_and_refused() -> bool:
        with session_scope() as session:
            ended = session.scalars(select(Bisection).where(Bisection.status == "done")).all()
            alert = session.scalar(select(Alert).where(Alert.kind == "failing"))
            return (
                bool(ended)
                and alert is not None
                and alert.filing_state == FilingState.FAILED_RETRYING
            )

    wait_until(
        searched_and_refused,
        timeout=400,
        interval=1,
        what="the bisection to end while GitHub refuses",
    )
    assert fake.issues == {}
    kept = list(get_settings().effective_outbox_dir.glob("*.md"))
    assert len(kept) == 1 and "Bisection 1 searches its 6 commit(s)" in kept[0].read_text()
    fake.token = TOKEN  # the token is fixed: the retry files the issue and tells the answer
    pending.retry_pending(force=True)
    (issue,) = fake.issues.values()
    (told,) = fake.comments[1]
    assert "fails on cpu since 2026-10-04" in issue["title"]
    assert told["body"].startswith(
        f"**Bisected: `tokbag:eval:cpu` fails from `{repo.crash[:10]}` on**:"
    ), told["body"]
    with session_scope() as session:
        (bisection,) = session.scalars(select(Bisection)).all()
        workers = {p.worker for p in session.scalars(select(Probe))}
        assert bisection.outcome == "culprit" and all(w.startswith("w0@") for w in workers)


@pytest.mark.slow
def test_a_failing_benchmark_is_bisected_to_the_commit_that_broke_it(
    minitok_deployment: Callable[..., PackageRepository], fake: FakeGitHub
) -> None:
    # Embedded (no broker): the whole chain in this thread. Each probe is a real checkout build
    # and real suite processes.
    repo = _breaking_repository(minitok_deployment, fake, suite_timeout_s=240)
    _tokbag_nights(repo)
    (issue,) = fake.issues.values()
    assert f"The commit range to search: `{repo.good[:10]}..{repo.bad[:10]}`" in issue["body"]
    assert "searches its 6 commit(s) on `cpu`" in issue["body"], issue["body"]
    # The bisection ran in this thread after the issue was filed; its answer is told once.
    (told,) = fake.comments[1]
    body = told["body"]
    assert body.startswith(
        f"**Bisected: `tokbag:eval:cpu` fails from `{repo.crash[:10]}` on**:"
        ' "Simplify how the tokenizer finds its longest piece"'
    ), body
    assert (
        f"it runs at its parent {repo.shas[3][:10]} (4 of 4 runs) and fails from "
        f"{repo.crash[:10]} on (4 of 4 runs)"
    ) in body
    assert "TypeError: unsupported operand type(s) for +: 'int' and 'str'" in body
    with session_scope() as session:
        (bisection,) = session.scalars(select(Bisection)).all()
        assert bisection.outcome == "culprit" and bisection.benchmarks == ["tokbag:eval:cpu"]
        assert [c["sha"] for c in bisection.result["culprits"]] == [repo.crash]
        # The search was given the nights' error: a probe failing with another one would have
        # counted neither way.
        assert bisection.config["error"].startswith("TypeError: unsupported operand")
        probes = session.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).all()
        assert replay_failures(bisection, probes).signature == "TypeError"
        # Run for real, two suite processes a probe: from commit 4 on both failed with the
        # tokenizer's error, before it both ran.
        failed = {p.index for p in probes if p.errors}
        assert (
            failed
            and min(failed) == 4
            and all(
                "TypeError" in p.errors["tokbag:eval:cpu"]
                and "(2 of 2 runs failed)" in p.errors["tokbag:eval:cpu"]
                for p in probes
                if p.errors
            )
        )
        assert all(len(p.samples["tokbag:eval:cpu"]) == 2 for p in probes if p.index < 4)
        # What GET /api/bisections/{id} answers, in its schema.
        read = BisectionRead.model_validate(read_bisection(bisection.id, session))
        assert read.search == "failure" and read.answers[0].culprit == repo.crash
        assert read.alert_id is not None and read.run_id is None
    # Telling again (a second delivery of the task) posts nothing more.
    pending.retry_pending(force=True)
    assert len(fake.comments[1]) == 1


@pytest.mark.slow
def test_another_failure_inside_the_range_is_stepped_around_for_real(
    minitok_deployment: Callable[..., PackageRepository], fake: FakeGitHub
) -> None:
    # Commit 4 of 8 half-renames a constant (the tokenizer raises a NameError; commit 5 finishes
    # it), commit 7 brings the nights' TypeError. The search's first probe lands on 4: failing,
    # but not as the nights did, so it counts neither way and 7 is named, not 4.
    repo = _breaking_repository(
        minitok_deployment,
        fake,
        suite_timeout_s=240,
        history={"commits": 8, "crash_culprit": 7, "unfinished": [4]},
    )
    _tokbag_nights(repo)
    (told,) = fake.comments[1]
    assert told["body"].startswith(
        f"**Bisected: `tokbag:eval:cpu` fails from `{repo.crash[:10]}` on**"
    ), told["body"]
    assert "TypeError: unsupported operand" in told["body"]
    assert (
        f"Stepped around, failing differently from the nights: `{repo.shas[4][:10]}` "
        "(tokbag:eval:cpu: NameError: name 'UNKNOWN' is not defined"
    ) in told["body"]
    with session_scope() as session:
        (bisection,) = session.scalars(select(Bisection)).all()
        probes = session.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).all()
        other = {
            p.index: p.errors["tokbag:eval:cpu"]
            for p in probes
            if p.errors and "NameError" in p.errors["tokbag:eval:cpu"]
        }
        assert list(other) == [4] and "name 'UNKNOWN' is not defined" in other[4], other
        (at_four,) = [p for p in replay_failures(bisection, probes).probes if p.index == 4]
        assert at_four.status == "other" and at_four.failed == 0 and at_four.other == 2
        assert bisection.outcome == "culprit" and bisection.result["error"].startswith(
            "tokbag:eval:cpu: TypeError"
        )


def test_what_a_failure_bisection_tells_when_it_names_no_commit() -> None:
    from workers.issues.model import FailureBisected
    from workers.issues.render.failing import render_bisected

    a, b, c = ("a" * 40, "b" * 40, "c" * 40)
    answer = {
        "benchmark": "dqn:eval:cpu",
        "status": "inconclusive",
        "culprit": None,
        "range": [b, c],
        "change": None,
        "reason": "the 1 commit(s) between aaaa (runs) and cccc (fails) did not build",
    }
    row = Bisection(
        id=7,
        status="done",
        outcome="inconclusive",
        good=a,
        bad=c,
        benchmarks=["dqn:eval:cpu"],
        config={"kind": "failure"},
        result={
            "builds": 5,
            "rounds": 4,
            "culprits": [],
            "benchmarks": [answer],
            "error": "dqn:eval:cpu: RuntimeError: shapes (2 of 2 runs failed)",
        },
    )

    def told(row: Bisection, repository: str | None) -> str:
        return render_bisected(
            FailureBisected(
                id=row.id,
                benchmark=row.benchmarks[0],
                outcome=row.outcome,
                result=dict(row.result or {}),
                source_repository=repository,
            )
        )

    text = told(row, "pytorch/pytorch")
    assert text.startswith(
        "**Bisection 7 could not name one commit** (5 builds, 4 rounds): the "
        "1 commit(s) between aaaa (runs) and cccc (fails) did not build."
    )
    assert (
        f"lies in [`{b[:10]}`](https://github.com/pytorch/pytorch/commit/{b}) .. "
        f"[`{c[:10]}`](https://github.com/pytorch/pytorch/commit/{c}) (2 commits)"
    ) in text
    assert "RuntimeError: shapes (2 of 2 runs failed)\n```" in text
    row.outcome, answer["reason"] = "not_reproduced", "the first failing build cccc runs"
    text = told(row, "")
    assert (
        text.startswith(
            "**Bisection 7 did not reproduce the failure** (5 builds, 4 rounds): "
            "the first failing build cccc runs."
        )
        and "lies in" not in text
    )


@pytest.mark.parametrize(
    ("source", "repository"),
    [
        ({"source_repo_path": Path("/src/minitok")}, None),  # a local clone, no GitHub address
        ({"source_repo_path": Path("/src/minitok"), "source_github_repository": ""}, None),
        (
            {"source_repo_path": Path("/src/minitok"), "source_github_repository": "ex/minitok"},
            "ex/minitok",
        ),
    ],
)
def test_a_failure_bisections_comment_links_only_to_the_source_repository(
    db: Session, settings: Settings, source: dict[str, object], repository: str | None
) -> None:
    from workers.issues.render.failing import render_bisected
    from workers.issues.reports.failing import finished_bisections

    good, culprit, bad = "a" * 40, "b" * 40, "c" * 40
    run = Run(
        night=date(2026, 10, 5),
        kind="nightly",
        status="complete",
        torch_version="2.13.0+cpu",
        torch_git_commit=bad,
    )
    db.add(run)
    db.flush()
    alert = Alert(run_id=run.id, kind="failing", status="open")
    db.add(alert)
    db.flush()
    answer = {
        "benchmark": "dqn:eval:cpu",
        "status": "culprit",
        "culprit": culprit,
        "range": [culprit],
        "reason": "it fails from this commit on",
    }
    db.add(
        Bisection(
            run_id=run.id,
            alert_id=alert.id,
            status="done",
            outcome="culprit",
            good=good,
            bad=bad,
            benchmarks=["dqn:eval:cpu"],
            config={"kind": "failure", "issue": "f"},
            result={
                "builds": 3,
                "rounds": 2,
                "culprits": [{"sha": culprit, "title": "Break dqn", "author": "Dev"}],
                "benchmarks": [answer],
            },
        )
    )
    db.flush()

    deployment = settings.model_copy(update=source)
    [(_, bisected)] = finished_bisections(db, alert_id=alert.id, settings=deployment)
    text = render_bisected(bisected)

    assert f"`{culprit[:10]}`" in text
    if repository is None:
        assert "github.com" not in text
    else:
        assert f"[`{culprit[:10]}`](https://github.com/{repository}/commit/{culprit})" in text
