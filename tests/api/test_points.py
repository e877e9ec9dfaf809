"""The packed history (``series_months``, kept by triggers) equals the results row by row.

Nights go in through the real write paths: ``store_record`` (nightly runs, ORM inserts), the
ingest path (``COPY``), a record stored twice, a night stored after later ones, two runs on one
night, a month boundary, a confirmation run (no history), a record without a median, failed
benchmarks; then results are updated and deleted and a run changes kind. After each step the
packed reader must return exactly what the row-by-row reader returns, for every filter, and the
table must equal a full rebuild from the results.
"""

from __future__ import annotations

import threading
from datetime import date, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, delete, select, text, update
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import normalise_url
from service.models import Result, Run
from service.results import history as hist
from service.results.points import HistoryFilter, Points, packed_points, row_points
from service.results.routes import _payload
from service.results.service import store_record
from service.runs.ingest import create_ingest_run, ingest_records
from service.runs.service import BenchmarkSpec, list_jobs
from tests.api.conftest import add_night, latency_series, make_record

START = date(2026, 1, 20)  # the nights cross into February and March
MODEL = "resnet18"


def _night(i: int) -> date:
    return START + timedelta(days=i)


def _records(i: int, lat: list[list[float]], *, fail: bool = False) -> list[dict[str, Any]]:
    mem = [float(2**30 + (i % 3) * 4096)]
    return [
        make_record(MODEL, "train", {"latency": lat[i], "cpu_peak_mem": mem}),
        make_record(
            MODEL,
            "eval",
            {"latency": lat[i][:5]},
            error="RuntimeError: out of memory" if fail else None,
        ),
    ]


def _assert_same(packed: Points, rows: Points) -> None:
    assert [s.key for s in packed.series] == [s.key for s in rows.series]
    for p, r in zip(packed.series, rows.series, strict=True):
        assert p.night == r.night, p.key
        for name in ("result_id", "run_id", "median", "iqr", "samples"):
            a, b = getattr(p, name), getattr(r, name)
            assert a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=f"{p.key} {name}")  # NaN equals NaN
    assert packed.errors == rows.errors


def _filters(db: Session) -> list[HistoryFilter]:
    key = db.scalar(
        select(Result.series_key)
        .where(Result.model == MODEL, Result.series_key.is_not(None))
        .limit(1)
    )
    machine = db.scalar(select(Result.machine_id).where(Result.model == MODEL).limit(1))
    return [
        HistoryFilter(),
        HistoryFilter(metric="latency"),
        HistoryFilter(mode="eval"),
        HistoryFilter(device="cpu", compiler="eager"),
        HistoryFilter(series=key),
        HistoryFilter(machine=machine),
        HistoryFilter(machine=999999),
        HistoryFilter(until=_night(15)),
        HistoryFilter(until=_night(11), metric="latency"),
        HistoryFilter(until=date(2020, 1, 1)),
    ]


def _table(db: Session) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in db.execute(
            text(
                "SELECT model, series_key, month, mode, device, compiler, metric, machine_id, nights, "
                "points FROM series_months ORDER BY model, series_key, month"
            )
        )
    ]


def _check(db: Session) -> Points:
    """Packed equals row by row for every filter, and the table equals a full rebuild."""
    db.flush()
    for f in _filters(db):
        _assert_same(packed_points(db, model=MODEL, f=f), row_points(db, model=MODEL, f=f))
    kept = _table(db)
    db.execute(text("SELECT series_months_rebuild()"))
    assert _table(db) == kept
    return row_points(db, model=MODEL, f=HistoryFilter())


def _ingest(db: Session, night: date, records: list[dict[str, Any]], key: str) -> Run:
    specs = [BenchmarkSpec(model=r["model"], mode=r["mode"]) for r in records]
    run, _ = create_ingest_run(
        db,
        night=night,
        benchmarks=specs,
        torch_spec="current",
        torch_version="2.13.0",
        torch_git_commit="b" * 40,
        key=key,
    )
    ingest_records(db, run_id=run.id, records=records)
    return run


def test_packed_points_follow_every_write_path(db: Session) -> None:
    lat = latency_series(40, step_at=25, seed=3)
    runs = {}
    for i in range(0, 30):
        if i == 12:
            continue  # stored later, out of order
        runs[i] = add_night(db, _night(i), _records(i, lat, fail=i == 7))
    first = _check(db)
    assert len(first.series) == 3 and len(first.errors) == 1
    assert sum(len(s.night) for s in first.series) == 29 * 3 - 1

    # A night stored after the later ones; then a second nightly run of one night.
    runs[12] = add_night(db, _night(12), _records(12, lat))
    add_night(db, _night(20), _records(20, lat))
    # Stored twice: the second store finds the first and writes nothing.
    job = list_jobs(db, run_id=runs[3].id)[0]
    again = store_record(db, run=runs[3], job=job, record=_records(3, lat)[0])
    assert {r.run_id for r in again} == {runs[3].id}
    # A confirmation re-run is no history; a record posted without a median is.
    confirm = add_night(db, _night(21), _records(21, lat), kind="confirm")
    no_median = _records(30, lat)
    no_median[0]["metrics"][0]["median"] = None
    add_night(db, _night(30), no_median)
    # The ingest path (COPY), on a night of its own and on a night nightly runs hold too.
    _ingest(db, _night(31), _records(31, lat), key="k31")
    _ingest(db, _night(29), _records(29, lat, fail=True), key="k29")
    after = _check(db)
    train = [s for s in after.series if len(s.night) > 30]
    assert train and all(s.night == sorted(s.night) for s in after.series)
    assert not any(np.isin(confirm.id, s.run_id) for s in after.series)
    assert _night(31) in after.series[0].night
    assert len(after.errors) == 2
    assert (
        np.isnan(after.series[0].median).sum()
        + np.isnan(after.series[1].median).sum()
        + np.isnan(after.series[2].median).sum()
        == 1
    )

    # Results edited, deleted one by one and with their run; a run that changes kind.
    db.execute(update(Result).where(Result.run_id == runs[5].id).values(median=123.0))
    db.execute(delete(Result).where(Result.run_id == runs[6].id, Result.mode == "train"))
    db.execute(delete(Run).where(Run.id == runs[8].id))
    db.execute(update(Run).where(Run.id == runs[9].id).values(kind="confirm"))
    edited = _check(db)
    assert sum(len(s.night) for s in edited.series) == sum(len(s.night) for s in after.series) - 8
    db.execute(update(Run).where(Run.id == runs[9].id).values(kind="nightly"))
    _check(db)


def test_history_response_is_the_same_packed_or_row_by_row(
    db: Session,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lat = latency_series(45, step_at=30, seed=5)
    for i in range(45):
        add_night(db, _night(i), _records(i, lat, fail=i == 40), torch_version=f"2.13.0.dev{i:02d}")
    settings = Settings()
    for f in (HistoryFilter(), HistoryFilter(since=_night(20)), HistoryFilter(until=_night(33))):
        packed = _payload(hist.model_history(db, model=MODEL, filters=f, settings=settings), {}, {})
        with monkeypatch.context() as m:
            m.setattr(hist, "read_points", row_points)
            rows = _payload(
                hist.model_history(db, model=MODEL, filters=f, settings=settings), {}, {}
            )
        assert packed["series"] and _plain(packed) == _plain(rows)


def _plain(value: Any) -> Any:
    """Arrays as lists (NaN as None), for comparing two payloads with ``==``."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, float) and value != value:
        return None
    return value


def test_concurrent_writers_of_one_month_both_land(database_url: str) -> None:
    """Two transactions store the same series' month at once: the second waits for the first
    and rebuilds the month with its rows, so neither is lost."""
    engine = create_engine(normalise_url(database_url))
    lat = latency_series(4, seed=9)
    try:
        with Session(engine) as s:
            add_night(s, _night(0), _records(0, lat))
            s.commit()
        first = Session(engine)
        add_night(first, _night(1), _records(1, lat))  # holds the month, not committed

        def second() -> None:
            with Session(engine) as s:
                add_night(s, _night(2), _records(2, lat))
                s.commit()

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive()  # waiting for the first writer's month
        first.commit()
        first.close()
        thread.join(timeout=30)
        assert not thread.is_alive()
        with Session(engine) as s:
            points = packed_points(s, model=MODEL, f=HistoryFilter())
            _assert_same(points, row_points(s, model=MODEL, f=HistoryFilter()))
            assert [len(p.night) for p in points.series] == [3, 3, 3]
    finally:
        engine.dispose()
