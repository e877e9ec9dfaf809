"""``nightbench status``: what runs, what is late, who works, what is not filed, what waits in
the queues; exit 1 when something is wrong (a filing failing among them)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="print JSON (as GET /api/status)")
    ] = False,
) -> None:
    """The system's state and its problems (exit status 1 when there is one).

    Each machine class's last night, the open runs (overdue ones in red), the workers seen in
    the last hour, the filings pending (failing ones in red), the queue lengths (and, when a
    queue holds messages, the workers listening to it; none in red), the stability verdicts
    the nightly re-check changed in the last week, the bisections running (over a day in red),
    the benchmarks marked unstable now (and from which regression each still alerts), and the
    problems. A section with nothing in it says "none". Exits 1 when there is a problem, so a
    cron job can page.
    """
    from service.config import get_settings
    from service.db import session_scope
    from service.migrate import upgrade_embedded_store
    from service.status.service import system_status

    settings = get_settings()
    upgrade_embedded_store()  # a fresh embedded store is an empty one, not a missing table
    with session_scope() as session:
        state = system_status(
            session,
            broker_url=settings.broker_url,
            queue_prefix=settings.queue_prefix,
            threshold_for=settings.threshold_for,
            resend_after_s=settings.step_resend_after_s,
        )
    if as_json:
        print(json.dumps(asdict(state), default=str, indent=1))
        raise typer.Exit(1 if state.problems else 0)
    console = Console()
    for table in _tables(state):
        # An empty section is one line, not a table of headers.
        console.print(table if table.row_count else f"[bold]{table.title}[/]: none")
    if state.unstable:
        console.print(f"[yellow]{escape(_unstable_line(state))}[/]")
    if state.coarse:
        console.print(f"[yellow]{escape(coarse_line(state))}[/]")
    for line in state.problems:
        console.print(f"[bold red]problem:[/] {escape(line)}")
    if not state.problems:
        console.print("[green]no problems[/]")
    raise typer.Exit(1 if state.problems else 0)


def _tables(state: Any) -> list[Table]:
    """The status's tables, in the order printed."""
    from service.status.service import BISECTION_STALE

    classes = Table("machine class", "last night", "nights behind", title="machine classes")
    for c in state.machine_classes:
        classes.add_row(
            c.queue,
            str(c.last_night),
            str(c.nights_behind),
            style="red" if c.nights_behind > 1 else None,
        )
    runs = Table(
        "run", "kind", "night", "status", "age", "deadline", "jobs pending", title="open runs"
    )
    for r in state.open_runs:
        runs.add_row(
            str(r.id),
            r.kind,
            str(r.night),
            r.status,
            f"{r.age_s / 3600:.1f} h",
            str(r.deadline_at or "—"),
            str(r.jobs_pending),
            style="bold red" if r.overdue else None,
        )
    workers = Table("worker", "last job started", "jobs", title="workers (last hour)")
    for w in state.workers:
        workers.add_row(w.worker, str(w.last_started_at), str(w.jobs))
    filings = Table(
        "alert",
        "kind",
        "run",
        "night",
        "state",
        "attempts",
        "pending",
        "last error",
        title="filings pending",
    )
    for f in state.pending_filings:
        filings.add_row(
            str(f.alert_id),
            f.kind,
            str(f.run_id),
            str(f.night),
            f.state,
            str(f.attempts),
            f"{f.age_s / 3600:.1f} h",
            escape(f.last_error or ""),
            style="bold red" if f.last_error else None,
        )
    queues = Table("queue", "waiting", "workers listening", title="queues")
    for name, waiting in (state.queues or {}).items():
        heard = None if state.listeners is None else state.listeners.get(name, [])
        queues.add_row(
            name,
            str(waiting),
            "—" if heard is None else ", ".join(heard) or "none",
            style="bold red" if waiting and heard == [] else None,
        )
    stability = Table(
        "benchmark", "night", "verdict", "source", title="stability changes (last week)"
    )
    for change in state.stability_changes:
        stability.add_row(
            change.benchmark,
            str(change.night),
            f"{change.from_verdict} → {change.to_verdict}",
            escape(change.source),
            style="yellow" if change.to_verdict == "unstable" else None,
        )
    bisections = Table(
        "bisection",
        "search",
        "benchmarks",
        "queue",
        "age",
        "rounds",
        "probes waiting",
        title="bisections running",
    )
    for b in state.bisections:
        bisections.add_row(
            str(b.id),
            b.search,
            ", ".join(b.benchmarks),
            b.queue,
            f"{b.age_s / 3600:.1f} h",
            str(b.rounds),
            str(b.probes_waiting),
            style="bold red" if b.age_s > BISECTION_STALE.total_seconds() else None,
        )
    return [classes, runs, workers, filings, queues, stability, bisections]


COARSE_LISTED = 8
"""Coarse series named in the status line (the JSON lists them all)."""


def coarse_line(state: Any) -> str:
    """``"3 of 134 series see only steps above their threshold at their noise: a:eval:cpu
    latency from +15.4% (7%), ..."``."""
    named = ", ".join(
        f"{c.benchmark} {c.metric} from {c.smallest_change:+.1%} ({c.threshold:.0%})"
        for c in state.coarse[:COARSE_LISTED]
    )
    more = (
        f", and {len(state.coarse) - COARSE_LISTED} more"
        if len(state.coarse) > COARSE_LISTED
        else ""
    )
    return (
        f"{len(state.coarse)} of {state.sensed} series see only steps above their threshold at "
        f"their noise (raised within 3 nights 95% of the time): {named}{more}"
    )


def _unstable_line(state: Any) -> str:
    """``"2 of 67 benchmark verdicts are unstable: ... (a:eval:cpu from +45%, ...)"``."""
    bars = ", ".join(
        f"{u.benchmark} from {u.alerts_from:+.0%}"
        if u.alerts_from is not None
        else f"{u.benchmark} never"
        for u in state.unstable
    )
    still = sorted({m for u in state.unstable for m in getattr(u, "still_alerts_on", ())})
    return (
        f"{len(state.unstable)} of {state.judged} benchmark verdicts are unstable: shown, "
        f"alerted only beyond their noise ({bars})"
        + (f"; on latency only: {', '.join(still)} alert as on any benchmark" if still else "")
    )
