"""``python -m suite``: list the models, or measure one benchmark into a JSON record.

Usage::

    python -m suite list [--json] [--suite nightbench|own|torchbench|all] [--torchbench PATH]
                         [--check-imports]
    python -m suite run --model M --mode train|eval --device cpu|cuda [--compiler eager|inductor]
                        [--batch-size N] [--iterations N] [--min-seconds S] [--threads N]
                        [--cpus 0,1] [--no-setup] --out FILE|-
    python -m suite coverage [--json] [--models M ...] [--threads N]
    python -m suite count --benchmarks M:MODE[:BATCH],... [--warmup-steps N] [--steps N]
                          [--repeats N] [--timeout S] --out FILE|-
    python -m suite profile --model M --mode train|eval [--device cpu|cuda] [--batch-size N]
                            [--warmup-steps N] [--steps N] [--windows N] [--threads N]
                            [--callgrind] [--trace FILE] [--timeout S] --out FILE|-

``run`` exits 0 when the record has no error, 1 when the benchmark failed (the record then holds
the reason: an exception, ``NotImplementedError`` for an unsupported configuration, an
out-of-memory), 2 on bad arguments (a ``--torchbench`` path that is not a pytorch/benchmark
checkout included). ``list --suite torchbench`` exits 0 with an empty list and a message on
stderr when no TorchBench checkout is configured; a TorchBench model is listed
``"available": true`` only once its import passed in this environment (``--check-imports``
checks those not checked yet, see :mod:`suite.torchbench_check`), else ``"available": false``
with the reason: a missing requirement, the import's failure, or "not checked" (also on
stderr). ``coverage`` prints
the distinct operators one train and one eval iteration of each model send to the dispatcher, per
model and in union (:mod:`suite.coverage`); it exits 1 when a model failed (reported, not raised).
This module uses argparse on purpose: it runs
inside the environment under test, which holds torch and the suite's model libraries only.

``run`` re-executes itself once with the measurement setup (``suite/cpu_setup.py``: a preloaded
allocator or glibc tunables, thread variables, core binding) unless ``--no-setup`` or
``NIGHTBENCH_SUITE_SETUP=off``; only when started as a program, never from :func:`main` called
with explicit arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import sys
from pathlib import Path

from suite.registry import ModelInfo, list_models


def _selected_models(suite: str, check_imports: bool = False) -> list[ModelInfo]:
    models: list[ModelInfo] = []
    if suite in ("nightbench", "own", "all"):
        models += list_models()
    if suite in ("torchbench", "all"):
        from suite import torchbench
        from suite import torchbench_checkout as checkout

        try:
            found = torchbench.list_models(check_imports=check_imports)
        except checkout.TorchBenchUnavailable as exc:
            print(f"torchbench suite skipped: {exc}", file=sys.stderr)
        else:
            models += found
            for m in found:
                if not m.available:
                    print(f"{m.name} unavailable: {m.reason}", file=sys.stderr)
    return models


def _list(args: argparse.Namespace) -> int:
    models = _selected_models(args.suite, args.check_imports)
    if args.json:
        print(json.dumps([m.as_json() for m in models], indent=1))
    else:
        width = max((len(m.name) for m in models), default=10)
        for m in models:
            print(
                f"{m.name:<{width}}  {m.status:<11}  {m.domain:<22}  {m.task:<24}  "
                f"{','.join(m.modes):<10}  {','.join(m.devices)}"
            )
    return 0


def _parse_cpus(text: str) -> tuple[int, ...]:
    try:
        cpus = tuple(sorted({int(c) for c in text.split(",") if c.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpus wants CPU ids like 0,1; got {text!r}") from None
    if not cpus:
        raise argparse.ArgumentTypeError("--cpus needs at least one CPU id")
    return cpus


def _run(args: argparse.Namespace) -> int:
    from suite.harness import HarnessConfig, run_benchmark

    cfg = HarnessConfig(
        warmup_iterations=args.warmup,
        warmup_seconds=args.warmup_seconds,
        min_iterations=args.iterations,
        max_iterations=max(args.max_iterations, args.iterations),
        min_seconds=args.min_seconds,
        threads=args.threads or None,
        inject_work=args.inject_work,
        cpus=args.cpus,
        steady_warmup={"auto": None, "on": True, "off": False}[args.steady_warmup],
    )
    # With --out -, stdout carries the record: whatever the model prints goes to stderr instead.
    redirect = (
        contextlib.redirect_stdout(sys.stderr) if args.out == "-" else contextlib.nullcontext()
    )
    with redirect:
        record = run_benchmark(
            args.model,
            args.mode,
            args.device,
            compiler=args.compiler,
            batch_size=args.batch_size,
            config=cfg,
        )
    text = json.dumps(record.to_json(), indent=1)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text)
    if record.error:
        print(f"{args.model} {args.mode} {args.device}: {record.error}", file=sys.stderr)
        return 1
    return 0


def _count(args: argparse.Namespace) -> int:
    """``python -m suite count``: instructions per step of each benchmark (``suite.counting``).

    Outside valgrind it starts one valgrind process that counts every benchmark in turn and
    writes ``{"records": [...]}`` to ``--out``, one record per benchmark in the order given (a
    host without valgrind: each ``skipped`` with the reason, exit 0); inside it (``NIGHTBENCH_COUNT_MANIFEST`` set) it counts and writes the manifest.
    """
    from suite import counting

    try:
        benchmarks = counting.parse_benchmarks(args.benchmarks)
        cfg = counting.CountConfig(
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            repeats=args.repeats,
            timeout_s=args.timeout,
        )
    except ValueError as exc:
        print(f"python -m suite count: {exc}", file=sys.stderr)
        return 2
    manifest = os.environ.get(counting.INSIDE_ENV)
    if manifest:
        with contextlib.redirect_stdout(sys.stderr):
            counting.count_benchmarks(benchmarks, cfg, Path(manifest))
        return 0
    try:
        records = counting.count_records(benchmarks, cfg)
    except counting.CountUnavailable as exc:
        records = [counting.skipped_record(m, mo, b, str(exc)) for m, mo, b in benchmarks]
    text = json.dumps({"records": records}, indent=1)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
    failed = [r for r in records if r["error"]]
    for r in failed:
        print(f"{r['model']} {r['mode']} cpu: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


def _profile(args: argparse.Namespace) -> int:
    """``python -m suite profile``: the operator table of a benchmark's step, or with
    ``--callgrind`` its function-level instruction counts (``suite.profiling``).

    Writes the profile document to ``--out``; exits 1 when the benchmark failed (the document's
    ``error``), 2 on bad arguments or when valgrind is missing for ``--callgrind``.
    """
    from suite import counting, profiling

    try:
        cfg = profiling.ProfileConfig(
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            windows=args.windows,
            threads=args.threads,
            timeout_s=args.timeout,
            python_functions=args.python_functions,
        )
    except ValueError as exc:
        print(f"python -m suite profile: {exc}", file=sys.stderr)
        return 2
    if args.callgrind and args.device != "cpu":
        print("python -m suite profile: --callgrind counts on the cpu only", file=sys.stderr)
        return 2
    manifest = os.environ.get(profiling.INSIDE_ENV)
    with contextlib.redirect_stdout(sys.stderr):  # a model's prints never mix with the document
        if args.callgrind and manifest:
            profiling.profile_inside(args.model, args.mode, args.batch_size, cfg, Path(manifest))
            return 0
        if args.callgrind:
            try:
                doc = profiling.profile_functions(
                    args.model, args.mode, batch_size=args.batch_size, config=cfg
                )
            except counting.CountUnavailable as exc:
                print(f"python -m suite profile: {exc}", file=sys.stderr)
                return 2
        else:
            doc = profiling.profile_operators(
                args.model,
                args.mode,
                args.device,
                batch_size=args.batch_size,
                config=cfg,
                trace=Path(args.trace) if args.trace else None,
            )
    text = json.dumps(doc, indent=1)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
    if doc["error"]:
        print(f"{args.model} {args.mode} {args.device}: {doc['error']}", file=sys.stderr)
        return 1
    return 0


def _apply_setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Re-execute this process with the measurement setup unless it is in force or disabled."""
    from suite.cpu_setup import SetupUnavailable, reexec_if_needed

    try:
        reexec_if_needed(
            threads=args.threads if args.device == "cpu" else None,
            cpus=args.cpus,
            enabled=not args.no_setup,
        )
    except SetupUnavailable as exc:
        parser.error(str(exc))  # exit 2: a forced allocator that is not installed


def _coverage(args: argparse.Namespace) -> int:
    import torch

    from suite import coverage

    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.models or [m.name for m in list_models()]
    redirect = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with redirect:  # a model's prints never mix with the JSON document
        results = coverage.suite_coverage(names, device=args.device)
    doc = coverage.coverage_json(results, device=args.device)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print_coverage_table(doc)
    for c in results:
        if c.error:
            print(f"{c.model}: {c.error}", file=sys.stderr)
    return 1 if doc["failed"] else 0


def _print_coverage_table(doc: dict[str, object]) -> None:
    models = doc["models"]
    assert isinstance(models, list)
    rows = [
        (
            m["model"],
            str(m["count"]),
            str(m["aten_count"]),
            ",".join(m["modes"]),
            m["error"] or "; ".join(f"{k}: {v}" for k, v in m["skipped"].items()),
        )
        for m in models
    ]
    total = ("union", str(doc["union_count"]), str(doc["union_aten_count"]), "", "")
    header = ("model", "operators", "aten", "modes", "note")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the environment under test may lack rich: plain columns then
        widths = [max(len(r[i]) for r in [header, *rows, total]) for i in range(4)]
        for row in [header, *rows, total]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])
        return
    table = Table(title=f"operator coverage ({doc['device']}, torch {doc['torch']})")
    for i, name in enumerate(header):
        table.add_column(name, justify="right" if i in (1, 2) else "left")
    for row in rows:
        table.add_row(*row)
    table.add_section()
    table.add_row(*total, style="bold")
    Console().print(table)


def _parser() -> argparse.ArgumentParser:
    """The command line: ``list``, ``run`` and ``coverage``."""
    parser = argparse.ArgumentParser(prog="python -m suite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the suite's models")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_list.add_argument(
        "--suite",
        default="nightbench",
        choices=["nightbench", "own", "torchbench", "all"],
        help="which models: the suite's own (nightbench or own, as "
        "`nightbench nightly --suite` names it), TorchBench's (if "
        "installed), or both",
    )
    p_list.add_argument(
        "--check-imports",
        action="store_true",
        help="check the imports of TorchBench's models not checked in this environment yet "
        "(a subprocess per batch, cached); without it they are listed as not checked",
    )
    p_list.set_defaults(func=_list)
    p_run = sub.add_parser("run", help="measure one benchmark")
    p_run.add_argument("--model", required=True)
    p_run.add_argument("--mode", required=True, choices=["train", "eval"])
    p_run.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p_run.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    p_run.add_argument("--batch-size", type=int, default=None)
    p_run.add_argument("--warmup", type=int, default=3, help="minimum warm-up iterations")
    p_run.add_argument("--warmup-seconds", type=float, default=0.5, help="minimum warm-up seconds")
    p_run.add_argument(
        "--steady-warmup",
        choices=["auto", "on", "off"],
        default=os.environ.get("NIGHTBENCH_SUITE_STEADY_WARMUP", "auto"),
        help="after the minimums, warm up until the iteration time is steady "
        "(median of 5 within 1%%; auto: on for cuda; default from "
        "NIGHTBENCH_SUITE_STEADY_WARMUP)",
    )
    p_run.add_argument("--iterations", type=int, default=15, help="minimum timed iterations")
    p_run.add_argument("--max-iterations", type=int, default=200)
    p_run.add_argument("--min-seconds", type=float, default=2.0, help="minimum timed seconds")
    p_run.add_argument("--threads", type=int, default=1, help="torch threads on CPU (0: default)")
    p_run.add_argument(
        "--cpus",
        type=_parse_cpus,
        default=None,
        help="pin the process to these CPU ids, e.g. 1 or 0,1 (default: inherited)",
    )
    p_run.add_argument(
        "--inject-work",
        type=float,
        default=0.0,
        help="extra work per iteration, as a fraction of an iteration (calibration)",
    )
    p_run.add_argument(
        "--no-setup",
        action="store_true",
        help="measure without the measurement setup (allocator, tunables, threads)",
    )
    p_run.add_argument("--out", required=True, help="output JSON file, or - for stdout")
    p_run.set_defaults(func=_run)
    p_count = sub.add_parser(
        "count", help="count instructions per step under valgrind (cpu_instructions)"
    )
    p_count.add_argument(
        "--benchmarks",
        required=True,
        help="MODEL:MODE[:BATCH],... counted in turn in one valgrind process (CPU)",
    )
    p_count.add_argument("--warmup-steps", type=int, default=2, help="uncounted steps first")
    p_count.add_argument("--steps", type=int, default=1, help="steps in each counted window")
    p_count.add_argument("--repeats", type=int, default=3, help="counted windows (samples)")
    p_count.add_argument("--timeout", type=float, default=3600.0, help="seconds for the process")
    p_count.add_argument("--out", required=True, help="output JSON file, or - for stdout")
    p_count.set_defaults(func=_count)
    p_prof = sub.add_parser(
        "profile", help="profile a benchmark's step: operators, or functions under callgrind"
    )
    p_prof.add_argument("--model", required=True)
    p_prof.add_argument("--mode", required=True, choices=["train", "eval"])
    p_prof.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p_prof.add_argument("--batch-size", type=int, default=None)
    p_prof.add_argument("--warmup-steps", type=int, default=3, help="unprofiled steps first")
    p_prof.add_argument("--steps", type=int, default=3, help="steps in each profiled window")
    p_prof.add_argument("--windows", type=int, default=7, help="profiled windows")
    p_prof.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    p_prof.add_argument(
        "--callgrind",
        action="store_true",
        help="count instructions per function under valgrind instead (cpu_instructions)",
    )
    p_prof.add_argument("--trace", default=None, help="write the last window's Chrome trace here")
    p_prof.add_argument(
        "--python-functions",
        action="store_true",
        help="a row per Python function too: cProfile's self time in an operator table, "
        "with --callgrind its bytecodes per step (sys.settrace, outside valgrind)",
    )
    p_prof.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds for the valgrind process"
    )
    p_prof.add_argument("--out", required=True, help="output JSON file, or - for stdout")
    p_prof.set_defaults(func=_profile)
    p_cov = sub.add_parser("coverage", help="distinct operators the models exercise")
    p_cov.add_argument("--json", action="store_true", help="print JSON")
    p_cov.add_argument(
        "--models",
        nargs="+",
        metavar="M",
        default=None,
        help="suite models to measure (default: all of the suite's own)",
    )
    p_cov.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p_cov.add_argument("--threads", type=int, default=1, help="torch threads on CPU (0: default)")
    p_cov.set_defaults(func=_coverage)
    for p in (p_list, p_run, p_count, p_prof):
        p.add_argument(
            "--torchbench",
            metavar="PATH",
            default=None,
            help="a pytorch/benchmark checkout (default: NIGHTBENCH_TORCHBENCH_PATH)",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m suite`` with ``argv`` (default: the process's); return the exit status.

    0 on success, 1 when a benchmark failed (its record carries the error); argparse exits
    with 2 on bad arguments.
    """
    # A hard crash inside torch (a segfault, an abort) leaves its Python stack on stderr, where
    # the worker picks it up as the error's reason.
    faulthandler.enable()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and argv is None:
        _apply_setup(parser, args)
    if getattr(args, "torchbench", None):
        # Stays: suite has no settings object; checkout_root() reads the checkout from here.
        os.environ["NIGHTBENCH_TORCHBENCH_PATH"] = args.torchbench
    if args.command == "list" and args.suite != "nightbench":
        from suite.torchbench_checkout import InvalidCheckout, TorchBenchUnavailable, checkout_root

        try:
            checkout_root()
        except InvalidCheckout as exc:
            parser.error(str(exc))  # exit 2: a path that is not a checkout is a bad argument
        except TorchBenchUnavailable:
            pass  # none configured: the listing says so and goes on
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
