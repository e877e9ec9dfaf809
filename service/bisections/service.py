"""Bisections as the API reads them: a bisection with its probes and verdicts, and the culprits
bisections named for regressions.

The search itself runs in ``workers/bisect/celery_driver.py``; it stores each probe as a
:class:`~service.models.bisection.Probe` row and, when it ends, the outcome's JSON in
``Bisection.result`` (``outcome``, ``culprits`` with commit details, per-benchmark answers
with their culprit or narrowed range, and every probe's per-benchmark verdicts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.benchmarks import benchmark_name
from service.errors import NotFound
from service.models import BisectionOutcome, BisectionStatus, Regression
from service.models.bisection import Bisection, Probe


@dataclass
class BisectionView:
    """A bisection, its probes in (round, index) order, and the verdicts of each probe."""

    bisection: Bisection
    probes: list[Probe]
    verdicts: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def culprits(self) -> list[dict[str, Any]]:
        """The culprits the bisection named (commit details), empty until it ends."""
        return list((self.bisection.result or {}).get("culprits") or [])

    @property
    def answers(self) -> list[dict[str, Any]]:
        """The answer per benchmark (culprit, or narrowed range), empty until it ends."""
        return list((self.bisection.result or {}).get("benchmarks") or [])


def get_bisection(session: Session, bisection_id: int) -> BisectionView:
    """The bisection with its probes. Raises NotFound."""
    bisection = session.get(Bisection, bisection_id)
    if bisection is None:
        raise NotFound(f"bisection {bisection_id} does not exist")
    probes = list(
        session.scalars(
            select(Probe)
            .where(Probe.bisection_id == bisection_id)
            .order_by(Probe.round, Probe.index, Probe.id)
        )
    )
    verdicts: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for p in (bisection.result or {}).get("probes") or []:
        verdicts[(int(p.get("round", -1)), str(p.get("sha")))] = list(p.get("results") or [])
    return BisectionView(bisection, probes, verdicts)


def _names(model: str, mode: str, device: str, compiler: str) -> tuple[str, str]:
    return f"{model}:{mode}:{device}", benchmark_name(model, mode, device, compiler)


@dataclass(frozen=True)
class _BisectionRow:
    id: int
    status: str
    outcome: str | None
    regression_ids: list[int]
    answers: list[dict[str, Any]]
    culprits: list[dict[str, Any]]


def _bisections_of(
    session: Session, regression_ids: Sequence[int]
) -> tuple[dict[int, tuple[str, str]], list[_BisectionRow]]:
    """The regressions' benchmark names, and the bisections naming any of them (oldest
    first). Reads only the outcome's answers and culprits, not the probes' samples."""
    ids = sorted(set(regression_ids))
    if not ids:
        return {}, []
    names: dict[int, tuple[str, str]] = {}
    runs: set[int] = set()
    for rid, run_id, model, mode, device, compiler in session.execute(
        select(
            Regression.id,
            Regression.run_id,
            Regression.model,
            Regression.mode,
            Regression.device,
            Regression.compiler,
        ).where(Regression.id.in_(ids))
    ):
        names[rid] = _names(model, mode, device, compiler)
        runs.add(run_id)
    if not names:
        return {}, []
    # A night's bisection carries its run; a manual one has none and names regressions only.
    rows = session.execute(
        select(
            Bisection.id,
            Bisection.status,
            Bisection.outcome,
            Bisection.regression_ids,
            Bisection.result["benchmarks"],
            Bisection.result["culprits"],
        )
        .where(or_(Bisection.run_id.in_(runs), Bisection.run_id.is_(None)))
        .order_by(Bisection.id)
    )
    wanted = set(ids)
    found = [
        _BisectionRow(
            bid, status, outcome, list(regs or []), list(answers or []), list(culprits or [])
        )
        for bid, status, outcome, regs, answers, culprits in rows
        if wanted & set(regs or [])
    ]
    return names, found


def bisections_for_regressions(
    session: Session, regression_ids: Sequence[int]
) -> dict[int, list[int]]:
    """Regression id -> ids of the bisections run for it (oldest first)."""
    _, bisections = _bisections_of(session, regression_ids)
    out: dict[int, list[int]] = {}
    wanted = set(regression_ids)
    for b in bisections:
        for rid in set(b.regression_ids) & wanted:
            out.setdefault(rid, []).append(b.id)
    return out


def culprits_for_regressions(session: Session, regression_ids: Sequence[int]) -> dict[int, str]:
    """Regression id -> culprit commit sha named by its latest finished bisection.

    The culprit is the one the bisection found for the regression's benchmark; when the
    bisection names a single culprit for all its benchmarks, that one.
    """
    names, bisections = _bisections_of(session, regression_ids)
    out: dict[int, str] = {}
    for b in bisections:
        if b.status != BisectionStatus.DONE:
            continue
        answers = {a.get("benchmark"): a.get("culprit") for a in b.answers}
        shas = [c.get("sha") for c in b.culprits if c.get("sha")]
        for rid in set(b.regression_ids) & names.keys():
            sha = next((answers[n] for n in names[rid] if answers.get(n)), None)
            if sha is None and len(shas) == 1 and b.outcome == BisectionOutcome.CULPRIT:
                sha = shas[0]
            if sha:
                out[rid] = str(sha)
    return out
