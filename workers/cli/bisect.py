"""``nightbench bisect`` and ``nightbench demo``: the commands, registered in ``workers/cli/__init__.py``.

Kept apart from ``cli.py`` so that its import stays cheap: the search (scipy) and the demo are
imported when a command runs.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from service.errors import NightbenchError
from service.models import BisectionOutcome, ProbeStatus
from workers.cli.common import (
    BaseShaOption,
    BuildOptions,
    InstallOption,
    PackageOption,
    ProviderOption,
    WheelUrlOption,
    WorkDirOption,
    build_provider,
    console,
    err_console,
)
from workers.cli.common import fail as _fail

if TYPE_CHECKING:
    from workers.bisect.local_driver import ProbeHook, RoundHook
    from workers.bisect.search import SearchConfig
    from workers.builds.base import BuildProvider
    from workers.commits import CommitInfo


class Direction(StrEnum):
    """The change ``nightbench bisect --direction`` hunts."""

    slower = "slower"
    either = "either"


_DIRECTION_HELP = (
    "slower: only a slowdown is bisected, endpoints measuring the other way end not "
    "reproduced (as the nightly's bisection); either: a change of either sign"
)


def bisect(
    repo: Annotated[Path, typer.Option(help="local git clone of the package under test")],
    good: Annotated[str, typer.Option(help="last good commit")],
    bad: Annotated[str, typer.Option(help="first bad commit")],
    benchmark: Annotated[
        list[str] | None, typer.Option(help="suite benchmark MODEL:MODE:DEVICE (repeatable)")
    ] = None,
    command: Annotated[
        list[str] | None,
        typer.Option(
            help='benchmark command run in the checkout; last stdout line {"samples": \\[ms, ...]} '
            "(repeatable: one benchmark each)"
        ),
    ] = None,
    install: InstallOption = "",
    workers: Annotated[int, typer.Option(min=1, max=64, help="commits probed per round")] = 1,
    samples: Annotated[
        int | None,
        typer.Option(min=3, help="samples per benchmark per probe (default 12; counted: 6)"),
    ] = None,
    max_samples: Annotated[
        int | None, typer.Option(min=3, help="cap when doubling samples (default 48; counted: 6)")
    ] = None,
    min_change: Annotated[
        float,
        typer.Option(min=0.0, help="endpoints closer than this fraction count as not reproduced"),
    ] = 0.05,
    direction: Annotated[Direction, typer.Option(help=_DIRECTION_HELP)] = Direction.either,
    budget_builds: Annotated[
        int | None,
        typer.Option(min=2, help="commits a benchmark may build (default: ⌈log2(N+1)⌉ + 8)"),
    ] = None,
    budget_samples: Annotated[
        int | None,
        typer.Option(min=1, help="samples of one benchmark in all (default: 60 × max-samples)"),
    ] = None,
    budget_seconds: Annotated[
        float | None,
        typer.Option(min=1.0, help="wall time of the bisection's rounds, s (default: no limit)"),
    ] = None,
    provider: ProviderOption = "checkout",
    wheel_url: WheelUrlOption = None,
    package: PackageOption = None,
    base_sha: BaseShaOption = None,
    work_dir: WorkDirOption = None,
    keep_builds: Annotated[bool, typer.Option(help="leave the builds on disk")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
    metric: Annotated[
        str,
        typer.Option(
            help="what each probe measures: latency, or cpu_instructions (counted under "
            "valgrind's callgrind: the command's toggled windows, or its whole run)"
        ),
    ] = "latency",
) -> None:
    """Bisect GOOD..BAD of a local repository to the commits that changed latency."""
    from service.metrics import BISECT_METRICS, INSTRUCTIONS
    from workers.bisect.counts import COUNT_SAMPLES
    from workers.bisect.local_driver import bisect_repository
    from workers.bisect.search import floor_builds

    if metric not in BISECT_METRICS:
        _fail(f"--metric must be one of {', '.join(BISECT_METRICS)}, got {metric!r}")
        return
    counted = metric == INSTRUCTIONS  # near-deterministic: few samples, one process a probe
    samples = samples or (COUNT_SAMPLES[0] if counted else 12)
    max_samples = max_samples or (COUNT_SAMPLES[1] if counted else 48)
    try:
        config, commits, builder = _bisect_inputs(
            repo,
            good,
            bad,
            workers=workers,
            samples=samples,
            max_samples=max_samples,
            min_change=min_change,
            slower=direction is Direction.slower,
            budget=(budget_builds, budget_samples, budget_seconds),
            build=BuildOptions(
                provider=provider,
                install=install,
                wheel_url=wheel_url,
                package=package,
                base_sha=base_sha,
                work_dir=work_dir,
            ),
        )
    except NightbenchError as exc:
        _fail(exc.message)
        return
    n = len(commits) - 1
    progress = _progress(transient=as_json)
    built: set[str] = set()
    with progress:
        bar = progress.add_task(f"{n} commits", total=floor_builds(n) + 2)
        on_round, on_probe = _progress_hooks(progress, bar, built)
        try:
            report = bisect_repository(
                repo,
                good,
                bad,
                benchmarks=benchmark or (),
                commands=command or (),
                install=install,
                config=config,
                provider=builder,
                keep_builds=keep_builds,
                on_round=on_round,
                on_probe=on_probe,
                metric=metric,
            )
        except NightbenchError as exc:
            _fail(exc.message)
            return
        progress.update(bar, description="done", completed=len(built), total=len(built))
    _print_report(report.as_json(), as_json=as_json)


def _bisect_inputs(
    repo: Path,
    good: str,
    bad: str,
    *,
    workers: int,
    samples: int,
    max_samples: int,
    min_change: float,
    slower: bool,
    budget: tuple[int | None, int | None, float | None] = (None, None, None),
    build: BuildOptions,
) -> tuple[SearchConfig, list[CommitInfo], BuildProvider]:
    """The options of ``nightbench bisect`` checked: the search settings, the commit range and
    the build provider. ``slower``: only a slowdown is bisected (``SearchConfig.slower``);
    ``budget``: builds, samples and seconds (``SearchConfig.budget_*``, None: the default);
    ``build``: the build provider's options (:func:`workers.cli.common.build_provider`).

    Raises:
        NightbenchError: an option is out of range, the commit range or the provider is bad.
    """
    from workers.bisect.search import SearchConfig
    from workers.commits import local_commit_range

    config = SearchConfig(
        workers=workers,
        initial_samples=samples,
        max_samples=max(max_samples, samples),
        min_change=min_change,
        slower=True if slower else None,
        budget_builds=budget[0],
        budget_samples=budget[1],
        budget_seconds=budget[2],
    )
    commits = local_commit_range(repo, good, bad)
    builder, _spec = build_provider(repo, build)
    return config, commits, builder


def _progress(*, transient: bool) -> Progress:
    """The progress bar of ``nightbench bisect``, on stderr: builds done of those expected."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("builds"),
        TimeElapsedColumn(),
        console=err_console,
        transient=transient,
    )


def _progress_hooks(
    progress: Progress, bar: TaskID, built: set[str]
) -> tuple[RoundHook, ProbeHook]:
    """The progress bar's hooks: each round's commits, and the commits built so far."""

    def on_round(state, requests) -> None:  # type: ignore[no-untyped-def]
        what = ", ".join(f"{r.sha[:8]} ({r.purpose})" for r in requests)
        progress.update(bar, description=f"round {state.round}: {what}")

    def on_probe(request, result) -> None:  # type: ignore[no-untyped-def]
        built.add(request.sha)
        total = max(progress.tasks[0].total or 0, len(built))
        progress.update(bar, completed=len(built), total=total)

    return on_round, on_probe


def _print_report(data: dict, *, as_json: bool) -> None:
    """The outcome on stdout: as JSON, or as a table of the probes and a line per answer."""
    if as_json:
        print(json.dumps(data, indent=1))
        return
    _print_bisection(data)


def _print_bisection(data: dict) -> None:
    names = [b["benchmark"] for b in data["benchmarks"]]
    several = len(names) > 1
    title = f"probes of {data['good'][:10]}..{data['bad'][:10]} ({data['commits']} commits)"
    table = Table(title=title if several else f"{title}: {names[0]}")
    short = {"different": "diff", "same": "same", "unknown": "?", None: "-"}
    columns = [
        "#",
        "commit",
        "purpose",
        "build s",
        *(["benchmark"] if several else []),
        "n",
        "median ms",
        "good/bad",
        "side",
    ]
    for col in columns:
        table.add_column(col, no_wrap=True, max_width=18 if col == "benchmark" else None)
    for p in data["probes"]:
        build = "-" if p["build_seconds"] is None else f"{p['build_seconds']:.1f}"
        head = [str(p["round"]), p["sha"][:8], p["purpose"], build]
        if p["status"] == ProbeStatus.SKIPPED:
            table.add_row(*head, *(["-"] if several else []), "-", "-", "-", "[yellow]skipped")
            continue
        for r in p["results"]:
            values = sorted(r["samples"])
            median = f"{values[len(values) // 2]:.3f}" if values else "-"
            verdicts = f"{short[r['vs_good']]}/{short[r['vs_bad']]}"
            side = r["side"] or ("error" if r["error"] else "-")
            table.add_row(
                *head,
                *([r["benchmark"]] if several else []),
                str(len(values)),
                median,
                verdicts,
                side,
            )
    console.print(table)
    for c in data["culprits"]:
        pr = f" (PR #{c['pr_number']})" if c["pr_number"] else ""
        changes = ", ".join(
            f"{name} {change:+.1%}" for name, change in c["change"].items() if change is not None
        )
        console.print(
            f"[bold red]culprit[/] {c['sha']}{pr}: {c['title']} — {c['author']} "
            f"<{c['author_email']}>; {changes}"
        )
    for b in data["benchmarks"]:
        if b["status"] != BisectionOutcome.CULPRIT:
            rng = f" in {b['range'][0][:10]}..{b['range'][-1][:10]}" if b["range"] else ""
            console.print(f"[yellow]{b['status']}[/] {b['benchmark']}{rng}: {b['reason']}")
    for s in data["skipped"]:
        first = s["reason"].splitlines()[0] if s["reason"] else ""
        console.print(f"[yellow]skipped[/] {s['sha'][:10]}: {first}")
    console.print(
        f"outcome: [bold]{data['outcome']}[/]; {data['builds']} builds, {data['rounds']} rounds"
    )


def demo(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="an empty folder for the demo (default: a new temporary one)"),
    ] = None,
    nights: Annotated[
        int, typer.Option(min=7, help="good nights before the bad one (the detector's baseline)")
    ] = 14,
    commits: Annotated[int, typer.Option(min=2, help="commits in the bad night's range")] = 12,
    culprit_kind: Annotated[
        str,
        typer.Option(
            "--culprit-kind",
            help="what the culprit plants: python-check (checks in minitok's encode) or "
            "aten-op (a copy of tokbag's embedding table in its forward)",
        ),
    ] = "python-check",
    counted_nights: Annotated[
        int,
        typer.Option(
            "--counted-nights",
            min=0,
            help="the last N good nights and the bad one also count tokbag's instructions "
            "under valgrind (cpu_instructions; minutes a night); 0: none",
        ),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Plant a slowdown in a small package, then detect, confirm, bisect and file it."""
    import tempfile

    from workers.demo.run import DEMO_BENCHMARK, run_demo

    workdir = directory or Path(tempfile.mkdtemp(prefix="nightbench-demo-"))
    try:
        with err_console.status("starting") as status:

            def on_step(text: str) -> None:
                status.update(text)
                err_console.log(text)

            result = run_demo(
                workdir,
                baseline_nights=nights,
                commits=commits,
                culprit=max(1, commits * 2 // 3),
                culprit_kind=culprit_kind,
                counted_nights=counted_nights,
                on_step=on_step,
            )
    except NightbenchError as exc:
        _fail(exc.message)
        return
    data = result.as_json()
    if as_json:
        print(json.dumps(data, indent=1))
        return
    found = [r for r in result.regressions if r["benchmark"] == DEMO_BENCHMARK]
    for r in found:
        console.print(
            f"regression: {r['benchmark']} {r['metric']} {r['change']:+.1%} "
            f"(confirmation: {r['confirmation']})"
        )
    if result.bisection:
        _print_bisection(result.bisection)
    console.print(f"planted culprit: {result.culprit}")
    for path in result.issues:
        console.print(f"issue filed: {path}")
    console.print(f"everything is under {result.workdir}")


def resume(
    bisection_id: Annotated[
        int, typer.Argument(help="the bisection, as `nightbench status` lists it")
    ],
) -> None:
    """Send a running bisection's unfinished probes to its queue again.

    After an outage, or when `nightbench status` says its probes have waited a day; when no
    probe is left unfinished, its next round is planned instead.
    """
    from workers.bisect.celery_driver import resume as resume_bisection

    try:
        sent = resume_bisection(bisection_id)
    except NightbenchError as exc:
        _fail(exc.message)
    console.print(
        f"bisection {bisection_id}: {sent} probe task(s) sent again"
        if sent
        else f"bisection {bisection_id}: no probe waits; its next step was sent"
    )
