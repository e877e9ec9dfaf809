"""A model's history: every series with its baseline at each night and its flags.

The points come from :mod:`service.results.points` (on Postgres the ``series_months`` table:
each series packed by month, a few hundred rows for three years; elsewhere one index-only scan
of ``ix_results_history``), the rest of what a history shows (identities, builds, stored
verdicts) from :mod:`service.results.history_queries`; the baseline track of every series is
then computed at once with numpy by the detector's own rule
(:func:`service.regressions.baseline.baseline_tracks`: the median of the levels of up to
``window`` earlier nights since the last reset, ``min_baseline`` nights at least; the band is
the baseline ± 2 night-to-night noise on the log scale, the noise being the scaled median
absolute successive difference of the window). The flags come from what the nightly detector
stored (:class:`~service.models.Regression` rows): replaying the online detector over three
years of every series at each request costs about 70 ms for 12 series (``detect_series``) and
grows as n² with ``assess_night`` night by night, while the stored verdicts are what
maintainers triage. Resets happen where the detector resets: at a night marked ``expected`` and
after a raised step.

Shapes: a series holds parallel columns (numpy arrays, or lists for text and dates), one entry
per night (a result), oldest first; NaN marks a missing value in a float column.
"""

from __future__ import annotations

import bisect
import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import NotFound
from service.metrics import ALERT_METRICS, exact_levels
from service.metrics import order as metric_order
from service.models import Confirmation, Machine
from service.regressions.baseline import BAND, SeriesLevels, baseline_tracks
from service.regressions.detection import DetectorParams
from service.regressions.sensitivity import series_smallest_change
from service.results.history_queries import (
    StoredVerdict,
    result_identities,
    result_samples,
    run_builds,
    stored_regressions,
)
from service.results.points import HistoryFilter, model_exists, read_points
from service.series import round_results

DEFAULT_PARAMS = DetectorParams()


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
    value (no IQR stored, no baseline yet). ``smallest_change``: the smallest step the next
    night would raise within three nights 95% of the time at the series' noise (relative;
    :mod:`service.regressions.sensitivity`), None without a baseline or for a metric that does
    not alert.
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
    smallest_change: float | None = None

    @property
    def benchmark(self) -> str:
        """The benchmark's name within its model, ``mode:device[:compiler]``."""
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
    """A model's history: its series and the nights its benchmarks failed."""

    model: str
    series: list[SeriesHistory]
    errors: list[ErrorPoint]
    machines: dict[int, Machine]


def model_history(
    session: Session,
    *,
    model: str,
    filters: HistoryFilter,
    settings: Settings,
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
    session: Session,
    *,
    model: str,
    f: HistoryFilter,
    settings: Settings,
    params: DetectorParams,
) -> ModelHistory:
    points = read_points(session, model=model, f=f)
    if not points.series and not points.errors:
        if not model_exists(session, model):
            raise NotFound(f"model {model!r} has no results")
        return ModelHistory(model=model, series=[], errors=[], machines={})
    meta, machines = result_identities(
        session, [int(p.result_id[0]) for p in points.series] + [e.result_id for e in points.errors]
    )
    series: list[SeriesHistory] = []
    if points.series:
        # Each night's build, by position of its run among the distinct runs.
        run_ids = np.concatenate([p.run_id for p in points.series])
        run_keys, run_pos = np.unique(run_ids, return_inverse=True)
        build_ids, build_versions, build_commits = run_builds(
            session, min(p.night[0] for p in points.series), max(p.night[-1] for p in points.series)
        )
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
                int(p.result_id[0])
            ]
            series.append(
                SeriesHistory(
                    key=p.key,
                    mode=mode,
                    device=device,
                    compiler=compiler,
                    metric=metric,
                    unit=unit,
                    batch_size=batch,
                    benchmark_version=version,
                    machine_id=machine_id,
                    threshold=settings.threshold_for(metric, f"{model}:{mode}"),
                    result_id=p.result_id,
                    run_id=p.run_id,
                    night=p.night,
                    torch_version=versions[run_pos[a:b]].tolist(),
                    torch_git_commit=commits[run_pos[a:b]].tolist(),
                    median=p.median,
                    iqr=p.iqr,
                    samples=p.samples,
                )
            )
            a = b
    errors = [
        ErrorPoint(
            night=e.night,
            run_id=e.run_id,
            result_id=e.result_id,
            mode=meta[e.result_id][0],
            device=meta[e.result_id][1],
            compiler=meta[e.result_id][2],
            error=e.error,
        )
        for e in points.errors
        if f.since is None or e.night >= f.since
    ]
    _fill_missing_medians(session, series)
    _round_medians(session, series)
    series.sort(
        key=lambda s: (
            s.mode,
            s.device,
            s.compiler,
            metric_order(s.metric),
            s.metric,
            s.machine_id or 0,
            s.night[0],
        )
    )

    stored = stored_regressions(session, [s.key for s in series])
    resets = [_flags(s, stored.get(s.key, {})) for s in series]
    _baselines(series, resets, params)
    if f.since is not None:
        series = [_since(s, f.since) for s in series]
        series = [s for s in series if len(s)]
    return ModelHistory(model=model, series=series, errors=errors, machines=machines)


def _fill_missing_medians(session: Session, series: list[SeriesHistory]) -> None:
    # Records posted without a median: the level is the median of the raw samples.
    todo = [(s, int(i)) for s in series for i in np.flatnonzero(np.isnan(s.median))]
    if not todo:
        return
    samples = result_samples(session, [int(s.result_id[i]) for s, i in todo])
    for s, i in todo:
        s.median[i] = float(np.median(samples[int(s.result_id[i])]))


def _round_medians(session: Session, series: list[SeriesHistory]) -> None:
    # Nights measured in several processes (NIGHTBENCH_NIGHT_PROCESSES): the level is the
    # median of the per-process medians, as detection reads it (service.series.night_samples).
    rounds = round_results(session, run_ids={int(r) for s in series for r in s.run_id})
    if not rounds:
        return
    for s in series:
        for i, run_id in enumerate(s.run_id):
            extra = rounds.get((int(run_id), s.key))
            if extra and not np.isnan(s.median[i]):
                s.median[i] = float(
                    np.median([s.median[i], *(np.median(r.samples) for r in extra)])
                )


def _flags(s: SeriesHistory, stored: dict[int, StoredVerdict]) -> list[tuple[int, int]]:
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
        elif confirmation != Confirmation.NOT_REPRODUCED:
            # A candidate the confirmation re-run did not reproduce was a one-night blip.
            s.regression[i] = True
            if confirmation == Confirmation.REPRODUCED:
                resets.append((j, i + 1))
    return resets


def _baselines(
    series: list[SeriesHistory], resets: list[list[tuple[int, int]]], params: DetectorParams
) -> None:
    """Fill baseline, band, change and outlier flags of every series (one batch)."""
    todo = [i for i, s in enumerate(series) if s.metric in ALERT_METRICS and len(s)]
    tracks = baseline_tracks(
        [SeriesLevels(series[i].median, exact_levels(series[i].metric), resets[i]) for i in todo],
        params,
    )
    by_index = dict(zip(todo, tracks, strict=True))
    for i, s in enumerate(series):
        track = by_index.get(i)
        if track is None:
            s.baseline, s.baseline_lower, s.baseline_upper, s.change = (
                np.full(len(s), np.nan) for _ in range(4)
            )
            s.outlier = np.zeros(len(s), dtype=bool)
            continue
        memory = exact_levels(s.metric)
        base = track.baseline
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.where(base > 0, s.median / base - 1, np.nan)
            log = np.log1p if memory else np.log
            dist = np.abs(log(s.median) - log(base))
        # Outlier: a night beyond both the threshold and the noise band that is not a flagged
        # change (the detector's persistence rule did not raise it).
        cut = np.maximum(BAND * track.noise, math.log1p(s.threshold))
        s.outlier = ~np.isnan(base) & (dist > cut) & ~(s.regression | s.improvement)
        s.baseline, s.baseline_lower, s.baseline_upper = base, track.lower, track.upper
        s.change = change
        # The next night's, judged as the detector judges it: against the nights of the
        # series' last segment, which starts at a raised step's first night at its new level.
        since = max((first for first, _ in resets[i]), default=0)
        s.smallest_change = series_smallest_change(
            s.median[since:], s.threshold, memory=memory, params=params
        )


def value_or_none(x: Any) -> Any:
    """A column entry as a Python value, NaN as None (for templates and text)."""
    if isinstance(x, np.generic):
        x = x.item()
    return None if isinstance(x, float) and x != x else x


_FIELDS = (
    "night",
    "run_id",
    "result_id",
    "torch_version",
    "torch_git_commit",
    "median",
    "iqr",
    "samples",
    "baseline",
    "baseline_lower",
    "baseline_upper",
    "change",
    "regression",
    "improvement",
    "outlier",
    "expected",
    "regression_id",
)


def _since(s: SeriesHistory, since: date) -> SeriesHistory:
    keep = bisect.bisect_left(s.night, since)
    for name in _FIELDS:
        setattr(s, name, getattr(s, name)[keep:])
    return s


def point_fields() -> tuple[str, ...]:
    """Names of the per-night fields of a series, in output order."""
    return _FIELDS
