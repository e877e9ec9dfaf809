"""Regression detection: series in, verdicts out (pure: no database, no torch, no I/O).

One series' nights (:class:`Night`) judged online (:func:`assess_night`) or with a confirmation
re-run (:func:`confirm`), over the batch code path of :mod:`service.regressions.scan`. All
metrics are "higher is worse"; levels are compared on a log scale. Method, constants and their
sources: docs/detection.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.errors import DetectionInputError, UnknownMetric
from service.mann_whitney import Ties, mann_whitney_p
from service.metrics import alerting
from service.regressions.baseline import band, has_baseline, window_nights, window_noise
from service.regressions.document import detect_document
from service.regressions.robust import envelope
from service.regressions.rules import MODE_SAME, multimodal, night_clock
from service.regressions.scan import (
    DEFAULT_PARAMS,
    DetectorParams,
    Flag,
    detect_series,
    from_log,
    to_log,
)
from service.regressions.unstable import STABLE, UnstableRule

__all__ = [
    "VERDICTS",
    "Assessment",
    "DetectionInputError",
    "DetectorParams",
    "Flag",
    "Night",
    "assess_night",
    "confirm",
    "detect_document",
    "detect_series",
]

VERDICTS = ("regression", "improvement", "unchanged", "no_baseline")


@dataclass(frozen=True)
class Night:
    """One night of a series.

    Attributes:
        night: ordinal of the night (e.g. days since epoch); increasing along a history. A
            gap between ordinals is a missing night (a run's length counts it) unless every
            night of the history has a ``date``, which then counts instead.
        samples: that night's raw samples, or its per-process medians (ms, bytes); >= 1.
        expected: a maintainer marked the step starting at this night ``expected``: the
            baseline resets here.
        rerun: the samples come from a confirmation re-run of the previous night's build; it
            counts as one more night right after the night it re-ran.
        date: the calendar night, when known: reasons name it instead of the ordinal, and a
            run's length is counted in calendar nights (a night without a result counts).
    """

    night: int
    samples: tuple[float, ...]
    expected: bool = False
    rerun: bool = False
    date: datetime.date | None = None

    def label(self) -> str:
        """How a reason names this night: its date (``2026-11-09``), else ``night N``."""
        return self.date.isoformat() if self.date is not None else f"night {self.night}"


@dataclass(frozen=True)
class Assessment:
    """The verdict on one night of one series.

    Attributes:
        verdict: ``regression`` | ``improvement`` | ``unchanged`` | ``no_baseline``.
        metric: one detection judges (``service.metrics.ALERT_METRICS``).
        baseline: baseline level (same unit as the samples), None without a baseline.
        value: tonight's level (median of tonight's samples).
        change: ``value / baseline - 1`` (0.12 = +12%), None without a baseline (a baseline of
            0 bytes counts as 1 byte).
        p_value: one-sided Mann-Whitney U p-value for latency; None for peak memory.
        alertable: a regression worth alerting (after its confirmation when not
            ``confirmed``); False for improvements, ``no_baseline``, ``unchanged`` and
            unstable benchmarks (unless the change is beyond their noise: module docstring).
        reason: one short sentence for the report.
        baseline_lower: lower edge of the baseline band (for charts).
        baseline_upper: upper edge of the baseline band (for charts).
        confirmed: the change already persisted (an earlier night or a re-run): it is raised
            tonight. A ``regression`` that is not confirmed is a candidate that needs its
            confirmation re-run (``confirm``) or the next night.
        first_night: the first night at the new level (``Night.night``) when raised.
        step_change: relative change of the new level (median of the persisting nights)
            against the baseline, when raised.
        back_from: first night (``Night.night``) of a raised regression the series is back from.
    """

    verdict: str
    metric: str
    baseline: float | None
    value: float
    change: float | None
    p_value: float | None
    alertable: bool
    reason: str
    baseline_lower: float | None = None
    baseline_upper: float | None = None
    confirmed: bool = False
    first_night: int | None = None
    step_change: float | None = None
    back_from: int | None = None


# --------------------------------------------------------------------------------------------
# One series, night by night (the nightly service)


def _check_metric(metric: str) -> bool:
    """Whether ``metric`` is judged by exact levels (its kind's rule in the metric table).

    Raises:
        DetectionInputError: ``metric`` is not one detection judges.
    """
    try:
        return alerting(metric).rule.exact_levels
    except UnknownMetric as exc:
        raise DetectionInputError(str(exc)) from None


def _night_level(night: Night, field: str, memory: bool) -> float:
    if not isinstance(night, Night):
        raise DetectionInputError(f"{field}: expected a Night, got {type(night).__name__}")
    vals = np.asarray(night.samples, dtype=float)
    if vals.ndim != 1 or vals.size == 0:
        raise DetectionInputError(f"{field}.samples: night {night.night} has no samples")
    if not np.all(np.isfinite(vals)) or np.any(vals < 0 if memory else vals <= 0):
        raise DetectionInputError(
            f"{field}.samples: night {night.night} has a sample that is not "
            + ("a finite number of bytes >= 0" if memory else "a finite value > 0")
        )
    return float(np.median(vals))


def _replay(
    nights: Sequence[Night], names: Sequence[str], memory: bool, threshold: float, p: DetectorParams
):
    """Online flags over one series of nights (re-runs count as nights; a run's length is
    counted by the nights' dates when every night has one, else by their ordinals)."""
    lv = np.array([[_night_level(n, name, memory) for n, name in zip(nights, names, strict=True)]])
    exp, again = (np.array([[getattr(n, a) for n in nights]]) for a in ("expected", "rerun"))
    return detect_series(
        lv,
        memory=memory,
        threshold=threshold,
        expected=exp,
        online=True,
        params=p,
        rerun=again,
        nights=_calendar(nights)[None, :],
    ), lv[0]


def _calendar(nights: Sequence[Night]) -> np.ndarray:
    """The night each of ``nights`` was measured on, shape (n,): their dates' ordinals when
    every night has one, else their ordinals, a re-run standing on its night's
    (:func:`service.regressions.rules.night_clock`, which raises DetectionInputError for
    ordinals that decrease)."""
    dated = all(n.date is not None for n in nights)
    t = np.array(
        [[n.date.toordinal() if dated and n.date else n.night for n in nights]], dtype=float
    )
    again = np.array([[n.rerun for n in nights]])
    return night_clock(
        np.ones_like(t), np.arange(t.shape[1])[None, :], np.array([t.shape[1]]), again, t
    )[0]


def _fmt_change(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _fmt_level(value: float, metric: str) -> str:
    """A level as a reason prints it, in its metric's unit (``service.metrics``)."""
    return alerting(metric).format(value)


def _relative(value: float, base: float) -> float:
    """``value / base - 1``; a baseline of 0 (bytes) counts as 1 byte so the change is finite."""
    return (value - base) / max(base, 1.0) if base <= 0 else value / base - 1


def _run_reaches(y: np.ndarray, thr: float, p: DetectorParams) -> bool:
    """Whether a run of 2 to ``p.max_run`` nights ending at ``y[-1]`` reached the threshold.

    ``y`` is one series' log levels since its last reset, tonight last. A run counts when each
    of its nights stands at least half the threshold above the median of the (up to
    ``p.window``, at least ``p.min_baseline``) nights before the run, and the run's median at
    least the threshold above it: a step whose first nights came out at +12% and +5% gets its
    confirmation re-run, a series wandering at +5% never does.
    """
    n = len(y)
    for m in range(2, p.max_run + 1):
        first = n - m
        kb = min(first, p.window)
        if kb < p.min_baseline:
            break
        base = float(np.median(y[first - kb : first]))
        run = y[first:] - base
        if np.all(run >= thr / 2) and float(np.median(run)) >= thr:
            return True
    return False


def _assess(
    nights: Sequence[Night],
    *,
    metric: str,
    threshold: float,
    dark: UnstableRule,
    p: DetectorParams,
    raise_at: set[int],
    names: Sequence[str],
    confirming: bool = False,
) -> Assessment:
    memory = _check_metric(metric)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0 < threshold < 10
    ):
        raise DetectionInputError(f"threshold: must be between 0 and 10, got {threshold!r}")
    flags, lv = _replay(nights, names, memory, threshold, p)
    value = float(lv[-1])
    raised = [f for f in flags if f.raised_night in raise_at]
    if raised:
        return _raised(raised[-1], nights, value, metric=metric, memory=memory, dark=dark)
    # Not raised tonight: compare tonight with the current baseline (since the last reset).
    start = _baseline_start(nights, flags)
    k = window_nights(len(nights) - 1 - start, p)
    if not has_baseline(k, p):
        return _no_baseline(nights, flags, start, k, metric=metric, value=value, p=p)
    out = _against_baseline(
        lv[start:],
        k,
        metric=metric,
        memory=memory,
        threshold=threshold,
        dark=dark,
        p=p,
        confirming=confirming,
    )
    back = [f for f in flags if f.resumed_night == len(nights) - 1]
    if back:  # tonight is the last of the nights the series came back on
        f = back[-1]
        up = f.direction == "regression"
        out = dataclasses.replace(
            out,
            back_from=nights[f.night].night if up else None,
            reason=(
                f"{out.reason} Back from the {f.direction} of {_fmt_change(f.change)} raised on "
                f"{nights[f.raised_night].label()} for {p.return_nights} nights: it did not "
                "persist, and the baseline from before it resumes."
            ),
        )
    return out


def _raised(
    f: Flag, nights: Sequence[Night], value: float, *, metric: str, memory: bool, dark: UnstableRule
) -> Assessment:
    """The assessment of a change raised tonight (a persistent step or a drift)."""
    base = f.baseline
    regression = f.direction == "regression"
    what = "drift" if f.kind == "drift" else "step"
    p_txt = "" if f.p_value is None else f", p={f.p_value:.2g}"
    reason = (
        f"{'Regression' if regression else 'Improvement'} ({what}) of "
        f"{_fmt_change(f.change)} against a baseline of {_fmt_level(base, metric)} "
        f"since {nights[f.night].label()}, {_persisting(nights, f.night)}{p_txt}."
    )
    loud, why = dark.judge(f.change) if regression else (False, "")
    return Assessment(
        verdict=f.direction,
        metric=metric,
        baseline=base,
        value=value,
        change=_relative(value, base),
        p_value=f.p_value,
        alertable=loud,
        reason=reason + why,
        confirmed=True,
        first_night=nights[f.night].night,
        step_change=f.change,
    )


def _persisting(nights: Sequence[Night], first: int) -> str:
    """How long a step raised tonight has lasted since ``nights[first]``: calendar nights (a
    night without a result counts, a re-run adds none), and its results when they differ."""
    clock = _calendar(nights)
    span, results = int(clock[-1] - clock[first]) + 1, len(nights) - first
    text = f"persisting {span} night{'s' if span != 1 else ''}"
    return text + (f" ({results} result{'s' if results != 1 else ''})" if results != span else "")


def _baseline_start(nights: Sequence[Night], flags: Sequence[Flag]) -> int:
    """Index of the night the current baseline starts at: the last reset (marked expected, or
    the first night of a raised step the series did not come back from: after one it came
    back from, ``Flag.resumed_night``, the baseline from before it resumed)."""
    start = max((i for i, n in enumerate(nights) if n.expected), default=0)
    return max([start, *(f.night for f in flags if f.resumed_night is None)])


def _no_baseline(
    nights: Sequence[Night],
    flags: Sequence[Flag],
    start: int,
    k: int,
    *,
    metric: str,
    value: float,
    p: DetectorParams,
) -> Assessment:
    """``no_baseline``: fewer than ``p.min_baseline`` nights since the last reset, and why."""
    if start == 0:
        why = "the series is new"
    elif nights[start].expected and not any(f.night == start for f in flags):
        why = f"the baseline restarted at {nights[start].label()}, marked expected"
    else:
        why = f"the baseline restarted at {nights[start].label()}, after a raised step"
    return Assessment(
        verdict="no_baseline",
        metric=metric,
        baseline=None,
        value=value,
        change=None,
        p_value=None,
        alertable=False,
        reason=f"No baseline: {why}; {k} of {p.min_baseline} earlier nights.",
    )


def _against_baseline(
    seg: np.ndarray,
    k: int,
    *,
    metric: str,
    memory: bool,
    threshold: float,
    dark: UnstableRule,
    p: DetectorParams,
    confirming: bool,
) -> Assessment:
    """Tonight (``seg[-1]``) against the median of the ``k`` nights before it: a candidate,
    unchanged, or (for a confirmation re-run) not reproduced."""
    mem = np.array([memory])
    y = to_log(seg[None, :], mem)
    j = len(seg) - 1
    window = y[0, j - k : j]
    base_log = float(np.median(window))
    noise = float(window_noise(y, np.array([0]), np.array([j - k]), np.array([k]), p, mem)[0])
    base = float(np.median(seg[j - k : j]))  # exact bytes for memory
    value = float(seg[j])
    est = float(y[0, j]) - base_log
    thr = math.log1p(threshold)
    lower, upper = (float(edge) for edge in band(base_log, noise, memory))
    change = _relative(value, base)
    pval = None
    if memory:
        modes = bool(multimodal(window[None, :])[0])
        noise = MODE_SAME if modes else noise  # the jitter inside a level (``scan._judge``)
        env = envelope(window[None, :], np.array([max(3 * noise, 1e-12)]), upper=True)[0]
        # A level the baseline took even once is one of its modes (``rules.significant``):
        # its re-run could never raise it.
        seen = modes and bool(np.any(np.abs(window - y[0, j]) <= 0.25 * abs(est)))
        up_candidate = est >= thr and y[0, j] > env and not seen
        upper = float(from_log(np.array(env), memory))
    else:
        pval = mann_whitney_p(
            [float(y[0, j])], window.tolist(), alternative="greater", ties=Ties.HALF
        )
        # A candidate reaches the threshold itself, tonight alone or with the nights just before
        # it: a change below it can never be raised online (``scan._judge``), so its
        # confirmation re-run would be wasted.
        up_candidate = est >= thr or _run_reaches(y[0], thr, p)
    against = f"{_fmt_change(change)} against a baseline of {_fmt_level(base, metric)}"
    verdict, alertable = "unchanged", False
    if confirming:
        reason = (
            f"Not reproduced: the re-run is at {against}, which does not confirm a "
            "persistent change."
        )
    elif up_candidate:
        (alertable, why), verdict = dark.judge(change), "regression"
        reason = (
            f"Candidate regression: {against} over {k} nights; needs its confirmation "
            f"re-run or the next night.{why}"
        )
    else:
        reason = f"Unchanged: {against} over {k} nights."
    return Assessment(
        verdict=verdict,
        metric=metric,
        baseline=base,
        value=value,
        change=change,
        p_value=pval,
        alertable=alertable,
        reason=reason,
        baseline_lower=lower,
        baseline_upper=upper,
    )


def assess_night(
    history: Sequence[Night],
    tonight: Night,
    *,
    metric: str,
    threshold: float = 0.07,
    unstable: bool = False,
    params: DetectorParams = DEFAULT_PARAMS,
    unstable_spread: float | None = None,
) -> Assessment:
    """Assess tonight's night of one series against its baseline.

    The online detector is replayed over ``history + [tonight]`` (so steps raised on earlier
    nights reset the baseline exactly as in ``detect_document(online=True)``), then:

    * a change raised tonight (it persisted: the previous night, or a re-run in the history)
      is a ``confirmed`` ``regression`` or ``improvement``;
    * otherwise, a change that reaches the threshold itself is a candidate ``regression``
      (``confirmed=False``, alertable): tonight alone at least the threshold above the
      baseline, or a run of 2 to ``max_run`` nights ending tonight whose median is (each night
      at least half of it). It needs ``confirm`` on a re-run of the same build, or the next
      night. A night below the threshold is never a candidate (it could never be raised, so
      its re-run would be wasted); a lone low night is ``unchanged`` until it persists;
    * fewer than ``params.min_baseline`` nights since the last reset give ``no_baseline``.

    Args:
        history: earlier nights of the same series, oldest first (may be empty). Confirmation
            re-runs may be included (``rerun=True``) right after the night they re-ran.
        tonight: tonight's night.
        metric: one detection judges (``service.metrics.ALERT_METRICS``).
        threshold: relative threshold (0.07 = 7%).
        unstable: the benchmark is marked unstable: shown, alerted only beyond its noise.
        params: detector constants.
        unstable_spread: the spread of that verdict (fraction; None: never alerted; UnstableRule).

    Returns:
        The Assessment of tonight.

    Raises:
        DetectionInputError: unknown metric, threshold outside (0, 10), a night without samples
            or with a non-positive latency / negative memory sample.
    """
    nights = [*history, tonight]
    names = [f"history[{i}]" for i in range(len(history))] + ["tonight"]
    dark = UnstableRule(unstable, unstable_spread, threshold, params.unstable_beyond)
    return _assess(
        nights,
        metric=metric,
        threshold=threshold,
        dark=dark,
        p=params,
        raise_at={len(nights) - 1},
        names=names,
    )


def confirm(
    history: Sequence[Night],
    tonight: Night,
    rerun: Night,
    *,
    metric: str,
    threshold: float = 0.07,
    params: DetectorParams = DEFAULT_PARAMS,
) -> Assessment:
    """Judge a confirmation re-run of tonight's build.

    The re-run counts as one more night right after tonight: the regression persists only if
    the run of nights ending with the re-run is raised by the same rule as ``assess_night``
    (beyond the threshold, significant, every night of the run closer to the new level). A
    regression already raised tonight from the previous night stays raised.

    Args:
        history: earlier nights, oldest first.
        tonight: the night whose candidate regression is being confirmed.
        rerun: the re-run's samples (its ``night`` ordinal is not used).
        metric: one detection judges (``service.metrics.ALERT_METRICS``).
        threshold: relative threshold (0.07 = 7%).
        params: detector constants.

    Returns:
        The re-run's Assessment: a ``confirmed`` ``regression`` when it reproduces, else
        ``unchanged`` (or another verdict) with the reason.

    Raises:
        DetectionInputError: as for ``assess_night``.
    """
    again = Night(tonight.night, tuple(rerun.samples), rerun=True, date=tonight.date)
    nights = [*history, tonight, again]
    names = [f"history[{i}]" for i in range(len(history))] + ["tonight", "rerun"]
    return _assess(
        nights,
        metric=metric,
        threshold=threshold,
        dark=STABLE,
        p=params,
        raise_at={len(nights) - 2, len(nights) - 1},
        names=names,
        confirming=True,
    )
