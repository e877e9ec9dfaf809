"""Comparing two runs benchmark by benchmark: ratio of medians and significance."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu
from sqlalchemy.orm import Session

from service.models import Result
from service.runs.service import run_results

Key = tuple[str, str, str, str, str]  # model, mode, device, compiler, metric


@dataclass(frozen=True)
class Comparison:
    """One benchmark metric measured in both runs (values in ``unit``: ms or bytes)."""

    benchmark: str
    metric: str
    unit: str
    a_median: float
    b_median: float
    ratio: float | None
    a_samples: int
    b_samples: int
    p_value: float
    significant: bool
    verdict: str


@dataclass(frozen=True)
class RunComparison:
    comparisons: list[Comparison]
    only_in_a: list[str]
    only_in_b: list[str]
    errors: list[str]


def _key(r: Result) -> Key:
    return (r.model, r.mode, r.device, r.compiler, r.metric)


def _label(key: Key) -> str:
    model, mode, device, compiler, metric = key
    name = f"{model}:{mode}:{device}" + ("" if compiler == "eager" else f":{compiler}")
    return f"{name} {metric}"


def compare_samples(
    a: list[float], b: list[float], *, alpha: float, threshold: float,
) -> tuple[float | None, float, bool, str]:
    """Ratio of medians (b / a), two-sided Mann-Whitney U p-value, significance and verdict.

    Both metrics are higher-is-worse, so a significant ratio above ``1 + threshold`` is a
    ``regression`` and one below ``1 - threshold`` an ``improvement``; a significant change
    inside the threshold is ``unchanged``; otherwise ``not significant``.

    Method: Mann & Whitney (1947), as ``scipy.stats.mannwhitneyu`` (exact for small samples
    without ties, normal approximation with tie correction otherwise).

    Args:
        a, b: raw samples of the two runs, shapes (n,) and (m,), n, m >= 1.
        alpha: significance level (0 < alpha < 1).
        threshold: relative change that matters (0.07 = 7%).
    """
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma > 0 else None
    if np.ptp(np.r_[a, b]) == 0:
        p = 1.0  # identical constants: no evidence of a difference (scipy would divide by 0)
    else:
        p = float(mannwhitneyu(b, a, alternative="two-sided").pvalue)
    if math.isnan(p):
        p = 1.0
    significant = p < alpha
    if not significant:
        verdict = "not significant"
    elif ratio is not None and ratio > 1 + threshold:
        verdict = "regression"
    elif ratio is not None and ratio < 1 - threshold:
        verdict = "improvement"
    else:
        verdict = "unchanged"
    return ratio, p, significant, verdict


def compare_runs(
    session: Session, *, a: int, b: int, alpha: float, threshold_for: Callable[[str, str], float],
) -> RunComparison:
    """Compare every benchmark metric of run ``a`` with run ``b``.

    Args:
        a, b: run ids (both must exist; see ``service.runs.service.get_run``).
        alpha: significance level of the Mann-Whitney U test.
        threshold_for: ``(metric, "model:mode") -> relative threshold``.
    """
    ra = {_key(r): r for r in run_results(session, run_id=a)}
    rb = {_key(r): r for r in run_results(session, run_id=b)}
    out: list[Comparison] = []
    errors: list[str] = []
    for key in sorted(ra.keys() & rb.keys()):
        x, y = ra[key], rb[key]
        if x.error or y.error or not x.samples or not y.samples:
            errors.append(_label(key))
            continue
        ratio, p, significant, verdict = compare_samples(
            x.samples, y.samples, alpha=alpha, threshold=threshold_for(key[4], f"{key[0]}:{key[1]}"))
        out.append(Comparison(
            benchmark=_label(key).rsplit(" ", 1)[0], metric=key[4], unit=y.unit,
            a_median=float(np.median(x.samples)), b_median=float(np.median(y.samples)),
            ratio=ratio, a_samples=len(x.samples), b_samples=len(y.samples), p_value=p,
            significant=significant, verdict=verdict))
    return RunComparison(
        comparisons=out,
        only_in_a=[_label(k) for k in sorted(ra.keys() - rb.keys())],
        only_in_b=[_label(k) for k in sorted(rb.keys() - ra.keys())],
        errors=errors,
    )
