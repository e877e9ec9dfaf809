"""The ``nightbench`` command line (typer)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from service.config import Settings, get_settings, settings_with, use_settings
from service.errors import NightbenchError
from service.metrics import ALERT_METRICS
from suite.model_info import TORCHBENCH_PREFIX
from workers.cli.common import console, err_console, fit_to_output, with_unit
from workers.cli.common import csv as _csv
from workers.cli.common import fail as _fail
from workers.cli.progress import measure

app = typer.Typer(
    help="nightbench: nightly performance-regression checks for PyTorch.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    """nightbench: nightly performance-regression checks for PyTorch."""
    fit_to_output()


db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
regressions_app = typer.Typer(help="Triage regressions.", no_args_is_help=True)
app.add_typer(regressions_app, name="regressions")
token_app = typer.Typer(help="API tokens for the write endpoints.", no_args_is_help=True)
app.add_typer(token_app, name="token")
suite_app = typer.Typer(
    help="The benchmark suite: stability of its benchmarks.", no_args_is_help=True
)
app.add_typer(suite_app, name="suite")
issues_app = typer.Typer(help="Issues: filing that GitHub refused or missed.", no_args_is_help=True)
app.add_typer(issues_app, name="issues")
runs_app = typer.Typer(help="Runs: compare two, process by process.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations to the configured database."""
    from service.migrate import upgrade

    upgrade(revision=revision)
    console.print(f"database at revision {revision}: {_safe_url()}")


def _safe_url() -> str:
    from sqlalchemy.engine import make_url

    return make_url(get_settings().effective_database_url).render_as_string(hide_password=True)


def _parse_night(night: str | None) -> date:
    try:
        return date.fromisoformat(night) if night else date.today()
    except ValueError:
        _fail(f"--date must be YYYY-MM-DD, got {night!r}")
        raise  # unreachable: _fail exits


def _create_runs(
    *,
    the_night: date,
    torch_spec: str,
    models: str | None,
    modes: str,
    compilers: str,
    device_classes: list[str],
) -> list[tuple[int, int]]:
    """Create one run per device class; returns ``(run_id, job_count)`` pairs."""
    from workers.night import plan as night_mod

    try:
        from service.migrate import upgrade_embedded_store

        upgrade_embedded_store()
        created = night_mod.create_nights(
            night=the_night,
            torch_spec=torch_spec,
            models=_csv(models),
            modes=_csv(modes) or [],
            compilers=_csv(compilers) or ["eager"],
            device_classes=device_classes,
        )
    except NightbenchError as exc:
        _fail(exc.message)
    for (run_id, count), device_class in zip(created, device_classes, strict=True):
        console.print(
            f"run {run_id}: {count} benchmark(s) on {device_class}, "
            f"torch {torch_spec!r}, night {the_night}"
        )
    return created


ModelsOpt = Annotated[
    str | None,
    typer.Option(
        help="comma-separated models or patterns, e.g. torchbench.hf_* (default: the own suite)"
    ),
]
ModesOpt = Annotated[str, typer.Option(help="comma-separated: train,eval")]
CompilersOpt = Annotated[str, typer.Option(help="comma-separated: eager,inductor")]
NightOpt = Annotated[str | None, typer.Option("--date", help="night YYYY-MM-DD (default today)")]
TorchOpt = Annotated[str, typer.Option("--torch", help="build under test: current, or a pip spec")]
SuiteOpt = Annotated[
    str,
    typer.Option(
        help="own | torchbench | all: which models when --models is not given; with "
        "--suite torchbench, bare --models names are TorchBench's (alexnet: torchbench.alexnet)"
    ),
]
TorchbenchOpt = Annotated[
    str | None,
    typer.Option(
        "--torchbench", help="a pytorch/benchmark checkout (default: NIGHTBENCH_TORCHBENCH_PATH)"
    ),
]
SUITE_MODELS = {"own": None, "torchbench": "torchbench.*", "all": "*"}


def _suite_models(
    suite: str, torchbench: str | None, models: str | None
) -> tuple[str | None, Settings]:
    """The --models a --suite stands for, and the settings of this run: --torchbench over
    ``torchbench_path`` (for :func:`~service.config.use_settings`; the suite processes get it
    from :func:`workers.night.jobs.suite_environment`).

    With ``--suite torchbench``, names and patterns given without the ``torchbench.`` prefix
    are TorchBench's (``alexnet`` is ``torchbench.alexnet``), not the own suite's namesakes.
    """
    if suite not in SUITE_MODELS:
        _fail(f"--suite must be one of {', '.join(SUITE_MODELS)}, got {suite!r}")
    settings = get_settings()
    if torchbench is not None:
        if not (Path(torchbench) / "torchbenchmark" / "models").is_dir():
            _fail(
                f"--torchbench {torchbench} is not a pytorch/benchmark checkout "
                f"(no torchbenchmark/models under it)"
            )
        settings = settings_with(torchbench_path=Path(torchbench).resolve())
    if suite != "own" and settings.torchbench_path is None:
        _fail(
            f"--suite {suite} needs a TorchBench checkout: --torchbench PATH or "
            f"NIGHTBENCH_TORCHBENCH_PATH"
        )
    if models and suite == "torchbench":
        models = ",".join(
            m if m.startswith(TORCHBENCH_PREFIX) else TORCHBENCH_PREFIX + m
            for m in (x.strip() for x in models.split(","))
            if m
        )
    return models or SUITE_MODELS[suite], settings


@contextlib.contextmanager
def _night_runs(
    *,
    suite: str,
    torchbench: str | None,
    models: str | None,
    night: str | None,
    torch_spec: str,
    modes: str,
    compilers: str,
    device_classes: list[str],
) -> Iterator[tuple[Settings, list[tuple[int, int]]]]:
    """Tonight's runs, one per device class (:func:`_create_runs`), under this command's
    settings (``--torchbench`` over the configured checkout): ``(settings, [(run_id,
    benchmarks measured), ...])``, the settings in force until the block ends."""
    picked, settings = _suite_models(suite, torchbench, models)
    with use_settings(settings):
        yield (
            settings,
            _create_runs(
                the_night=_parse_night(night),
                torch_spec=torch_spec,
                models=picked,
                modes=modes,
                compilers=compilers,
                device_classes=device_classes,
            ),
        )


@app.command()
def nightly(
    models: ModelsOpt = None,
    modes: ModesOpt = "train,eval",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    compilers: CompilersOpt = "eager",
    night: NightOpt = None,
    torch_spec: TorchOpt = "current",
    suite: SuiteOpt = "own",
    torchbench: TorchbenchOpt = None,
) -> None:
    """Run tonight's check: measure, detect, confirm, report (embedded by default)."""
    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    from workers.night import plan as night_mod

    with _night_runs(
        suite=suite,
        torchbench=torchbench,
        models=models,
        night=night,
        torch_spec=torch_spec,
        modes=modes,
        compilers=compilers,
        device_classes=["cpu" if device == "cpu" else "default"],
    ) as (settings, created):
        for run_id, total in created:
            if not settings.embedded:
                night_mod.enqueue_jobs(run_id)
            measure(run_id, total)
            _print_report(run_id)


@app.command()
def dispatch(
    night: NightOpt = None,
    torch_spec: TorchOpt = "current",
    device_class: Annotated[
        list[str], typer.Option(help="cpu, or a GPU class (a100, h100, ...): one run each")
    ] = ["cpu"],  # noqa: B006
    models: ModelsOpt = None,
    modes: ModesOpt = "train,eval",
    compilers: CompilersOpt = "eager",
    wait: Annotated[bool, typer.Option(help="wait for the runs and print their reports")] = False,
    suite: SuiteOpt = "own",
    torchbench: TorchbenchOpt = None,
) -> None:
    """Create tonight's runs and enqueue one task per benchmark.

    Each benchmark goes to its device class's queue; a queue that no worker listens to is
    warned of (stderr), with what waits there.
    """
    from workers.night import plan as night_mod

    with _night_runs(
        suite=suite,
        torchbench=torchbench,
        models=models,
        night=night,
        torch_spec=torch_spec,
        modes=modes,
        compilers=compilers,
        device_classes=device_class,
    ) as (settings, created):
        for run_id, total in created:
            if settings.embedded:
                measure(run_id, total)
            else:
                night_mod.enqueue_jobs(run_id)
                if wait:
                    measure(run_id, total)
            if settings.embedded or wait:
                _print_report(run_id)
        if not settings.embedded and not wait:
            _warn_unheard()
    print(json.dumps({"runs": [run_id for run_id, _ in created]}))


def _warn_unheard() -> None:
    """Warn (stderr, ``warning: ...``) of each queue that holds messages and that no worker
    listens to, naming what waits there (the status's problem lines of the broker)."""
    from service.db import session_scope
    from service.models.base import utcnow
    from service.status.broker import broker_state
    from service.status.service import running_bisections, waiting_on

    settings = get_settings()
    with session_scope() as session:
        waits = waiting_on(session, running_bisections(session, now=utcnow()))
    for line in broker_state(
        settings.broker_url, prefix=settings.queue_prefix, waiting_on=waits
    ).problems:
        err_console.print(f"warning: {escape(line)}", soft_wrap=True, highlight=False)


def sees_cell(res: dict[str, Any]) -> str:
    """A report row's smallest detectable change, yellow when well above its threshold."""
    from service.regressions.sensitivity import is_coarse

    smallest = res.get("smallest_change")
    if smallest is None:
        return "—"
    text = f"{smallest * 100:+.1f}%"
    threshold = get_settings().threshold_for(res["metric"], f"{res['model']}:{res['mode']}")
    return f"[yellow]{text}[/]" if is_coarse(smallest, threshold) else text


@app.command()
def report(
    run: Annotated[int | None, typer.Option(help="run id (default: the latest night)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print a night's report: benchmark, metric, baseline, tonight, change %, verdict."""
    from service.db import session_scope
    from service.migrate import upgrade_embedded_store
    from service.runs.report import latest_run_id

    upgrade_embedded_store()
    if run is None:
        with session_scope() as session:
            run = latest_run_id(session)
        if run is None:
            _fail("no nightly run stored yet; run `nightbench nightly` first")
    assert run is not None
    _print_report(run, as_json=as_json)


_fmt = with_unit


VERDICT_STYLE = {
    "regression": "bold red",
    "flagged": "red",
    "improvement": "green",
    "error": "bold magenta",
    "not reproduced": "yellow",
    "no_baseline": "dim",
}


def _print_environment_changes(report: dict[str, Any]) -> None:
    """Say which build identity changes started new series tonight (variant, requirements), and
    which benchmarks the nightly stability re-check darkened or un-darkened."""
    for change in report.get("environment_changes", []):
        console.print(f"[yellow]environment:[/] {escape(change)}", highlight=False, soft_wrap=True)
    for c in report.get("stability_changes", []):
        console.print(
            f"[yellow]stability:[/] {escape(c['benchmark'])} {c['from']} → {c['to']} "
            f"({escape(str(c['source']))})",
            highlight=False,
            soft_wrap=True,
        )


def _print_processes(report: dict[str, Any]) -> None:
    """Say how many processes tonight's levels stand on, when more than one
    (``NIGHTBENCH_NIGHT_PROCESSES``)."""
    counts = sorted({res.get("processes", 1) for res in report["results"] if not res["error"]})
    if counts and counts[-1] > 1:
        span = str(counts[-1]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        console.print(f"tonight: median of per-process medians, {span} processes per benchmark")


def _print_failures(report: dict[str, Any]) -> None:
    """Print each benchmark no process measured tonight (``error``), then each failed process
    of a benchmark the night measured in its other processes (``process failed``)."""
    for res in report["results"]:
        if res["error"]:
            console.print(
                f"[bold magenta]error[/] {escape(res['benchmark'])}: {escape(res['error'])}",
                markup=True,
                highlight=False,
                soft_wrap=True,
            )
    for f in report.get("failed_processes", []):
        console.print(
            f"[magenta]process failed[/] {escape(f['benchmark'])}, process {f['process']} "
            f"(the night reads its others): {escape(f['error'])}",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )


SKIPPED_SHOWN = 20  # skipped benchmarks printed by the report; --json lists every one


def _print_skipped(report: dict[str, Any]) -> None:
    """Print the benchmarks a posted run's runner withdrew, with its reasons (the first
    ``SKIPPED_SHOWN``, then how many more)."""
    skipped = report.get("skipped", [])
    for s in skipped[:SKIPPED_SHOWN]:
        console.print(
            f"[dim]skipped[/] {escape(s['benchmark'])}: {escape(s['reason'])}",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )
    if len(skipped) > SKIPPED_SHOWN:
        console.print(f"[dim]… and {len(skipped) - SKIPPED_SHOWN} more skipped (--json)[/]")


def _print_report(run_id: int, *, as_json: bool = False) -> None:
    from service.db import session_scope
    from service.models import AlertKind, Confirmation
    from service.runs.report import run_report

    try:
        with session_scope() as session:
            data = run_report(session, run_id=run_id, settings=get_settings())
    except NightbenchError as exc:
        _fail(exc.message)
    if as_json:
        print(json.dumps(data, indent=1, default=str))
        return
    r = data["run"]
    jobs = r["jobs"]
    table = Table(
        title=f"nightbench run {r['id']} · night {r['night']} · torch {r['torch_version']} "
        f"({(r['torch_git_commit'] or '?')[:10]}) · {r['status']}"
    )
    table.add_column("benchmark", no_wrap=True)
    for col, justify in (
        ("metric", "left"),
        ("baseline", "right"),
        ("tonight", "right"),
        ("change %", "right"),
        ("verdict", "left"),
        ("sees ≥", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for res in data["results"]:
        if res["metric"] not in ALERT_METRICS and not res["error"]:
            continue
        change = f"{res['change'] * 100:+.1f}" if res["change"] is not None else "—"
        verdict = res["verdict"] if not res["error"] else "error (below)"
        style = VERDICT_STYLE.get(res["verdict"], "")
        table.add_row(
            res["benchmark"],
            res["metric"],
            _fmt(res["baseline"], res["unit"]),
            _fmt(res["value"], res["unit"]),
            change,
            f"[{style}]{verdict}[/]" if style else verdict,
            sees_cell(res),
        )
    console.print(table)
    console.print(
        "sees ≥: the smallest step the series' noise lets the detector raise within 3 nights, "
        "95% of the time (yellow: well above its threshold)"
    )
    console.print(
        f"jobs: {jobs['done']} done, {jobs['error']} error, {jobs['missing']} missing"
        + (f", {jobs['skipped']} skipped" if jobs.get("skipped") else "")
        + f" of {jobs['total']}"
    )
    _print_skipped(data)
    _print_processes(data)
    _print_failures(data)
    for line in (r.get("note") or "").splitlines():  # the count pass's skips and failures
        if line.startswith("cpu_instructions not counted"):
            console.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    regs = [g for g in data["regressions"] if g["direction"] == "regression"]
    reproduced = [g for g in regs if g["confirmation"] == Confirmation.REPRODUCED]
    if reproduced:
        console.print(
            f"[bold red]{len(reproduced)} confirmed regression(s)[/]; issue written to "
            f"{get_settings().effective_outbox_dir}"
        )
    elif regs:
        console.print(f"[yellow]{len(regs)} flagged, none confirmed[/]")
    else:
        console.print("[green]no regression[/]")
    _print_environment_changes(data)
    for alert in data["alerts"]:
        if alert["kind"] == AlertKind.MISSING_DATA:
            console.print(f"[bold red]missing data:[/] {alert['summary']}")


@app.command()
def detect(
    input_path: Annotated[str, typer.Option("--input", help="series JSON file, or - for stdin")],
    output_path: Annotated[
        str, typer.Option("--output", help="flags JSON file, or - for stdout")
    ] = "-",
    online: Annotated[
        bool, typer.Option(help="decide each night from the nights up to it")
    ] = False,
) -> None:
    """Offline detection over exported series, with the service's own detector."""
    from service.regressions.detection import DetectionInputError, detect_document

    try:
        text = sys.stdin.read() if input_path == "-" else Path(input_path).read_text()
        doc = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        _fail(f"cannot read --input {input_path}: {exc}")
    try:
        out = detect_document(doc, online=online)
    except DetectionInputError as exc:
        _fail(f"invalid input: {exc}")
    payload = json.dumps(out, indent=1)
    if output_path == "-":
        print(payload)
    else:
        Path(output_path).write_text(payload + "\n")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the REST API, charts and model pages.

    FastAPI on uvicorn, with deadlines for slow clients (NIGHTBENCH_API_HEADER_TIMEOUT_S,
    _BODY_TIMEOUT_S, _KEEP_ALIVE_S, _MAX_CONNECTIONS).
    """
    from service.migrate import upgrade_embedded_store
    from service.server import serve as serve_api

    upgrade_embedded_store()
    console.print(f"nightbench API on http://{host}:{port} (database {_safe_url()})")
    serve_api(host=host, port=port, workers=workers)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="who or what uses the token, e.g. ci-runner-a100")],
) -> None:
    """Create an API token and print it once (only its SHA-256 hash is stored)."""
    from service.auth import create_token
    from service.db import session_scope

    try:
        with session_scope() as session:
            _, plain = create_token(session, name=name)
    except NightbenchError as exc:
        _fail(exc.message)
    err_console.print(f"token {name!r} created; it is shown only now, store it safely:")
    print(plain)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Option(help="the token's name")]) -> None:
    """Delete an API token; requests using it are refused from now on."""
    from service.auth import revoke_token
    from service.db import session_scope

    try:
        with session_scope() as session:
            revoke_token(session, name=name)
    except NightbenchError as exc:
        _fail(exc.message)
    console.print(f"token {name!r} revoked")


@regressions_app.command("list")
def regressions_list(
    state: Annotated[str | None, typer.Option(help="only this triage state")] = None,
    run: Annotated[int | None, typer.Option(help="only this run")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List regressions and improvements with their triage state."""
    from sqlalchemy import select

    from service.db import session_scope
    from service.models import TRIAGE_STATES, Regression

    if state is not None and state not in TRIAGE_STATES:
        _fail(f"--state must be one of {', '.join(TRIAGE_STATES)}, got {state!r}")
    with session_scope() as session:
        stmt = select(Regression).order_by(Regression.id)
        if state:
            stmt = stmt.where(Regression.state == state)
        if run is not None:
            stmt = stmt.where(Regression.run_id == run)
        rows: list[dict[str, Any]] = [
            {
                "id": r.id,
                "run": r.run_id,
                "benchmark": r.benchmark,
                "metric": r.metric,
                "direction": r.direction,
                "change": r.change,
                "confirmation": r.confirmation,
                "state": r.state,
                "back_night": r.back_night and r.back_night.isoformat(),
            }
            for r in session.scalars(stmt)
        ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title="regressions")
    for col in ("id", "run", "benchmark", "metric", "change %", "confirmation", "state", "back"):
        table.add_column(col, no_wrap=col == "benchmark")
    for r in rows:
        table.add_row(
            str(r["id"]),
            str(r["run"]),
            r["benchmark"],
            r["metric"],
            f"{r['change'] * 100:+.1f}",
            r["confirmation"],
            r["state"],
            r["back_night"] or "",
        )
    console.print(table)


@regressions_app.command("set")
def regressions_set(
    regression_id: Annotated[int, typer.Argument(help="regression id")],
    state: Annotated[
        str, typer.Argument(help="untriaged|confirmed|invalid|expected|fixed|reverted")
    ],
) -> None:
    """Change a regression's triage state (``expected`` resets the series' baseline)."""
    from service.db import session_scope
    from service.regressions.service import set_state

    try:
        with session_scope() as session:
            reg = set_state(session, regression_id=regression_id, state=state)
            console.print(f"regression {reg.id} ({reg.benchmark} {reg.metric}): {reg.state}")
    except NightbenchError as exc:
        _fail(exc.message)


# Bisection commands live in workers/cli/bisect.py (heavy imports happen when they run).
from workers.cli import bisect as _bisect_cli  # noqa: E402

app.command("bisect")(_bisect_cli.bisect)
app.command("demo")(_bisect_cli.demo)
app.command("bisect-resume")(_bisect_cli.resume)

from workers.cli import ab as _ab_cli  # noqa: E402

app.command("ab")(_ab_cli.ab)

from workers.cli import profile as _profile_cli  # noqa: E402

app.command("profile")(_profile_cli.profile)

from workers.cli import worker as _worker_cli  # noqa: E402

app.command("worker")(_worker_cli.worker)

from workers.cli import status as _status_cli  # noqa: E402

app.command("status")(_status_cli.status)

from workers.cli import issues as _issues_cli  # noqa: E402

issues_app.command("retry")(_issues_cli.retry)

from workers.cli import runs as _runs_cli  # noqa: E402

runs_app.command("compare")(_runs_cli.compare)

from workers.cli import suite as _suite_cli  # noqa: E402

suite_app.command("stability")(_suite_cli.stability)

from workers.cli import torchbench as _torchbench_cli  # noqa: E402

import_app = typer.Typer(help="Import results from other tools.", no_args_is_help=True)
app.add_typer(import_app, name="import")
import_app.command("torchbench")(_torchbench_cli.import_torchbench)
export_app = typer.Typer(help="Export results for other tools.", no_args_is_help=True)
app.add_typer(export_app, name="export")
export_app.command("torchbench")(_torchbench_cli.export_torchbench)

torchbench_app = typer.Typer(
    help="A TorchBench checkout: its models' requirements, and which of them run here.",
    no_args_is_help=True,
)
app.add_typer(torchbench_app, name="torchbench")
torchbench_app.command("install")(_torchbench_cli.install_torchbench)
torchbench_app.command("check")(_torchbench_cli.check_torchbench)
