"""``nightbench ab``: an A/B of two commits, on this machine or of a pull request on the workers.

Registered in ``workers/cli/__init__.py``; the measuring modules are imported when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.errors import NightbenchError
from service.models import ABStatus
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


def ab(
    base: Annotated[
        str | None, typer.Option(help="the base commit (a PR's merge base); not with --pr")
    ] = None,
    head: Annotated[str | None, typer.Option(help="the head commit; not with --pr")] = None,
    repo: Annotated[
        Path | None, typer.Option(help="local git clone of the package under test (local A/B)")
    ] = None,
    pr: Annotated[
        int | None,
        typer.Option(
            help="a pull request of NIGHTBENCH_GITHUB_REPOSITORY: its merge base against its "
            "head, measured by the workers and reported on the PR"
        ),
    ] = None,
    requested_by: Annotated[
        str | None, typer.Option(help="with --pr: the GitHub login that asked (needs write)")
    ] = None,
    queue: Annotated[str, typer.Option(help="with --pr: the queue that measures")] = "cpu",
    benchmark: Annotated[
        list[str] | None,
        typer.Option(
            help="suite benchmark MODEL:MODE:DEVICE (repeatable; default NIGHTBENCH_AB_BENCHMARKS)"
        ),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            help="comma-separated models, each as MODEL:MODE:DEVICE with --modes; all: every "
            "model of the suite (the full set, hours on one CPU worker)"
        ),
    ] = None,
    modes: Annotated[str, typer.Option(help="with --models: comma-separated modes")] = "eval",
    device: Annotated[str, typer.Option(help="with --models: cpu or cuda")] = "cpu",
    command: Annotated[
        list[str] | None,
        typer.Option(
            help='benchmark command run in the checkout; last stdout line {"samples": \\[ms, ...]}'
        ),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="metrics to judge (repeatable): latency, cpu_peak_mem, gpu_peak_mem, "
            "cpu_instructions (default NIGHTBENCH_AB_METRICS: latency and peak memory)"
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=2, help="processes a side per benchmark (default NIGHTBENCH_AB_PROCESSES, 6)"
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            min=1, help="timed iterations per process (default NIGHTBENCH_AB_SAMPLES, 10)"
        ),
    ] = None,
    profile: Annotated[bool, typer.Option(help="profile the regressed benchmarks")] = True,
    provider: ProviderOption = "checkout",
    install: InstallOption = "",
    wheel_url: WheelUrlOption = None,
    package: PackageOption = None,
    base_sha: BaseShaOption = None,
    work_dir: WorkDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the A/B as JSON")] = False,
) -> None:
    """Measure HEAD against BASE, interleaved, and judge every benchmark metric.

    Locally (--repo, --base, --head): builds both commits here, measures, prints the table and
    stores it (GET /api/ab/ID); exit 1 when a row is flagged or a build failed. With
    --pr N: reads the PR, refuses forks and requesters without write access, and sends the
    A/B to the workers (--queue), which comment on the PR and set its commit status.
    """
    from service.config import get_settings
    from service.migrate import upgrade_embedded_store
    from workers.ab.run import ABRequest

    settings = get_settings()
    benchmarks = list(benchmark or [])
    if models:
        names = [m.strip() for m in models.split(",") if m.strip()]
        if names == ["all"]:
            from suite.registry import model_names

            names = model_names()
        benchmarks += [
            f"{m}:{mode.strip()}:{device}"
            for m in names
            for mode in modes.split(",")
            if mode.strip()
        ]
    if not benchmarks and not command:
        benchmarks = list(settings.ab_benchmarks)
    try:
        request = ABRequest(
            base or "",
            head or "",
            benchmarks=tuple(benchmarks),
            commands=tuple(command or ()),
            metrics=tuple(metric or settings.ab_metrics),
            processes=processes or settings.ab_processes,
            samples=samples or settings.ab_samples,
            profile=profile,
        )
    except NightbenchError as exc:
        _fail(exc.message)
        return
    upgrade_embedded_store()
    if pr is not None:
        if base or head or repo:
            _fail("--pr takes its commits from the pull request: drop --base, --head and --repo")
        _dispatch(request, pr, requested_by, queue)
        return
    if not (repo and base and head):
        _fail("a local A/B needs --repo, --base and --head (or --pr N for a pull request)")
        return
    build = BuildOptions(
        provider=provider,
        install=install,
        wheel_url=wheel_url,
        package=package,
        base_sha=base_sha,
        work_dir=work_dir,
    )
    _local(request, repo=repo, build=build, as_json=as_json)


def _dispatch(request: object, pr: int, requested_by: str | None, queue: str) -> None:
    from workers.ab.flow import request_ab
    from workers.enqueue import send

    try:
        ab_id, steps = request_ab(request, pr_number=pr, requested_by=requested_by, queue=queue)  # type: ignore[arg-type]
    except NightbenchError as exc:
        _fail(exc.message)
        return
    verb = (
        "refused; the reason goes to the PR" if steps[0].task == "ab.report" else f"sent to {queue}"
    )
    console.print(f"A/B {ab_id} of PR #{pr}: {verb}")
    send(steps)


def _local(
    request: object,
    *,
    repo: Path,
    build: BuildOptions,
    as_json: bool,
) -> None:
    from service.config import get_settings
    from service.db import session_scope
    from service.models.base import utcnow
    from workers.ab import store
    from workers.ab.run import ABRequest, run_ab

    assert isinstance(request, ABRequest)
    settings = get_settings()
    try:
        builder, spec = build_provider(repo, build)
    except NightbenchError as exc:
        _fail(exc.message)
        return
    names = len(request.benchmarks) + len(request.commands)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("processes"),
        TimeElapsedColumn(),
        console=err_console,
        transient=as_json,
    )
    with session_scope() as session:
        row = store.create_ab(
            session, request, provider_spec=spec, requested_by="cli", queue="local"
        )
        row.status, row.started_at = ABStatus.RUNNING, utcnow()
        ab_id = row.id
    with progress:
        bar = progress.add_task("building", total=names * request.processes * 2)

        def on_turn(benchmark: str, side: str, turn: int) -> None:
            progress.update(bar, description=f"{benchmark} {side}", advance=1)

        try:
            outcome = run_ab(
                request,
                builder,
                threshold_for=settings.threshold_for,
                progress=lambda line: progress.update(bar, description=line),
                on_turn=on_turn,
            )
        except NightbenchError as exc:
            _fail(exc.message)
            return
    with session_scope() as session:
        store.save_outcome(session, store.get_ab(session, ab_id), outcome)
    if as_json:
        doc = {
            "id": ab_id,
            "base": request.base_sha,
            "head": request.head_sha,
            "error": outcome.error,
            "rows": [r.as_dict() for r in outcome.rows],
            "profiles": outcome.profiles,
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print(ab_id, request.base_sha, request.head_sha, outcome)
    if outcome.error or outcome.flagged:
        raise typer.Exit(1)


def _print(ab_id: int, base: str, head: str, outcome: object) -> None:
    from service.metrics import format_change, format_value
    from workers.ab.run import ABOutcome

    assert isinstance(outcome, ABOutcome)
    if outcome.error:
        err_console.print(f"[bold red]A/B {ab_id}: not measured:[/] {outcome.error}")
        return
    table = Table(title=f"A/B {ab_id}: {base[:10]} (base) → {head[:10]} (head)")
    for name in ("benchmark", "metric", "base", "head", "change", "95% interval", "p", "verdict"):
        table.add_column(name, justify="right" if name in ("base", "head", "p") else "left")
    for r in outcome.rows:
        interval = (
            f"{format_change(r.low - 1)} to {format_change(r.high - 1)}"
            if r.low is not None and r.high is not None
            else "—"
        )
        verdict = f"[bold red]{r.verdict}[/]" if r.flagged else r.verdict
        table.add_row(
            r.benchmark,
            r.metric,
            format_value(r.base, r.unit),
            format_value(r.head, r.unit),
            format_change(r.ratio - 1) if r.ratio is not None else "—",
            interval,
            f"{r.p_value:.3g}" if r.p_value is not None else "—",
            verdict,
        )
    console.print(table)
    flagged = outcome.flagged
    console.print(f"{len(flagged)} flagged of {len(outcome.rows)}" if flagged else "no regression")
