"""What an issue is, as plain data: what it says, the issue ready to file, the issue as filed.

:class:`IssueReport` and its parts (:class:`Change`, :class:`Bisection`, :class:`Probe`,
:class:`Commit`, :class:`Environment`, :class:`Checks`) are what one issue says, assembled from
stored results (:mod:`workers.issues.reports.regression`) and rendered (:mod:`workers.issues.render.regression`) into a
:class:`RenderedIssue`; :class:`TrackedIssue` is an issue as a tracker holds it. Pure: no
database, no network.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from service.benchmarks import benchmark_name
from service.errors import InvalidInput
from service.models import BisectionOutcome

_VERDICTS = ("different", "same", "unknown")
_SIDES = ("good", "bad", "undecided")
_OUTCOMES = ("culprit", "inconclusive", "not_reproduced", "not_bisected")


@dataclass(frozen=True)
class Change:
    """One series that moved beyond its threshold tonight.

    Attributes:
        model, mode, device, compiler: the benchmark (``compiler`` is ``eager`` unless compiled).
        metric: a metric name (``service.metrics``; any name renders).
        unit: ``ms`` or ``bytes`` (memory renders as MiB); other units render verbatim.
        baseline: the series' baseline, in ``unit``.
        tonight: tonight's value (median of samples), in ``unit``.
        p_value: the detector's p-value for "tonight differs from the baseline", if computed.
        p_basis: what the p-value compares, in words (``"tonight and its re-run vs 14
            nights"``): the detector tests night levels, so its p-value depends on how many.
        baseline_samples, tonight_samples: how many samples each side holds.
        machine: the machine (or machine class) that measured tonight's result.
        chart_url: an image of the series' history (the API's chart endpoint), if known.
        history_url: the API address of the series' history, if known.
        recent: the last nights' values in ``unit``, oldest first, tonight last.
        since: the step's first night at the new level when it began before tonight (it was
            raised once it persisted); ``None`` when it began tonight.
        noise: one sentence when the benchmark is marked unstable (alerted only beyond its
            noise): its spread and the bar the change cleared; ``None`` otherwise.
        sensitivity: one sentence on the smallest change the series could have seen at its
            noise (:mod:`service.regressions.sensitivity`); ``None`` without a baseline.
        work: one sentence on the work per step (``cpu_instructions``) beside a change in
            time: whether the count moved with it, ``None`` when the night counted nothing.
    """

    model: str
    mode: str
    device: str
    metric: str
    unit: str
    baseline: float
    tonight: float
    compiler: str = "eager"
    p_value: float | None = None
    p_basis: str | None = None
    baseline_samples: int | None = None
    tonight_samples: int | None = None
    machine: str = ""
    chart_url: str | None = None
    history_url: str | None = None
    recent: tuple[float, ...] = ()
    since: date | None = None
    noise: str | None = None
    sensitivity: str | None = None
    work: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.baseline) and self.baseline > 0):
            raise InvalidInput(
                f"baseline of {self.benchmark} {self.metric} must be a positive number, "
                f"got {self.baseline!r}"
            )
        if not math.isfinite(self.tonight) or self.tonight < 0:
            raise InvalidInput(
                f"tonight's value of {self.benchmark} {self.metric} must be a finite number >= 0, "
                f"got {self.tonight!r}"
            )

    @property
    def benchmark(self) -> str:
        """``"hf_Bert train cuda"`` (plus the compiler when not eager)."""
        name = f"{self.model} {self.mode} {self.device}"
        return name if self.compiler == "eager" else f"{name} {self.compiler}"

    @property
    def benchmark_id(self) -> str:
        """``"hf_Bert:train:cuda"``, the form ``nightbench bisect --benchmark`` takes."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)

    @property
    def relative(self) -> float:
        """Relative change ``(tonight - baseline) / baseline``; +0.124 is 12.4% more."""
        return (self.tonight - self.baseline) / self.baseline


@dataclass(frozen=True)
class Commit:
    """A commit as the issue names it.

    Attributes:
        sha: full hexadecimal sha.
        title: first line of the commit message.
        author: the author's name as git records it.
        author_login: the author's GitHub login when known (they get cc'd).
        pr_number: the pull request the message names (``(#61056)``), if any.
    """

    sha: str
    title: str = ""
    author: str = ""
    author_login: str | None = None
    pr_number: int | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-fA-F]{7,64}", self.sha):
            raise InvalidInput(f"commit sha must be 7 to 64 hex digits, got {self.sha!r}")

    @property
    def short(self) -> str:
        """The commit's short sha (7 hex digits)."""
        return self.sha[:7]


@dataclass(frozen=True)
class Probe:
    """One commit built and measured during the bisection (one benchmark's view of it).

    Attributes:
        commit: the probed commit.
        verdict_good: ``different`` | ``same`` | ``unknown`` against the good endpoint;
            ``None`` at the good endpoint itself.
        verdict_bad: the same against the bad endpoint; ``None`` at the bad endpoint itself.
        side: ``good`` | ``bad`` | ``undecided`` as the search read all samples of the commit;
            ``None`` derives it from the two verdicts.
        benchmark: which benchmark the verdicts are about (``model:mode:device``).
        purpose: why it was measured: ``endpoint`` | ``search`` | ``refine`` | ``verify``.
        samples: samples measured at this probe.
        median: median of those samples, in ``unit``.
        unit: unit of ``median``.
        build_seconds: time spent building the commit, in seconds.
        skipped: why the commit was skipped (failed to build), or ``None``.
    """

    commit: Commit
    verdict_good: str | None = "unknown"
    verdict_bad: str | None = "unknown"
    side: str | None = None
    benchmark: str = ""
    purpose: str = ""
    samples: int | None = None
    median: float | None = None
    unit: str = "ms"
    build_seconds: float | None = None
    skipped: str | None = None

    def __post_init__(self) -> None:
        for name in ("verdict_good", "verdict_bad"):
            value = getattr(self, name)
            if value is not None and value not in _VERDICTS:
                raise InvalidInput(f"probe {name} must be one of {_VERDICTS}, got {value!r}")
        if self.side is not None and self.side not in _SIDES:
            raise InvalidInput(f"probe side must be one of {_SIDES}, got {self.side!r}")

    @property
    def reading(self) -> str:
        """``good``, ``bad``, ``undecided`` or ``skipped``: where the search put this commit."""
        if self.skipped is not None:
            return "skipped"
        if self.side is not None:
            return self.side
        good = self.verdict_good in (None, "same") and self.verdict_bad == "different"
        bad = self.verdict_good == "different" and self.verdict_bad in (None, "same")
        if good:
            return "good"
        if bad:
            return "bad"
        return "undecided"


@dataclass(frozen=True)
class Bisection:
    """The search for the culprit over the night's commit range.

    Attributes:
        outcome: ``culprit`` | ``inconclusive`` (narrowed range, no single commit) |
            ``not_reproduced`` (the endpoints measured alike) | ``not_bisected``.
        good: the last good commit (the previous night's build, or the narrowed range's start);
            ``None`` only for ``not_bisected`` when the previous build's commit is unknown.
        bad: the first bad commit known (tonight's build, or the narrowed range's end);
            ``None`` only for ``not_bisected`` when tonight's commit is unknown.
        commits: how many commits the night's range held.
        culprit: the first bad commit, when ``outcome == "culprit"``.
        culprit_parent: the culprit's first parent.
        verified: culprit verification: its parent measures as good and it measures as bad.
        probes: every probe in the order measured, endpoints included.
        builds: distinct commits built, endpoints included.
        suspects: the commits that may hold the cause, oldest first (an inconclusive range's
            commits, or the night's range when not bisected), listed in the issue.
        reason: the bisection's own words for an ``inconclusive`` or ``not_reproduced``
            outcome (e.g. "the endpoints differ by +3.1%, below the 5% that counts").
    """

    outcome: str
    good: Commit | None
    bad: Commit | None
    commits: int | None = None
    culprit: Commit | None = None
    culprit_parent: Commit | None = None
    verified: bool | None = None
    probes: tuple[Probe, ...] = ()
    builds: int | None = None
    suspects: tuple[Commit, ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in _OUTCOMES:
            raise InvalidInput(
                f"bisection outcome must be one of {_OUTCOMES}, got {self.outcome!r}"
            )
        if self.outcome == BisectionOutcome.CULPRIT and self.culprit is None:
            raise InvalidInput("a bisection with outcome 'culprit' needs its culprit commit")
        if self.outcome != "not_bisected" and (self.good is None or self.bad is None):
            raise InvalidInput(
                f"a bisection with outcome {self.outcome!r} needs its good and bad commits"
            )

    @property
    def known_range(self) -> tuple[Commit, Commit] | None:
        """``(good, bad)`` when both ends are known."""
        if self.good is None or self.bad is None:
            return None
        return self.good, self.bad


@dataclass(frozen=True)
class Environment:
    """Where a result was measured (from the suite record's ``environment``).

    Attributes:
        torch_version: e.g. ``2.13.0.dev20261121+cu128``.
        torch_commit: torch's git commit (full sha).
        gpu: GPU model, or ``None`` on a CPU-only machine.
        driver: NVIDIA driver version.
        cuda: CUDA runtime version torch was built with.
        cpu: CPU model.
        python: Python version.
        machine: host or machine-class name.
        allocator: the measurement setup's allocator verified in the benchmark process
            (``jemalloc``, ``glibc + GLIBC_TUNABLES``, ...), ``None`` for older records.
    """

    torch_version: str | None = None
    torch_commit: str | None = None
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cpu: str | None = None
    python: str | None = None
    machine: str | None = None
    allocator: str | None = None


@dataclass(frozen=True)
class Checks:
    """What was done to make sure before filing.

    Attributes:
        confirmation: the confirmation re-run, in words (``"re-ran 2 benchmarks with 30
            samples each; both still regressed"``), or ``None`` if none was run.
        confirmed: whether the re-run reproduced the regression.
    """

    confirmation: str | None = None
    confirmed: bool | None = None


@dataclass(frozen=True)
class WhatChanged:
    """The profile probe of one benchmark: what changed between two builds, for the issue.

    Attributes:
        benchmark: ``model:mode:device``.
        metric: the metric profiled (``latency``: operators and Python functions;
            ``cpu_instructions``: functions).
        before: the first build's commit (the culprit's parent, or the range's good side).
        after: the second build's commit (the culprit, or the range's bad end).
        culprit: ``after`` is the named culprit.
        diff: :func:`service.profiles.diff_json` of the two profiles; None when it failed.
        failed: why the probe failed, in one line (None when it did not).
        traced: the two builds' Chrome traces were kept.
        diff_url: the API address of the full diff.
        trace_urls: the API addresses of the two builds' Chrome traces (empty: none kept).
    """

    benchmark: str
    metric: str
    before: str
    after: str
    culprit: bool
    diff: dict[str, Any] | None = None
    failed: str | None = None
    traced: bool = False
    diff_url: str | None = None
    trace_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class IssueReport:
    """Everything one issue says: the regressions of one alert that share a culprit or range.

    Attributes:
        regressions: the regressed series (at least one), worst first is not required.
        night: the night's date.
        tonight: environment of tonight's run.
        bisection: the bisection's outcome; the commit range alone when not bisected.
        baseline: environment of the baseline's latest night, for the side-by-side table.
        improvements: series of the same alert that got better.
        checks: confirmation re-run and what it found.
        code_url: the repository the range's commits live in, for links
            (``https://github.com/pytorch/pytorch``); ``None`` renders bare shas.
        torch_url: the repository of torch's own commits (environment table); ``None``
            renders bare shas.
        bisect_repo: path of the checkout the reproduction's ``nightbench bisect`` runs on.
        install_command: the ``--install`` command of that reproduction.
        alert_id, run_id: for the footer, so the issue points back at the stored alert.
        labels: labels to put on the issue.
        build_changes: how the build's identity (torch variant, suite requirements) moved
            between the baseline nights and tonight, one line each
            (:func:`service.runs.report.environment_changes`); empty when it did not.
        what_changed: the profile probe of the group's benchmarks (empty: none ran).
    """

    regressions: tuple[Change, ...]
    night: date
    tonight: Environment
    bisection: Bisection
    baseline: Environment | None = None
    improvements: tuple[Change, ...] = ()
    checks: Checks = field(default_factory=Checks)
    code_url: str | None = "https://github.com/pytorch/pytorch"
    torch_url: str | None = "https://github.com/pytorch/pytorch"
    bisect_repo: str = "~/pytorch"
    install_command: str = "python setup.py develop"
    alert_id: int | None = None
    run_id: int | None = None
    labels: tuple[str, ...] = ("performance", "regression")
    build_changes: tuple[str, ...] = ()
    what_changed: tuple[WhatChanged, ...] = ()

    def __post_init__(self) -> None:
        if not self.regressions:
            raise InvalidInput(
                "an issue needs at least one regression; improvements alone are not filed"
            )


@dataclass(frozen=True)
class RenderedIssue:
    """An issue ready to file: GitHub's fields plus the fingerprint the body carries."""

    title: str
    body: str
    labels: tuple[str, ...]
    fingerprint: str


@dataclass(frozen=True)
class TrackedIssue:
    """An issue as the tracker holds it.

    Attributes:
        number: the issue number (GitHub's, or the outbox file's).
        url: where a person reads it (``html_url``, or the outbox file's path).
        title: the issue title.
        state: ``open`` | ``closed``.
        state_reason: GitHub's ``completed`` | ``not_planned`` | ``reopened``, or ``None``.
        labels: label names.
        fingerprint: the fingerprint in the body's marker, ``None`` if it carries none.
        updated_at: last change, timezone-aware UTC.
        run_id: the run the issue was filed for (from the body's run marker), if any.
    """

    number: int
    url: str
    title: str
    state: str
    labels: tuple[str, ...]
    fingerprint: str | None
    updated_at: datetime
    state_reason: str | None = None
    run_id: int | None = None


@dataclass(frozen=True)
class NightRun:
    """A night's run as the missing-data and failing issues name it.

    Attributes:
        id: the run.
        night: its night.
        torch_spec: the build it measured (``nightly:2026-11-20``, a wheel, a commit).
        torch_git_commit: torch's commit of that build (full sha), when known.
        deadline_at: when the night stopped waiting for results (UTC), when it has one.
    """

    id: int
    night: date
    torch_spec: str
    torch_git_commit: str | None = None
    deadline_at: datetime | None = None


@dataclass(frozen=True)
class MissingJob:
    """A benchmark of a night that never reported by the run's deadline.

    Attributes:
        benchmark: ``model:mode:device`` (plus the compiler when not eager).
        model: the model, for the re-dispatch command.
        worker: the worker that last took the job, ``None`` when none did.
        attempts: how many times a worker started it.
        error: its last error text, if any.
    """

    benchmark: str
    model: str
    worker: str | None
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class MissingDataReport:
    """One missing-data issue: the benchmarks of one machine class (queue) and night that never
    reported (at least one)."""

    run: NightRun
    queue: str
    jobs: tuple[MissingJob, ...]

    def __post_init__(self) -> None:
        if not self.jobs:
            raise InvalidInput("a missing-data issue needs at least one missing benchmark")


@dataclass(frozen=True)
class Arrival:
    """Data that came for benchmarks of a missing-data issue (a comment on it).

    Attributes:
        night, queue: the night and machine class the issue is about.
        arrived: the benchmarks whose data came, sorted.
        still: those of the machine class still missing, sorted.
    """

    night: date
    queue: str
    arrived: tuple[str, ...]
    still: tuple[str, ...]


@dataclass(frozen=True)
class FailedNight:
    """One night a failing benchmark's job ended in an error (its run and the error text)."""

    run: NightRun
    error: str | None


@dataclass(frozen=True)
class FailingReport:
    """One failing-benchmark issue: a benchmark whose job failed on its last nights in a row.

    Attributes:
        benchmark, queue: the benchmark and the machine class it fails on.
        model, mode, device, compiler: the benchmark's parts, for the reproduction command.
        nights: how many nights in a row it failed; ``since``: the streak's first night.
        run: tonight's run (the one that filed it).
        failed: the failing nights, newest first.
        last_good: the last night it ran, when known (a benchmark counts only after it ran).
        source_repository: ``owner/name`` of the source repository on GitHub, for links.
        bisection_id, bisection_commits: the failure bisection searching the range, if started.
        bisect_provider: whether a build provider is configured (a bisection can be started).
    """

    benchmark: str
    queue: str
    model: str
    mode: str
    device: str
    compiler: str
    nights: int
    since: date
    run: NightRun
    failed: tuple[FailedNight, ...]
    last_good: NightRun | None = None
    source_repository: str | None = None
    bisection_id: int | None = None
    bisection_commits: int | None = None
    bisect_provider: bool = False


@dataclass(frozen=True)
class RunsAgain:
    """A benchmark that ``run`` measured after failing on ``nights`` nights since ``since``."""

    run: NightRun
    benchmark: str
    queue: str
    nights: int
    since: date


@dataclass(frozen=True)
class FailureBisected:
    """What a finished failure bisection found, for the comment on its issue.

    Attributes:
        id: the bisection.
        benchmark: the benchmark it searched.
        outcome: ``culprit`` | ``inconclusive`` | ``not_reproduced``.
        result: its stored answer (``Bisection.result``: culprits, per-benchmark answers,
            builds, rounds, the error and the commits stepped around).
        source_repository: ``owner/name`` of the source repository on GitHub, for links.
    """

    id: int
    benchmark: str
    outcome: str | None
    result: dict[str, Any]
    source_repository: str | None = None


@dataclass(frozen=True)
class Comment:
    """A comment an alert's filing posts once (``key``) on an open issue.

    Attributes:
        key: what makes a repeat a no-op (:meth:`IssueTracker.comment`).
        body: the comment's Markdown.
        fingerprint: the open issue carrying this fingerprint (one filed in the same attempt,
            else the tracker's); no open issue: nothing is told.
        number, url: the issue itself, when the kind found it already (checked open).
        record_id, regression_ids: the stored issue record and the regressions it tells of.
        action: what the filing reports for it (``commented`` | ``told``).
    """

    key: str
    body: str
    fingerprint: str | None = None
    number: int | None = None
    url: str = ""
    record_id: int | None = None
    regression_ids: tuple[int, ...] = ()
    action: str = "commented"


@dataclass(frozen=True)
class FiledIssue:
    """What filing did for one issue of an alert.

    Attributes:
        record_id: the :class:`~service.models.IssueRecord`, for the kinds that keep one.
        number: the issue number in its tracker.
        url: where to read it.
        action: ``created`` | ``commented`` (recurrence, arrival, runs again, bisected) |
            ``told`` (its series is back) | ``adopted`` (found by its marker, filed for this
            run by an attempt that did not get to record it).
        fingerprint: the fingerprint it carries.
        regression_ids: the regressions it now speaks for.
    """

    number: int
    url: str
    action: str
    fingerprint: str
    record_id: int | None = None
    regression_ids: tuple[int, ...] = ()
