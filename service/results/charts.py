"""History charts (matplotlib, Agg backend, SVG out) for the API, the model page and issues.

One panel per series: the night medians with their spread (median ± IQR/2), the baseline and
its band, markers for regressions (red, up), improvements (green, down) and outlier nights
(orange), dotted lines at nights marked ``expected``, error nights as a rug, and the culprit
commit named by a bisection next to its regression. Figures are built with the object API
(``matplotlib.figure.Figure``), never pyplot, so concurrent requests share no global figure.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
# Fixed element ids: the same history renders to the same bytes (cacheable, comparable).
matplotlib.rcParams["svg.hashsalt"] = "nightbench"

import matplotlib.dates as mdates  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from service.metrics import UNITS  # noqa: E402
from service.results.history import ModelHistory, SeriesHistory  # noqa: E402

MAX_PANELS = 24
_PANEL_HEIGHT_IN = 2.8
_WIDTH_IN = 10.0


def _scale(unit: str) -> tuple[float, str]:
    shape = UNITS.get(unit)
    return (shape.scale, shape.suffix) if shape else (1.0, unit)


def history_svg(history: ModelHistory, culprits: dict[int, str]) -> bytes:
    """Render ``history`` as an SVG document (UTF-8 bytes).

    Args:
        history: from :func:`service.results.history.model_history`; one panel per series.
        culprits: regression id -> culprit commit sha, annotated at the regression's night.
    """
    panels = max(len(history.series), 1)
    fig = Figure(figsize=(_WIDTH_IN, _PANEL_HEIGHT_IN * panels + 0.3), layout="constrained")
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    if not history.series:
        ax = axes[0]
        ax.text(
            0.5,
            0.5,
            f"{history.model}: no results match",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=12,
        )
        ax.set_axis_off()
    for ax, series in zip(axes, history.series, strict=False):
        _panel(ax, history, series, culprits)
    buf = io.BytesIO()
    # No date in the metadata: the same history gives the same bytes (cacheable, testable).
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _panel(ax, history: ModelHistory, s: SeriesHistory, culprits: dict[int, str]) -> None:  # type: ignore[no-untyped-def]
    factor, unit = _scale(s.unit)
    x = np.array(s.night, dtype="datetime64[D]")
    med = np.asarray(s.median, dtype=float) / factor
    iqr = np.asarray(s.iqr, dtype=float) / factor
    base = np.asarray(s.baseline, dtype=float) / factor
    lo = np.asarray(s.baseline_lower, dtype=float) / factor
    hi = np.asarray(s.baseline_upper, dtype=float) / factor

    ax.fill_between(
        x, lo, hi, color="#9aa5b1", alpha=0.35, linewidth=0, step="mid", label="baseline band"
    )
    ax.plot(
        x,
        base,
        color="#52606d",
        linewidth=1.2,
        linestyle="--",
        drawstyle="steps-mid",
        label="baseline",
    )
    ax.fill_between(
        x, med - iqr / 2, med + iqr / 2, color="#2680c2", alpha=0.25, linewidth=0, label="IQR"
    )
    # Dots mark each night while they stay apart; over long histories the line alone reads better.
    ax.plot(
        x,
        med,
        color="#1f5f99",
        linewidth=1.1,
        marker="o" if len(s) <= 120 else None,
        markersize=2.2,
        label="median",
    )

    reg = np.asarray(s.regression, dtype=bool)
    imp = np.asarray(s.improvement, dtype=bool)
    out = np.asarray(s.outlier, dtype=bool)
    if reg.any():
        ax.scatter(
            x[reg],
            med[reg],
            marker="^",
            s=70,
            color="#d64545",
            zorder=5,
            edgecolors="black",
            linewidths=0.5,
            label="regression",
        )
    if imp.any():
        ax.scatter(
            x[imp],
            med[imp],
            marker="v",
            s=70,
            color="#3ebd93",
            zorder=5,
            edgecolors="black",
            linewidths=0.5,
            label="improvement",
        )
    if out.any():
        ax.scatter(
            x[out], med[out], marker="x", s=30, color="#f0b429", zorder=4, label="outlier night"
        )
    for night in x[np.asarray(s.expected, dtype=bool)]:
        ax.axvline(night, color="#7b8794", linestyle=":", linewidth=1)
    for i, reg_id in enumerate(s.regression_id):
        sha = culprits.get(reg_id) if reg_id is not None else None
        if sha:
            ax.annotate(
                f"culprit {sha[:10]}",
                xy=(x[i], med[i]),
                xytext=(12, 14),
                textcoords="offset points",
                fontsize=8,
                color="#b91c1c",
                arrowprops={"arrowstyle": "->", "color": "#b91c1c", "lw": 0.8},
            )
    errs = [
        e.night
        for e in history.errors
        if (e.mode, e.device, e.compiler) == (s.mode, s.device, s.compiler)
    ]
    if errs:
        ax.plot(
            np.array(errs, dtype="datetime64[D]"),
            np.zeros(len(errs)),
            "|",
            color="#8e44ad",
            markersize=12,
            transform=ax.get_xaxis_transform(),
            label="error night",
        )

    machine = history.machines.get(s.machine_id) if s.machine_id is not None else None
    where = (machine.gpu_name or machine.cpu_model or machine.device_class) if machine else ""
    ax.set_title(
        f"{history.model}:{s.benchmark} · {s.metric}" + (f" · {where}" if where else ""),
        fontsize=10,
        loc="left",
    )
    ax.set_ylabel(unit)
    ax.grid(True, alpha=0.3)
    locator = mdates.AutoDateLocator(maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    # Above the plot, right-aligned opposite the title: the legend never hides a night.
    ax.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
        ncols=8,
        frameon=False,
        borderaxespad=0.2,
        handlelength=1.5,
        columnspacing=1.0,
    )
