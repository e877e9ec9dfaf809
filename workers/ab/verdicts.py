"""Judging an A/B: one row per benchmark and metric, base against head.

Each side's replicates are processes (Kalibera & Jones 2013): latency and peak memory give one
value per suite process (the median of its timed iterations; the process's peak), measured
interleaved with the other side's. A counted metric (``cpu_instructions``) is one valgrind
process a side whose steps are the replicates, as a count bisection's probes are
(:mod:`workers.bisect.counts`): counts do not stray between processes the way latency does.

A row's figures:

- ``ratio``: head's median over base's (1.10: head takes 10% more);
- ``interval``: the Hodges–Lehmann estimate of the change and its distribution-free
  ``1 - 2 * INTERVAL_ALPHA`` interval (:func:`workers.bisect.verdicts.shift_interval`;
  Hollander, Wolfe & Chicken 2014, §4.3), as ratios;
- ``p_value``: the two-sided Mann–Whitney U test over the replicates
  (:func:`service.runs.compare.compare_processes`, exact for small sides, ties included);
- ``verdict``: ``regression`` when significant at ``alpha`` and the ratio is above
  ``1 + threshold`` (the metric's threshold, 7% unless set otherwise), ``improvement`` below
  ``1 - threshold``, ``unchanged`` when significant inside it, ``not significant``, ``not
  enough processes`` when the sides cannot reach ``alpha``; and when a side could not be
  measured, ``fails on head`` (head broke the benchmark: flagged, but never called a
  regression), ``fails on base`` (nothing to compare with) or ``fails on both``.

A row left unsure (its estimate past the threshold, its test short of ``alpha``: a process or
two disturbed by a busy host) is measured again with as many processes more before it is
judged for good (:func:`workers.ab.run.run_ab`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from service.metrics import METRICS
from service.runs.compare import compare_processes
from workers.bisect.verdicts import shift_interval

AB_ALPHA = 0.01
"""A row's significance level. With six processes a side the exact test's smallest p is 0.002,
so a change seen in every pair is significant, one seen in most is not."""
INTERVAL_ALPHA = 0.025
"""Each bound's one-sided error rate: the interval covers with 95%."""

REGRESSION = "regression"
IMPROVEMENT = "improvement"
FAILS_ON_HEAD = "fails on head"
FAILS_ON_BASE = "fails on base"
FAILS_ON_BOTH = "fails on both"
FLAGGED = frozenset({REGRESSION, FAILS_ON_HEAD})
"""Verdicts that fail the check: a regression, or a benchmark the head broke."""


@dataclass(frozen=True)
class Side:
    """What one side (base or head) measured of one benchmark metric.

    Attributes:
        values: the replicates: per process the median (ms) or the peak (bytes), or per counted
            step the instructions.
        samples: timed iterations behind ``values`` in all (== ``len(values)`` for memory and
            counts).
        error: why the side could not be measured (then ``values`` may be empty).
    """

    values: tuple[float, ...] = ()
    samples: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ABRow:
    """One benchmark metric judged (values in the metric's unit: ms, bytes, instructions).

    ``base`` / ``head`` are the medians of the sides' replicates (None for a side that failed);
    ``low`` / ``high`` bound the ratio (None when a side failed or has a single replicate).
    """

    benchmark: str
    metric: str
    unit: str
    base: float | None
    head: float | None
    ratio: float | None
    low: float | None
    high: float | None
    p_value: float | None
    verdict: str
    threshold: float
    base_replicates: int
    head_replicates: int
    error: str | None = None

    @property
    def flagged(self) -> bool:
        """The row fails the check (:data:`FLAGGED`)."""
        return self.verdict in FLAGGED

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (``flagged`` included)."""
        return {**asdict(self), "flagged": self.flagged}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ABRow:
        """The row :meth:`as_dict` wrote (``flagged`` is derived, not read)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**fields)


def judge(
    benchmark: str,
    metric: str,
    base: Side,
    head: Side,
    *,
    threshold: float,
    alpha: float = AB_ALPHA,
) -> ABRow:
    """The verdict of one benchmark metric, base against head (see the module docstring).

    Args:
        benchmark: ``model:mode:device[:compiler]`` or a command's name.
        metric: a metric of :data:`service.metrics.METRICS` (its unit names the values').
        base: the base's replicates (one value per process, or per counted step).
        head: the head's replicates, the same.
        threshold: the relative change that matters (0.07 = 7%).
        alpha: the significance level of the rank test.

    Returns:
        The :class:`ABRow`.

    Raises:
        KeyError: ``metric`` is not a metric of the table.
    """
    unit = METRICS[metric].unit
    failed = [side.error for side in (base, head) if side.error or not side.values]
    if failed:
        verdict = (
            FAILS_ON_BOTH
            if len(failed) == 2
            else (FAILS_ON_HEAD if head.error or not head.values else FAILS_ON_BASE)
        )
        return ABRow(
            benchmark,
            metric,
            unit,
            _median(base.values),
            _median(head.values),
            None,
            None,
            None,
            None,
            verdict,
            threshold,
            len(base.values),
            len(head.values),
            error=head.error or base.error or "no value measured",
        )
    a, b = list(base.values), list(head.values)
    ratio, p, _significant, verdict = compare_processes(a, b, alpha=alpha, threshold=threshold)
    low = high = None
    if len(a) > 1 and len(b) > 1 and min(a) > 0 and min(b) > 0:
        shift = shift_interval(a, b, alpha=INTERVAL_ALPHA)
        low, high = 1 + shift.low, 1 + shift.high
        low = low if math.isfinite(low) and low > 0 else None
        high = high if math.isfinite(high) else None
    return ABRow(
        benchmark,
        metric,
        unit,
        _median(a),
        _median(b),
        ratio,
        low,
        high,
        p,
        verdict,
        threshold,
        len(a),
        len(b),
    )


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def order_rows(rows: Iterable[ABRow]) -> list[ABRow]:
    """Flagged rows first, then by the size of the change (largest first), then by name."""

    def size(row: ABRow) -> float:
        if row.ratio is None or row.ratio <= 0:
            return -1.0
        return abs(math.log(row.ratio))

    return sorted(rows, key=lambda r: (not r.flagged, -size(r), r.benchmark, r.metric))


def judge_all(
    measured: Mapping[str, Mapping[str, tuple[Side, Side]]],
    *,
    threshold_for: Callable[[str, str], float],
    alpha: float = AB_ALPHA,
) -> list[ABRow]:
    """Every benchmark metric measured, judged and ordered (:func:`order_rows`).

    Args:
        measured: benchmark -> metric -> (base side, head side).
        threshold_for: ``(metric, benchmark) -> threshold`` (the settings' ``threshold_for``).
        alpha: the rank test's significance level.
    """
    rows = [
        judge(
            benchmark,
            metric,
            base,
            head,
            threshold=threshold_for(metric, benchmark),
            alpha=alpha,
        )
        for benchmark, metrics in measured.items()
        for metric, (base, head) in metrics.items()
    ]
    return order_rows(rows)
