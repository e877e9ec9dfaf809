"""Counted processes of a count bisection: each build counted once against the old way.

A count bisection (``cpu_instructions``) used to measure as a latency bisection does: both
endpoints counted again beside every round's probe, and a verification's parent and candidate
counted again in two rounds of their own. A count does not drift with the host, so each build
is now counted once (``SearchConfig.measure_once``, from the metric table's
``KindRule.bisect_once``). This drives the local driver (:func:`workers.bisect.local_driver.run_bisection`)
over N commits with a culprit at every position in turn, counting with a stand-in for the count
measurer (one process a call, as ``SuiteCountMeasurer``; a step of +10% at the culprit, the
same counts for every process of a build), once with the metric's rule and once with the old
one, and reports the processes and rounds each took and whether both named the culprit.
Nothing is built or counted for real: only how many processes each way asks for.

Usage::

    .venv/bin/python -m benchmarks.count_bisection_processes [--commits 4 16 32]
"""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from service.metrics import INSTRUCTIONS, bisect_once
from workers.bisect.counts import COUNT_SAMPLES
from workers.bisect.local_driver import run_bisection
from workers.bisect.search import SearchConfig, outcome, start
from workers.builds.base import BuildEnvironment


@dataclass
class StandInCounter:
    """One counted process per call; the counts of a +10% step at ``culprit``."""

    culprit: int
    processes: int = 1
    counted: list[str] = field(default_factory=list)

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        """As :meth:`measure_once`, as a tuple."""
        return tuple(self.measure_once(env, benchmark, samples))

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """``samples`` counts (instructions) of the build ``env.sha`` (its index, in hex)."""
        self.counted.append(env.sha)
        level = 1e6 * (1.1 if int(env.sha, 16) >= self.culprit else 1.0)
        return [level + k % 3 for k in range(samples)]


def bisect(n: int, culprit: int, *, once: bool, scratch: Path) -> tuple[int, int, bool]:
    """One bisection of ``n`` commits: ``(processes, rounds, culprit named)``."""
    config = SearchConfig(
        initial_samples=COUNT_SAMPLES[0],
        max_samples=COUNT_SAMPLES[1],
        slower=True,
        measure_once=once,
    )
    counter = StandInCounter(culprit)
    state = start([f"{i:040x}" for i in range(n + 1)], ["sac:eval:cpu"], config)

    def build(sha: str) -> BuildEnvironment:
        return BuildEnvironment(
            sha=sha, provider="checkout", python=scratch, root=scratch, workdir=scratch
        )

    state = run_bisection(state, build=build, measurer=counter)
    final = outcome(state)
    named = final is not None and [s for s, _ in final.culprits] == [f"{culprit:040x}"]
    return len(counter.counted), state.round, named


def main() -> None:
    """Print, per range size, the processes and rounds of both ways over every culprit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[4, 16, 32])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.commits:
            for label, once in (("each build once", bisect_once(INSTRUCTIONS)), ("before", False)):
                runs = [bisect(n, c, once=once, scratch=Path(tmp)) for c in range(1, n + 1)]
                processes = [p for p, _, _ in runs]
                rounds = [r for _, r, _ in runs]
                print(
                    f"N={n} ({label}): processes {min(processes)}-{max(processes)} "
                    f"(mean {sum(processes) / len(processes):.1f}), rounds "
                    f"{min(rounds)}-{max(rounds)}, culprit named {sum(ok for *_, ok in runs)} "
                    f"of {n}; ⌈log2(N+1)⌉ + 2 = {math.ceil(math.log2(n + 1)) + 2}"
                )


if __name__ == "__main__":
    main()
