"""The profile probe: what changed between the builds either side of a bisection's answer.

When a night's bisection ends, the task ``bisect.profile`` (on the bisection's queue, so on the
machine class that measured it, where its builds are) profiles its regressed benchmarks on two
builds from the same provider the probes used:

- a benchmark with a culprit: the culprit's parent and the culprit;
- one without (an inconclusive range): the commit before the range and the range's last commit;
- a step not reproduced by the bisection: the range's good and bad ends (the baseline night's
  build and tonight's).

One benchmark per pair of builds is profiled (a culprit of several benchmarks once), at most
``profile_benchmarks`` per bisection. For a latency regression each build gets an operator table
(``torch.profiler``: aten operators, and Python functions with ``profile_python_functions``) and
the first build a second one, interleaved (first, second, first again), whose spread is the
noise the diff's rows must clear (:func:`service.profiles.diff_profiles`); the Chrome trace of
each build is kept. A ``cpu_instructions`` regression (a bisection by counts) gets the
function-level instruction counts under callgrind instead, once per build (near-deterministic),
and with ``profile_python_functions`` each Python function's bytecodes per step beside them
(callgrind does not see Python functions on CPython 3.11; ``suite/profiling.py``).

Each benchmark's answer is one :class:`~service.models.BisectionProfile` row: the diff as JSON,
or the reason the probe failed in one line. A failed probe never holds the issue back: the task
then hands the night to filing (``night.file``) as it does after a profile, and when the task
fails for good (:func:`give_up`) the reason is stored and filing is sent all the same.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import BuildError, InvalidInput, MeasureError, NotFound
from service.metrics import MetricKind, metric
from service.models import Bisection, BisectionOutcome, BisectionProfile, ProfileStatus
from workers.bisect.celery_driver import provider_for, work_dir
from workers.bisect.profiles import diff_document, profile_commit
from workers.builds.base import BuildProvider
from workers.enqueue import Step

log = logging.getLogger(__name__)

_ANSWER_ORDER = {"culprit": 0, "inconclusive": 1, "not_reproduced": 2}
"""Benchmarks with a culprit are profiled first, then ranges, then steps not reproduced."""


@dataclass(frozen=True)
class ProfileTarget:
    """One benchmark to profile on two builds.

    Attributes:
        benchmark: ``model:mode:device``.
        before: the first build's sha (the culprit's parent, or the range's good side).
        after: the second build's sha (the culprit, or the range's bad end).
        culprit: ``after`` is the named culprit.
    """

    benchmark: str
    before: str
    after: str
    culprit: bool


def profile_targets(
    result: Mapping[str, Any], commits: Sequence[Mapping[str, Any]], *, limit: int
) -> list[ProfileTarget]:
    """The benchmarks a finished bisection's profile probe profiles, and on which builds.

    Args:
        result: the bisection's stored answer (:func:`workers.bisect.report.outcome_json`).
        commits: the range ``[good, ..., bad]`` (dicts with ``sha``), first-parent order.
        limit: at most this many targets.

    Returns:
        One target per distinct pair of builds, culprits first (module docstring); empty when
        the answer names no benchmark or the range has fewer than two commits.
    """
    order = [str(c["sha"]) for c in commits]
    if len(order) < 2:
        return []
    index = {sha: i for i, sha in enumerate(order)}
    answers = sorted(
        result.get("benchmarks") or [], key=lambda b: _ANSWER_ORDER.get(b.get("status"), 3)
    )
    targets: list[ProfileTarget] = []
    for answer in answers:
        culprit, span = answer.get("culprit"), [s for s in answer.get("range") or [] if s in index]
        if answer.get("status") == BisectionOutcome.CULPRIT and index.get(culprit, 0) > 0:
            target = ProfileTarget(answer["benchmark"], order[index[culprit] - 1], culprit, True)
        elif span and index[span[0]] > 0:
            target = ProfileTarget(answer["benchmark"], order[index[span[0]] - 1], span[-1], False)
        else:
            target = ProfileTarget(answer["benchmark"], order[0], order[-1], False)
        if any((t.before, t.after) == (target.before, target.after) for t in targets):
            continue
        targets.append(target)
        if len(targets) == limit:
            break
    return targets


def profile_bisection(bisection_id: int, *, settings: Settings | None = None) -> list[Step]:
    """Run the profile probe of a finished bisection and store each benchmark's answer (task
    ``bisect.profile``).

    A benchmark already answered (a redelivered task) is not profiled again.

    Returns:
        ``night.file`` of the bisection's night (nothing for a bisection of no night). The
        builds this host made for the bisection are removed.

    Raises:
        NotFound: no such bisection.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        bisection = session.get(Bisection, bisection_id)
        if bisection is None:
            raise NotFound(f"bisection {bisection_id} does not exist")
        run_id, metric_name = bisection.run_id, _metric_of(bisection)
        targets = _unanswered(session, bisection, settings)
        commands = bool(bisection.config.get("measure", {}).get("commands"))
        try:
            provider: BuildProvider | None = provider_for(bisection, settings)
            unavailable = None
        except InvalidInput as exc:
            provider, unavailable = None, f"the build provider is not usable: {exc}"
    for target in targets:
        if commands:
            reason = "its benchmarks are shell commands, which have no suite profile"
            row = _failed(bisection_id, target, metric_name, reason)
        elif provider is None:
            row = _failed(bisection_id, target, metric_name, unavailable or "no build provider")
        else:
            row = profile_target(provider, target, metric_name, settings=settings)
            row.bisection_id = bisection_id
        _store(row)
    shutil.rmtree(work_dir(settings, bisection_id), ignore_errors=True)
    return [Step("night.file", (run_id,))] if run_id is not None else []


def profile_target(
    provider: BuildProvider,
    target: ProfileTarget,
    metric_name: str,
    *,
    settings: Settings,
) -> BisectionProfile:
    """Profile one target's two builds and diff them (module docstring for what is run).

    Returns:
        An unsaved row (``bisection_id`` unset): ``done`` with the diff and the traces, or
        ``failed`` with the reason (a build that failed, a profile that failed or timed out).
    """
    counted = metric(metric_name).kind == MetricKind.COUNT
    options: dict[str, Any] = (
        {
            "steps": 1,
            "windows": 2,
            "batch_size": settings.count_batch_size,
            "python_functions": settings.profile_python_functions,
            "timeout_s": settings.count_process_timeout_s,
        }
        if counted
        else {
            "steps": settings.profile_steps,
            "windows": settings.profile_windows,
            "python_functions": settings.profile_python_functions,
            "timeout_s": settings.profile_timeout_s,
        }
    )
    try:
        before_env = provider.prepare(target.before)
        after_env = provider.prepare(target.after)
        with tempfile.TemporaryDirectory(prefix="nightbench-profile-") as tmp:
            traces = (Path(tmp) / "before.json", Path(tmp) / "after.json")
            bench, name = target.benchmark, metric_name
            before = profile_commit(before_env, bench, name, trace=traces[0], **options)
            after = profile_commit(after_env, bench, name, trace=traces[1], **options)
            repeat = None if counted else profile_commit(before_env, bench, name, **options)
            diff = diff_document(before, after, repeat=repeat)
            stored = [gzip.compress(t.read_bytes()) if t.is_file() else None for t in traces]
    except (BuildError, MeasureError, InvalidInput) as exc:
        log.warning("profile probe of %s failed: %s", target.benchmark, exc)
        return _failed(None, target, metric_name, _one_line(str(exc)))
    return BisectionProfile(
        benchmark=target.benchmark,
        metric=metric_name,
        before=target.before,
        after=target.after,
        culprit=target.culprit,
        status=ProfileStatus.DONE,
        diff=diff,
        trace_before=stored[0],
        trace_after=stored[1],
    )


def give_up(bisection_id: int, *, reason: str, settings: Settings | None = None) -> list[Step]:
    """When the ``bisect.profile`` task failed for good: store ``reason`` for every target not
    answered yet, and return ``night.file`` so the night is filed all the same.

    Returns:
        ``night.file`` of the bisection's night (nothing for no night or no such bisection).
    """
    settings = settings or get_settings()
    with session_scope() as session:
        bisection = session.get(Bisection, bisection_id)
        if bisection is None:
            return []
        run_id, metric_name = bisection.run_id, _metric_of(bisection)
        targets = _unanswered(session, bisection, settings)
    for target in targets:
        _store(_failed(bisection_id, target, metric_name, _one_line(reason)))
    return [Step("night.file", (run_id,))] if run_id is not None else []


def _metric_of(bisection: Bisection) -> str:
    """The metric a bisection measured (``latency`` unless it counted instructions)."""
    return str(bisection.config.get("measure", {}).get("metric") or "latency")


def _unanswered(session: Session, bisection: Bisection, settings: Settings) -> list[ProfileTarget]:
    """The bisection's profile targets (:func:`profile_targets`) with no stored answer yet (a
    redelivered task profiles nothing twice)."""
    answered = set(
        session.scalars(
            select(BisectionProfile.benchmark).where(BisectionProfile.bisection_id == bisection.id)
        )
    )
    targets = profile_targets(
        bisection.result or {}, bisection.commits, limit=settings.profile_benchmarks
    )
    return [t for t in targets if t.benchmark not in answered]


def _failed(
    bisection_id: int | None, target: ProfileTarget, metric_name: str, reason: str
) -> BisectionProfile:
    return BisectionProfile(
        bisection_id=bisection_id,
        benchmark=target.benchmark,
        metric=metric_name,
        before=target.before,
        after=target.after,
        culprit=target.culprit,
        status=ProfileStatus.FAILED,
        reason=reason,
    )


def _store(row: BisectionProfile) -> None:
    """Insert ``row``; one stored by a concurrent delivery of the same task wins."""
    try:
        with session_scope() as session:
            session.add(row)
    except IntegrityError:
        log.info("profile of %s for bisection %s stored already", row.benchmark, row.bisection_id)


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
