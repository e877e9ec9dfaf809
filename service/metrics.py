"""The metric table: every metric nightbench stores, judges and prints, one row each.

A metric's *kind* decides how its noise is modelled by the detector, how a regression in it is
confirmed and bisected, and which marks apply to it; its *unit* decides how a value is printed.
Code reads the row (:func:`metric`, :func:`format_value`); it never tests a metric's name. A
new metric is one row here plus its measurement in the suite (``suite/records.py`` names the
units the suite writes). The rows and their sources are described in docs/architecture.md
("Metrics").

Kinds:

- ``timed`` (latency): a median of timed iterations; its night-to-night noise is measured from
  the series and judged with a rank test (Mann & Whitney 1947); the host's speed moves it, so a
  confirmation is paired with the previous night's build measured beside it, benchmarks whose
  processes spread are marked unstable, and a bisection measures it in fresh processes.
- ``memory`` (peak memory): exact levels in bytes, judged by the envelope of the levels the
  baseline recurs at, without a p-value (multimodal allocations are modes, not steps).
- ``count`` (instructions executed, callgrind's ``Ir``): near-deterministic; its small noise is
  measured from the nights like latency's and judged the same way, but the host's speed does
  not move it, so neither the paired confirmation nor the unstable mark applies, and a
  regression in it is bisected by counting (one counted process per probe), each build counted
  once per bisection and its count reused by every later comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from service.errors import UnknownMetric


class MetricKind(StrEnum):
    """How a metric is measured and judged (see the module docstring)."""

    TIMED = "timed"
    MEMORY = "memory"
    COUNT = "count"


@dataclass(frozen=True)
class KindRule:
    """What a metric's kind decides, for every metric of that kind.

    Attributes:
        exact_levels: the detector judges nights by the envelope of the baseline's recurring
            levels without a p-value or noise floor (peak memory), rather than by the noise
            measured between nights and a rank test (latency, counts).
        host_bound: the host's speed moves the value: a confirmation re-run is judged against
            the previous night's build measured beside it, and a benchmark whose processes
            spread is marked unstable for this metric.
        bisect_by: what a bisection of a regression in this metric measures at each probe:
            ``latency`` (timed samples in fresh processes) or ``cpu_instructions`` (one counted
            process). None: not bisected by itself (a memory regression is bisected by
            latency's probes, its culprit named by the range).
        bisect_once: a bisection by this metric measures each build once and compares every
            probe with the endpoints' stored values (an exact count: the same build counts the
            same in any process, on any host), rather than measuring both endpoints again
            beside every round's probes to cancel the host's drift (latency).
    """

    exact_levels: bool
    host_bound: bool
    bisect_by: str | None
    bisect_once: bool = False


KIND_RULES: dict[MetricKind, KindRule] = {
    MetricKind.TIMED: KindRule(exact_levels=False, host_bound=True, bisect_by="latency"),
    MetricKind.MEMORY: KindRule(exact_levels=True, host_bound=False, bisect_by=None),
    MetricKind.COUNT: KindRule(
        exact_levels=False, host_bound=False, bisect_by="cpu_instructions", bisect_once=True
    ),
}


BISECT_METRICS: tuple[str, ...] = tuple(
    dict.fromkeys(r.bisect_by for r in KIND_RULES.values() if r.bisect_by)
)
"""What a bisection's probes can measure: ``latency``, ``cpu_instructions``."""


@dataclass(frozen=True)
class Unit:
    """How values of one unit are printed.

    Attributes:
        scale: the printed number is ``value / scale``.
        suffix: what follows the number (``ms``, ``MiB``, ``M instr``).
        decimals: ``(at least, decimals)`` pairs, largest first: a printed number of at least
            that magnitude gets that many decimals (the last pair should start at 0).
    """

    scale: float
    suffix: str
    decimals: tuple[tuple[float, int], ...] = ((100.0, 1), (1.0, 2), (0.0, 3))

    def format(self, value: float) -> str:
        """``value`` (in the stored unit) as printed, e.g. ``12.41 ms``, ``1,234.5 MiB``."""
        shown = value / self.scale
        if not math.isfinite(shown):
            return f"{shown} {self.suffix}".rstrip()
        places = next((d for edge, d in self.decimals if abs(shown) >= edge), self.decimals[-1][1])
        return f"{shown:,.{places}f} {self.suffix}".rstrip()


UNITS: dict[str, Unit] = {
    "ms": Unit(scale=1.0, suffix="ms"),
    "bytes": Unit(scale=2.0**20, suffix="MiB", decimals=((0.0, 1),)),
    "instructions": Unit(scale=1e6, suffix="M instr"),
}
"""Printing of each stored unit; a unit not listed prints as ``{value:.4g} {unit}``."""


@dataclass(frozen=True)
class Metric:
    """One row of the metric table.

    Attributes:
        name: the stored name (``Result.metric``), at most 32 characters.
        unit: the stored unit (``ms``, ``bytes``, ``instructions``): a key of :data:`UNITS`.
        kind: how it is measured and judged (:class:`MetricKind`).
        description: one line for help texts and the API.
        threshold: the default relative threshold (0.07 = 7%; ``NIGHTBENCH_THRESHOLDS``
            overrides it per metric or benchmark).
        alerts: detection judges it and a regression in it is filed.
        higher_is_worse: the bad direction (every metric stored today is "lower is better").
        devices: the devices it is measured on.
    """

    name: str
    unit: str
    kind: MetricKind
    description: str
    threshold: float = 0.07
    alerts: bool = True
    higher_is_worse: bool = True
    devices: frozenset[str] = frozenset({"cpu", "cuda"})

    @property
    def rule(self) -> KindRule:
        """The rule of this metric's kind (:data:`KIND_RULES`)."""
        return KIND_RULES[self.kind]

    def format(self, value: float) -> str:
        """A value of this metric as printed (``12.41 ms``, ``1,234.5 MiB``, ``412.3 M instr``)."""
        return format_value(value, self.unit)


INSTRUCTIONS = "cpu_instructions"
"""The instruction-count metric, what a count pass measures (``suite/counting.py``)."""

METRIC_TABLE: tuple[Metric, ...] = (
    Metric(
        "latency",
        "ms",
        MetricKind.TIMED,
        "milliseconds per iteration (median of the timed iterations)",
    ),
    Metric(
        "gpu_peak_mem",
        "bytes",
        MetricKind.MEMORY,
        "peak GPU memory allocated by the process (torch.cuda.max_memory_allocated)",
        devices=frozenset({"cuda"}),
    ),
    Metric(
        "cpu_peak_mem",
        "bytes",
        MetricKind.MEMORY,
        "peak resident memory of the process above its level once the model was ready",
    ),
    Metric(
        INSTRUCTIONS,
        "instructions",
        MetricKind.COUNT,
        "instructions executed per step, counted by valgrind's callgrind around the steps only",
        devices=frozenset({"cpu"}),
    ),
    Metric("cpu_time", "ms", MetricKind.TIMED, "CPU time per iteration", alerts=False),
    Metric(
        "cpu_peak_mem_total",
        "bytes",
        MetricKind.MEMORY,
        "peak resident memory of the whole process",
        alerts=False,
    ),
    Metric(
        "mem_growth",
        "bytes",
        MetricKind.MEMORY,
        "memory the process kept growing by over the measured iterations (a leak suspect)",
        alerts=False,
        devices=frozenset({"cpu"}),
    ),
)

METRICS: dict[str, Metric] = {m.name: m for m in METRIC_TABLE}
"""The table by name."""

ALERT_METRICS: tuple[str, ...] = tuple(m.name for m in METRIC_TABLE if m.alerts)
"""The metrics detection judges and alerts on, in the table's order."""


def metric(name: str) -> Metric:
    """The row of metric ``name``.

    Raises:
        UnknownMetric: no such metric; the message names the metrics there are.
    """
    try:
        return METRICS[name]
    except KeyError:
        raise UnknownMetric(
            f"unknown metric {name!r}: one of {', '.join(sorted(METRICS))}"
        ) from None


def alerting(name: str) -> Metric:
    """The row of metric ``name``, which must be one detection judges.

    Raises:
        UnknownMetric: no such metric, or one that does not alert; the message names those
            that do.
    """
    row = METRICS.get(name)
    if row is None or not row.alerts:
        raise UnknownMetric(f"metric: must be one of {', '.join(ALERT_METRICS)}, got {name!r}")
    return row


def exact_levels(name: str) -> bool:
    """Whether metric ``name`` is judged by exact levels (peak memory; :class:`KindRule`);
    False for a name not in the table."""
    row = METRICS.get(name)
    return row is not None and row.rule.exact_levels


def host_bound(name: str) -> bool:
    """Whether the host's speed moves metric ``name`` (latency; :class:`KindRule`); False for a
    name not in the table."""
    row = METRICS.get(name)
    return row is not None and row.rule.host_bound


def bisect_once(name: str) -> bool:
    """Whether a bisection by metric ``name`` measures each build once and reuses its value
    (an exact count; :class:`KindRule`); False for a name not in the table."""
    row = METRICS.get(name)
    return row is not None and row.rule.bisect_once


def order(name: str) -> int:
    """Where metric ``name`` sorts in tables and charts: the table's order, unknown names last."""
    names = list(METRICS)
    return names.index(name) if name in METRICS else len(names)


def format_value(value: float | None, unit: str) -> str:
    """A stored value with its unit as printed: ``12.41 ms``, ``1,234.5 MiB``,
    ``412.3 M instr``; ``—`` for None; a unit not in :data:`UNITS` as ``{value:.4g} {unit}``."""
    if value is None:
        return "—"
    shape = UNITS.get(unit)
    if shape is None:
        return f"{value:,.4g} {unit}".rstrip()
    return shape.format(value)


def format_change(relative: float) -> str:
    """``+12.4%`` for a relative change of 0.124."""
    return f"{relative * 100:+.1f}%"
