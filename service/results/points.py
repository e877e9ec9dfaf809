"""A model's points, series by series: the queries behind a history.

Two readers give the same answer (:class:`Points`):

* :func:`packed_points` (Postgres): the model's ``series_months`` rows, primary-key order (model,
  series, month), each a run of 40-byte records decoded by numpy in one call per series; a
  full history (12 series x 1,096 nights) is 12 x 36 rows instead of 13,152. The errors come
  from ``ix_results_history`` (``series_key IS NULL``).
* :func:`row_points` (any database): one row per result, from one index-only scan of
  ``ix_results_history`` (model, series_key, night, run_id, including every other column
  read or filtered on).

Both follow the same rules: results of nightly and ingest runs only; a series' points in
(night, run_id) order and series by key; errors (results without a series) by (night, run_id,
result id). Postgres keeps ``series_months`` equal to the results by triggers (migration
0002), and the tests compare both readers after storing nights through every write path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import date, timedelta
from functools import lru_cache
from typing import Any

import numpy as np
from sqlalchemy import Select, and_, bindparam, select
from sqlalchemy.orm import Session

from service.models import POINT_BYTES, POINT_FIELDS, Result, Run, RunKind, SeriesMonth

HISTORY_KINDS = (RunKind.NIGHTLY, RunKind.INGEST)
_POINT = np.dtype(list(POINT_FIELDS))
assert _POINT.itemsize == POINT_BYTES
_EPOCH = date(2000, 1, 1)  # a packed night counts days from it (Postgres' own date epoch)


@dataclass(frozen=True)
class HistoryFilter:
    """Which series of a model to return; None means any."""

    metric: str | None = None
    mode: str | None = None
    device: str | None = None
    compiler: str | None = None
    machine: int | None = None
    series: str | None = None
    since: date | None = None
    until: date | None = None


@dataclass(frozen=True)
class SeriesPoints:
    """One series' points, oldest first; every column has shape (n,).

    ``result_id``/``run_id`` int64; ``night`` dates; ``median``/``iqr`` float64 in the series'
    unit, NaN where none was stored; ``samples`` int64, 0 where none was counted.
    """

    key: str
    result_id: np.ndarray
    run_id: np.ndarray
    night: list[date]
    median: np.ndarray
    iqr: np.ndarray
    samples: np.ndarray


@dataclass(frozen=True)
class ErrorRow:
    """A result without samples: the benchmark failed that night."""

    result_id: int
    run_id: int
    night: date
    error: str


@dataclass(frozen=True)
class Points:
    """A model's history as the charts read it: points per series, and the failed nights."""

    series: list[SeriesPoints]
    errors: list[ErrorRow]


def model_exists(session: Session, model: str) -> bool:
    """Whether any result of ``model`` is stored."""
    return session.scalar(select(Result.id).where(Result.model == model).limit(1)) is not None


def read_points(session: Session, *, model: str, f: HistoryFilter) -> Points:
    """The model's points matching ``f`` (``f.since`` aside: the caller needs earlier nights
    for the baselines); packed on Postgres, row by row elsewhere."""
    if session.connection().dialect.name == "postgresql":
        return packed_points(session, model=model, f=f)
    return row_points(session, model=model, f=f)


# --------------------------------------------------------------------------------------------
# Row by row


_FILTER_COLUMNS = (
    ("metric", Result.metric),
    ("mode", Result.mode),
    ("device", Result.device),
    ("compiler", Result.compiler),
    ("machine", Result.machine_id),
    ("series", Result.series_key),
)


def _other_runs() -> Any:
    # Plain comparisons rather than IN lists: the statement compiles once, with no expanding
    # parameters to render per call.
    return (
        select(Run.id).where(and_(*(Run.kind != kind for kind in HISTORY_KINDS))).scalar_subquery()
    )


@lru_cache(maxsize=128)
def _history_select(shape: tuple[str, ...]) -> Select:  # type: ignore[type-arg]
    stmt = (
        select(
            Result.id,
            Result.run_id,
            Result.night,
            Result.series_key,
            Result.median,
            Result.iqr,
            Result.sample_count,
            Result.error,
        )
        .where(Result.model == bindparam("model"), Result.run_id.not_in(_other_runs()))
        .order_by(Result.series_key, Result.night, Result.run_id)
    )
    return _filtered(stmt, shape)


def _filtered(
    stmt: Select,  # type: ignore[type-arg]
    shape: tuple[str, ...],
    columns: Any = _FILTER_COLUMNS,
    night: Any = Result.night,
) -> Select:  # type: ignore[type-arg]
    """``stmt`` with a bound equality for each filter of ``columns`` named in ``shape``, and
    ``night <= :until`` when ``until`` is."""
    for name, column in columns:
        if name in shape:
            stmt = stmt.where(column == bindparam(name))
    if "until" in shape:
        stmt = stmt.where(night <= bindparam("until"))
    return stmt


def _params(model: str, f: HistoryFilter) -> dict[str, Any]:
    params: dict[str, Any] = {"model": model}
    for name, _ in _FILTER_COLUMNS:
        value = getattr(f, name)
        if value is not None:
            params[name] = value
    if f.until is not None:
        params["until"] = f.until
    return params


def _shape(params: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(k for k in params if k != "model"))


def history_statement(model: str, f: HistoryFilter) -> tuple[Select, dict[str, Any]]:  # type: ignore[type-arg]
    """The row-by-row query of a model's history and its parameters, in index order.

    ``ix_results_history`` (model, series_key, night, run_id, including every other column read
    or filtered on) makes it one index-only scan with no sort; runs of other kinds drop out by
    a hashed ``NOT IN``. The statement is built once per combination of filters; the values
    travel as parameters.
    """
    params = _params(model, f)
    return _history_select(_shape(params)), params


def row_points(session: Session, *, model: str, f: HistoryFilter) -> Points:
    """The model's points from one row per result (:func:`history_statement`)."""
    stmt, values = history_statement(model, f)
    rows = fetch(session, stmt, values)
    if not rows:
        return Points([], [])
    ids_t, runs_t, nights_t, keys_t, medians_t, iqrs_t, counts_t, errs_t = zip(*rows, strict=True)
    ids = np.array(ids_t, dtype=np.int64)
    run_ids = np.array(runs_t, dtype=np.int64)
    medians = np.array(medians_t, dtype=float)  # None -> NaN
    iqrs = np.array(iqrs_t, dtype=float)
    counts = np.nan_to_num(np.array(counts_t, dtype=float)).astype(np.int64)
    nights = list(nights_t)
    keys = np.array(keys_t, dtype=object)
    # Stretches of equal series_key (rows come ordered by it); errors carry no key.
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    bounds = [(int(a), int(b)) for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(rows)], strict=True)]
    errors = [
        ErrorRow(int(ids[k]), int(run_ids[k]), nights[k], errs_t[k])
        for a, b in bounds
        if keys[a] is None
        for k in range(a, b)
        if errs_t[k] is not None
    ]
    errors.sort(key=lambda e: (e.night, e.run_id, e.result_id))
    series = [
        SeriesPoints(
            key=str(keys[a]),
            result_id=ids[a:b],
            run_id=run_ids[a:b],
            night=nights[a:b],
            median=medians[a:b].copy(),
            iqr=iqrs[a:b],
            samples=counts[a:b],
        )
        for a, b in bounds
        if keys[a] is not None
    ]
    return Points(series, errors)


# --------------------------------------------------------------------------------------------
# Packed by month


_MONTH_COLUMNS = (
    ("metric", SeriesMonth.metric),
    ("mode", SeriesMonth.mode),
    ("device", SeriesMonth.device),
    ("compiler", SeriesMonth.compiler),
    ("machine", SeriesMonth.machine_id),
    ("series", SeriesMonth.series_key),
)


@lru_cache(maxsize=128)
def _months_select(shape: tuple[str, ...]) -> Select:  # type: ignore[type-arg]
    stmt = (
        select(SeriesMonth.series_key, SeriesMonth.points)
        .where(SeriesMonth.model == bindparam("model"))
        .order_by(SeriesMonth.series_key, SeriesMonth.month)
    )
    return _filtered(stmt, shape, _MONTH_COLUMNS, SeriesMonth.month)


@lru_cache(maxsize=128)
def _errors_select(shape: tuple[str, ...]) -> Select:  # type: ignore[type-arg]
    stmt = (
        select(Result.id, Result.run_id, Result.night, Result.error)
        .where(
            Result.model == bindparam("model"),
            Result.series_key.is_(None),
            Result.error.is_not(None),
            Result.run_id.not_in(_other_runs()),
        )
        .order_by(Result.night, Result.run_id, Result.id)
    )
    return _filtered(stmt, shape)


def packed_statements(model: str, f: HistoryFilter) -> tuple[Select, Select, dict[str, Any]]:  # type: ignore[type-arg]
    """The queries of :func:`packed_points` (months, errors) and their parameters."""
    params = _params(model, f)
    shape = _shape(params)
    return _months_select(shape), _errors_select(shape), params


def packed_points(session: Session, *, model: str, f: HistoryFilter) -> Points:
    """The model's points from ``series_months`` (Postgres), errors from ``results``."""
    months, errors_stmt, values = packed_statements(model, f)
    series = [
        (key, np.frombuffer(b"".join(chunk for _, chunk in rows), _POINT))
        for key, rows in itertools.groupby(fetch(session, months, values), key=lambda row: row[0])
    ]
    if f.until is not None:
        last = (f.until - _EPOCH).days
        series = [(key, p[p["night"] <= last]) for key, p in series]
        series = [(key, p) for key, p in series if len(p)]
    errors = [ErrorRow(*row) for row in fetch(session, errors_stmt, values)]
    nights = _dates([p["night"] for _, p in series])
    return Points(
        [
            SeriesPoints(
                key=key,
                result_id=p["result_id"].astype(np.int64),
                run_id=p["run_id"].astype(np.int64),
                night=night,
                median=p["median"].astype(np.float64),
                iqr=p["iqr"].astype(np.float64),
                samples=p["samples"].astype(np.int64),
            )
            for (key, p), night in zip(series, nights, strict=True)
        ],
        errors,
    )


def _dates(days: list[np.ndarray]) -> list[list[date]]:
    """Days since 2000-01-01 (one array per series) as dates, each distinct night made once."""
    if not days:
        return []
    unique, where = np.unique(np.concatenate(days), return_inverse=True)
    table = np.array([_EPOCH + timedelta(days=d) for d in unique.tolist()], dtype=object)
    cuts = np.cumsum([len(d) for d in days])[:-1]
    return [part.tolist() for part in np.split(table[where], cuts)]


# --------------------------------------------------------------------------------------------
# Fetching


# id(statement) -> (statement, compiled); statements are module-level or lru-cached, so they
# live as long as the process.
_COMPILED: dict[int, tuple[Any, Any]] = {}


def history_sql(dialect: Any, stmt: Select, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:  # type: ignore[type-arg]
    """Text and parameters of a module-level or cached statement for ``dialect`` (compiled
    once per statement; it must hold no expanding ``IN`` parameter)."""
    hit = _COMPILED.get(id(stmt))
    if hit is None or hit[0] is not stmt:
        hit = _COMPILED[id(stmt)] = (stmt, stmt.compile(dialect=dialect))
    compiled = hit[1]
    return str(compiled), dict(compiled.construct_params(params))


def fetch(session: Session, stmt: Select, params: dict[str, Any]) -> list[tuple[Any, ...]]:  # type: ignore[type-arg]
    """All rows of ``stmt`` with ``params``; on Postgres through a binary-format cursor.

    Many rows cost more in parsing than in the database: psycopg's binary format hands over
    numbers, dates and bytes without text parsing, and the statement's text is compiled once.
    """
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        return [tuple(row) for row in conn.execute(stmt, params)]
    sql, values = history_sql(conn.dialect, stmt, params)
    driver = conn.connection.driver_connection
    assert driver is not None
    with driver.cursor(binary=True) as cur:
        cur.execute(sql, values)
        return cur.fetchall()
