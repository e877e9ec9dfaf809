"""The deadline sweep over a posted run with skipped benchmarks: they are not marked missing, no
missing-data alert or issue names them, and a run whose other benchmarks all reported finishes
complete (embedded: the sweep's steps run here, on a committed database)."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

from sqlalchemy import select

from service.db import session_scope
from service.models import Alert, Run
from service.models.base import utcnow
from service.runs import ingest
from service.runs.service import BenchmarkSpec, list_jobs
from tests.api.conftest import make_record
from workers.issues.reports.missing import missing_reports
from workers.night import deadline

NO_IMPORT = "No module named 'torch_geometric' (missing framework library)"
SPECS = [
    BenchmarkSpec(model="dcgan", mode="eval", queue="ingest"),
    BenchmarkSpec(model="schnet", mode="eval", queue="ingest"),
    BenchmarkSpec(model="schnet", mode="train", queue="ingest"),
]


def _posted(key: str, *, skip: list[str], post: list[str]) -> int:
    """An ingest run of ``SPECS`` with a deadline, ``skip`` (benchmark names) withdrawn and
    ``post`` reported; committed."""
    with session_scope() as session:
        run, _ = ingest.create_ingest_run(
            session,
            night=date(2026, 11, 14),
            benchmarks=SPECS,
            torch_spec="ingest",
            torch_version=None,
            torch_git_commit=None,
            key=key,
            deadline_s=3600,
        )
        by_name = {s.name: s for s in SPECS}
        ingest.skip_benchmarks(
            session,
            run_id=run.id,
            skips=[
                ingest.Skip(
                    model=by_name[n].model,
                    mode=by_name[n].mode,
                    device="cpu",
                    compiler="eager",
                    reason=NO_IMPORT,
                )
                for n in skip
            ],
        )
        records = [
            make_record(by_name[n].model, by_name[n].mode, {"latency": [3.0, 3.1, 2.9]})
            for n in post
        ]
        if records:
            ingest.ingest_records(session, run_id=run.id, records=records)
        return run.id


def test_the_sweep_marks_only_unreported_benchmarks_missing(
    database_url: str, tmp_path: Path
) -> None:
    run_id = _posted("partly", skip=["schnet:train:cpu"], post=["dcgan:eval:cpu"])
    deadline.sweep_deadlines(now=utcnow() + timedelta(hours=2))
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "incomplete"
        assert {j.benchmark: j.status for j in list_jobs(session, run_id=run_id)} == {
            "dcgan:eval:cpu": "done",
            "schnet:eval:cpu": "missing",
            "schnet:train:cpu": "skipped",
        }
        (alert,) = session.scalars(select(Alert).where(Alert.run_id == run_id))
        assert "schnet:eval:cpu" in alert.summary and "schnet:train:cpu" not in alert.summary
        (report,) = missing_reports(session, run=run)
        assert [j.benchmark for j in report.jobs] == ["schnet:eval:cpu"]
    issues = [p.read_text() for p in (tmp_path / "nightbench" / "outbox").glob("issue-*.md")]
    (text,) = [t for t in issues if "missing-data" in t]
    assert "schnet:eval:cpu" in text and "schnet:train:cpu" not in text


def test_a_run_of_reported_and_skipped_benchmarks_completes_without_an_alert(
    database_url: str, tmp_path: Path
) -> None:
    run_id = _posted(
        "all-in", skip=["schnet:eval:cpu", "schnet:train:cpu"], post=["dcgan:eval:cpu"]
    )
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "detecting"
    # Detection runs on the sweep before the deadline; past it there is nothing left to mark.
    assert deadline.sweep_deadlines() == [run_id]
    deadline.sweep_deadlines(now=utcnow() + timedelta(hours=2))
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == "complete"
        assert list(session.scalars(select(Alert).where(Alert.kind == "missing_data"))) == []
        done = ingest.completeness(session, run_id=run_id)
        assert done.complete and [s.reason for s in done.skipped] == [NO_IMPORT, NO_IMPORT]
    issues = [p.read_text() for p in (tmp_path / "nightbench" / "outbox").glob("issue-*.md")]
    assert not any("missing-data" in text for text in issues)
