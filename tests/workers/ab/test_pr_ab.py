"""A pull request's A/B end to end: real builds, real suite processes, real Celery workers
through Redis, and the GitHub stand-in answering PyGithub.

The package under test is ``minitok`` (workers/demo/minitok.py): a PR whose head adds the
encode culprit (redundant checks in the tokenizer's loops, a Python-only change) slows the
suite's ``tokbag`` model by about 30%; a PR whose head is an ordinary commit changes nothing the
benchmark runs; a PR whose head does not build. Each is asked for as the workflow asks
(``nightbench ab --pr N --requested-by LOGIN``), measured by a worker on ``cpu`` and reported
by one on ``control``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from service.db import session_scope
from service.main import create_app
from service.models import ABTest, Result, Run
from tests.conftest import WorkerPool, wait_until
from tests.github_server import FakeGitHub
from workers.ab import reporting
from workers.ab.github import AB_MARKER, STATUS_CONTEXT
from workers.cli import app
from workers.demo.minitok import PackageRepository

TOKEN = "ghp_ab_test_token_not_secret"
BENCHMARK = "tokbag:eval:cpu"
MAINTAINER = "ada"


@dataclass
class Setup:
    """The package's history, the stand-in, and how to ask for an A/B."""

    repo: PackageRepository
    fake: FakeGitHub
    ask: Callable[..., int]


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    """The GitHub stand-in, answering for ``TOKEN``."""
    with FakeGitHub(token=TOKEN) as server:
        yield server


@pytest.fixture
def setup(
    broker_url: str, minitok_deployment: Callable[..., PackageRepository], fake: FakeGitHub
) -> Setup:
    """minitok's history: 1 ordinary, 2 the encode culprit (+30%), 3 broken (its build
    fails), 4 repairs it, 5 makes the tokenizer raise; the checkout provider builds it; the
    maintainer has write access.

    One A/B is one task: two builds, 5 processes a side, a profile of what regressed, and as
    many processes more when a busy host leaves the first ones unsure. That outlasts the 45 s
    the broker fixture gives a task (its limits are short so a killed worker's task comes back
    within a test), so these tests give it the room a deployment's 1,800 s default does."""
    repo = minitok_deployment(
        fake,
        {"commits": 5, "encode_culprit": 2, "broken": [3], "crash_culprit": 5},
        api_base_url="http://nightbench.test",
        task_soft_time_limit_s=300,
        task_time_limit_s=320,
        visibility_timeout_s=330,
    )
    fake.set_permission(MAINTAINER, "write")

    def ask(pr: int, *, by: str = MAINTAINER) -> int:
        """What the workflow runs: ``nightbench ab --pr N --requested-by LOGIN``."""
        args = ["ab", "--pr", str(pr), "--requested-by", by, "--benchmark", BENCHMARK]
        out = CliRunner().invoke(app, [*args, "--processes", "5", "--samples", "6"])
        found = re.search(r"A/B (\d+) of PR #\d+", out.output)
        assert out.exit_code == 0 and found, out.output
        return int(found.group(1))

    return Setup(repo, fake, ask)


def _reported(ab_id: int) -> Callable[[], bool]:
    def done() -> bool:
        with session_scope() as session:
            ab = session.get(ABTest, ab_id)
            return ab is not None and ab.report_state in ("reported", "failed_retrying")

    return done


def _status(fake: FakeGitHub, sha: str) -> dict[str, object]:
    statuses = [s for s in fake.statuses.get(sha, []) if s["context"] == STATUS_CONTEXT]
    assert statuses, f"no {STATUS_CONTEXT} status on {sha[:10]}"
    return max(statuses, key=lambda s: int(s["id"]))  # the newest


@pytest.mark.slow
@pytest.mark.measured
def test_a_planted_slowdown_is_flagged_in_one_comment_edited_on_a_rerun(
    setup: Setup, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    repo, fake = setup.repo, setup.fake
    fake.add_pull(7, head_sha=repo.shas[2], base_sha=repo.shas[1], merge_base=repo.shas[0])
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    first = setup.ask(7)
    wait_until(_reported(first), timeout=240, what="the first A/B to be reported")

    (comment,) = fake.comments[7]
    body = str(comment["body"])
    assert body.startswith(AB_MARKER)
    assert "1 regression(s) in `tokbag:eval:cpu`" in body, body
    row = next(line for line in body.splitlines() if line.startswith("| ❌ | `tokbag:eval:cpu`"))
    assert "| latency |" in row and "| regression |" in row, row
    # Against the merge base, not the base branch's tip.
    assert f"Base [`{repo.shas[0][:10]}`](https://github.com/octo-org/perf/commit/" in body
    assert f"against head [`{repo.shas[2][:10]}`]" in body
    # The regressed benchmark was profiled: the tokenizer's encode is a row of what changed.
    assert "### What changed in `tokbag:eval:cpu` (latency)" in body
    assert "minitok/tokenizer.py: encode" in body, body
    assert "nightbench ab --repo PATH/TO/CLONE --base" in body
    status = _status(fake, repo.shas[2])
    assert status["state"] == "failure"
    assert "tokbag:eval:cpu latency +" in str(status["description"])

    with session_scope() as session:
        ab = session.get(ABTest, first)
        assert ab is not None and ab.status == "done" and ab.comment_id == comment["id"]
        (latency,) = [r for r in ab.rows if r["metric"] == "latency"]
        assert latency["verdict"] == "regression" and 1.15 < latency["ratio"] < 1.6, latency
        assert latency["low"] > 1.0 and latency["p_value"] < 0.01
        # The processes are runs of kind ab, never nightly series.
        runs = session.scalars(select(Run).where(Run.id.in_([ab.base_run_id, ab.head_run_id])))
        assert {r.kind for r in runs} == {"ab"}
        results = session.scalars(select(Result).where(Result.run_id == ab.head_run_id)).all()
        assert all(r.series_key is None for r in results)
        # One sample per process: 5 asked, or 10 when a busy host left the first 5 unsure
        # and the A/B measured it again with as many processes more (and said so).
        remeasured = BENCHMARK in (ab.options.get("remeasured") or ())
        samples = len(next(r for r in results if r.metric == "latency").samples)
        assert samples == (10 if remeasured else 5), (samples, ab.options)
        assert ("Measured again with as many processes more" in body) == remeasured, body

    # GET /api/ab/{id} serves the rows and every process.
    with TestClient(create_app()) as client:
        read = client.get(f"/api/ab/{first}").json()
    assert read["flagged"] >= 1 and read["rows"][0]["verdict"] == "regression"
    assert {p["side"] for p in read["processes"]} == {"base", "head"}
    assert read["comment_url"] == comment["html_url"]

    # A re-run edits the same comment: never a second one.
    second = setup.ask(7)
    wait_until(_reported(second), timeout=240, what="the re-run to be reported")
    assert len(fake.comments[7]) == 1
    assert f"A/B {second}" in str(fake.comments[7][0]["body"])
    with session_scope() as session:
        again = session.get(ABTest, second)
        assert again is not None and again.comment_id == comment["id"]
    with TestClient(create_app()) as client:
        listed = client.get("/api/ab", params={"pr": 7}).json()
    assert [a["id"] for a in listed] == [second, first]


@pytest.mark.slow
@pytest.mark.measured
def test_a_comment_only_change_passes_and_a_build_failure_fails_with_its_reason(
    setup: Setup, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    repo, fake = setup.repo, setup.fake
    fake.add_pull(8, head_sha=repo.shas[1], base_sha=repo.shas[0], merge_base=repo.shas[0])
    fake.add_pull(9, head_sha=repo.shas[3], base_sha=repo.shas[1], merge_base=repo.shas[1])
    fake.add_pull(13, head_sha=repo.shas[5], base_sha=repo.shas[4], merge_base=repo.shas[4])
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    quiet, broken, crashing = setup.ask(8), setup.ask(9), setup.ask(13)
    wait_until(_reported(quiet), timeout=240, what="the quiet PR's A/B to be reported")
    wait_until(_reported(broken), timeout=120, what="the broken PR's A/B to be reported")
    wait_until(_reported(crashing), timeout=120, what="the crashing PR's A/B to be reported")

    (comment,) = fake.comments[8]
    assert "no regression" in str(comment["body"]) and "❌" not in str(comment["body"])
    assert _status(fake, repo.shas[1])["state"] == "success"

    (failed,) = fake.comments[9]
    body = str(failed["body"])
    assert "Not measured:" in body and f"the head ({repo.shas[3][:12]}) does not build" in body
    status = _status(fake, repo.shas[3])
    assert status["state"] == "failure"
    assert "does not build" in str(status["description"])

    # A benchmark the head breaks is flagged as broken, never as a regression.
    (crashed,) = fake.comments[13]
    body = str(crashed["body"])
    row = next(line for line in body.splitlines() if line.startswith("| ❌ | `tokbag:eval:cpu`"))
    assert "fails on head: " in row and "TypeError" in row and "regression |" not in row, row
    status = _status(fake, repo.shas[5])
    assert status["state"] == "failure"
    assert "tokbag:eval:cpu fails on head" in str(status["description"])
    with session_scope() as session:
        ab = session.get(ABTest, crashing)
        assert ab is not None and [r["verdict"] for r in ab.rows] == ["fails on head"]
        # One turn a side, then the turns stop: the base ran once, the head failed once.
        assert ab.rows[0]["base_replicates"] == 1 and ab.rows[0]["head_replicates"] == 0


@pytest.mark.slow
def test_a_fork_is_refused_and_a_push_during_the_run_is_said(
    setup: Setup, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    repo, fake = setup.repo, setup.fake
    fake.add_pull(10, head_sha=repo.shas[2], base_sha=repo.shas[0], fork=True)
    fake.add_pull(11, head_sha=repo.shas[1], base_sha=repo.shas[0], merge_base=repo.shas[0])
    celery_workers.start("cpu", "control", log_dir=tmp_path)

    refused = setup.ask(10)
    stranger = setup.ask(11, by="mallory")
    for ab_id in (refused, stranger):
        wait_until(_reported(ab_id), timeout=60, what=f"A/B {ab_id}'s refusal to be reported")
    assert "comes from a fork" in str(fake.comments[10][0]["body"])
    assert _status(fake, repo.shas[2])["state"] == "error"
    assert "mallory may not start an A/B" in str(fake.comments[11][0]["body"])
    with session_scope() as session:
        for ab_id in (refused, stranger):
            ab = session.get(ABTest, ab_id)
            assert ab is not None and ab.status == "failed" and ab.base_run_id is None

    # A push while the A/B measures: the comment names the head measured and the new one.
    measured = setup.ask(11)
    fake.push(11, repo.shas[4])
    wait_until(_reported(measured), timeout=240, what="the pushed PR's A/B to be reported")
    body = str(fake.comments[11][0]["body"])
    assert len(fake.comments[11]) == 1
    assert f"The PR's head is now [`{repo.shas[4][:10]}`]" in body, body
    assert f"these figures are of [`{repo.shas[1][:10]}`]" in body


@pytest.mark.slow
def test_a_report_github_refuses_is_kept_and_posted_once_it_answers(
    setup: Setup, celery_workers: WorkerPool, tmp_path: Path
) -> None:
    repo, fake = setup.repo, setup.fake
    fake.add_pull(12, head_sha=repo.shas[1], base_sha=repo.shas[0], merge_base=repo.shas[0])
    fake.fail("POST", r".*/issues/12/comments", status=401, message="Bad credentials")
    celery_workers.start("cpu", "control", log_dir=tmp_path)
    ab_id = setup.ask(12)
    wait_until(_reported(ab_id), timeout=240, what="the A/B's report to be tried")
    with session_scope() as session:
        ab = session.get(ABTest, ab_id)
        assert ab is not None and ab.status == "done"
        assert ab.report_state == "failed_retrying" and ab.report_attempts == 1
        assert "NIGHTBENCH_GITHUB_TOKEN" in (ab.report_error or "")
        assert ab.next_report_at is not None
    assert not fake.comments.get(12)
    # Not due yet: nothing is sent; forced (or once due): posted once.
    assert reporting.retry_due() == {}
    assert reporting.retry_due(force=True) == {ab_id: "reported"}
    assert len(fake.comments[12]) == 1
    assert _status(fake, repo.shas[1])["state"] == "success"


def test_an_unreadable_pull_request_stores_nothing(setup: Setup) -> None:
    out = CliRunner().invoke(app, ["ab", "--pr", "404", "--benchmark", BENCHMARK])
    assert out.exit_code == 2 and "404" in out.output, out.output
    with session_scope() as session:
        assert session.scalars(select(ABTest)).all() == []


def test_a_pr_a_b_takes_its_commits_from_the_pr(setup: Setup) -> None:
    out = CliRunner().invoke(app, ["ab", "--pr", "7", "--base", "abc", "--benchmark", BENCHMARK])
    assert out.exit_code == 2 and "drop --base, --head and --repo" in out.output
