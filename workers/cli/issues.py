"""``nightbench issues retry``: file every alert whose filing is pending, now."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from service.models import ReportState


def retry(
    all_now: Annotated[
        bool,
        typer.Option(
            "--now/--due",
            help="try every pending filing now (default), or only those whose backoff has passed",
        ),
    ] = True,
) -> None:
    """File the alerts whose filing is pending or failed (GitHub was away or refused the token),
    each exactly once, and post the A/B reports GitHub refused; exits 1 while any still fails,
    with its error."""
    from service.config import get_settings
    from workers.issues.pending import retry_pending

    console = Console(emoji=False)
    from workers.ab.reporting import retry_due

    settings = get_settings()
    attempts = retry_pending(settings=settings, force=all_now)
    reports = retry_due(settings=settings, force=all_now)
    if not attempts and not reports:
        console.print("no filing pending")
    failed = sum(1 for state in reports.values() if state == ReportState.FAILED_RETRYING)
    for ab_id, state in reports.items():
        console.print(f"A/B {ab_id}: {state}", highlight=False)
    for attempt in attempts:
        if attempt.error is None:
            console.print(f"alert {attempt.alert_id}: filed {' '.join(attempt.urls)}")
        else:
            failed += 1
            console.print(
                f"[bold red]alert {attempt.alert_id}: still failing:[/] {escape(attempt.error)}",
                markup=True,
                highlight=False,
            )
    raise typer.Exit(1 if failed else 0)
