"""What a filed issue says, as plain data, and its Markdown.

Pure: dataclasses in, a :class:`RenderedIssue` out; no database, no network. The same text goes
to GitHub and to the local outbox. The issue is written for a maintainer who will not click
anything: every number carries its unit, tables are Markdown, and nothing is a JSON dump.

A hidden marker, ``<!-- nightbench:fingerprint=<hex> -->``, ends every body so that a later
filing finds the open issue for the same benchmarks, metrics and culprit (or commit range) and
comments there instead of opening another.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date

from service.errors import InvalidInput

MARKER_PREFIX = "nightbench:fingerprint="
_MARKER_RE = re.compile(r"<!--\s*nightbench:fingerprint=([0-9a-f]{8,64})\s*-->")
_VERDICTS = ("different", "same", "unknown")
_SIDES = ("good", "bad", "undecided")
_RUN_MARKER_RE = re.compile(r"<!--\s*nightbench:run=(\d+)\s*-->")
_OUTCOMES = ("culprit", "inconclusive", "not_reproduced", "not_bisected")
_TITLE_LIMIT = 256  # GitHub rejects longer issue titles
_SPARK = "▁▂▃▄▅▆▇█"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Change:
    """One series that moved beyond its threshold tonight.

    Attributes:
        model, mode, device, compiler: the benchmark (``compiler`` is ``eager`` unless compiled).
        metric: ``latency`` | ``gpu_peak_mem`` | ``cpu_peak_mem`` (any name renders).
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
        name = f"{self.model}:{self.mode}:{self.device}"
        return name if self.compiler == "eager" else f"{name}:{self.compiler}"

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
            ``not_reproduced`` (the endpoints measured the same) | ``not_bisected``.
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

    def __post_init__(self) -> None:
        if self.outcome not in _OUTCOMES:
            raise InvalidInput(
                f"bisection outcome must be one of {_OUTCOMES}, got {self.outcome!r}"
            )
        if self.outcome == "culprit" and self.culprit is None:
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
    """

    torch_version: str | None = None
    torch_commit: str | None = None
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cpu: str | None = None
    python: str | None = None
    machine: str | None = None


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


def fingerprint(
    benchmarks: Iterable[str],
    metrics: Iterable[str],
    *,
    culprit: str | None = None,
    commit_range: tuple[str, str] | None = None,
) -> str:
    """A stable identity for "these benchmarks regressed in these metrics because of X".

    Order and repetition of ``benchmarks`` and ``metrics`` do not matter; shas compare
    case-insensitively.

    Args:
        benchmarks: benchmark ids such as ``"hf_Bert:train:cuda"``.
        metrics: metric names such as ``"latency"``.
        culprit: the culprit's full sha, when the bisection named one.
        commit_range: ``(good_sha, bad_sha)`` when there is no single culprit.

    Returns:
        16 lowercase hex digits (the start of a SHA-256 over a canonical JSON form).

    Raises:
        InvalidInput: no benchmark or metric, or not exactly one of ``culprit`` and
            ``commit_range``.
    """
    names = sorted({b.strip() for b in benchmarks if b.strip()})
    kinds = sorted({m.strip() for m in metrics if m.strip()})
    if not names:
        raise InvalidInput("fingerprint needs at least one benchmark")
    if not kinds:
        raise InvalidInput("fingerprint needs at least one metric")
    if (culprit is None) == (commit_range is None):
        raise InvalidInput("fingerprint needs exactly one of culprit and commit_range")
    cause = (
        {"culprit": culprit.lower()}
        if culprit is not None
        else {"range": [commit_range[0].lower(), commit_range[1].lower()]}  # type: ignore[index]
    )
    canonical = json.dumps({"benchmarks": names, "metrics": kinds, **cause}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def marker(fp: str) -> str:
    """The hidden HTML comment that carries ``fp`` in an issue body."""
    return f"<!-- {MARKER_PREFIX}{fp} -->"


def run_marker(run_id: int) -> str:
    """The hidden HTML comment naming the run an issue was filed for."""
    return f"<!-- nightbench:run={run_id} -->"


def find_fingerprint(body: str | None) -> str | None:
    """The fingerprint in an issue body's marker, or ``None`` if it carries none."""
    if not body:
        return None
    found = _MARKER_RE.search(body)
    return found.group(1) if found else None


def report_fingerprint(report: IssueReport) -> str:
    """The fingerprint of ``report``: its regressed benchmarks, metrics and culprit or range."""
    bisection = report.bisection
    benchmarks = [c.benchmark_id for c in report.regressions]
    metrics = [c.metric for c in report.regressions]
    if bisection.outcome == "culprit" and bisection.culprit is not None:
        return fingerprint(benchmarks, metrics, culprit=bisection.culprit.sha)
    # Without a known commit, the torch builds stand for the ends of the range.
    good = bisection.good.sha if bisection.good else f"torch:{_version(report.baseline)}"
    bad = bisection.bad.sha if bisection.bad else f"torch:{_version(report.tonight)}"
    return fingerprint(benchmarks, metrics, commit_range=(good, bad))


def find_run_id(body: str | None) -> int | None:
    """The run id in an issue body's run marker, or ``None``."""
    if not body:
        return None
    found = _RUN_MARKER_RE.search(body)
    return int(found.group(1)) if found else None


def format_value(value: float, unit: str) -> str:
    """A number with its unit: ``12.41 ms``, ``1,234.5 MiB`` (bytes are shown in MiB)."""
    if unit == "bytes":
        return f"{value / _MIB:,.1f} MiB"
    if unit == "ms":
        if abs(value) >= 100:
            return f"{value:,.1f} ms"
        if abs(value) >= 1:
            return f"{value:.2f} ms"
        return f"{value:.3f} ms"
    return f"{value:,.4g} {unit}".rstrip()


def format_change(relative: float) -> str:
    """``+12.4%`` for a relative change of 0.124."""
    return f"{relative * 100:+.1f}%"


def format_p_value(p_value: float | None) -> str:
    """``p < 0.001``, ``p = 0.012``, or ``n/a``."""
    if p_value is None or not math.isfinite(p_value):
        return "n/a"
    if p_value < 0.001:
        return "p < 0.001"
    return f"p = {p_value:.3f}"


def sparkline(values: Sequence[float]) -> str:
    """A one-line chart of ``values`` with block characters (lowest ▁ to highest █)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low <= 0:
        return _SPARK[0] * len(values)
    steps = len(_SPARK) - 1
    return "".join(_SPARK[round((v - low) / (high - low) * steps)] for v in values)


def render_issue(report: IssueReport) -> RenderedIssue:
    """Render ``report`` as a GitHub issue.

    Args:
        report: what the issue says.

    Returns:
        The title (at most 256 characters), the Markdown body ending in the fingerprint marker,
        the labels, and the fingerprint.
    """
    fp = report_fingerprint(report)
    ordered = tuple(sorted(report.regressions, key=lambda c: c.relative, reverse=True))
    sections = [
        _lead(report, ordered),
        _summary_section(ordered),
        _culprit_section(report),
        _history_section(ordered),
        _environment_section(report),
        _reproduce_section(report, ordered),
        _checks_section(report),
        _improvements_section(report.improvements),
        _footer(report, fp),
    ]
    body = "\n\n".join(s for s in sections if s) + "\n"
    return RenderedIssue(
        title=_title(report, ordered),
        body=body,
        labels=tuple(dict.fromkeys(report.labels)),
        fingerprint=fp,
    )


def render_recurrence(report: IssueReport, *, issue_number: int | None = None) -> str:
    """The comment left on the open issue when the same regression shows up another night.

    Args:
        report: tonight's report carrying the same fingerprint as the issue.
        issue_number: the issue commented on, only for the wording of the note.

    Returns:
        Markdown: ``Still regressed on D`` and tonight's summary table.
    """
    ordered = tuple(sorted(report.regressions, key=lambda c: c.relative, reverse=True))
    where = f" (run {report.run_id})" if report.run_id is not None else ""
    torch = report.tonight.torch_version or "unknown torch"
    lines = [
        f"**Still regressed on {report.night.isoformat()}**{where}, torch {torch}.",
        "",
        _summary_table(ordered),
    ]
    return "\n".join(lines) + "\n"


def _title(report: IssueReport, ordered: Sequence[Change]) -> str:
    worst = ordered[0]
    what = f"{worst.benchmark} {worst.metric} {format_change(worst.relative)}"
    if len(ordered) > 1:
        what += f" and {len(ordered) - 1} more"
    bisection = report.bisection
    if bisection.outcome == "culprit" and bisection.culprit is not None:
        tail = f"since {bisection.culprit.short}"
        commit_title = _shorten(bisection.culprit.title, 80)
        if commit_title:
            tail += f" ({commit_title})"
    elif bisection.outcome == "inconclusive" and bisection.known_range is not None:
        good, bad = bisection.known_range
        tail = f"in {good.short}..{bad.short}"
        if bisection.commits:
            tail += f" ({bisection.commits} commits)"
    else:
        tail = f"on {report.night.isoformat()}"
        if bisection.known_range is not None:
            good, bad = bisection.known_range
            same = good.sha.lower() == bad.sha.lower()
            tail += f" (at {bad.short})" if same else f" ({good.short}..{bad.short})"
        elif report.tonight.torch_version:
            tail += f" (torch {report.tonight.torch_version})"
    return _shorten(f"[perf] {what} {tail}", _TITLE_LIMIT)


def _lead(report: IssueReport, ordered: Sequence[Change]) -> str:
    worst = ordered[0]
    bisection = report.bisection
    sentence = (
        f"**{worst.benchmark} {worst.metric} went from {format_value(worst.baseline, worst.unit)} "
        f"to {format_value(worst.tonight, worst.unit)} ({format_change(worst.relative)})** "
        f"on the night of {report.night.isoformat()}"
    )
    if worst.machine:
        sentence += f" on `{worst.machine}`"
    if len(ordered) > 1:
        sentence += f"; {len(ordered) - 1} more series regressed with it"
    sentence += "."
    lines = [sentence]
    if bisection.outcome == "culprit" and bisection.culprit is not None:
        c = bisection.culprit
        who = _person(c)
        text = f"The bisection names {_commit_link(report, c)}"
        if c.title:
            text += f" {_quote(c.title)}"
        if who:
            text += f" by {who}"
        if c.pr_number is not None:
            text += f", {_pr_link(report, c.pr_number)}"
        lines.append(text + " as the first bad commit.")
    elif bisection.outcome == "inconclusive":
        lines.append(
            "The bisection narrowed the cause to the range "
            f"{_range_link(report, bisection)} but could not single out one "
            "commit: the measurements there were too close to call."
        )
    elif bisection.outcome == "not_reproduced":
        lines.append(
            "Bisection did not reproduce the change between "
            f"{_range_link(report, bisection)}: "
            "both endpoints measured the same."
        )
    else:
        lines.append(
            f"The night's commit range is {_range_link(report, bisection)}; "
            "it has not been bisected."
        )
    culprit = bisection.culprit if bisection.outcome == "culprit" else None
    if culprit is not None and culprit.author_login:
        lines.append(f"cc @{culprit.author_login}")
    return "\n\n".join(lines)


def _summary_table(ordered: Sequence[Change]) -> str:
    rows = [
        "| benchmark | metric | baseline → tonight | change | confidence "
        "| samples (baseline / tonight) | machine |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in ordered:
        samples = f"{_count(c.baseline_samples)} / {_count(c.tonight_samples)}"
        rows.append(
            f"| {c.benchmark} | {c.metric} | {format_value(c.baseline, c.unit)} → "
            f"{format_value(c.tonight, c.unit)} | **{format_change(c.relative)}**"
            f"{f' since {c.since}' if c.since else ''} | "
            f"{_confidence_cell(c)} | {samples} | {_cell(c.machine) or 'n/a'} |"
        )
    return "\n".join(rows)


def _confidence_cell(change: Change) -> str:
    if change.p_value is None:
        return _cell(change.p_basis) or "n/a"
    text = format_p_value(change.p_value)
    if change.p_basis:
        text += f" ({_cell(change.p_basis)})"
    return text


def _summary_section(ordered: Sequence[Change]) -> str:
    return "## Summary\n\n" + _summary_table(ordered)


def _culprit_section(report: IssueReport) -> str:
    bisection = report.bisection
    parts: list[str] = []
    if bisection.outcome == "culprit" and bisection.culprit is not None:
        c = bisection.culprit
        rows = [
            "| | |",
            "| --- | --- |",
            f"| commit | {_commit_link(report, c)} |",
            f"| title | {_cell(c.title) or 'n/a'} |",
            f"| author | {_cell(_person(c)) or 'n/a'} |",
            f"| pull request | {_pr_link(report, c.pr_number) if c.pr_number else 'none named'} |",
        ]
        if bisection.culprit_parent is not None:
            rows.append(f"| parent | {_commit_link(report, bisection.culprit_parent)} |")
        parts.append("## Culprit\n\n" + "\n".join(rows))
    elif bisection.outcome == "inconclusive":
        text = (
            "## Commit range\n\n"
            f"No single culprit: the cause lies in {_range_link(report, bisection)}, "
            "where the probes could not tell the commits apart even with extra samples."
        )
        if bisection.suspects:
            text += " The commits to read:\n\n" + _commit_table(report, bisection.suspects)
        parts.append(text)
    else:
        text = f"## Commit range\n\n{_range_link(report, bisection)}"
        text += f", {bisection.commits} commits." if bisection.commits else "."
        if bisection.suspects:
            text += "\n\n" + _commit_table(report, bisection.suspects)
        parts.append(text)
    if bisection.probes:
        parts.append(_probe_table(report, bisection))
    return "\n\n".join(parts)


def _probe_table(report: IssueReport, bisection: Bisection) -> str:
    head = "### Bisection"
    facts = []
    if bisection.commits:
        floor = math.ceil(math.log2(bisection.commits + 1))
        facts.append(f"{bisection.commits} commits in range")
        if bisection.builds is not None:
            facts.append(f"{bisection.builds} builds (binary-search floor {floor})")
    elif bisection.builds is not None:
        facts.append(f"{bisection.builds} builds")
    show_benchmark = len({p.benchmark for p in bisection.probes if p.benchmark}) > 1
    header = "| # | commit | title |" + (" benchmark |" if show_benchmark else "")
    header += " vs good | vs bad | reading | samples | median | build |"
    rule = "|" + " --- |" * (header.count("|") - 1)
    rows = [header, rule]
    for i, p in enumerate(bisection.probes, start=1):
        median = format_value(p.median, p.unit) if p.median is not None else "n/a"
        build = f"{p.build_seconds:.0f} s" if p.build_seconds is not None else "n/a"
        reading = p.reading if p.skipped is None else f"skipped: {_cell(p.skipped)}"
        cells = [str(i), _commit_link(report, p.commit), _cell(_shorten(p.commit.title, 60))]
        if show_benchmark:
            cells.append(p.benchmark)
        cells += [
            _verdict_cell(p, p.verdict_good),
            _verdict_cell(p, p.verdict_bad),
            f"**{reading}**",
            _count(p.samples),
            median,
            build,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    text = head + "\n\n"
    if facts:
        text += "; ".join(facts) + ". "
    text += (
        "Each probe's samples are compared with the good and the bad endpoint's; "
        "a verdict is `different`, `same` or `unknown` (too close to call).\n\n"
    )
    return text + "\n".join(rows)


def _verdict_cell(probe: Probe, verdict: str | None) -> str:
    if probe.skipped is not None:
        return ""
    return verdict or "(endpoint)"


def _history_section(ordered: Sequence[Change]) -> str:
    blocks = []
    for c in ordered:
        lines = [f"**{c.benchmark} {c.metric}**"]
        if c.chart_url:
            lines.append(f"![{c.benchmark} {c.metric} history]({c.chart_url})")
        if c.recent:
            values = ", ".join(format_value(v, c.unit) for v in c.recent)
            lines.append(
                f"Last {len(c.recent)} nights, oldest first: `{sparkline(c.recent)}` {values}"
            )
        if c.history_url:
            lines.append(f"History API: {c.history_url}")
        if len(lines) > 1:
            blocks.append("\n\n".join(lines))
    if not blocks:
        return ""
    return "## History\n\n" + "\n\n".join(blocks)


def _environment_section(report: IssueReport) -> str:
    rows_spec = [
        ("torch", "torch_version"),
        ("torch commit", "torch_commit"),
        ("GPU", "gpu"),
        ("driver", "driver"),
        ("CUDA", "cuda"),
        ("CPU", "cpu"),
        ("Python", "python"),
        ("machine", "machine"),
    ]
    base = report.baseline
    if base is not None:
        rows = ["| | baseline | tonight |", "| --- | --- | --- |"]
    else:
        rows = ["| | tonight |", "| --- | --- |"]
    for label, attr in rows_spec:
        tonight = getattr(report.tonight, attr)
        before = getattr(base, attr) if base is not None else None
        if tonight is None and before is None:
            continue
        fmt = _sha_cell if attr == "torch_commit" else _plain_cell
        if base is not None:
            rows.append(f"| {label} | {fmt(report, before)} | {fmt(report, tonight)} |")
        else:
            rows.append(f"| {label} | {fmt(report, tonight)} |")
    return "## Environment\n\n" + "\n".join(rows)


def _reproduce_section(report: IssueReport, ordered: Sequence[Change]) -> str:
    lines = []
    seen: set[str] = set()
    for c in ordered:
        if c.benchmark_id in seen:
            continue
        seen.add(c.benchmark_id)
        command = (
            f"python -m suite run --model {shlex.quote(c.model)} --mode {c.mode} "
            f"--device {c.device}"
        )
        if c.compiler != "eager":
            command += f" --compiler {c.compiler}"
        lines.append(command + f" --out {_slug(c.benchmark_id)}.json")
    bisection = report.bisection
    pair: tuple[str, str] | None = None
    if bisection.outcome == "culprit" and bisection.culprit and bisection.culprit_parent:
        # The culprit and its parent are the narrowest pair that shows the change.
        pair = (bisection.culprit_parent.sha, bisection.culprit.sha)
    elif bisection.known_range is not None and bisection.good != bisection.bad:
        pair = (bisection.known_range[0].sha, bisection.known_range[1].sha)
    if pair is not None:
        benchmark_flags = " ".join(f"--benchmark {b}" for b in sorted(seen))
        lines.append(
            f"nightbench bisect --repo {report.bisect_repo} --good {pair[0]} --bad {pair[1]} "
            f"{benchmark_flags} --install {shlex.quote(report.install_command)}"
        )
    intro = (
        "With tonight's build installed, measure the benchmark"
        + (", then bisect on your own checkout" if pair is not None else "")
        + " (each `--out` file holds the raw samples, in ms per iteration):"
    )
    return "## Reproduce\n\n" + intro + "\n\n```bash\n" + "\n".join(lines) + "\n```"


def _checks_section(report: IssueReport) -> str:
    items = []
    checks = report.checks
    if checks.confirmation:
        verdict = {True: "reproduced", False: "did not reproduce", None: "no verdict"}[
            checks.confirmed
        ]
        items.append(f"- Confirmation re-run ({verdict}): {checks.confirmation}")
    else:
        items.append("- Confirmation re-run: not run.")
    bisection = report.bisection
    if bisection.outcome == "culprit":
        if bisection.verified is True:
            parent = bisection.culprit_parent
            parent_text = f" ({_commit_link(report, parent)})" if parent is not None else ""
            items.append(
                f"- Culprit verification: passed; the parent{parent_text} measures as good and "
                "the culprit as bad."
            )
        elif bisection.verified is False:
            items.append(
                "- Culprit verification: **failed**; "
                "treat the named commit as a lead, not a verdict."
            )
        else:
            items.append("- Culprit verification: not run.")
    elif bisection.outcome == "inconclusive":
        items.append("- Culprit verification: not applicable, no single culprit was named.")
    skipped = [p for p in bisection.probes if p.skipped is not None]
    if skipped:
        names = ", ".join(f"`{p.commit.short}` ({_cell(p.skipped)})" for p in skipped)
        items.append(f"- Skipped commits (did not build): {names}")
    return "## What was checked\n\n" + "\n".join(items)


def _improvements_section(improvements: Sequence[Change]) -> str:
    if not improvements:
        return ""
    rows = [
        "## Improvements\n",
        "The same night also got better here (no action needed):\n",
        "| benchmark | metric | baseline → tonight | change |",
        "| --- | --- | --- | --- |",
    ]
    for c in sorted(improvements, key=lambda c: c.relative):
        rows.append(
            f"| {c.benchmark} | {c.metric} | {format_value(c.baseline, c.unit)} → "
            f"{format_value(c.tonight, c.unit)} | {format_change(c.relative)} |"
        )
    return "\n".join(rows)


def _footer(report: IssueReport, fp: str) -> str:
    where = []
    if report.alert_id is not None:
        where.append(f"alert {report.alert_id}")
    if report.run_id is not None:
        where.append(f"run {report.run_id}")
    source = f" ({', '.join(where)})" if where else ""
    return (
        "---\n\n"
        f"<sub>Filed by nightbench{source}. Triage here: close this issue once fixed; close it "
        "with the label `invalid` (or as not planned) if it is noise; add the label `expected` to "
        "accept the new level as the baseline. Recurrences are added as comments.</sub>\n\n"
        + (run_marker(report.run_id) + "\n" if report.run_id is not None else "")
        + marker(fp)
    )


def _commit_link(report: IssueReport, commit: Commit) -> str:
    if report.code_url:
        return f"[`{commit.short}`]({report.code_url.rstrip('/')}/commit/{commit.sha})"
    return f"`{commit.short}`"


def _range_link(report: IssueReport, bisection: Bisection) -> str:
    if bisection.known_range is None:
        before, after = _version(report.baseline), _version(report.tonight)
        return f"unknown (torch {before} → {after}, commits not recorded)"
    good, bad = bisection.known_range
    if good.sha.lower() == bad.sha.lower():
        return f"{_commit_link(report, bad)} (no new commit since the previous night)"
    text = f"`{good.short}..{bad.short}`"
    if report.code_url:
        return f"[{text}]({report.code_url.rstrip('/')}/compare/{good.sha}...{bad.sha})"
    return text


def _commit_table(report: IssueReport, commits: Sequence[Commit]) -> str:
    rows = ["| commit | title | author | pull request |", "| --- | --- | --- | --- |"]
    for c in commits:
        pr = _pr_link(report, c.pr_number) if c.pr_number else ""
        rows.append(
            f"| {_commit_link(report, c)} | {_cell(_shorten(c.title, 80))} | "
            f"{_cell(_person(c))} | {pr} |"
        )
    return "\n".join(rows)


def _version(env: Environment | None) -> str:
    return (env.torch_version if env is not None else None) or "unknown"


def _pr_link(report: IssueReport, number: int | None) -> str:
    if number is None:
        return "none named"
    if report.code_url:
        return f"[#{number}]({report.code_url.rstrip('/')}/pull/{number})"
    return f"#{number}"


def _person(commit: Commit) -> str:
    if commit.author and commit.author_login:
        return f"{commit.author} (@{commit.author_login})"
    if commit.author_login:
        return f"@{commit.author_login}"
    return commit.author


def _sha_cell(report: IssueReport, value: str | None) -> str:
    if not value:
        return "n/a"
    if re.fullmatch(r"[0-9a-fA-F]{7,64}", value):
        short = value[:7]
        if report.torch_url:
            return f"[`{short}`]({report.torch_url.rstrip('/')}/commit/{value})"
        return f"`{short}`"
    return _cell(value)


def _plain_cell(report: IssueReport, value: str | None) -> str:
    return _cell(value) if value else "n/a"


def _cell(text: str | None) -> str:
    """Text safe inside a Markdown table cell (one line, pipes escaped)."""
    if not text:
        return ""
    return " ".join(text.split()).replace("|", "\\|")


def _quote(title: str) -> str:
    return f'"{_cell(_shorten(title, 100))}"' if title else ""


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _count(n: int | None) -> str:
    return str(n) if n is not None else "n/a"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "result"
