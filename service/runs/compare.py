"""Comparing two runs benchmark by benchmark, by process: ratio of medians and significance.

The replicate is a process, not an iteration. A benchmark's iterations in one process share
that process's allocator state, page layout and frequency: the same build varies by several per
cent from process to process, far more than its iterations vary inside one. A test on
iterations treats one process as many and calls that spread a change (pseudo-replication).
So each process contributes one value, the median of its samples (the one value of a memory
metric), and the test compares those: a run's processes are its own result and those of its
confirmation runs (runs whose ``parent_run_id`` is it). With too few processes on a side for
the test to reach ``alpha`` at all, the verdict says so instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.mann_whitney import mann_whitney_p
from service.models import Result, Run, RunKind
from service.runs.service import run_results
from service.series import is_paired_round

NOT_ENOUGH = "not enough processes"

Key = tuple[str, str, str, str, str]  # model, mode, device, compiler, metric


@dataclass(frozen=True)
class Comparison:
    """One benchmark metric measured in both runs (values in ``unit``: ms or bytes).

    ``a_median`` / ``b_median`` are the medians of the per-process medians; ``p_value`` is None
    when a side has too few processes for the test (verdict ``not enough processes``).
    """

    benchmark: str
    metric: str
    unit: str
    a_median: float
    b_median: float
    ratio: float | None
    difference: float
    a_processes: int
    b_processes: int
    a_samples: int
    b_samples: int
    p_value: float | None
    significant: bool
    verdict: str


@dataclass(frozen=True)
class RunComparison:
    """Two runs compared: the per-benchmark comparisons and what only one side measured."""

    comparisons: list[Comparison]
    only_in_a: list[str]
    only_in_b: list[str]
    errors: list[str]


def _key(r: Result) -> Key:
    return (r.model, r.mode, r.device, r.compiler, r.metric)


def _label(key: Key) -> str:
    model, mode, device, compiler, metric = key
    name = benchmark_name(model, mode, device, compiler)
    return f"{name} {metric}"


def smallest_p_value(n: int, m: int) -> float:
    """The smallest two-sided p-value an exact Mann-Whitney U test can give with n and m values.

    Reached when every value of one side lies above every value of the other: 2 / C(n+m, n).
    1 vs 1 gives 1.0, 3 vs 3 gives 0.1, 4 vs 4 gives 0.029, 5 vs 5 gives 0.0079.

    Raises:
        ValueError: n or m below 1.
    """
    if n < 1 or m < 1:
        raise ValueError(f"each side needs at least one value, got {n} and {m}")
    return min(1.0, 2 / math.comb(n + m, n))


GROWTH_METRICS = frozenset({"mem_growth"})
"""Metrics that are a signed change in bytes (growth over a process's timed loop, often near
0 or below it): a ratio of two such values means nothing, so they are compared by difference."""
GROWTH_MIN_BYTES = 8 * 1024 * 1024
"""The growth difference that matters: the leak rule's least sustained growth on CPU
(``suite.process_memory.LEAK_MIN_BYTES``)."""


def compare_processes(
    a: list[float],
    b: list[float],
    *,
    alpha: float,
    threshold: float,
    min_difference: float | None = None,
) -> tuple[float | None, float | None, bool, str]:
    """Ratio of medians (b / a), two-sided Mann-Whitney U p-value, significance and verdict,
    with one value per process on each side (the process's median; ms or bytes).

    Both metrics are higher-is-worse, so a significant ratio above ``1 + threshold`` is a
    ``regression`` and one below ``1 - threshold`` an ``improvement``; a significant change
    inside the threshold is ``unchanged``; otherwise ``not significant``. When the sides are
    too small for any outcome to reach ``alpha`` (:func:`smallest_p_value`), the verdict is
    ``not enough processes`` and the p-value None: one process per side can never say.

    Method: Mann & Whitney (1947), :func:`service.mann_whitney.mann_whitney_p` (exact for small
    samples, ties included; normal approximation with tie correction for large ones), on
    per-process medians as the replicates (Kalibera & Jones, "Rigorous benchmarking in
    reasonable time", 2013: the process is the unit of repetition whose variation matters).

    Args:
        a: per-process values of the first run, shape (n,), n >= 1.
        b: per-process values of the second run, shape (m,), m >= 1.
        alpha: significance level (0 < alpha < 1).
        threshold: relative change that matters (0.07 = 7%).
        min_difference: for a signed metric (``GROWTH_METRICS``), the absolute difference
            ``median(b) - median(a)`` that matters, in the values' unit; the ratio is then None
            and ``threshold`` is not used.

    Raises:
        ValueError: an empty side.
    """
    if not a or not b:
        raise ValueError(f"each side needs at least one process, got {len(a)} and {len(b)}")
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma > 0 and min_difference is None else None
    worse = (
        (mb - ma >= min_difference)
        if min_difference is not None
        else (ratio is not None and ratio > 1 + threshold)
    )
    better = (
        (ma - mb >= min_difference)
        if min_difference is not None
        else (ratio is not None and ratio < 1 - threshold)
    )
    if smallest_p_value(len(a), len(b)) >= alpha:
        return ratio, None, False, NOT_ENOUGH
    if np.ptp(np.r_[a, b]) == 0:
        p = 1.0  # identical constants: no evidence of a difference (scipy would divide by 0)
    else:
        p = mann_whitney_p(b, a)
    if math.isnan(p):
        p = 1.0
    significant = p < alpha
    if not significant:
        verdict = "not significant"
    elif worse:
        verdict = "regression"
    elif better:
        verdict = "improvement"
    else:
        verdict = "unchanged"
    return ratio, p, significant, verdict


def run_processes(session: Session, *, run_id: int) -> dict[Key, list[Result]]:
    """The results of run ``run_id`` and of every run measuring its build for it (its
    confirmation runs, replicate runs and rounds, and the rounds of its confirmation runs, not
    their paired rounds, which measure the previous night's build), by benchmark metric: one
    result per process (errors included)."""
    children = list(
        session.scalars(select(Run.id).where(Run.parent_run_id == run_id).order_by(Run.id))
    )
    rows = (
        list(
            session.execute(
                select(Run.id, Run.options)
                .where(Run.parent_run_id.in_(children), Run.kind == RunKind.REPLICATE)
                .order_by(Run.id)
            )
        )
        if children
        else []
    )
    grandchildren = [rid for rid, options in rows if not is_paired_round(options)]
    out: dict[Key, list[Result]] = {}
    for rid in (run_id, *children, *grandchildren):
        for r in run_results(session, run_id=rid):
            out.setdefault(_key(r), []).append(r)
    return out


def compare_runs(
    session: Session,
    *,
    a: int,
    b: int,
    alpha: float,
    threshold_for: Callable[[str, str], float],
) -> RunComparison:
    """Compare every benchmark metric of run ``a`` with run ``b``, process by process.

    A benchmark metric is compared on the processes that measured it without an error; one
    whose every process failed on a side is listed in ``errors``.

    Args:
        session: an open database session.
        a: id of the first run (must exist; see ``service.runs.service.get_run``).
        b: id of the second run (must exist).
        alpha: significance level of the Mann-Whitney U test.
        threshold_for: ``(metric, "model:mode") -> relative threshold``.
    """
    ra, rb = run_processes(session, run_id=a), run_processes(session, run_id=b)
    out: list[Comparison] = []
    errors: list[str] = []
    for key in sorted(ra.keys() & rb.keys()):
        xs = [r for r in ra[key] if not r.error and r.samples]
        ys = [r for r in rb[key] if not r.error and r.samples]
        if not xs or not ys:
            errors.append(_label(key))
            continue
        pa = [float(np.median(r.samples)) for r in xs]
        pb = [float(np.median(r.samples)) for r in ys]
        ratio, p, significant, verdict = compare_processes(
            pa,
            pb,
            alpha=alpha,
            threshold=threshold_for(key[4], f"{key[0]}:{key[1]}"),
            min_difference=GROWTH_MIN_BYTES if key[4] in GROWTH_METRICS else None,
        )
        out.append(
            Comparison(
                benchmark=_label(key).rsplit(" ", 1)[0],
                metric=key[4],
                unit=ys[0].unit,
                a_median=float(np.median(pa)),
                b_median=float(np.median(pb)),
                ratio=ratio,
                difference=float(np.median(pb) - np.median(pa)),
                a_processes=len(pa),
                b_processes=len(pb),
                a_samples=sum(len(r.samples) for r in xs),
                b_samples=sum(len(r.samples) for r in ys),
                p_value=p,
                significant=significant,
                verdict=verdict,
            )
        )
    return RunComparison(
        comparisons=out,
        only_in_a=[_label(k) for k in sorted(ra.keys() - rb.keys())],
        only_in_b=[_label(k) for k in sorted(rb.keys() - ra.keys())],
        errors=errors,
    )
