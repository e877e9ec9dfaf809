"""What caused an alert's regressions, as its issues tell it.

The bisection's findings (:class:`BisectionInput`: from a local bisection's report, or a night's
finished bisection read back by :func:`night_bisection_input`) split the reproduced regressions
by cause, one issue each: one group per culprit commit, one per inconclusive narrowed range, and
the rest under the night's commit range. For each group, the commits and probes its issue shows
(:class:`~workers.issues.model.Bisection`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Bisection as BisectionRow
from service.models import BisectionProfile, BisectionStatus, ProfileStatus, Regression, Run
from service.regressions.service import range_start
from workers.bisect.search import (
    CULPRIT,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REFERENCE,
    SKIPPED,
    Outcome,
    ProbeRecord,
)
from workers.bisect.state import BenchmarkOutcome, BenchmarkVerdict
from workers.issues.model import Bisection, Commit, Probe, WhatChanged

_SHA_CHARS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class BisectionInput:
    """What a bisection of the alert's commit range found, for the issues to report.

    Attributes:
        outcome: :func:`workers.bisect.search.outcome` of the final state.
        probes: every probe recorded (``BisectionState.probes``), in order.
        commits: the range ``[good, ..., bad]`` in first-parent order, as
            :class:`workers.commits.CommitInfo` or its ``as_json()`` dict; an ``author_login``
            key, when present, gets the author cc'd.
        repo: path of the checkout to give in the reproduction's ``nightbench bisect --repo``.
        code_url: web address of the repository, for commit links (``None``: bare shas): what
            the provider spec recorded (:func:`workers.builds.registry.spec_from_settings`).
        install_command: the reproduction's ``--install`` command.
        profiles: the profile probe's answers, one per benchmark profiled (no URLs yet).
    """

    outcome: Outcome
    probes: tuple[ProbeRecord, ...]
    commits: tuple[Any, ...]
    repo: str | None = None
    code_url: str | None = None
    install_command: str | None = None
    profiles: tuple[WhatChanged, ...] = ()

    @classmethod
    def from_report(
        cls,
        report: Any,
        *,
        repo: str | None = None,
        code_url: str | None = None,
        install_command: str | None = None,
    ) -> BisectionInput:
        """From a :class:`workers.bisect.local_driver.BisectionReport` (what ``bisect_repository`` returns).

        Args:
            report: has ``outcome``, ``state.probes`` and ``commits`` (``CommitInfo``).
            repo: the checkout's path, as the attribute.
            code_url: the repository's web address, as the attribute.
            install_command: the reproduction's install command, as the attribute.
        """
        return cls(
            outcome=report.outcome,
            probes=tuple(report.state.probes),
            commits=tuple(report.commits),
            repo=repo,
            code_url=code_url,
            install_command=install_command,
        )


def night_bisection_input(session: Session, *, run_id: int) -> BisectionInput | None:
    """The finished bisection of a night, for its issue, read from its stored answer
    (``Bisection.result``, :func:`workers.bisect.report.outcome_json`): every probe but the
    endpoints' reference measurements, and the commits, links and install command its provider
    recorded. Nothing is replayed.

    Returns:
        None when no bisection of the night finished (none ran, or it failed), or its stored
        answer holds no outcome.
    """
    bisection = session.scalar(
        select(BisectionRow)
        .where(BisectionRow.run_id == run_id)
        .order_by(BisectionRow.id.desc())
        .limit(1)
    )
    if bisection is None or bisection.status != BisectionStatus.DONE or not bisection.result:
        return None
    stored = stored_outcome(bisection.result)
    if stored is None:
        return None
    final, probes = stored
    spec = bisection.provider
    # The endpoints measured again beside every round are the yardstick, not findings: the
    # issue lists the probes themselves (the full record stays in Bisection.result).
    return BisectionInput(
        outcome=final,
        probes=tuple(p for p in probes if p.purpose != REFERENCE),
        commits=tuple(bisection.commits),
        repo=spec.get("repo"),
        code_url=spec.get("code_url"),
        install_command=spec.get("install_command"),
        profiles=stored_profiles(session, bisection.id),
    )


def stored_profiles(session: Session, bisection_id: int) -> tuple[WhatChanged, ...]:
    """The profile probe's stored answers for a bisection (``bisection_profiles`` rows, their
    traces left unread), in the order they were stored."""
    rows = session.execute(
        select(
            BisectionProfile.benchmark,
            BisectionProfile.metric,
            BisectionProfile.before,
            BisectionProfile.after,
            BisectionProfile.culprit,
            BisectionProfile.status,
            BisectionProfile.reason,
            BisectionProfile.diff,
            BisectionProfile.trace_before.isnot(None),
        )
        .where(BisectionProfile.bisection_id == bisection_id)
        .order_by(BisectionProfile.id)
    ).all()
    return tuple(
        WhatChanged(
            benchmark=benchmark,
            metric=metric,
            before=before,
            after=after,
            culprit=culprit,
            diff=diff if status == ProfileStatus.DONE else None,
            failed=(reason or "no reason was recorded") if status != ProfileStatus.DONE else None,
            traced=bool(traced),
        )
        for benchmark, metric, before, after, culprit, status, reason, diff, traced in rows
    )


def stored_outcome(
    result: Mapping[str, Any],
) -> tuple[Outcome, tuple[ProbeRecord, ...]] | None:
    """A bisection's answer and probes as :func:`workers.bisect.report.outcome_json` stored
    them (``Bisection.result``); None when it holds no outcome."""
    if not result.get("outcome"):
        return None
    outcome = Outcome(
        kind=str(result["outcome"]),
        benchmarks=tuple(
            BenchmarkOutcome(
                benchmark=b["benchmark"],
                status=b["status"],
                culprit=b.get("culprit"),
                range=tuple(b.get("range") or ()),
                change=b.get("change"),
                reason=b.get("reason") or "",
            )
            for b in result.get("benchmarks") or []
        ),
        culprits=tuple(
            (c["sha"], tuple(c.get("benchmarks") or ())) for c in result.get("culprits") or []
        ),
        skipped=tuple((s["sha"], s.get("reason") or "") for s in result.get("skipped") or []),
        builds=int(result.get("builds") or 0),
        rounds=int(result.get("rounds") or 0),
    )
    probes = tuple(
        ProbeRecord(
            round=p["round"],
            sha=p["sha"],
            index=p["index"],
            purpose=p["purpose"],
            status=p["status"],
            build_seconds=p.get("build_seconds"),
            results=tuple(
                BenchmarkVerdict(
                    benchmark=r["benchmark"],
                    samples=tuple(r.get("samples") or ()),
                    vs_good=r.get("vs_good"),
                    vs_bad=r.get("vs_bad"),
                    side=r.get("side"),
                    error=r.get("error"),
                )
                for r in p.get("results") or []
            ),
            reason=p.get("reason"),
        )
        for p in result.get("probes") or []
    )
    return outcome, probes


@dataclass
class CauseGroup:
    """Regressions of one alert that share a cause, and what the bisection says of it."""

    outcome: str  # culprit | inconclusive | not_reproduced | not_bisected
    regressions: list[Regression]
    culprit: str | None = None
    good: str | None = None
    bad: str | None = None
    suspects: tuple[str, ...] = ()
    reason: str = ""


def cause_groups(
    session: Session, run: Run, regressions: Sequence[Regression], bisection: BisectionInput | None
) -> list[CauseGroup]:
    """The regressions split by what the bisection says caused them, in a stable order."""
    night_good, night_bad = _night_range(session, run)
    if bisection is None:
        suspects = tuple(commit_dicts(run.commit_range or [])[1:])
        return [
            CauseGroup(
                "not_bisected",
                list(regressions),
                good=night_good,
                bad=night_bad,
                suspects=tuple(c["sha"] for c in suspects),
            )
        ]
    shas = [c["sha"] for c in commit_dicts(bisection.commits)]
    per_benchmark = {o.benchmark: o for o in bisection.outcome.benchmarks}
    groups: dict[tuple[str, ...], CauseGroup] = {}
    for regression in regressions:
        found = per_benchmark.get(regression.benchmark)
        if found is None:
            key: tuple[str, ...] = ("not_bisected",)
            group = CauseGroup("not_bisected", [], good=night_good, bad=night_bad)
        elif found.status == CULPRIT and found.culprit:
            key = (CULPRIT, found.culprit)
            group = CauseGroup(CULPRIT, [], culprit=found.culprit)
        elif found.status == INCONCLUSIVE and found.range:
            first = shas.index(found.range[0]) if found.range[0] in shas else 1
            good = shas[first - 1] if first >= 1 else shas[0]
            key = (INCONCLUSIVE, good, found.range[-1])
            group = CauseGroup(
                INCONCLUSIVE,
                [],
                good=good,
                bad=found.range[-1],
                suspects=tuple(found.range),
                reason=found.reason,
            )
        else:
            outcome = NOT_REPRODUCED if found.status == NOT_REPRODUCED else "not_bisected"
            key = (outcome,)
            group = CauseGroup(
                outcome,
                [],
                good=shas[0],
                bad=shas[-1],
                reason=found.reason if outcome == NOT_REPRODUCED else "",
            )
        groups.setdefault(key, group).regressions.append(regression)
    return list(groups.values())


def _night_range(session: Session, run: Run) -> tuple[str | None, str | None]:
    """``(good, bad)`` shas of the night: the recorded commit range, else the two builds."""
    commits = commit_dicts(run.commit_range or [])
    if len(commits) >= 2:
        return commits[0]["sha"], commits[-1]["sha"]
    previous = range_start(session, run=run)
    good = previous.torch_git_commit if previous is not None else None
    return _sha_or_none(good), _sha_or_none(run.torch_git_commit)


def _sha_or_none(value: str | None) -> str | None:
    if value and 7 <= len(value) <= 64 and set(value) <= _SHA_CHARS:
        return value
    return None


def commit_dicts(commits: Sequence[Any]) -> list[dict[str, Any]]:
    """``commits`` (``CommitInfo`` or dicts) as dicts, those without a valid sha left out."""
    out = []
    for c in commits:
        data = c.as_json() if hasattr(c, "as_json") else dict(c)
        if _sha_or_none(data.get("sha")):
            out.append(data)
    return out


def _commit(info: Mapping[str, Any] | None, sha: str) -> Commit:
    info = info or {}
    pr = info.get("pr_number")
    return Commit(
        sha=sha,
        title=str(info.get("title") or ""),
        author=str(info.get("author") or info.get("author_name") or ""),
        author_login=info.get("author_login") or None,
        pr_number=int(pr) if pr is not None else None,
    )


def issue_bisection(
    group: CauseGroup, bisection: BisectionInput | None, commits: Mapping[str, Mapping[str, Any]]
) -> Bisection:
    """What the issue of ``group`` says of the bisection: its commits, probes and answer."""

    def commit(sha: str | None) -> Commit | None:
        return _commit(commits.get(sha), sha) if sha else None

    suspects = tuple(_commit(commits.get(s), s) for s in group.suspects)
    if bisection is None or group.outcome == "not_bisected":
        return Bisection(
            outcome="not_bisected",
            good=commit(group.good),
            bad=commit(group.bad),
            commits=len(group.suspects) or None,
            suspects=suspects,
        )
    shas = [c["sha"] for c in commit_dicts(bisection.commits)]
    names = {g.benchmark for g in group.regressions}
    probes = tuple(_probes(bisection.probes, names, commits))
    if group.outcome == CULPRIT and group.culprit:
        culprit = commit(group.culprit)
        index = shas.index(group.culprit) if group.culprit in shas else -1
        parent_sha = shas[index - 1] if index >= 1 else commits.get(group.culprit, {}).get("parent")
        verified = any(
            p.sha == group.culprit and p.purpose == "verify" and p.status != SKIPPED
            for p in bisection.probes
        )
        return Bisection(
            outcome=CULPRIT,
            good=commit(shas[0]),
            bad=commit(shas[-1]),
            commits=len(shas) - 1,
            culprit=culprit,
            culprit_parent=commit(parent_sha),
            verified=True if verified else None,
            probes=probes,
            builds=bisection.outcome.builds,
        )
    return Bisection(
        outcome=group.outcome,
        good=commit(group.good),
        bad=commit(group.bad),
        commits=len(shas) - 1,
        probes=probes,
        builds=bisection.outcome.builds,
        suspects=suspects,
        reason=group.reason,
    )


def _probes(
    records: Sequence[ProbeRecord], names: set[str], commits: Mapping[str, Mapping[str, Any]]
) -> list[Probe]:
    out = []
    for record in records:
        commit = _commit(commits.get(record.sha), record.sha)
        if record.status == SKIPPED:
            out.append(
                Probe(
                    commit,
                    None,
                    None,
                    purpose=record.purpose,
                    skipped=record.reason or "did not build",
                )
            )
            continue
        for verdict in record.results:
            if verdict.benchmark not in names:
                continue
            samples = verdict.samples
            out.append(
                Probe(
                    commit,
                    verdict.vs_good,
                    verdict.vs_bad,
                    side=verdict.side,
                    benchmark=verdict.benchmark,
                    purpose=record.purpose,
                    samples=len(samples),
                    median=statistics.median(samples) if samples else None,
                    unit="ms",
                    build_seconds=record.build_seconds,
                    skipped=f"not measured: {verdict.error}" if verdict.error else None,
                )
            )
    return out
