"""A model's history: every series with its baseline at each night and its flags.

The points come from :mod:`service.results.points` (on Postgres the ``series_months`` table:
each series packed by month, a few hundred rows for three years; elsewhere one index-only scan
of ``ix_results_history``); the baseline track of every series is then computed at once with
numpy, following the detector's rule (``service/regressions/detection.py``: the median of the
levels of up to ``window`` earlier nights since the last reset, ``min_baseline`` nights at
least; the band is the baseline ± 2 night-to-night noise on the log scale, the noise being the
scaled median absolute successive difference of the window). The flags come from what the
nightly detector stored
(:class:`~service.models.Regression` rows): replaying the online detector over three years of
every series at each request costs about 70 ms for 12 series (``detect_series``) and grows as
n² with ``assess_night`` night by night, while the stored verdicts are what maintainers triage.
Resets happen where the detector resets: at a night marked ``expected`` and after a raised step.

Shapes: a series holds parallel columns (numpy arrays, or lists for text and dates), one entry
per night (a result), oldest first; NaN marks a missing value in a float column.
"""

from __future__ import annotations

import bisect
import gc
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.lib.stride_tricks import sliding_window_view
from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import NotFound
from service.models import Machine, Regression, Result, Run
from service.regressions.detection import MEMORY_METRICS, METRICS, DetectorParams
from service.results.points import (
    HISTORY_KINDS,
    HistoryFilter,
    fetch,
    model_exists,
    read_points,
)

_METRIC_ORDER = {"latency": 0, "gpu_peak_mem": 1, "cpu_peak_mem": 2}
DEFAULT_PARAMS = DetectorParams()
_MAD_TO_SD = 1.4826  # MAD -> standard deviation for normal noise (Rousseeuw & Croux, 1993)
# Suite model metadata, read as data (service never imports the suite package).
_SUITE_MODELS = Path(__file__).resolve().parents[2] / "suite" / "models"


def _empty_float() -> np.ndarray:
    return np.zeros(0)


def _empty_bool() -> np.ndarray:
    return np.zeros(0, dtype=bool)


def _empty_int() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class SeriesHistory:
    """One series: its identity and its nights (parallel columns, oldest first).

    Units: ``median``, ``iqr``, ``baseline*`` in the series' ``unit`` (ms or bytes); ``change``
    relative (0.12 = +12%); ``samples`` a count. Float columns hold NaN where there is no
    value (no IQR stored, no baseline yet).
    """

    key: str
    mode: str
    device: str
    compiler: str
    metric: str
    unit: str
    batch_size: int | None
    benchmark_version: str | None
    machine_id: int | None
    threshold: float
    result_id: np.ndarray = field(default_factory=_empty_int)
    run_id: np.ndarray = field(default_factory=_empty_int)
    night: list[date] = field(default_factory=list)
    torch_version: list[str | None] = field(default_factory=list)
    torch_git_commit: list[str | None] = field(default_factory=list)
    median: np.ndarray = field(default_factory=_empty_float)
    iqr: np.ndarray = field(default_factory=_empty_float)
    samples: np.ndarray = field(default_factory=_empty_int)
    baseline: np.ndarray = field(default_factory=_empty_float)
    baseline_lower: np.ndarray = field(default_factory=_empty_float)
    baseline_upper: np.ndarray = field(default_factory=_empty_float)
    change: np.ndarray = field(default_factory=_empty_float)
    regression: np.ndarray = field(default_factory=_empty_bool)
    improvement: np.ndarray = field(default_factory=_empty_bool)
    outlier: np.ndarray = field(default_factory=_empty_bool)
    expected: np.ndarray = field(default_factory=_empty_bool)
    regression_id: list[int | None] = field(default_factory=list)

    @property
    def benchmark(self) -> str:
        name = f"{self.mode}:{self.device}"
        return name if self.compiler == "eager" else f"{name}:{self.compiler}"

    def __len__(self) -> int:
        return len(self.night)


@dataclass(frozen=True)
class ErrorPoint:
    """A night on which a benchmark of the model failed (no samples)."""

    night: date
    run_id: int
    result_id: int
    mode: str
    device: str
    compiler: str
    error: str


@dataclass
class ModelHistory:
    model: str
    series: list[SeriesHistory]
    errors: list[ErrorPoint]
    machines: dict[int, Machine]


# --------------------------------------------------------------------------------------------
# Baseline track (pure)


@dataclass(frozen=True)
class BaselineTrack:
    """Per night of one series: baseline and band (NaN where there is none). Shapes (n,).

    ``baseline`` is in the series' unit (the median of the window's levels, exact bytes for
    memory); ``lower``/``upper`` are the baseline ± 2 noise on the detector's log scale;
    ``noise`` is in log units.
    """

    baseline: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    noise: np.ndarray


@dataclass(frozen=True)
class SeriesLevels:
    """Input of :func:`baseline_tracks` for one series.

    Attributes:
        levels: night levels (median of each night's samples), oldest first, shape (n,);
            ms (> 0) or bytes (>= 0).
        memory: peak memory (log1p scale, no noise floor) rather than latency (log scale).
        resets: ``(index, effective_from)`` pairs: the baseline restarts at night ``index``
            for every night ``j >= effective_from``. A night ``i`` marked ``expected`` is
            ``(i, i)``; a step first seen at ``i`` and raised that night is ``(i, i + 1)``.
    """

    levels: Sequence[float] | np.ndarray
    memory: bool
    resets: Sequence[tuple[int, int]] = ()


def _segment_starts(n: int, resets: Sequence[tuple[int, int]]) -> np.ndarray:
    start = np.zeros(n, dtype=int)
    for index, effective in resets:
        if 0 <= effective < n:
            start[effective:] = np.maximum(start[effective:], index)
    return start


def _prev_window_mids(
    segments: Sequence[np.ndarray], w: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every position j of every segment: the two middle order statistics of the window
    ``segment[max(0, j - w):j]`` and its size ``k = min(j, w)``.

    Their mean is the window's median (equal to ``np.median``; for ``k = 0`` they are NaN).
    All windows of all segments are gathered into one (positions, w) array and sorted at once:
    each segment is preceded by ``w`` NaNs, which sort last, so the first ``k`` entries of a
    sorted window are its values. Medians of log levels and of levels share their order
    statistics, so one pass serves both.

    Returns:
        ``(lo, hi, k)`` for the segments' positions one after the other, shape (sum of lengths,).
    """
    lengths = np.array([len(seg) for seg in segments], dtype=np.int64)
    gap = np.full(w, np.nan, dtype=segments[0].dtype if segments else float)
    padded = np.concatenate([gap] + [part for seg in segments for part in (seg, gap)])
    # Position j of segment i sits at padded index starts[i] + w + j; its window starts at
    # starts[i] + j.
    starts = np.concatenate([[0], np.cumsum(lengths + w)[:-1]]) if len(lengths) else lengths
    j = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    windows = np.sort(sliding_window_view(padded, w)[np.repeat(starts, lengths) + j], axis=-1)
    k = np.minimum(j, w)
    lo = np.take_along_axis(windows, np.maximum((k - 1) // 2, 0)[:, None], axis=-1)[:, 0]
    hi = np.take_along_axis(windows, np.minimum(k // 2, w - 1)[:, None], axis=-1)[:, 0]
    return lo, hi, k


def baseline_tracks(
    series: Sequence[SeriesLevels], params: DetectorParams = DEFAULT_PARAMS,
) -> list[BaselineTrack]:
    """The baseline the detector holds at each night of each series.

    The detector's rule (``service/regressions/detection.py``), computed for every night at
    once: the baseline is the median of the levels of the ``k = min(nights since the last
    reset, window)`` earlier nights, none when ``k < min_baseline``; the band is the median of
    their log levels ± 2 noise, the noise being the median absolute successive difference of
    those log levels times 1.4826 / sqrt(2) (0 for ``k < 3``, at least ``noise_floor`` for
    latency). The stretches between resets of every series are sorted window by window in two
    vectorised passes (levels, then successive differences), so a whole model costs two sorts.

    Returns:
        One track per series, in order; NaN where there is no baseline. Equal to
        ``assess_night``'s ``baseline`` night by night (and to its band for latency; for peak
        memory ``assess_night`` puts the upper edge at the window's recurring envelope).
    """
    pieces: list[tuple[int, int, int, int]] = []  # (series, lo, hi, stretch start)
    linear: list[np.ndarray] = []
    for i, s in enumerate(series):
        lv = np.asarray(s.levels, dtype=float)
        linear.append(lv)
        start = _segment_starts(lv.size, s.resets)
        cuts = np.flatnonzero(np.diff(start)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, lv.size], strict=True):
            if hi > lo:
                pieces.append((i, int(lo), int(hi), int(start[lo])))
    out = [BaselineTrack(baseline=np.full(lv.size, np.nan), lower=np.full(lv.size, np.nan),
                         upper=np.full(lv.size, np.nan), noise=np.zeros(lv.size))
           for lv in linear]
    if not pieces:
        return out
    w = params.window
    segments = [linear[i][st:hi] for i, _, hi, st in pieces]
    lengths = np.array([len(seg) for seg in segments])
    mem = np.repeat([series[i].memory for i, *_ in pieces], lengths)

    def log(v: np.ndarray, m: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(m, np.log1p(v), np.log(v))

    lo, hi, k = _prev_window_mids(segments, w)
    have = k >= params.min_baseline
    base = np.where(have, 0.5 * (lo + hi), np.nan)
    base_log = 0.5 * (log(lo, mem) + log(hi, mem))
    # Noise at night j: the k - 1 successive differences inside its window, which are the
    # differences' window (of size w - 1) before difference j - 1. In float32: the noise only
    # sets the band's width (relative error ~1e-7), and the sort moves half the bytes.
    flat = np.concatenate(segments)
    seg_start = np.cumsum(lengths) - lengths
    diff_ok = np.ones(flat.size, dtype=bool)
    diff_ok[seg_start] = False  # the first night of a stretch has no difference before it
    diffs_all = np.abs(np.diff(log(flat, mem), prepend=np.nan)).astype(np.float32)
    d_segments = np.split(diffs_all[diff_ok], np.cumsum(np.maximum(lengths - 1, 0))[:-1])
    d_lo, d_hi, _ = _prev_window_mids(d_segments, w - 1)
    # Night j of stretch i sits at flat position p; the window before its difference j - 1
    # sits at p - i - 1 among the differences (each stretch drops its first night's).
    j = np.arange(flat.size) - np.repeat(seg_start, lengths)
    d_index = np.clip(np.arange(flat.size) - np.repeat(np.arange(len(segments)) + 1, lengths),
                      0, None)
    noise = (np.where(j >= 3, 0.5 * (d_lo[d_index] + d_hi[d_index]), 0.0)
             if d_lo.size else np.zeros(flat.size))
    noise = np.maximum(noise * (_MAD_TO_SD / math.sqrt(2)),
                       np.where(mem, 0.0, params.noise_floor))
    lower = np.where(have, np.where(mem, np.expm1(base_log - 2 * noise),
                                    np.exp(base_log - 2 * noise)), np.nan)
    upper = np.where(have, np.where(mem, np.expm1(base_log + 2 * noise),
                                    np.exp(base_log + 2 * noise)), np.nan)
    for (i, a, b, st), s0 in zip(pieces, seg_start.tolist(), strict=True):
        rows = slice(s0 + a - st, s0 + b - st)
        track = out[i]
        track.baseline[a:b] = base[rows]
        track.lower[a:b] = lower[rows]
        track.upper[a:b] = upper[rows]
        track.noise[a:b] = noise[rows]
    return out


def baseline_track(
    levels: Sequence[float] | np.ndarray, *, memory: bool, resets: Sequence[tuple[int, int]] = (),
    params: DetectorParams = DEFAULT_PARAMS,
) -> BaselineTrack:
    """:func:`baseline_tracks` for one series (see :class:`SeriesLevels` for the arguments)."""
    return baseline_tracks([SeriesLevels(levels, memory, resets)], params)[0]


# --------------------------------------------------------------------------------------------
# The history


def model_history(
    session: Session, *, model: str, filters: HistoryFilter, settings: Settings,
    params: DetectorParams = DEFAULT_PARAMS,
) -> ModelHistory:
    """Every series of ``model`` matching ``filters``, with baselines and flags per night.

    Nights before ``filters.since`` are read too (the baseline at ``since`` depends on them)
    and then left out; only nightly and ingested runs count, as for detection.

    Raises:
        NotFound: the model has no results at all.
    """
    f = filters
    with _gc_paused():
        return _model_history(session, model=model, f=f, settings=settings, params=params)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cycle collector while a history is built.

    A three-year history allocates some 10^5 short-lived, acyclic objects (row tuples, dates,
    numbers); they trip generation-2 collections that scan every object of the process and
    add tens of milliseconds to a request at random. Reference counting frees them anyway.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _model_history(
    session: Session, *, model: str, f: HistoryFilter, settings: Settings,
    params: DetectorParams,
) -> ModelHistory:
    points = read_points(session, model=model, f=f)
    if not points.series and not points.errors:
        if not model_exists(session, model):
            raise NotFound(f"model {model!r} has no results")
        return ModelHistory(model=model, series=[], errors=[], machines={})
    meta, machines = _identities(session, [int(p.result_id[0]) for p in points.series]
                                 + [e.result_id for e in points.errors])
    series: list[SeriesHistory] = []
    if points.series:
        # Each night's build, by position of its run among the distinct runs.
        run_ids = np.concatenate([p.run_id for p in points.series])
        run_keys, run_pos = np.unique(run_ids, return_inverse=True)
        build_ids, build_versions, build_commits = _builds(
            session, min(p.night[0] for p in points.series),
            max(p.night[-1] for p in points.series))
        versions = np.full(len(run_keys), None, dtype=object)
        commits = np.full(len(run_keys), None, dtype=object)
        if len(build_ids):
            at = np.clip(np.searchsorted(build_ids, run_keys), 0, len(build_ids) - 1)
            known = build_ids[at] == run_keys
            versions[known] = build_versions[at[known]]
            commits[known] = build_commits[at[known]]
        a = 0
        for p in points.series:
            b = a + len(p.night)
            mode, device, compiler, metric, unit, batch, version, machine_id = meta[
                int(p.result_id[0])]
            series.append(SeriesHistory(
                key=p.key, mode=mode, device=device, compiler=compiler, metric=metric,
                unit=unit, batch_size=batch, benchmark_version=version, machine_id=machine_id,
                threshold=settings.threshold_for(metric, f"{model}:{mode}"),
                result_id=p.result_id, run_id=p.run_id, night=p.night,
                torch_version=versions[run_pos[a:b]].tolist(),
                torch_git_commit=commits[run_pos[a:b]].tolist(),
                median=p.median, iqr=p.iqr, samples=p.samples))
            a = b
    errors = [ErrorPoint(night=e.night, run_id=e.run_id, result_id=e.result_id,
                         mode=meta[e.result_id][0], device=meta[e.result_id][1],
                         compiler=meta[e.result_id][2], error=e.error)
              for e in points.errors if f.since is None or e.night >= f.since]
    _fill_missing_medians(session, series)
    series.sort(key=lambda s: (s.mode, s.device, s.compiler, _METRIC_ORDER.get(s.metric, 9),
                               s.metric, s.machine_id or 0, s.night[0]))

    stored = _stored_regressions(session, [s.key for s in series])
    resets = [_flags(s, stored.get(s.key, {})) for s in series]
    _baselines(series, resets, params)
    if f.since is not None:
        series = [_since(s, f.since) for s in series]
        series = [s for s in series if len(s)]
    return ModelHistory(model=model, series=series, errors=errors, machines=machines)


def _identities(
    session: Session, result_ids: list[int],
) -> tuple[dict[int, tuple[Any, ...]], dict[int, Machine]]:
    """result id -> (mode, device, compiler, metric, unit, batch size, version, machine id),
    and the machines they name (one query)."""
    if not result_ids:
        return {}, {}
    rows = session.execute(
        select(Result.id, Result.mode, Result.device, Result.compiler, Result.metric,
               Result.unit, Result.batch_size, Result.benchmark_version, Result.machine_id,
               Machine)
        .outerjoin(Machine, Machine.id == Result.machine_id)
        .where(Result.id.in_(result_ids)))
    meta: dict[int, tuple[Any, ...]] = {}
    machines: dict[int, Machine] = {}
    for row in rows:
        meta[row[0]] = tuple(row[1:9])
        if row[9] is not None:
            machines[row[9].id] = row[9]
    return meta, machines


_BUILDS = (select(Run.id, Run.torch_version, Run.torch_git_commit)
           .where(Run.night >= bindparam("first"), Run.night <= bindparam("last"),
                  or_(*(Run.kind == kind for kind in HISTORY_KINDS)))
           .order_by(Run.id))


def _builds(session: Session, first: date, last: date) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of the period: ids (sorted), torch versions and git commits, as arrays."""
    rows = fetch(session, _BUILDS, {"first": first, "last": last})
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object), np.zeros(0, dtype=object)
    ids, versions, commits = zip(*rows, strict=True)
    return (np.array(ids, dtype=np.int64), np.array(versions, dtype=object),
            np.array(commits, dtype=object))


def _fill_missing_medians(session: Session, series: list[SeriesHistory]) -> None:
    # Records posted without a median: the level is the median of the raw samples.
    todo = [(s, int(i)) for s in series for i in np.flatnonzero(np.isnan(s.median))]
    if not todo:
        return
    samples = dict(session.execute(select(Result.id, Result.samples).where(
        Result.id.in_([int(s.result_id[i]) for s, i in todo]))).all())
    for s, i in todo:
        s.median[i] = float(np.median(samples[int(s.result_id[i])]))


def _stored_regressions(
    session: Session, keys: list[str],
) -> dict[str, dict[int, tuple[int, str, str, str, int]]]:
    """series_key -> result_id -> (regression id, direction, confirmation, state, result id of
    the step's first night)."""
    out: dict[str, dict[int, tuple[int, str, str, str, int]]] = {}
    if not keys:
        return out
    rows = session.execute(
        select(Regression.series_key, Regression.result_id, Regression.id, Regression.direction,
               Regression.confirmation, Regression.state,
               func.coalesce(Regression.first_result_id, Regression.result_id))
        .where(Regression.series_key.in_(keys))
    )
    for key, result_id, reg_id, direction, confirmation, state, first_id in rows:
        out.setdefault(key, {})[result_id] = (reg_id, direction, confirmation, state, first_id)
    return out


def _flags(s: SeriesHistory,
           stored: dict[int, tuple[int, str, str, str, int]]) -> list[tuple[int, int]]:
    """Set the series' flags from the stored verdicts; return where its baseline resets.

    Resets are ``(first night of the new segment, first night it applies to)`` positions, as
    the detector resets: at a step marked expected from its first night on, and after a raised
    step at the step's first night at the new level (earlier than the night it was raised when
    it persisted first) from the night after it was raised.
    """
    n = len(s)
    s.regression = np.zeros(n, dtype=bool)
    s.improvement = np.zeros(n, dtype=bool)
    s.expected = np.zeros(n, dtype=bool)
    s.regression_id = [None] * n
    resets: list[tuple[int, int]] = []
    if not stored:
        return resets
    for i in np.flatnonzero(np.isin(s.result_id, list(stored))).tolist():
        reg_id, direction, confirmation, state, first_id = stored[int(s.result_id[i])]
        s.regression_id[i] = reg_id
        at = np.flatnonzero(s.result_id[: i + 1] == first_id)
        j = int(at[-1]) if at.size else i
        if state == "expected":
            s.expected[j] = True
            resets.append((j, j))
        if direction == "improvement":
            s.improvement[i] = True
            resets.append((j, i + 1))
        elif confirmation != "not_reproduced":
            # A candidate the confirmation re-run did not reproduce was a one-night blip.
            s.regression[i] = True
            if confirmation == "reproduced":
                resets.append((j, i + 1))
    return resets


def _baselines(series: list[SeriesHistory], resets: list[list[tuple[int, int]]],
               params: DetectorParams) -> None:
    """Fill baseline, band, change and outlier flags of every series (one batch)."""
    todo = [i for i, s in enumerate(series) if s.metric in METRICS and len(s)]
    tracks = baseline_tracks([SeriesLevels(series[i].median, series[i].metric in MEMORY_METRICS,
                                           resets[i]) for i in todo], params)
    by_index = dict(zip(todo, tracks, strict=True))
    for i, s in enumerate(series):
        track = by_index.get(i)
        if track is None:
            s.baseline, s.baseline_lower, s.baseline_upper, s.change = (
                np.full(len(s), np.nan) for _ in range(4))
            s.outlier = np.zeros(len(s), dtype=bool)
            continue
        memory = s.metric in MEMORY_METRICS
        base = track.baseline
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.where(base > 0, s.median / base - 1, np.nan)
            log = np.log1p if memory else np.log
            dist = np.abs(log(s.median) - log(base))
        # Outlier: a night beyond both the threshold and the noise band that is not a flagged
        # change (the detector's persistence rule did not raise it).
        cut = np.maximum(2 * track.noise, math.log1p(s.threshold))
        s.outlier = ~np.isnan(base) & (dist > cut) & ~(s.regression | s.improvement)
        s.baseline, s.baseline_lower, s.baseline_upper = base, track.lower, track.upper
        s.change = change


def value_or_none(x: Any) -> Any:
    """A column entry as a Python value, NaN as None (for templates and text)."""
    if isinstance(x, np.generic):
        x = x.item()
    return None if isinstance(x, float) and x != x else x


_FIELDS = ("night", "run_id", "result_id", "torch_version", "torch_git_commit", "median", "iqr",
           "samples", "baseline", "baseline_lower", "baseline_upper", "change", "regression",
           "improvement", "outlier", "expected", "regression_id")


def _since(s: SeriesHistory, since: date) -> SeriesHistory:
    keep = bisect.bisect_left(s.night, since)
    for name in _FIELDS:
        setattr(s, name, getattr(s, name)[keep:])
    return s


def point_fields() -> tuple[str, ...]:
    """Names of the per-night fields of a series, in output order."""
    return _FIELDS


# --------------------------------------------------------------------------------------------
# Models and their configurations


@lru_cache(maxsize=256)
def model_domain(model: str) -> str | None:
    """The model's domain from the suite's ``metadata.yaml`` (None for models not in it)."""
    path = _SUITE_MODELS / model / "metadata.yaml"
    if "/" in model or not path.is_file():
        return None
    try:
        meta = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    domain = meta.get("domain") if isinstance(meta, dict) else None
    return str(domain) if domain else None


def list_models(session: Session, *, since: date | None, days: int) -> tuple[date | None, list[Any]]:
    """Models with the configurations measured since ``since`` (default: ``days`` before the
    latest night), one row per (model, mode, device, compiler, metric, machine).

    Returns:
        ``(since used, rows)``; rows are ``(model, mode, device, compiler, metric, unit,
        machine_id, first night, last night, results)`` ordered by model.
    """
    if since is None:
        latest = session.scalar(select(func.max(Run.night)).where(Run.kind.in_(HISTORY_KINDS)))
        if latest is None:
            return None, []
        since = date.fromordinal(max(latest.toordinal() - days, 1))
    stmt = (
        select(Result.model, Result.mode, Result.device, Result.compiler, Result.metric,
               func.min(Result.unit), Result.machine_id, func.min(Result.night),
               func.max(Result.night), func.count())
        .join(Run, Run.id == Result.run_id)
        .where(Run.night >= since, Run.kind.in_(HISTORY_KINDS), Result.error.is_(None))
        .group_by(Result.model, Result.mode, Result.device, Result.compiler, Result.metric,
                  Result.machine_id)
        .order_by(Result.model, Result.mode, Result.device, Result.compiler, Result.metric,
                  Result.machine_id)
    )
    return since, list(session.execute(stmt).all())
