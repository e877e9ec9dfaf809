"""``GET /api/status``: last night per machine class, open and overdue runs, workers, problems."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import BenchmarkStability, Job, Result
from service.runs.service import BenchmarkSpec, create_run
from service.status.service import system_status
from tests.api.conftest import add_night, make_record, night


def test_status_tells_what_is_late_and_who_works(client: TestClient, db: Session) -> None:
    now = datetime(2026, 1, 10, 12, tzinfo=UTC)
    add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0, 3.1]})])
    add_night(db, night(8), [make_record("dcgan", "eval", {"latency": [3.0, 3.1]})])
    gpu = add_night(db, night(3), [make_record("dcgan", "eval", {"latency": [1.0]}, device="cuda")])
    db.execute(Job.__table__.update().where(Job.run_id == gpu.id).values(queue="gpu.h100"))
    late = create_run(
        db,
        night=night(9),
        benchmarks=[
            BenchmarkSpec(model="dcgan", mode="eval"),
            BenchmarkSpec(model="dcgan", mode="train"),
        ],
    )
    late.deadline_at = now - timedelta(hours=2)
    late.created_at = now - timedelta(hours=8)
    running = db.scalars(select(Job).where(Job.run_id == late.id).order_by(Job.id)).first()
    running.status, running.worker = "running", "w0@gpu-07"
    running.started_at = now - timedelta(minutes=20)
    db.flush()

    status = system_status(db, now=now)
    classes = {c.queue: c for c in status.machine_classes}
    assert (classes["cpu"].last_night, classes["cpu"].nights_behind) == (night(8), 1)
    assert (classes["gpu.h100"].last_night, classes["gpu.h100"].nights_behind) == (night(3), 6)
    (run,) = [r for r in status.open_runs if r.id == late.id]
    assert run.overdue and run.jobs_pending == 2 and run.age_s == 8 * 3600
    assert [(w.worker, w.jobs) for w in status.workers] == [("w0@gpu-07", 1)]
    assert (
        f"run {late.id} (nightly, night {night(9)}) is past its deadline by 2.0 h with 2 "
        "job(s) not reported" in status.problems
    )
    assert (
        f"machine class gpu.h100 last measured night {night(3)} (6 nights ago)" in status.problems
    )
    assert not any("machine class cpu" in p for p in status.problems)  # measured last night

    body = client.get("/api/status").json()  # judged by the real clock: all of it is old
    assert {c["queue"] for c in body["machine_classes"]} == {"cpu", "gpu.h100"}
    assert any(r["id"] == late.id and r["overdue"] for r in body["open_runs"])
    assert any(p.startswith(f"run {late.id} ") for p in body["problems"])


def test_a_quiet_system_has_no_problems(db: Session) -> None:
    add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0]})])
    now = datetime.combine(night(1), datetime.min.time(), tzinfo=UTC)
    status = system_status(db, now=now)
    assert status.problems == [] and status.workers == []


def test_status_tells_a_benchmark_failing_night_after_night(
    client: TestClient, db: Session
) -> None:
    # dcgan eval fails on nights 2 and 4 (night 3 it was not measured), after two good
    # nights; dcgan train failed once, on night 2, and came back on night 3: only eval is told.
    boom = (
        'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: CUDA error: '
        "an illegal memory access was encountered\n"
    )
    ok = {"latency": [3.0, 3.1]}
    for i in (0, 1):
        add_night(
            db, night(i), [make_record("dcgan", "eval", ok), make_record("dcgan", "train", ok)]
        )
    add_night(
        db,
        night(2),
        [
            make_record("dcgan", "eval", {}, error=boom),
            make_record("dcgan", "train", {}, error="ValueError: once"),
        ],
    )
    add_night(db, night(3), [make_record("dcgan", "train", ok)])
    add_night(
        db,
        night(4),
        [make_record("dcgan", "eval", {}, error=boom), make_record("dcgan", "train", ok)],
    )
    now = datetime.combine(night(5), datetime.min.time(), tzinfo=UTC)
    status = system_status(db, now=now)
    assert [(f.benchmark, f.queue, f.nights, f.since) for f in status.failing] == [
        ("dcgan:eval:cpu", "cpu", 2, night(2))
    ]
    assert (
        status.failing[0].error == "RuntimeError: CUDA error: an illegal memory access was "
        "encountered"
    )
    told = [p for p in status.problems if p.startswith("benchmark ")]
    assert told == [
        f"benchmark dcgan:eval:cpu on cpu has failed 2 nights in a row (since "
        f"{night(2)}): {status.failing[0].error}; its series has no point since, so "
        "a regression there goes unseen"
    ]
    # Measured again, it is no longer a problem.
    add_night(db, night(5), [make_record("dcgan", "eval", ok)])
    assert system_status(db, now=now + timedelta(days=1)).failing == []
    body = client.get("/api/status").json()
    assert "failing" in body


def test_status_lists_failing_filings_and_counts_the_queues(
    client: TestClient, db: Session
) -> None:
    import redis

    from service.models import Alert, FilingState
    from service.queues import QUEUE_NAMES
    from service.status.broker import queue_lengths

    run = add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0]})])
    since = datetime.now(UTC) - timedelta(hours=3)
    alert = Alert(
        run_id=run.id,
        kind="regression",
        status="open",
        filing_state=FilingState.FAILED_RETRYING,
        filing_attempts=2,
        filing_error="GitHub rejected the token (401)",
        filing_pending_since=since,
        filing_next_at=since + timedelta(hours=4),
    )
    db.add(alert)
    db.flush()

    body = client.get("/api/status").json()
    [pending] = body["pending_filings"]
    assert (pending["alert_id"], pending["state"], pending["attempts"]) == (
        alert.id,
        "failed_retrying",
        2,
    )
    assert pending["last_error"] == "GitHub rejected the token (401)"
    assert 3 * 3600 <= pending["age_s"] < 3 * 3600 + 60
    assert any(p.startswith(f"alert {alert.id} (run {run.id}") for p in body["problems"])
    assert body["queues"] is None  # no broker configured

    prefix = f"nightbench-status-test-{id(alert)}:"
    client_redis = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client_redis.rpush(f"{prefix}cpu", "a", "b")
        client_redis.rpush(f"{prefix}gpu.h100", "c")
        counts = queue_lengths("redis://127.0.0.1:6379/0", prefix=prefix)
    finally:
        client_redis.delete(f"{prefix}cpu", f"{prefix}gpu.h100")
    assert counts == {name: {"cpu": 2, "gpu.h100": 1}.get(name, 0) for name in QUEUE_NAMES}
    assert queue_lengths(None) is None
    down = system_status(db, broker_url="redis://127.0.0.1:1/0")
    assert down.queues is None
    assert any("could not read the queues" in p for p in down.problems)


def test_status_lists_the_benchmarks_marked_unstable_and_their_bars(
    client: TestClient,
    db: Session,
) -> None:
    run = add_night(
        db,
        night(0),
        [
            make_record("dcgan", "eval", {"latency": [3.0]}),
            make_record("dcgan", "train", {"latency": [9.0]}),
        ],
    )
    machine = db.scalar(select(Result.machine_id).where(Result.run_id == run.id))
    for mode, unstable, spread in (("eval", True, 0.12), ("train", False, 0.02)):
        db.add(
            BenchmarkStability(
                model="dcgan",
                mode=mode,
                device="cpu",
                compiler="eager",
                machine_id=machine,
                repeats=5,
                medians_ms=[1.0] * 5,
                cv=0.01,
                spread=spread,
                unstable=unstable,
                threshold=0.07,
            )
        )
    db.flush()
    body = client.get("/api/status").json()
    assert body["judged"] == 2
    assert [(u["benchmark"], u["spread"]) for u in body["unstable"]] == [("dcgan:eval:cpu", 0.12)]
    assert body["unstable"][0]["alerts_from"] == pytest.approx(0.36)


def test_status_tells_a_bisection_running_for_over_a_day(client: TestClient, db: Session) -> None:
    from service.models import Bisection, Probe

    now = datetime(2026, 11, 20, 12, tzinfo=UTC)
    run = add_night(db, night(0), [make_record("dcgan", "eval", {"latency": [3.0]})])
    stuck = Bisection(
        status="running",
        good="a" * 40,
        bad="b" * 40,
        benchmarks=["dcgan:eval:cpu"],
        config={"kind": "failure"},
        queue="gpu.h100",
        created_at=now - timedelta(hours=30),
    )
    fresh = Bisection(
        status="running",
        good="a" * 40,
        bad="c" * 40,
        run_id=run.id,
        benchmarks=["dcgan:eval:cpu"],
        config={"search": {}},
        queue="cpu",
        created_at=now - timedelta(hours=2),
    )
    db.add_all([stuck, fresh])
    db.flush()
    db.add_all(
        [
            Probe(
                bisection_id=stuck.id,
                round=r,
                sha=sha,
                index=i,
                purpose="search",
                benchmarks=["dcgan:eval:cpu"],
                samples_wanted=2,
                status=status,
            )
            for r, sha, i, status in (
                (0, "a" * 40, 0, "done"),
                (0, "b" * 40, 4, "done"),
                (1, "d" * 40, 2, "queued"),
            )
        ]
    )
    db.flush()
    status = system_status(db, now=now)
    assert [
        (b.id, b.search, b.rounds, b.probes_waiting, round(b.age_s / 3600))
        for b in status.bisections
    ] == [(stuck.id, "failure", 2, 1, 30), (fresh.id, "latency", 0, 0, 2)]
    (line,) = [p for p in status.problems if p.startswith("bisection ")]
    assert line.startswith(
        f"bisection {stuck.id} (failure: dcgan:eval:cpu) has run 30.0 h, 2 "
        "round(s); 1 probe(s) wait on `gpu.h100`"
    )
    assert f"nightbench bisect-resume {stuck.id}" in line
    assert line.endswith("its issue is told the culprit when it ends")
    body = client.get("/api/status").json()
    assert {b["id"]: b["search"] for b in body["bisections"]} == {
        stuck.id: "failure",
        fresh.id: "latency",
    }


def test_status_names_a_stuck_a_b_and_a_report_github_refuses(
    client: TestClient, db: Session
) -> None:
    from service.models import ABTest

    now = datetime.now(UTC)
    old = now - timedelta(hours=3)
    stuck = ABTest(
        status="queued",
        pr_number=5,
        base_sha="a" * 40,
        head_sha="b" * 40,
        options={"queue": "gpu.a100"},
        rows=[],
        profiles={},
        report_state="pending",
        created_at=old,
    )
    local = ABTest(
        status="running",
        base_sha="a" * 40,
        head_sha="b" * 40,
        options={"queue": "local"},
        rows=[],
        profiles={},
        report_state="none",
        created_at=old,
    )
    fresh = ABTest(
        status="running",
        pr_number=6,
        base_sha="a" * 40,
        head_sha="b" * 40,
        options={"queue": "cpu"},
        rows=[],
        profiles={},
        report_state="pending",
        created_at=now,
    )
    refused = ABTest(
        status="done",
        pr_number=7,
        base_sha="a" * 40,
        head_sha="b" * 40,
        options={},
        rows=[],
        profiles={},
        report_state="failed_retrying",
        report_attempts=2,
        report_error="GitHub rejected the token (401)",
        next_report_at=now + timedelta(hours=1),
    )
    db.add_all([stuck, local, fresh, refused])
    db.flush()

    problems = client.get("/api/status").json()["problems"]
    ab_lines = [p for p in problems if p.startswith("A/B ")]
    assert len(ab_lines) == 2, ab_lines
    assert ab_lines[0].startswith(f"A/B {stuck.id} (PR #5) has been queued for 3.0 h")
    assert "queue (gpu.a100)" in ab_lines[0]
    assert ab_lines[1].startswith(f"A/B {refused.id}: reporting on PR #7 failed 2 time(s)")
    assert "GitHub rejected the token (401)" in ab_lines[1]
