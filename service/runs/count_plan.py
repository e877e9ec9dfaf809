"""Which benchmarks a night's count pass counts: every one when the pass fits its budget, else a
rotation under the budget, the benchmarks counted longest ago first.

Counting runs each step under valgrind, tens to hundreds of times slower than the timed run;
the CPU suite's full count pass costs hours of one core on a small host (docs/benchmarks.md,
"Instruction counts"). ``NIGHTBENCH_COUNT_BUDGET_S`` bounds a night's pass in CPU seconds of
one core. When the whole pass fits, every benchmark is counted every night; when it does not,
the night counts the benchmarks whose last count is oldest (never counted: first), each at the
cost its last count took, until the budget is spent, so every benchmark is counted once every
``ceil(pass / budget)`` nights or so. A count series then has a point every few nights: the
detector compares it with its own earlier points (a count does not drift with the host), and
the commit range of a count regression starts at the night of the series' point before it
(:func:`service.regressions.service.range_start`). A confirmation run's count pass is not
rotated: it counts each candidate again.

The oldest benchmark is always counted, even alone over the budget, so no benchmark waits
forever behind the others.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.metrics import INSTRUCTIONS
from service.models import Job, Result
from service.runs.service import BenchmarkSpec

PROCESS_CPU_S = 15.0
"""CPU seconds one valgrind count process spends besides its benchmarks (``import torch`` with
instrumentation off, ``--instr-atstart=no``: 12 to 16 s measured on the 2-core development
host, against 34 to 64 s instrumented; docs/benchmarks.md, "The count process's
instrumentation")."""
DEFAULT_COST_S = 120.0
"""CPU seconds assumed for a benchmark never counted on the queue, when no benchmark has been."""


@dataclass(frozen=True)
class CountHistory:
    """A benchmark's last count on a queue.

    Attributes:
        night: the night it was last counted (or its count failed); None: never.
        cpu_s: CPU seconds that count took under valgrind (build, warm-up and counted steps,
            ``import torch`` left out); None when unknown (a count that timed out or crashed).
    """

    night: date | None = None
    cpu_s: float | None = None


@dataclass(frozen=True)
class CountPlan:
    """What a count pass counts tonight.

    Attributes:
        counted: the benchmarks counted, in the order their jobs are sent.
        deferred: the benchmarks left for later nights (oldest count first).
        estimated_cpu_s: the pass's estimated cost (CPU seconds of one core), valgrind
            processes' start included.
        budget_s: the budget it was planned under (0: none).
    """

    counted: tuple[BenchmarkSpec, ...]
    deferred: tuple[BenchmarkSpec, ...]
    estimated_cpu_s: float
    budget_s: float

    def note(self) -> str | None:
        """The night's note line when the rotation left benchmarks out, else None."""
        if not self.deferred:
            return None
        total = len(self.counted) + len(self.deferred)
        return (
            f"cpu_instructions: {len(self.counted)} of {total} benchmarks counted tonight "
            f"(about {self.estimated_cpu_s / 60:.0f} min of one core, budget "
            f"{self.budget_s / 60:.0f} min: NIGHTBENCH_COUNT_BUDGET_S); the other "
            f"{len(self.deferred)} in turn on the next nights, the longest uncounted first"
        )


def estimated_cost(spec: BenchmarkSpec, history: dict[str, CountHistory]) -> float:
    """CPU seconds counting ``spec`` is expected to take under valgrind (``import torch`` left
    out): its last count's cost, else the median of the known costs in ``history``, else
    :data:`DEFAULT_COST_S`."""
    h = history.get(spec.name)
    if h is not None and h.cpu_s is not None:
        return h.cpu_s
    known = [x.cpu_s for x in history.values() if x.cpu_s is not None]
    return statistics.median(known) if known else DEFAULT_COST_S


def plan_count_pass(
    specs: Sequence[BenchmarkSpec],
    history: dict[str, CountHistory],
    *,
    budget_s: float,
    batch: int,
    process_cpu_s: float = PROCESS_CPU_S,
) -> CountPlan:
    """Choose tonight's counted benchmarks under ``budget_s`` CPU seconds of one core.

    Args:
        specs: the night's CPU benchmarks to count (each with ``name``).
        history: the last count of each benchmark, by ``spec.name`` (missing: never counted).
        budget_s: the pass's budget in CPU seconds of one core; 0 counts every benchmark.
        batch: benchmarks per valgrind process (``NIGHTBENCH_COUNT_BATCH``): a process's start
            (``process_cpu_s``) is paid once per ``batch`` benchmarks.
        process_cpu_s: CPU seconds a valgrind process spends before its first benchmark.

    Returns:
        The plan: the benchmarks whose last count is oldest first (never counted before any
        counted, then by name), each taken while the estimate stays within the budget (one
        that does not fit is passed over for a cheaper one after it); the oldest always taken.
        A benchmark's estimate is its last count's cost, else the median of the known costs,
        else :data:`DEFAULT_COST_S`.

    Raises:
        ValueError: ``budget_s`` < 0 or ``batch`` < 1.
    """
    if budget_s < 0 or batch < 1:
        raise ValueError(f"count plan: budget_s >= 0 and batch >= 1, got {budget_s}, {batch}")

    def cost(spec: BenchmarkSpec) -> float:
        return estimated_cost(spec, history)

    def estimate(n: int, steps_s: float) -> float:
        return steps_s + math.ceil(n / batch) * process_cpu_s

    everything = estimate(len(specs), sum(cost(s) for s in specs))
    if budget_s == 0 or everything <= budget_s:
        return CountPlan(tuple(specs), (), everything, budget_s)
    order = sorted(
        specs,
        key=lambda s: (
            (history.get(s.name) or CountHistory()).night or date.min,
            s.name,
        ),
    )
    counted: list[BenchmarkSpec] = []
    deferred: list[BenchmarkSpec] = []
    spent = 0.0
    for spec in order:
        if not counted or estimate(len(counted) + 1, spent + cost(spec)) <= budget_s:
            counted.append(spec)
            spent += cost(spec)
        else:
            deferred.append(spec)
    return CountPlan(tuple(counted), tuple(deferred), estimate(len(counted), spent), budget_s)


def count_history(
    session: Session, *, specs: Sequence[BenchmarkSpec], queue: str
) -> dict[str, CountHistory]:
    """The last count on ``queue`` of each of ``specs`` (a failed count included: it was tried),
    by benchmark name; benchmarks never counted there are left out.

    The cost is the ``environment["counter"]["cpu_s"]`` a count result carries
    (:mod:`suite.counting`)."""
    models = sorted({s.model for s in specs})
    if not models:
        return {}
    rows = session.execute(
        select(Result.model, Result.mode, Result.device, Result.compiler, Result.night)
        .add_columns(Result.environment)
        .join(Job, Job.id == Result.job_id)
        .where(
            Result.metric == INSTRUCTIONS,
            Result.device == "cpu",
            Result.model.in_(models),
            Job.queue == queue,
        )
        .order_by(Result.night, Result.id)
    )
    out: dict[str, CountHistory] = {}
    wanted = {s.name for s in specs}
    for model, mode, device, compiler, night, environment in rows:
        name = BenchmarkSpec(model=model, mode=mode, device=device, compiler=compiler).name
        if name not in wanted:
            continue
        counter = (environment or {}).get("counter") or {}
        cpu_s = counter.get("cpu_s")
        previous = out.get(name)
        out[name] = CountHistory(
            night=night,
            cpu_s=float(cpu_s)
            if isinstance(cpu_s, int | float)
            else (previous.cpu_s if previous else None),
        )
    return out
