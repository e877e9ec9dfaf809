"""``nightbench runs compare A B [--processes N]``: two runs compared process by process, after
measuring more processes of each on its own build when asked."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.config import get_settings
from service.errors import NightbenchError
from workers.cli.common import console, fail, with_unit

VERDICT_STYLE = {
    "regression": "bold red",
    "improvement": "green",
    "not enough processes": "yellow",
    "not significant": "dim",
}


def compare(
    a: Annotated[int, typer.Argument(metavar="A", help="id of the first run (the reference)")],
    b: Annotated[int, typer.Argument(metavar="B", help="id of the second run")],
    processes: Annotated[
        int | None,
        typer.Option(
            min=2,
            max=50,
            help="first measure more processes of each run on its own build, until "
            "each benchmark has N",
        ),
    ] = None,
    alpha: Annotated[float, typer.Option(help="significance level, between 0 and 1")] = 0.01,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Compare run B with run A per benchmark metric: medians (ms, MiB), ratio B / A, processes
    per side, Mann-Whitney U p-value over per-process medians, verdict. With too few processes
    the verdict is "not enough processes": ask for more with --processes (5 per side reach
    p < 0.01)."""
    from service.db import session_scope
    from service.migrate import upgrade_embedded_store
    from service.runs.compare import compare_runs
    from service.runs.service import get_run

    if not 0 < alpha < 1:
        fail(f"--alpha must be between 0 and 1 (exclusive), got {alpha}")
    upgrade_embedded_store()
    settings = get_settings()
    try:
        with session_scope() as session:
            get_run(session, a), get_run(session, b)
        requests = _add_processes([a, b], processes) if processes else []
        with session_scope() as session:
            result = compare_runs(
                session,
                a=a,
                b=b,
                alpha=alpha,
                threshold_for=lambda m, bench: settings.threshold_for(m, bench),
            )
    except NightbenchError as exc:
        fail(exc.message)
        raise  # unreachable: fail exits
    payload: dict[str, Any] = {
        "a": a,
        "b": b,
        "alpha": alpha,
        "processes_requested": processes,
        "requests": [asdict(r) for r in requests],
        **asdict(result),
    }
    if as_json:
        print(json.dumps(payload, indent=1))
        return
    _print(payload)


def _add_processes(run_ids: list[int], processes: int) -> list[Any]:
    """Ask both runs for ``processes`` processes, then measure them (embedded: here; with a
    broker: send the jobs and wait for the workers)."""
    from workers.night import replicate

    requests = replicate.request_processes(run_ids, processes=processes)
    for r in requests:
        console.print(
            f"run {r.run_id}: {r.jobs} more process(es) to reach {processes} per "
            f"benchmark" + (f" (replicate runs {', '.join(map(str, r.runs))})" if r.runs else "")
        )
    _measure(run_ids)
    return requests


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _measure(parents: list[int]) -> None:
    """Measure the open replicate runs of ``parents``, with a progress bar."""
    from service.db import session_scope
    from service.runs.processes import claim_pending, open_replicates
    from workers.enqueue import send
    from workers.night import plan

    with session_scope() as session:
        claimed = claim_pending(session, parent_ids=parents)
        waiting = open_replicates(session, parent_ids=parents)
    if not waiting:
        return
    if get_settings().embedded:
        # No workers: every queued job of these runs is measured here, claimed now or earlier.
        jobs = [job for run_id in waiting for job in plan.queued_jobs(run_id)]
        with _progress() as progress:
            bar = progress.add_task("measuring", total=len(jobs))
            for job_id, queue, name in jobs:
                progress.update(bar, description=name)
                plan.send_job(job_id, queue)
                progress.advance(bar)
        return
    send([step for run_id in claimed for step in plan.job_steps(run_id)])
    _wait(waiting)


def _wait(run_ids: list[int], poll_s: float = 2.0) -> None:
    """Wait until the runs ``run_ids`` have finished, showing their jobs as they end."""
    from sqlalchemy import func, select

    from service.db import session_scope
    from service.models import JOB_ENDED, RUN_OPEN, Job, Run

    with _progress() as progress:
        bar = progress.add_task("workers measuring", total=None)
        while True:
            with session_scope() as session:
                total = session.scalar(
                    select(func.count()).select_from(Job).where(Job.run_id.in_(run_ids))
                )
                ended = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.run_id.in_(run_ids), Job.status.in_(JOB_ENDED))
                )
                still_open = session.scalar(
                    select(func.count())
                    .select_from(Run)
                    .where(Run.id.in_(run_ids), Run.status.in_(RUN_OPEN))
                )
            progress.update(
                bar,
                total=total,
                completed=ended,
                description=f"workers measuring: {still_open} run(s) open",
            )
            if not still_open:
                return
            time.sleep(poll_s)


def _change(c: dict[str, Any]) -> str:
    """The "B / A" cell: the ratio, or for a signed growth (no ratio) the difference with unit."""
    if c["ratio"] is not None:
        return f"{c['ratio']:.3f}"
    if c.get("difference") is None:
        return "—"
    sign = "+" if c["difference"] >= 0 else "−"
    return sign + with_unit(abs(c["difference"]), c["unit"])


def _print(payload: dict[str, Any]) -> None:
    table = Table(
        title=f"run {payload['b']} vs run {payload['a']} · by process · alpha {payload['alpha']}"
    )
    table.add_column("benchmark", no_wrap=True)
    for col in ("metric", "A median", "B median", "B / A", "processes A|B", "p-value", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    for c in payload["comparisons"]:
        style = VERDICT_STYLE.get(c["verdict"], "")
        table.add_row(
            c["benchmark"],
            c["metric"],
            with_unit(c["a_median"], c["unit"]),
            with_unit(c["b_median"], c["unit"]),
            _change(c),
            f"{c['a_processes']}|{c['b_processes']}",
            f"{c['p_value']:.3g}" if c["p_value"] is not None else "—",
            f"[{style}]{c['verdict']}[/]" if style else c["verdict"],
        )
    console.print(table)
    for label, names in (
        ("only in A", payload["only_in_a"]),
        ("only in B", payload["only_in_b"]),
        ("failed in every process of a side", payload["errors"]),
    ):
        if names:
            console.print(f"{label}: {', '.join(names)}", highlight=False, soft_wrap=True)
    if any(c["verdict"] == "not enough processes" for c in payload["comparisons"]):
        console.print(
            "[yellow]not enough processes to say:[/] measure more with --processes N "
            "(5 per side can reach p < 0.01)"
        )
