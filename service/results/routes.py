"""Models, their history (JSON, CSV, SVG chart) and the model page."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from service.api import (
    FilterText,
    ModelName,
    Night,
    errors,
    json_response,
    url,
)
from service.benchmarks import benchmark_name
from service.bisections.service import culprits_for_regressions
from service.deps import SessionDep, SettingsDep
from service.errors import InvalidInput
from service.metrics import format_value, host_bound
from service.regressions.sensitivity import is_coarse
from service.regressions.service import unstable_spreads
from service.regressions.unstable import alerts_from
from service.results import catalog
from service.results import history as hist
from service.results.charts import MAX_PANELS, history_svg
from service.results.schemas import HistoryRead, ModelsRead

router = APIRouter(tags=["history"])
pages = APIRouter(tags=["pages"])
templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent.parent / "templates"))

_CSV_COLUMNS = (
    "series_key",
    "benchmark",
    "metric",
    "unit",
    "machine_id",
    *hist.point_fields(),
    "culprit",
)


def _filters(
    metric: FilterText = None,
    mode: FilterText = None,
    device: FilterText = None,
    compiler: FilterText = None,
    machine: int | None = None,
    series: str | None = None,
    since: date | None = None,
    until: date | None = None,
) -> hist.HistoryFilter:
    return hist.HistoryFilter(
        metric=metric,
        mode=mode,
        device=device,
        compiler=compiler,
        machine=machine,
        series=series,
        since=since,
        until=until,
    )


SeriesKey = Query(
    default=None,
    min_length=1,
    max_length=64,
    pattern=r"^[0-9a-f]+$",
    description="one series by its key",
)
MachineId = Query(default=None, ge=1, le=2**31 - 1, description="machine id")


@router.get("/api/models", response_model=ModelsRead, responses=errors(422))
def list_models(
    session: SessionDep,
    since: Night = None,
    days: int = Query(
        7, ge=1, le=3660, description="period before the latest night, when since is not given"
    ),
) -> dict[str, Any]:
    """Models with their domain and the configurations measured in the period."""
    used, rows = catalog.list_models(session, since=since, days=days)
    domains = catalog.model_domains(session, sorted({row[0] for row in rows}))
    models: dict[str, dict[str, Any]] = {}
    for model, mode, device, compiler, metric, unit, machine_id, first, last, count in rows:
        entry = models.setdefault(
            model,
            {
                "name": model,
                "domain": domains[model],
                "configurations": [],
                "history_url": url(f"/api/models/{model}/history"),
                "page_url": url(f"/models/{model}"),
            },
        )
        entry["configurations"].append(
            {
                "mode": mode,
                "device": device,
                "compiler": compiler,
                "metric": metric,
                "unit": unit,
                "machine_id": machine_id,
                "first_night": first,
                "last_night": last,
                "results": count,
            }
        )
    return {"since": used, "models": list(models.values())}


@router.get(
    "/api/models/{model}/history",
    response_model=HistoryRead,
    responses={
        **errors(404, 422),
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "JSON, or CSV with format=csv",
        },
    },
)
def model_history(
    model: ModelName,
    session: SessionDep,
    settings: SettingsDep,
    metric: FilterText = None,
    mode: FilterText = None,
    device: FilterText = None,
    compiler: FilterText = None,
    machine: int | None = MachineId,
    series: str | None = SeriesKey,
    since: Night = None,
    until: Night = None,
    format: Literal["json", "csv"] = Query("json", description="json or csv"),
) -> Response:
    """Every series of the model: per night the torch build, median, IQR, sample count, the
    baseline held then, and the regression / improvement / outlier flags."""
    filters = _filters(metric, mode, device, compiler, machine, series, since, until)
    history = hist.model_history(session, model=model, filters=filters, settings=settings)
    culprits = culprits_for_regressions(session, _regression_ids(history))
    if format == "csv":
        return Response(
            _csv(history, culprits),
            media_type="text/csv",
            headers={"Content-Disposition": f'inline; filename="{_safe(model)}.csv"'},
        )
    return json_response(_payload(history, culprits, _alerts_from(session, history)))


@router.get(
    "/api/models/{model}/history.svg",
    response_class=Response,
    responses={
        **errors(404, 422, json_route=False),
        200: {
            "content": {"image/svg+xml": {"schema": {"type": "string"}}},
            "description": "the chart",
        },
    },
)
def model_history_svg(
    model: ModelName,
    session: SessionDep,
    settings: SettingsDep,
    metric: FilterText = None,
    mode: FilterText = None,
    device: FilterText = None,
    compiler: FilterText = None,
    machine: int | None = MachineId,
    series: str | None = SeriesKey,
    since: Night = None,
    until: Night = None,
) -> Response:
    """The history as an SVG chart: one panel per series with its spread (IQR), baseline band,
    regression and improvement markers, and culprit commits named by bisections."""
    filters = _filters(metric, mode, device, compiler, machine, series, since, until)
    history = hist.model_history(session, model=model, filters=filters, settings=settings)
    if len(history.series) > MAX_PANELS:
        raise InvalidInput(
            f"{len(history.series)} series match; narrow with metric, mode, device, compiler, "
            f"machine or series (at most {MAX_PANELS} per chart)"
        )
    culprits = culprits_for_regressions(session, _regression_ids(history))
    return Response(
        history_svg(history, culprits),
        media_type="image/svg+xml",
        headers={"Cache-Control": "max-age=300"},
    )


@pages.get(
    "/models/{model}", response_class=HTMLResponse, responses=errors(404, 422, json_route=False)
)
def model_page(
    model: ModelName,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    since: Night = None,
) -> HTMLResponse:
    """A page with the model's charts, one per series, for people who would rather look."""
    history = hist.model_history(
        session, model=model, filters=hist.HistoryFilter(since=since), settings=settings
    )
    culprits = culprits_for_regressions(session, _regression_ids(history))
    bars = _alerts_from(session, history)
    charts = []
    for s in history.series:
        last = len(s) - 1
        change = hist.value_or_none(s.change[last]) if last >= 0 else None
        charts.append(
            {
                "title": f"{model}:{s.benchmark} · {s.metric}",
                "machine": _machine_label(history, s.machine_id),
                "src": url(f"/api/models/{model}/history.svg", series=s.key, since=since),
                "nights": len(s),
                "latest": _fmt(s.median[last], s.unit) if last >= 0 else "—",
                "baseline": _fmt(s.baseline[last], s.unit) if last >= 0 else "—",
                "change": f"{change * 100:+.1f}%" if change is not None else "—",
                "flags": int(s.regression.sum() + s.improvement.sum()),
                "unstable": s.key in bars,
                "alerts_from": _pct(bars.get(s.key)),
                "smallest_change": None
                if s.smallest_change is None
                else f"{s.smallest_change * 100:+.1f}%",
                "blind": is_coarse(s.smallest_change, s.threshold),
            }
        )
    flagged = [
        {
            "night": s.night[i],
            "benchmark": f"{model}:{s.benchmark}",
            "metric": s.metric,
            "kind": "regression" if s.regression[i] else "improvement",
            "change": f"{(hist.value_or_none(s.change[i]) or 0) * 100:+.1f}%",
            "regression_id": s.regression_id[i],
            "culprit": culprits.get(s.regression_id[i] or 0),
        }
        for s in history.series
        for i in np.flatnonzero(s.regression | s.improvement).tolist()
    ]
    flagged.sort(key=lambda r: str(r["night"]), reverse=True)
    return templates.TemplateResponse(
        request,
        "model.html",
        {
            "model": model,
            "domain": catalog.model_domains(session, [model])[model],
            "charts": charts,
            "flagged": flagged[:50],
            "errors": history.errors[-20:],
            "json_url": url(f"/api/models/{model}/history", since=since),
            "csv_url": url(f"/api/models/{model}/history", since=since, format="csv"),
        },
    )


def _alerts_from(session: Session, history: hist.ModelHistory) -> dict[str, float | None]:
    """``{series_key: bar}`` for the latency series marked unstable on their own machine: the
    least regression each still alerts (a fraction; None: never), ``UnstableRule``."""
    spreads = unstable_spreads(session, by_machine=True)
    return {
        s.key: alerts_from(spreads[key], s.threshold)
        for s in history.series
        if host_bound(s.metric)
        and (key := (history.model, s.mode, s.device, s.compiler, s.machine_id)) in spreads
    }


def _pct(value: float | None) -> str:
    return "never" if value is None else f"{value * 100:+.1f}%"


def _regression_ids(history: hist.ModelHistory) -> list[int]:
    return [r for s in history.series for r in s.regression_id if r is not None]


def _machine_label(history: hist.ModelHistory, machine_id: int | None) -> str:
    m = history.machines.get(machine_id) if machine_id is not None else None
    if m is None:
        return "unknown machine"
    return m.gpu_name or m.cpu_model or m.device_class


def _fmt(value: float | None, unit: str) -> str:
    return format_value(hist.value_or_none(value), unit)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _payload(
    history: hist.ModelHistory, culprits: dict[int, str], bars: dict[str, float | None]
) -> dict[str, Any]:
    series = []
    for s in history.series:
        m = history.machines.get(s.machine_id) if s.machine_id is not None else None
        culprit = (
            [culprits.get(r) if r else None for r in s.regression_id]
            if culprits
            else [None] * len(s)
        )
        points = {name: getattr(s, name) for name in hist.point_fields()}
        points["culprit"] = culprit
        series.append(
            {
                "series_key": s.key,
                "benchmark": f"{history.model}:{s.benchmark}",
                "mode": s.mode,
                "device": s.device,
                "compiler": s.compiler,
                "metric": s.metric,
                "unit": s.unit,
                "batch_size": s.batch_size,
                "benchmark_version": s.benchmark_version,
                "machine": None
                if m is None
                else {
                    "id": m.id,
                    "device_class": m.device_class,
                    "cpu_model": m.cpu_model,
                    "gpu_name": m.gpu_name,
                    "driver": m.driver,
                    "hostname": m.hostname,
                },
                "threshold": s.threshold,
                "unstable": s.key in bars,
                "alerts_from": bars.get(s.key),
                "smallest_change": s.smallest_change,
                "chart_url": url(f"/api/models/{history.model}/history.svg", series=s.key),
                "points": points,
            }
        )
    errors_ = [
        {
            "night": e.night,
            "run_id": e.run_id,
            "result_id": e.result_id,
            "benchmark": _benchmark(history.model, e.mode, e.device, e.compiler),
            "error": e.error,
        }
        for e in history.errors
    ]
    return {"model": history.model, "series": series, "errors": errors_}


def _benchmark(model: str, mode: str, device: str, compiler: str) -> str:
    return benchmark_name(model, mode, device, compiler)


def _csv(history: hist.ModelHistory, culprits: dict[int, str]) -> str:
    frames = []
    for s in history.series:
        frame = pd.DataFrame({name: getattr(s, name) for name in hist.point_fields()})
        frame.insert(0, "machine_id", s.machine_id)
        frame.insert(0, "unit", s.unit)
        frame.insert(0, "metric", s.metric)
        frame.insert(0, "benchmark", f"{history.model}:{s.benchmark}")
        frame.insert(0, "series_key", s.key)
        frame["culprit"] = [culprits.get(r) if r else None for r in s.regression_id]
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=list(_CSV_COLUMNS)).to_csv(index=False)
    return pd.concat(frames, ignore_index=True).to_csv(index=False)
