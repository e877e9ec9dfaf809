"""Benchmarks marked unstable: shown, and alerted only beyond their own noise.

The rule is described in docs/detection.md ("Verdicts"); the constant
that sets it is ``DetectorParams.unstable_beyond``.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.regressions.rules import DEFAULT_PARAMS, DetectorParams


@dataclass(frozen=True)
class UnstableRule:
    """Whether a benchmark is marked unstable, and the change from which it alerts anyway.

    A benchmark marked unstable is shown, and alerts only a latency regression of at least
    ``beyond`` (``DetectorParams.unstable_beyond``) times the spread of the verdict that marked
    it unstable, and the threshold (``service/regressions/detection.py``); the verdict judges
    latency, so its peak memory alerts as on any benchmark (``service.regressions.service``).

    Attributes:
        unstable: the benchmark is marked unstable.
        spread: that verdict's spread ((max - min) / min of its processes' medians, a fraction);
            None: not known (it then never alerts).
        threshold: the series' threshold (fraction).
        beyond: ``DetectorParams.unstable_beyond`` (0: never alerts).
    """

    unstable: bool
    spread: float | None
    threshold: float
    beyond: float

    @property
    def bar(self) -> float | None:
        """The least change an unstable benchmark alerts (fraction); None: it never does."""
        if not self.unstable or self.spread is None or self.beyond <= 0:
            return None
        return max(self.threshold, self.beyond * self.spread)

    def judge(self, change: float) -> tuple[bool, str]:
        """Whether a regression of ``change`` (fraction, 0.12 = +12%) alerts, and the sentence
        its reason adds (empty for a stable benchmark)."""
        if not self.unstable:
            return True, ""
        bar = self.bar
        if bar is None:
            return False, " Benchmark marked unstable: shown, not alerted."
        noise = (
            f"{self.beyond:g} times the {(self.spread or 0.0) * 100:.1f}% spread that "
            "marked it unstable"
        )
        if change >= bar:
            return True, f" Benchmark marked unstable, alerted: the change is beyond {noise}."
        return False, (
            f" Benchmark marked unstable: shown, not alerted (it alerts from "
            f"{bar * 100:+.1f}%, {noise})."
        )


STABLE = UnstableRule(unstable=False, spread=None, threshold=0.07, beyond=0.0)
"""A benchmark not marked unstable (a confirmation re-run is judged as one)."""


def alerts_from(
    spread: float | None, threshold: float, params: DetectorParams = DEFAULT_PARAMS
) -> float | None:
    """The least latency regression (a fraction) a benchmark marked unstable at ``spread`` still
    alerts: ``params.unstable_beyond`` times it and at least ``threshold``; None: never."""
    return UnstableRule(True, spread, threshold, params.unstable_beyond).bar
