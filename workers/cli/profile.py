"""``nightbench profile``: a benchmark profiled on two builds and the diff printed.

Registered in ``workers/cli/__init__.py``; the profiling itself is
:mod:`workers.bisect.profiles` (each build's profile in a suite subprocess of its environment).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from service.errors import NightbenchError
from service.metrics import format_change
from service.profiles import ProfileDiff, RowStatus, diff_json, format_profile_value
from workers.cli.common import console, err_console
from workers.cli.common import fail as _fail


def diff_table(diff: ProfileDiff, title: str) -> Table:
    """The diff's rows as a table: op or function, before, after, change, share, new/gone."""
    table = Table(title=title)
    for name, justify in (
        ("op / function", "left"),
        ("before", "right"),
        ("after", "right"),
        ("change", "right"),
        ("share", "right"),
        ("", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in diff.rows:
        relative = "" if r.relative is None else f" ({format_change(r.relative)})"
        table.add_row(
            escape(r.name),
            format_profile_value(r.before, diff.unit),
            format_profile_value(r.after, diff.unit),
            f"{r.change:+,.1f}{relative}",
            "—" if r.share is None else f"{r.share:.0%}",
            "" if r.status is RowStatus.CHANGED else str(r.status),
        )
    return table


def profile(
    benchmark: Annotated[str, typer.Option(help="suite benchmark MODEL:MODE:DEVICE")],
    build: Annotated[
        list[str],
        typer.Option(help="torch spec as the nightly takes it (current, torch==X); give two"),
    ],
    metric: Annotated[
        str, typer.Option(help="latency: operator table; cpu_instructions: functions")
    ] = "latency",
    steps: Annotated[int, typer.Option(min=1, help="steps per profiled window")] = 3,
    windows: Annotated[int, typer.Option(min=1, help="profiled windows per build")] = 7,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="batch size (default: the model's)")
    ] = None,
    repeat: Annotated[
        bool,
        typer.Option(help="profile the first build twice and measure the noise between the two"),
    ] = True,
    python_functions: Annotated[
        bool,
        typer.Option(
            help="a row per Python function too: its self time (cProfile) for latency, its "
            "bytecodes per step (sys.settrace) for cpu_instructions"
        ),
    ] = True,
    top: Annotated[int, typer.Option(min=1, help="rows printed at most")] = 20,
    trace_dir: Annotated[
        Path | None, typer.Option(help="keep each build's Chrome trace in this folder")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the diff as JSON")] = False,
) -> None:
    """Profile a benchmark on two builds and print what changed, above the noise."""
    from workers.bisect.profiles import diff_builds, diff_python, profile_build

    if len(build) != 2:
        _fail(f"--build: give two builds, got {len(build)}")
    # The first build again, between the two: its noise is measured on the host as it is now.
    order = [build[0], build[0], build[1]] if repeat else list(build)
    profiles = []
    try:
        for i, spec in enumerate(order):
            trace = None
            if trace_dir is not None:  # kept by operator tables only
                trace_dir.mkdir(parents=True, exist_ok=True)
                trace = trace_dir.resolve() / f"trace-{i + 1}.json"
            err_console.print(f"profiling {benchmark} on {spec} ({metric}) ...")
            profiles.append(
                profile_build(
                    spec,
                    benchmark,
                    metric,
                    steps=steps,
                    windows=windows,
                    batch_size=batch_size,
                    trace=trace,
                    python_functions=python_functions,
                )
            )
        a, b = profiles[0], profiles[-1]
        diff = diff_builds(a, b, repeat=profiles[1] if repeat else None, top=top)
        python = diff_python(a, b, top=top)
    except NightbenchError as exc:
        _fail(exc.message, code=1)
        return
    if as_json:
        doc = diff_json(diff, python=python)
        doc["builds"] = [{"spec": p.spec, "torch": p.torch} for p in (a, b)]
        print(json.dumps(doc, indent=1))
        return
    title = f"{benchmark} {metric}: {a.spec} ({a.torch}) → {b.spec} ({b.torch}), per step"
    if python is not None:  # the Python-level rows first: the C rows are the interpreter's
        if python.rows:
            console.print(diff_table(python, f"{title}: Python functions, bytecodes"))
        console.print(f"Python functions: {python.summary()}")
    if diff.rows:
        console.print(diff_table(diff, title))
    console.print(diff.summary())
