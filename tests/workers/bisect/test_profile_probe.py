"""The profile probe when it cannot profile: the reason is stored and the night is filed."""

from __future__ import annotations

import gzip
import json
import subprocess
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Bisection, BisectionProfile, Run
from service.runs.service import BenchmarkSpec
from tests.conftest import WorkerPool, wait_until
from workers.bisect import profile_probe
from workers.enqueue import Step, send
from workers.night import plan as nightly


def _repo(path: Path) -> list[str]:
    """A git repository of three commits; their shas, oldest first."""
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for i in range(3):
        (path / "f.txt").write_text(f"{i}\n")
        subprocess.run([*git, "add", "f.txt"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"commit {i}"], check=True)
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True)
        shas.append(head.stdout.decode().strip())
    return shas


def _bisection(run_id: int, shas: list[str], provider: dict[str, str], **config: object) -> int:
    bench = "dqn:eval:cpu"
    with session_scope() as session:
        row = Bisection(
            run_id=run_id,
            status="done",
            outcome="culprit",
            good=shas[0],
            bad=shas[-1],
            commits=[{"sha": s} for s in shas],
            benchmarks=[bench],
            config=dict(config),
            provider=provider,
            result={
                "outcome": "culprit",
                "benchmarks": [
                    {"benchmark": bench, "status": "culprit", "culprit": shas[1], "range": []}
                ],
            },
        )
        session.add(row)
        session.flush()
        return row.id


def _rows(bisection_id: int) -> list[tuple[str, str, str, str, bool, str | None]]:
    with session_scope() as session:
        return [
            (r.benchmark, r.before, r.after, r.status, r.culprit, r.reason)
            for r in session.scalars(
                select(BisectionProfile).where(BisectionProfile.bisection_id == bisection_id)
            )
        ]


def _night() -> int:
    return nightly.create_night(night=date(2026, 11, 9), benchmarks=[BenchmarkSpec("dqn", "eval")])


def test_a_build_that_fails_is_stored_as_the_reason_and_the_night_is_filed(
    database_url: str,
    configure,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    configure(bisect_work_dir=tmp_path / "builds")
    shas = _repo(tmp_path / "src")
    run_id = _night()
    spec = {"kind": "checkout", "repo": str(tmp_path / "src"), "install_command": "exit 3"}
    bisection_id = _bisection(run_id, shas, spec)
    assert profile_probe.profile_bisection(bisection_id) == [Step("night.file", (run_id,))]
    [(bench, before, after, status, culprit, reason)] = _rows(bisection_id)
    assert (bench, before, after, status, culprit) == ("dqn:eval:cpu", *shas[:2], "failed", True)
    assert reason is not None and "exit 3" in reason and "\n" not in reason
    assert not (tmp_path / "builds" / str(bisection_id)).exists()  # the builds are removed
    # A second delivery of the task profiles nothing again, and still files the night.
    assert profile_probe.profile_bisection(bisection_id) == [Step("night.file", (run_id,))]
    assert len(_rows(bisection_id)) == 1


def test_benchmarks_given_as_commands_have_no_profile(
    database_url: str,
    configure,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    configure(bisect_work_dir=tmp_path / "builds")
    shas = _repo(tmp_path / "src")
    spec = {"kind": "checkout", "repo": str(tmp_path / "src"), "install_command": "true"}
    bisection_id = _bisection(_night(), shas, spec, measure={"commands": {"x": "echo"}})
    profile_probe.profile_bisection(bisection_id)
    [(*_, status, _, reason)] = _rows(bisection_id)
    assert status == "failed" and reason is not None and "shell commands" in reason


def test_a_task_that_failed_for_good_stores_why_and_files_the_night(
    database_url: str,
    configure,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    shas = _repo(tmp_path / "src")
    run_id = _night()
    spec = {"kind": "checkout", "repo": str(tmp_path / "src"), "install_command": "true"}
    bisection_id = _bisection(run_id, shas, spec)
    steps = profile_probe.give_up(bisection_id, reason="profile task failed: TimeLimitExceeded")
    assert steps == [Step("night.file", (run_id,))]
    [(*_, status, _, reason)] = _rows(bisection_id)
    assert (status, reason) == ("failed", "profile task failed: TimeLimitExceeded")


@pytest.mark.slow
def test_a_real_worker_profiles_both_builds_and_files_the_night(
    celery_workers: WorkerPool,
    configure,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``bisect.profile`` through Redis on a worker process: two checkout builds profiled for
    real (dqn eval, a matmul planted by the harness in both), the answer and its traces stored,
    the run handed to filing."""
    configure(bisect_work_dir=tmp_path / "builds", profile_windows=3)
    monkeypatch.setenv("NIGHTBENCH_SUITE_INJECT_WORK", "dqn:eval=0.2")
    shas = _repo(tmp_path / "src")
    run_id = _night()
    spec = {"kind": "checkout", "repo": str(tmp_path / "src"), "install_command": "true"}
    bisection_id = _bisection(run_id, shas, spec)
    celery_workers.start("cpu", "control", log_dir=tmp_path, name="w0")
    send([Step("bisect.profile", (bisection_id,), "cpu")])

    def run_closed() -> bool:
        with session_scope() as session:
            return session.scalar(select(Run.status).where(Run.id == run_id)) == "complete"

    wait_until(lambda: bool(_rows(bisection_id)), timeout=300, interval=1, what="the profile")
    [(_, before, after, status, culprit, reason)] = _rows(bisection_id)
    assert (before, after, status, culprit, reason) == (*shas[:2], "done", True, None)
    with session_scope() as session:
        row = session.scalar(
            select(BisectionProfile).where(BisectionProfile.bisection_id == bisection_id)
        )
        assert row is not None and row.diff is not None
        # The same code on both sides: nothing above the noise, but every operator compared.
        assert row.diff["rows"] == [] and row.diff["compared"] > 10, row.diff["summary"]
        assert row.diff["total_before"] > 0
        trace = json.loads(gzip.decompress(row.trace_after or b""))
        assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    wait_until(run_closed, timeout=120, interval=1, what="night.file to close the run")
