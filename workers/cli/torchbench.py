"""``nightbench import torchbench FILE``, ``nightbench export torchbench --run ID`` and
``nightbench torchbench install [--models ...]``.

TorchBench's result JSON (:mod:`suite.torchbench_results`: the userbenchmark and the
pytest-benchmark formats) in and out of the database. An import is an ingest run
(:mod:`service.runs.ingest`) keyed by the file's content, so a file imported twice is stored
once, and its results are detected like any other ingest's. Bad input exits with code 2 and
stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import date
from pathlib import Path
from typing import Annotated, Any
from unittest.mock import patch

import typer

from service.config import get_settings
from service.errors import NightbenchError
from suite.model_info import TORCHBENCH_PREFIX
from suite.records import BenchmarkRecord
from suite.torchbench_check import NEEDS, NO_TEST, SETUP_FAILED
from suite.torchbench_checkout import ENV_VAR
from suite.torchbench_results import (
    PYTEST_BENCHMARK,
    TorchBenchFormatError,
    from_torchbench,
    pytest_benchmark_night,
    result_format,
    to_userbenchmark,
)
from workers.cli.common import csv as _csv
from workers.cli.common import fail as _fail

EXPORT_SUITES = ("all", "own", "torchbench")


def _read(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}")
        raise  # unreachable: _fail exits
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        _fail(f"{path} is not JSON: {exc}")
        raise


def _migrate_embedded() -> None:
    """The embedded SQLite store is created on first use, as ``nightbench nightly`` does."""
    from service.migrate import upgrade_embedded_store

    upgrade_embedded_store()


def import_key(data: Any) -> str:
    """The ingest key of a TorchBench file: its format and a hash of its JSON content."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return f"torchbench:{hashlib.sha256(canonical).hexdigest()[:32]}"


def import_torchbench(
    file: Annotated[Path, typer.Argument(help="a TorchBench result JSON file")],
    night: Annotated[
        str | None,
        typer.Option("--date", help="night YYYY-MM-DD (default: the file's date, else today)"),
    ] = None,
    note: Annotated[str | None, typer.Option(help="a note stored on the run")] = None,
) -> None:
    """Import a TorchBench result (userbenchmark or pytest-benchmark JSON) as an ingest run.

    TorchBench's models are stored as ``torchbench.<name>`` in the suite's units (ms, bytes);
    a file written by ``nightbench export torchbench`` keeps its names. Importing the same file
    again stores nothing new and names the run it made.
    """
    from service.db import session_scope
    from service.runs.ingest import create_ingest_run, ingest_records, ingest_run_by_key
    from service.runs.service import BenchmarkSpec

    data = _read(file)
    try:
        kind = result_format(data)
        records = from_torchbench(data)
    except TorchBenchFormatError as exc:
        _fail(f"{file}: {exc}")
        raise
    if not records:
        _fail(f"{file}: the {kind} result holds no benchmark")
    the_night = _night(night, data if kind == PYTEST_BENCHMARK else None)
    key = import_key(data)
    _migrate_embedded()
    environment = next((r.environment for r in records if r.environment), {})
    try:
        with session_scope() as session:
            existing = ingest_run_by_key(session, key=key)
            if existing is not None:
                typer.echo(
                    f"{file} was already imported as run {existing.id}; nothing stored", err=True
                )
                print(json.dumps({"run": existing.id, "stored": 0, "already_stored": len(records)}))
                return
            specs = [
                BenchmarkSpec(
                    model=r.model,
                    mode=r.mode,
                    device=r.device,
                    compiler=r.compiler,
                    batch_size=r.batch_size,
                    queue="ingest",
                )
                for r in records
            ]
            run, _ = create_ingest_run(
                session,
                night=the_night,
                benchmarks=specs,
                torch_spec=f"torchbench {kind}: {file.name}",
                torch_version=environment.get("torch_version"),
                torch_git_commit=environment.get("torch_git_version"),
                key=key,
                note=note,
            )
            outcome = ingest_records(session, run_id=run.id, records=[r.to_json() for r in records])
            run_id = run.id
    except NightbenchError as exc:
        _fail(f"{file}: {exc.message}")
        raise
    errors = sum(1 for r in records if r.error)
    typer.echo(
        f"run {run_id}: {outcome.stored} benchmark(s) from {kind} {file} "
        f"({errors} error(s)), night {the_night}",
        err=True,
    )
    if outcome.stored:
        _judge_if_embedded(run_id)
    print(
        json.dumps(
            {"run": run_id, "stored": outcome.stored, "already_stored": outcome.already_stored}
        )
    )


def _judge_if_embedded(run_id: int) -> None:
    """No workers sweep an embedded store: the imported night is judged here and now."""
    if get_settings().embedded:
        from workers.enqueue import Step, send

        send([Step("night.finish", (run_id,))])


def _night(night: str | None, pytest_data: Any) -> date:
    if night is not None:
        try:
            return date.fromisoformat(night)
        except ValueError:
            _fail(f"--date must be YYYY-MM-DD, got {night!r}")
    return (pytest_benchmark_night(pytest_data) if pytest_data else None) or date.today()


def export_torchbench(
    run: Annotated[int, typer.Option(help="the run to export")],
    out: Annotated[Path | None, typer.Option(help="write here (default: stdout)")] = None,
    suite: Annotated[
        str,
        typer.Option(
            help="all | own | torchbench: which models (torchbench: the torchbench.* ones)"
        ),
    ] = "all",
) -> None:
    """Export a run's results as a TorchBench userbenchmark result (``test_bench`` keys).

    TorchBench's ``userbenchmark/test_bench/regression_detector.py`` compares two such files;
    ``torchbench.<name>`` models are written as ``<name>``, values in TorchBench's units.
    """
    from service.db import session_scope
    from service.runs.service import run_records

    if suite not in EXPORT_SUITES:
        _fail(f"--suite must be one of {', '.join(EXPORT_SUITES)}, got {suite!r}")
    _migrate_embedded()
    try:
        with session_scope() as session:
            rows = run_records(session, run_id=run)
    except NightbenchError as exc:
        _fail(exc.message)
        raise
    records = [
        BenchmarkRecord.from_json(r)
        for r in rows
        if suite == "all" or r["model"].startswith(TORCHBENCH_PREFIX) == (suite == "torchbench")
    ]
    try:
        doc = to_userbenchmark(records)
    except TorchBenchFormatError as exc:
        _fail(f"run {run}: {exc} (--suite own or --suite torchbench)")
        raise
    payload = json.dumps(doc, indent=1)
    if out is None:
        print(payload)
    else:
        out.write_text(payload + "\n")
        typer.echo(f"run {run}: {len(records)} benchmark(s) written to {out}", err=True)


def install_torchbench(
    models: Annotated[
        str | None,
        typer.Option(
            help="comma-separated models or patterns as for `nightbench nightly --models`, e.g. "
            "torchbench.lennard_jones,torchbench.hf_* (default: every model of the checkout)"
        ),
    ] = None,
    torchbench: Annotated[
        str | None,
        typer.Option(
            "--torchbench",
            help="a pytorch/benchmark checkout (default: NIGHTBENCH_TORCHBENCH_PATH)",
        ),
    ] = None,
    torch_index: Annotated[
        str | None,
        typer.Option(
            "--torch-index",
            help="the index of torchvision/torchaudio builds matching this torch (default: "
            "NIGHTBENCH_TORCH_INDEX_URL, the index torch builds come from, else PyTorch's index "
            "of torch's +cpu/+cuXXX variant)",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(help="the interpreter of the environment to install into (default: this one)"),
    ] = None,
) -> None:
    """Install the chosen TorchBench models' requirements with the checkout's own ``install.py``,
    and say which models fail.

    First torchvision and torchaudio: each that does not import is installed from the index of
    the torch under test (``--torch-index``), torch held, and imported again. Then TorchBench's
    top-level requirements.txt (torch, torchvision, torchaudio, numpy held, as TorchBench holds
    them); then ``python install.py MODEL... --continue_on_fail`` with everything installed so
    far held (``PIP_CONSTRAINT``), so one model's requirements cannot move what the others run
    on. Afterwards each model's import is checked in that environment (as ``python -m suite
    list --check-imports`` does, checked again whatever the cache holds). Names each model
    whose setup FAILED with TorchBench's last error line, each that does not import with the
    cause, and each that imports but lacks what building it needs here (a HuggingFace config
    not in the local cache). Exit code 2 and nothing installed for a path that is not a
    checkout, a model that matches nothing, or no torch (or no torchvision/torchaudio at all)
    to install against; 1 when a setup failed, a model does not import or lacks what it needs,
    torchvision/torchaudio does not import, or ``install.py`` failed; 0 when all are available.
    """
    from suite import torchbench_check
    from suite import torchbench_install as tb_install

    try:
        root = tb_install.checkout_for_install(torchbench)
        chosen = tb_install.select(root, _csv(models) or [])
    except tb_install.InstallInputError as exc:
        _fail(str(exc))
        raise
    if chosen.own:
        typer.echo(f"the own suite's {', '.join(chosen.own)}: nothing to install", err=True)
    if not chosen.torchbench:
        return
    python = python or sys.executable
    try:
        broken = _torch_libraries(python, torch_index)
        held = _held_after_top_level(root, python)
        command = tb_install.installer_command(chosen.torchbench, python=python)
        typer.echo(f"in {root}: {' '.join(command)} (PIP_CONSTRAINT={held})", err=True)
        code, output = tb_install.run_installer_captured(
            root, command, env=tb_install.constrained_environment(held)
        )
        setups = tb_install.parse_setup_output(output)
        # Checked again whatever the cache holds: the install may have fetched what a model
        # needed (a HuggingFace config) without changing the environment's packages. The
        # check's checkout_root() reads the checkout from the environment (suite has no
        # settings object): set for the check alone, and the caller's environment after it.
        with patch.dict(os.environ, {ENV_VAR: str(root)}):
            identity, found = torchbench_check.checks(
                chosen.torchbench, python=python, refresh=True
            )
            torchbench_check.store_setups(
                identity,
                {n: (o.status, o.error) for n, o in setups.items() if n in chosen.torchbench},
            )
    except typer.Exit:
        raise  # a refusal already explained (click's Exit is a RuntimeError)
    except (tb_install.InstallInputError, RuntimeError, OSError) as exc:
        _fail(str(exc))
        raise
    failed = {n: o for n, o in setups.items() if o.status == "FAIL" and n in chosen.torchbench}
    for name, outcome in failed.items():
        typer.echo(f"{TORCHBENCH_PREFIX}{name}: setup FAILED: {outcome.error}", err=True)
    no_import = {n: c.cause for n, c in found.items() if not c.imported}
    for name, why in sorted(no_import.items()):
        typer.echo(f"{TORCHBENCH_PREFIX}{name} does not import: {why}", err=True)
    # Imported, but missing what building it needs here (a HuggingFace config not cached).
    needs = {n: c.cause for n, c in found.items() if c.imported and c.cause and n not in failed}
    for name, why in sorted(needs.items()):
        typer.echo(f"{TORCHBENCH_PREFIX}{name} is unavailable: {why}", err=True)
    total = len(chosen.torchbench)
    typer.echo(
        f"{total - len(no_import)} of {total} TorchBench model(s) import after install; "
        f"{len(failed)} setup(s) FAILED, {len(no_import)} do not import"
        + (f", {len(needs)} need what is missing here" if needs else "")
        + (f"; not importing: {', '.join(sorted(broken))}" if broken else ""),
        err=True,
    )
    if code != 0:
        _fail(f"{tb_install.INSTALLER} exited with code {code}", code=1)
    if failed or no_import or needs or broken:
        raise typer.Exit(1)


def _torch_libraries(python: str, configured_index: str | None) -> dict[str, str]:
    """Torchvision and torchaudio made to import, from the index of the torch under test where
    they do not; returns those that still do not, with why. Exits 2 without torch, or when one
    is still not installed at all (TorchBench's installer reads their versions for every model).
    """
    from suite import torchbench_install as tb_install

    torch_version = tb_install.installed_version(python, "torch")
    if torch_version is None:
        _fail(f"torch is not installed in {python}: install the torch to benchmark first")
        raise AssertionError  # unreachable: _fail exits
    index = tb_install.torch_index(
        torch_version, configured_index or get_settings().torch_index_url
    )
    where = index or "the default index"
    errors = tb_install.library_errors(python)
    if any(errors.values()):
        command = tb_install.torch_library_command(python, torch_version, index)
        typer.echo(
            f"torchvision/torchaudio for torch {torch_version}: {' '.join(command)}", err=True
        )
        tb_install.run_installer_captured(Path.cwd(), command)
        errors = tb_install.library_errors(python)
    missing = [lib for lib, why in errors.items() if why == "not installed"]
    if missing:
        _fail(
            f"{', '.join(missing)} not installed for torch {torch_version} (tried {where}): "
            f"TorchBench's install.py and each model's setup read the versions of "
            f"{', '.join(tb_install.TORCH_DEPS)}, so every model's install would fail; give "
            f"the index of this torch's builds with --torch-index or NIGHTBENCH_TORCH_INDEX_URL"
        )
    broken = {lib: why for lib, why in errors.items() if why}
    for lib, why in broken.items():
        typer.echo(
            f"{lib} does not import: {why} (not a build of torch {torch_version}; tried "
            f"{where}): the models that need it will not import",
            err=True,
        )
    return broken


def _held_after_top_level(root: Path, python: str) -> Path:
    """Install TorchBench's top-level requirements.txt (torch and its libraries held, as
    TorchBench's own ``build/constraints.txt`` holds them), then write everything installed as
    the constraints the models install under; returns that file."""
    from suite import torchbench_install as tb_install

    held = root / "build" / "nightbench-constraints.txt"
    tb_install.write_constraints(python, held)
    requirements = root / "requirements.txt"
    if requirements.is_file():
        deps = {d.lower() for d in tb_install.TORCH_DEPS}
        pins = [ln for ln in held.read_text().splitlines() if ln.split("==")[0] in deps]
        torch_pins = root / "build" / "nightbench-torch-constraints.txt"
        torch_pins.write_text("\n".join(pins) + "\n")
        command = [python, "-m", "pip", "install", "-r", str(requirements)]
        typer.echo(f"in {root}: {' '.join(command)} (PIP_CONSTRAINT={torch_pins})", err=True)
        code, output = tb_install.run_installer_captured(
            root, command, env=tb_install.constrained_environment(torch_pins)
        )
        if code != 0:
            last = [ln for ln in output.splitlines() if ln.strip()][-1:] or [""]
            typer.echo(f"TorchBench's requirements.txt did not install: {last[0]}", err=True)
        tb_install.write_constraints(python, held)
    return held


# ---------------------------------------------------------------------------------------------
# nightbench torchbench check: the matrix
# ---------------------------------------------------------------------------------------------

MATRIX_TESTS = ("eval", "train")
QUICK_RUN = [
    "--iterations",
    "3",
    "--max-iterations",
    "3",
    "--min-seconds",
    "0.01",
    "--warmup",
    "1",
    "--warmup-seconds",
    "0",
]


def matrix_row(entry: dict[str, Any], runs: dict[str, str], device: str) -> dict[str, Any]:
    """One model's line of the matrix, from its listing entry (``python -m suite list --json
    --check-imports`` in the environment under test) and what its runs gave (``{test: "ok" |
    "error: ..."}``; a test missing from ``runs`` was not run).

    Returns:
        ``{"model", "installed", "importable", "eval", "train"}``: ``installed`` and
        ``importable`` are ``"yes"`` or why not, each test ``"ok"``, ``"not offered: why"``,
        ``"unavailable: why"`` (TorchBench's setup FAILED here, or building it needs what is
        missing here: a HuggingFace config not cached), ``"error: ..."``, ``"not
        run"``, or ``"-"`` where the model does not import.
    """
    reason = entry.get("reason") or ""
    installed = reason if reason.startswith("missing requirement") else "yes"
    imported_only = reason.startswith((NO_TEST, SETUP_FAILED, NEEDS))
    if entry.get("available") or imported_only:
        importable = "yes"
    elif installed != "yes":
        importable = "-"
    else:
        importable = reason
    row = {"model": entry["name"], "installed": installed, "importable": importable}
    for test in MATRIX_TESTS:
        key = f"{test}:{device}"
        if importable != "yes":
            row[test] = "-"
        elif reason.startswith((SETUP_FAILED, NEEDS)):
            row[test] = f"unavailable: {reason}"
        elif key in (entry.get("not_offered") or {}):
            row[test] = f"not offered: {entry['not_offered'][key]}"
        elif test not in entry.get("modes", []) or device not in entry.get("devices", []):
            row[test] = "not offered"
        else:
            row[test] = runs.get(test, "not run")
    return row


def matrix_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The matrix's totals: listed, installed, importable, and per test offered, run, ok."""
    counts = {
        "listed": len(rows),
        "installed": sum(r["installed"] == "yes" for r in rows),
        "importable": sum(r["importable"] == "yes" for r in rows),
    }
    for test in MATRIX_TESTS:
        offered = [
            r[test]
            for r in rows
            if r[test] != "-" and not r[test].startswith(("not offered", "unavailable"))
        ]
        counts[f"{test}_offered"] = len(offered)
        counts[f"{test}_run"] = sum(v != "not run" for v in offered)
        counts[f"{test}_ok"] = sum(v == "ok" for v in offered)
    return counts


def check_torchbench(
    models: Annotated[
        str | None,
        typer.Option(help="comma-separated models or patterns (default: every model)"),
    ] = None,
    torchbench: Annotated[
        str | None,
        typer.Option(
            "--torchbench",
            help="a pytorch/benchmark checkout (default: NIGHTBENCH_TORCHBENCH_PATH)",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(help="the interpreter of the environment to check (default: this one)"),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    run: Annotated[
        int | None,
        typer.Option(
            help="run eval and train (one iteration each) for the first N importable models "
            "chosen (default: all of them; 0: none)"
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds per run")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print the matrix of TorchBench's models in an environment: listed, installed (its
    requirements.txt satisfied), importable (the import check, with the cause), and whether
    eval and train run on ``--device`` (one iteration each through ``python -m suite run``),
    each failure with its cause. Exit code 0 whatever the matrix says; 2 for bad input.
    """
    from suite import torchbench_install as tb_install
    from workers import runner
    from workers.night.jobs import ROOT, suite_environment

    try:
        root = tb_install.checkout_for_install(torchbench)
        chosen = tb_install.select(root, _csv(models) or [])
    except tb_install.InstallInputError as exc:
        _fail(str(exc))
        raise
    python = python or sys.executable
    env = suite_environment()
    env[ENV_VAR] = str(root)
    typer.echo(f"checking the imports of {len(chosen.torchbench)} model(s) in {python}", err=True)
    listing = runner.run_suite(
        python,
        ["list", "--json", "--suite", "torchbench", "--check-imports"],
        timeout_s=max(1800.0, 120.0 * len(chosen.torchbench)),
        env=env,
        cwd=ROOT,
        record=False,
    )
    if listing.error:
        _fail(f"python -m suite list failed: {listing.error}")
    wanted = {TORCHBENCH_PREFIX + n for n in chosen.torchbench}
    entries = [e for e in json.loads(listing.stdout) if e["name"] in wanted]
    budget = len(entries) if run is None else run
    rows = []
    for entry in entries:
        runs: dict[str, str] = {}
        offered = [
            t
            for t in MATRIX_TESTS
            if entry.get("available")
            and t in entry.get("modes", [])
            and device in entry.get("devices", [])
            and f"{t}:{device}" not in (entry.get("not_offered") or {})
        ]
        if offered and budget > 0:
            budget -= 1
            for test in offered:
                runs[test] = _run_once(python, entry["name"], test, device, timeout, env)
        rows.append(matrix_row(entry, runs, device))
    counts = matrix_counts(rows)
    if as_json:
        print(json.dumps({"device": device, "counts": counts, "models": rows}, indent=1))
        return
    for row in rows:
        print(
            f"{row['model']}\tinstalled: {row['installed']}\timportable: {row['importable']}\t"
            f"eval: {row['eval']}\ttrain: {row['train']}"
        )
    print(json.dumps(counts))


def _run_once(python: str, model: str, test: str, device: str, timeout: float, env: dict) -> str:
    """``ok`` or ``error: <why>`` for one iteration of one benchmark in its own process."""
    from workers import runner

    typer.echo(f"running {model} {test} on {device}", err=True)
    args = ["run", "--model", model, "--mode", test, "--device", device, "--no-setup", *QUICK_RUN]
    outcome = runner.run_suite(python, args, timeout_s=timeout, env=env)
    if outcome.record is not None and not outcome.record.get("error"):
        return "ok"
    why = (outcome.record or {}).get("error") or outcome.error or "no record"
    return "error: " + " ".join(str(why).split())[:300]
