"""Regression detection: series in, verdicts out (pure: no database, no torch, no I/O).

A *series* is the history of one metric of one benchmark (see the glossary in DESIGN.md). Each
night contributes one *level*: the median of that night's raw samples. All three metrics
(``latency`` in ms, ``gpu_peak_mem`` and ``cpu_peak_mem`` in bytes) are "higher is worse".
Levels are compared on a log scale, so a change is relative and symmetric
(``log(1.07)`` up is a regression of +7%, the same distance down an improvement of -6.5%).

The rule (online, night by night; ``DetectorParams`` holds every constant):

* **Baseline.** The median of the levels of up to ``window`` (28) earlier nights of the series
  since its last reset, never a single earlier run; the median ignores outlier nights. A
  reset happens at a night a maintainer marked ``expected`` and at the first night of a step
  already raised, so one step is raised once. Fewer than ``min_baseline`` (4) earlier nights:
  ``no_baseline``, never an alert (new benchmarks, new series after an environment change).
* **Noise.** The night-to-night noise of the series is the median absolute successive
  difference of the baseline levels, scaled to a standard deviation (1.4826 / sqrt 2): it
  ignores outlier nights, steps and slow drift (a robust form of von Neumann's successive
  differences; the 1.4826 consistency factor of Rousseeuw & Croux, JASA 1993).
* **Magnitude.** With ``se`` the standard error of the change estimate (from the noise, the
  number of nights on each side and the pi/2 variance factor of a median), a change ``d``
  counts when ``d >= max(thr, thr/2 + z_low*se)`` (z_low = 2.576): at least the threshold,
  and clearly above half of it whatever the noise. On a quiet series (``se`` ~ 0, e.g. peak
  memory in exact bytes) this is exactly ``d >= thr``; on a noisy one it waits for more
  nights instead of guessing. Offline, where a change point is located with both sides
  known, a change may fall short of the threshold by ``z*se`` (z = 1.645) when the noise
  cannot tell it from the threshold: ``d >= max(thr - z*se, thr/2 + z_low*se)``.
* **Persistence.** A flag needs a *run* of 2 to ``max_run`` (7) consecutive nights ending
  tonight (confirmation re-runs count as nights), each closer to the new level than to the
  baseline (from five nights on, all but the run's lowest quarter); its first night is the
  first night at the new level. A one-night blip never forms such a run. The run may reach
  back a week, so that on a noisy host a step the first nights could not yet tell from the
  noise is still judged against the baseline from before it as evidence accumulates (with
  3, a step whose first re-run came out low had its own nights in the baseline by the third
  night and was never raised).
* **A new level.** Fewer than ``visited`` (3) baseline nights may reach to within a quarter of
  the change of the run's lowest night: a bimodal benchmark's nights at its other mode, which
  the baseline visits regularly, are not a step. A short baseline (under 12 nights) allows
  fewer (none under 8), so a series settling after its first nights is not a step either.
* **Significance.** Latency: the run's levels against the baseline's levels with the exact
  one-sided Mann-Whitney U test (Mann & Whitney, Ann. Math. Statist. 18(1), 1947; exact null
  distribution by their recurrence, identical to ``scipy.stats.mannwhitneyu(method="exact")``)
  at ``alpha`` (0.01), on night levels, not on pooled samples (nights, not iterations, are the
  independent units). Rank-based, it is indifferent to heavy tails. While the baseline has
  too few nights for ranks to reach ``alpha`` (a young series, or just after a reset), a
  one-sided t-test of the change over its robust standard error (``scipy.stats.t``, k - 1
  degrees of freedom; Student, Biometrika 1908) stands in. Peak memory is nearly
  deterministic, where any p-value would only count nights, so it gets no p-value: every
  night of the run must stand beyond the baseline's *recurring* envelope (the highest level
  seen on at least two baseline nights), so a bimodal allocation is not a step and one
  outlier night does not hide one.
* **Slow drift.** Besides the recent window, the median of the last ``drift_nights`` (7)
  nights is compared with the *anchor*: the first ``window`` nights after the last reset,
  once there are 2 * ``window`` nights since it. A drift too slow to show between
  neighbouring windows is raised once it has added up to the threshold plus ``z * se`` since
  the level last accepted (a drift is not urgent; without the margin a grey-zone step judged
  night after night would cross the threshold by chance sooner or later).
* **Verdicts.** Improvements are found by the same rule downwards, reported, never alerted.
  Benchmarks marked unstable are assessed and shown, never alerted. Environment changes
  (another GPU, driver or ``benchmark_version``) are not seen here: they start another series
  (another ``series_key``), whose first nights have no baseline.

Offline (``detect_series(..., online=False)``, ``nightbench detect`` without ``--online``) sees
the whole series and works as a change-point detector: at every night it compares the
``window`` nights before with the ``window`` nights from it on (the moving two-window method of
Mozilla Perfherder's performance alerts, ``treeherder/perf/alerts``), keeps the local maxima of
the change (non-maximum suppression over half a window) that pass the same magnitude, new
level and significance tests with the first two nights after it at the new level, places each
change point by a robust two-level step fit near the peak (cf. asv's ``step_detect``), then
checks each stretch between change points for drift (its first window against its last), in
the manner of E-Divisive's segment-wise testing (Matteson & James, JASA 2014). Its
``raised_night`` is the last night of the series.

Everything runs on ``(series, nights)`` numpy matrices, one code path for one series
(``assess_night``), a document (``detect_document``) and a benchmark of 100,000 series.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.regressions.robust import DetectionInputError, envelope, mann_whitney_greater
from service.regressions.scan import (
    DEFAULT_PARAMS,
    MEDIAN_VAR,
    DetectorParams,
    Flag,
    detect_series,
    from_log,
    to_log,
    window_noise,
)

__all__ = [
    "METRICS", "MEMORY_METRICS", "VERDICTS", "Assessment", "DetectionInputError",
    "DetectorParams", "Flag", "Night", "assess_night", "confirm", "detect_document",
    "detect_series", "mann_whitney_greater",
]

METRICS = ("latency", "gpu_peak_mem", "cpu_peak_mem")
MEMORY_METRICS = ("gpu_peak_mem", "cpu_peak_mem")
VERDICTS = ("regression", "improvement", "unchanged", "no_baseline")


@dataclass(frozen=True)
class Night:
    """One night of a series.

    Attributes:
        night: ordinal of the night (e.g. days since epoch); increasing along a history.
        samples: raw samples of that night (ms for latency, bytes for peak memory); >= 1.
        expected: a maintainer marked the step starting at this night ``expected``: the
            baseline resets here.
        rerun: the samples come from a confirmation re-run of the previous night's build; it
            counts as one more night right after the night it re-ran.
    """

    night: int
    samples: tuple[float, ...]
    expected: bool = False
    rerun: bool = False


@dataclass(frozen=True)
class Assessment:
    """The verdict on one night of one series.

    Attributes:
        verdict: ``regression`` | ``improvement`` | ``unchanged`` | ``no_baseline``.
        metric: ``latency`` | ``gpu_peak_mem`` | ``cpu_peak_mem``.
        baseline: baseline level (same unit as the samples), None without a baseline.
        value: tonight's level (median of tonight's samples).
        change: ``value / baseline - 1`` (0.12 = +12%), None without a baseline (a baseline of
            0 bytes counts as 1 byte).
        p_value: one-sided Mann-Whitney U p-value for latency; None for peak memory.
        alertable: a regression worth alerting (after its confirmation when not
            ``confirmed``); False for improvements, ``no_baseline``, ``unchanged`` and
            unstable benchmarks.
        reason: one short sentence for the report.
        baseline_lower: lower edge of the baseline band (for charts).
        baseline_upper: upper edge of the baseline band (for charts).
        confirmed: the change already persisted (an earlier night or a re-run): it is raised
            tonight. A ``regression`` that is not confirmed is a candidate that needs its
            confirmation re-run (``confirm``) or the next night.
        first_night: the first night at the new level (``Night.night``) when raised.
        step_change: relative change of the new level (median of the persisting nights)
            against the baseline, when raised.
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


# --------------------------------------------------------------------------------------------
# One series, night by night (the nightly service)


def _check_metric(metric: str) -> bool:
    if metric not in METRICS:
        raise DetectionInputError(f"metric: must be one of {', '.join(METRICS)}, got {metric!r}")
    return metric in MEMORY_METRICS


def _night_level(night: Night, field: str, memory: bool) -> float:
    if not isinstance(night, Night):
        raise DetectionInputError(f"{field}: expected a Night, got {type(night).__name__}")
    vals = np.asarray(night.samples, dtype=float)
    if vals.ndim != 1 or vals.size == 0:
        raise DetectionInputError(f"{field}.samples: night {night.night} has no samples")
    if not np.all(np.isfinite(vals)) or np.any(vals < 0 if memory else vals <= 0):
        raise DetectionInputError(
            f"{field}.samples: night {night.night} has a sample that is not "
            + ("a finite number of bytes >= 0" if memory else "a finite latency > 0"))
    return float(np.median(vals))


def _replay(nights: Sequence[Night], names: Sequence[str], memory: bool, threshold: float,
            p: DetectorParams):
    """Online flags over one series of nights (re-runs count as nights)."""
    lv = np.array([[_night_level(n, name, memory) for n, name in zip(nights, names, strict=True)]])
    exp = np.array([[n.expected for n in nights]])
    return detect_series(lv, memory=memory, threshold=threshold, expected=exp, online=True,
                         params=p), lv[0]


def _fmt_change(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _relative(value: float, base: float) -> float:
    """``value / base - 1``; a baseline of 0 (bytes) counts as 1 byte so the change is finite."""
    return (value - base) / max(base, 1.0) if base <= 0 else value / base - 1


def _assess(
    nights: Sequence[Night], *, metric: str, threshold: float, unstable: bool,
    p: DetectorParams, raise_at: set[int], names: Sequence[str], confirming: bool = False,
) -> Assessment:
    memory = _check_metric(metric)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) \
            or not 0 < threshold < 10:
        raise DetectionInputError(f"threshold: must be between 0 and 10, got {threshold!r}")
    flags, lv = _replay(nights, names, memory, threshold, p)
    last = len(nights) - 1
    value = float(lv[last])
    raised = [f for f in flags if f.raised_night in raise_at]
    if raised:
        f = raised[-1]
        base = f.baseline
        change = _relative(value, base)
        regression = f.direction == "regression"
        what = "drift" if f.kind == "drift" else "step"
        p_txt = "" if f.p_value is None else f", p={f.p_value:.2g}"
        reason = (f"{'Regression' if regression else 'Improvement'} ({what}) of "
                  f"{_fmt_change(f.change)} against a baseline of {base:.6g} since night "
                  f"{nights[f.night].night}, persisting {last - f.night + 1} nights{p_txt}.")
        if unstable and regression:
            reason += " Benchmark marked unstable: shown, not alerted."
        return Assessment(
            verdict=f.direction, metric=metric, baseline=base, value=value, change=change,
            p_value=f.p_value, alertable=regression and not unstable, reason=reason,
            confirmed=True, first_night=nights[f.night].night, step_change=f.change)
    # Not raised tonight: compare tonight with the current baseline (since the last reset).
    start = 0
    for i, n in enumerate(nights):
        if n.expected:
            start = i
    for f in flags:
        start = max(start, f.night)
    seg = lv[start:]
    k = min(last - start, p.window)
    if k < p.min_baseline:
        if start == 0:
            why = "the series is new"
        elif nights[start].expected and not any(f.night == start for f in flags):
            why = f"the baseline restarted at night {nights[start].night}, marked expected"
        else:
            why = f"the baseline restarted at night {nights[start].night}, after a raised step"
        return Assessment(
            verdict="no_baseline", metric=metric, baseline=None, value=value, change=None,
            p_value=None, alertable=False,
            reason=f"No baseline: {why}; {k} of {p.min_baseline} earlier nights.")
    mem = np.array([memory])
    y = to_log(seg[None, :], mem)
    window = y[0, len(seg) - 1 - k : len(seg) - 1]
    j = len(seg) - 1
    base_log = float(np.median(window))
    noise = float(window_noise(y, np.array([0]), np.array([j - k]), np.array([k]), p, mem)[0])
    base = float(np.median(seg[len(seg) - 1 - k : len(seg) - 1]))  # exact bytes for memory
    est = float(y[0, j]) - base_log
    se = noise * math.sqrt(MEDIAN_VAR * (1 + 1 / k))
    thr = math.log1p(threshold)
    band = 2 * noise
    lower = float(from_log(np.array(base_log - band), memory))
    upper = float(from_log(np.array(base_log + band), memory))
    change = _relative(value, base)
    pval = None
    if memory:
        env = envelope(window[None, :], np.array([max(3 * noise, 1e-12)]), upper=True)[0]
        up_candidate = est >= thr and y[0, j] > env
        upper = float(from_log(np.array(env), memory))
    else:
        pval = mann_whitney_greater([float(y[0, j])], window.tolist())
        up_candidate = est >= max(thr - p.z * se, p.grey_fraction * thr)
    chg = _fmt_change(change)
    if confirming:
        return Assessment(
            verdict="unchanged", metric=metric, baseline=base, value=value, change=change,
            p_value=pval, alertable=False, baseline_lower=lower, baseline_upper=upper,
            reason=f"Not reproduced: the re-run is at {chg} against a baseline of {base:.6g}, "
            "which does not confirm a persistent change.")
    if up_candidate:
        reason = (f"Candidate regression: {chg} against a baseline of {base:.6g} over {k} "
                  "nights; needs its confirmation re-run or the next night.")
        if unstable:
            reason += " Benchmark marked unstable: shown, not alerted."
        return Assessment(
            verdict="regression", metric=metric, baseline=base, value=value, change=change,
            p_value=pval, alertable=not unstable, reason=reason, baseline_lower=lower,
            baseline_upper=upper, confirmed=False)
    reason = f"Unchanged: {chg} against a baseline of {base:.6g} over {k} nights"
    return Assessment(
        verdict="unchanged", metric=metric, baseline=base, value=value, change=change,
        p_value=pval, alertable=False, reason=reason + ".", baseline_lower=lower,
        baseline_upper=upper)


def assess_night(
    history: Sequence[Night], tonight: Night, *, metric: str, threshold: float = 0.07,
    unstable: bool = False, params: DetectorParams = DEFAULT_PARAMS,
) -> Assessment:
    """Assess tonight's night of one series against its baseline.

    The online detector is replayed over ``history + [tonight]`` (so steps raised on earlier
    nights reset the baseline exactly as in ``detect_document(online=True)``), then:

    * a change raised tonight (it persisted: the previous night, or a re-run in the history)
      is a ``confirmed`` ``regression`` or ``improvement``;
    * otherwise, tonight alone standing above the baseline beyond the threshold is a candidate
      ``regression`` (``confirmed=False``, alertable): it needs ``confirm`` on a re-run of the
      same build, or the next night. A lone low night is ``unchanged`` until it persists;
    * fewer than ``params.min_baseline`` nights since the last reset give ``no_baseline``.

    Args:
        history: earlier nights of the same series, oldest first (may be empty). Confirmation
            re-runs may be included (``rerun=True``) right after the night they re-ran.
        tonight: tonight's night.
        metric: ``latency`` | ``gpu_peak_mem`` | ``cpu_peak_mem``.
        threshold: relative threshold (0.07 = 7%).
        unstable: the benchmark is marked unstable: assessed and shown, never alertable.
        params: detector constants.

    Returns:
        The Assessment of tonight.

    Raises:
        DetectionInputError: unknown metric, threshold outside (0, 10), a night without samples
            or with a non-positive latency / negative memory sample.
    """
    nights = [*history, tonight]
    names = [f"history[{i}]" for i in range(len(history))] + ["tonight"]
    return _assess(nights, metric=metric, threshold=threshold, unstable=unstable, p=params,
                   raise_at={len(nights) - 1}, names=names)


def confirm(
    history: Sequence[Night], tonight: Night, rerun: Night, *, metric: str,
    threshold: float = 0.07, params: DetectorParams = DEFAULT_PARAMS,
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
        metric: ``latency`` | ``gpu_peak_mem`` | ``cpu_peak_mem``.
        threshold: relative threshold (0.07 = 7%).
        params: detector constants.

    Returns:
        The re-run's Assessment: a ``confirmed`` ``regression`` when it reproduces, else
        ``unchanged`` (or another verdict) with the reason.

    Raises:
        DetectionInputError: as for ``assess_night``.
    """
    again = Night(night=tonight.night, samples=tuple(rerun.samples), rerun=True)
    nights = [*history, tonight, again]
    names = [f"history[{i}]" for i in range(len(history))] + ["tonight", "rerun"]
    return _assess(nights, metric=metric, threshold=threshold, unstable=False, p=params,
                   raise_at={len(nights) - 2, len(nights) - 1}, names=names, confirming=True)


# --------------------------------------------------------------------------------------------
# `nightbench detect` documents


def _threshold_for(doc_thr: Any, series: Mapping[str, Any], metric: str, where: str) -> float:
    thr = series.get("threshold", doc_thr)
    field = f"{where}.threshold" if "threshold" in series else "threshold"
    if isinstance(thr, Mapping):
        thr = thr.get(metric, 0.07)
        field = f"{field}.{metric}"
    if isinstance(thr, bool) or not isinstance(thr, int | float) or not 0 < thr < 10:
        raise DetectionInputError(f"{field}: must be a number between 0 and 10 (0.07 = 7%)")
    return float(thr)


def _parse_series(doc: Mapping[str, Any]):
    if not isinstance(doc, Mapping):
        raise DetectionInputError("document: expected a JSON object with a 'series' list")
    doc_thr = doc.get("threshold", 0.07)
    if isinstance(doc_thr, Mapping):
        unknown = set(doc_thr) - set(METRICS)
        if unknown:
            raise DetectionInputError(f"threshold: unknown metric {sorted(unknown)[0]!r}")
    series = doc.get("series")
    if not isinstance(series, list):
        raise DetectionInputError("series: expected a list")
    parsed = []
    for i, s in enumerate(series):
        where = f"series[{i}]"
        if not isinstance(s, Mapping):
            raise DetectionInputError(f"{where}: expected an object")
        sid = s.get("id")
        if not isinstance(sid, str):
            raise DetectionInputError(f"{where}.id: expected a string")
        metric = s.get("metric")
        if metric not in METRICS:
            raise DetectionInputError(f"{where}.metric: must be one of {', '.join(METRICS)}")
        memory = metric in MEMORY_METRICS
        thr = _threshold_for(doc_thr, s, metric, where)
        nights = s.get("nights")
        if not isinstance(nights, list):
            raise DetectionInputError(f"{where}.nights: expected a list")
        ordinals: list[int] = []
        levels: list[float] = []
        expected: list[bool] = []
        for j, n in enumerate(nights):
            nw = f"{where}.nights[{j}]"
            if not isinstance(n, Mapping):
                raise DetectionInputError(f"{nw}: expected an object")
            night = n.get("night")
            if isinstance(night, bool) or not isinstance(night, int):
                raise DetectionInputError(f"{nw}.night: expected an integer")
            if ordinals and night <= ordinals[-1]:
                raise DetectionInputError(f"{nw}.night: nights must be increasing (oldest first)")
            samples = n.get("samples")
            if not isinstance(samples, list) or not samples or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in samples
            ):
                raise DetectionInputError(f"{nw}.samples: expected a non-empty list of numbers")
            # Plain Python: per-night numpy calls would dominate on large exports.
            low = min(samples)
            if not all(math.isfinite(x) for x in samples) or (low < 0 if memory else low <= 0):
                raise DetectionInputError(f"{nw}.samples: " + (
                    "bytes must be finite and >= 0" if memory else "latency must be finite, > 0"))
            exp = n.get("expected", False)
            if not isinstance(exp, bool):
                raise DetectionInputError(f"{nw}.expected: expected true or false")
            ordinals.append(night)
            levels.append(float(statistics.median(samples)))
            expected.append(exp)
        parsed.append((sid, memory, thr, ordinals, levels, expected))
    return parsed


def detect_document(doc: Mapping[str, Any], *, online: bool) -> dict[str, Any]:
    """Run detection over an exported document (the ``nightbench detect`` JSON).

    Input: ``{"threshold": 0.07, "series": [{"id": str, "metric": "latency" | "gpu_peak_mem" |
    "cpu_peak_mem", "nights": [{"night": int, "samples": [float, ...]}, ...]}]}``, nights oldest
    first with increasing ``night``; one sample per night is allowed. ``threshold`` (default
    0.07) may also be a mapping ``{metric: threshold}`` (metrics left out get 0.07), and a
    series may carry its own ``"threshold"`` (a number or such a mapping), which wins. A night
    may carry ``"expected": true`` (the baseline resets there).

    Output: ``{"flags": [{"id", "night", "raised_night", "direction", "change", "p_value"}]}``
    in input order of series, then by night: ``night`` is the first night at the new level,
    ``raised_night`` the night on which the flag is raised (online: decided from nights up to
    it only, each flag once; offline: the last night of the series), ``direction``
    ``regression`` | ``improvement``, ``change`` relative (0.12 = +12%), ``p_value`` the
    one-sided Mann-Whitney p-value for latency and null for peak memory.

    Args:
        doc: the parsed input document.
        online: decide night by night as the nightly service does.

    Returns:
        The output document.

    Raises:
        DetectionInputError: malformed input; the message names the field
            (e.g. ``series[2].nights[5].samples``).
    """
    parsed = _parse_series(doc)
    if not parsed:
        return {"flags": []}
    width = max(1, max(len(p[3]) for p in parsed))
    levels = np.full((len(parsed), width), np.nan)
    expected = np.zeros((len(parsed), width), dtype=bool)
    for i, (_, _, _, _, lv, ex) in enumerate(parsed):
        levels[i, : len(lv)] = lv
        expected[i, : len(ex)] = ex
    flags = detect_series(
        levels, memory=np.array([p[1] for p in parsed]),
        threshold=np.array([p[2] for p in parsed]), expected=expected, online=online)
    out = []
    for f in flags:
        sid, memory, _, ordinals, _, _ = parsed[f.series]
        out.append({
            "id": sid, "night": ordinals[f.night], "raised_night": ordinals[f.raised_night],
            "direction": f.direction, "change": round(f.change, 6),
            "p_value": None if memory or f.p_value is None else float(f"{f.p_value:.6g}"),
        })
    return {"flags": out}

