"""``python -m suite``: list the models, or measure one benchmark into a JSON record.

Usage::

    python -m suite list [--json] [--suite nightbench|torchbench|all]
    python -m suite run --model M --mode train|eval --device cpu|cuda [--compiler eager|inductor]
                        [--batch-size N] [--iterations N] [--min-seconds S] [--threads N]
                        [--cpus 0,1] --out FILE|-

``run`` exits 0 when the record has no error, 1 when the benchmark failed (the record then holds
the reason: an exception, ``NotImplementedError`` for an unsupported configuration, an
out-of-memory), 2 on bad arguments. ``list --suite torchbench`` exits 0 with an empty list and a
message on stderr when TorchBench is not installed. This module uses argparse on purpose: it runs
inside the environment under test, which holds torch and the suite's model libraries only.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import sys

from suite.registry import ModelInfo, list_models


def _selected_models(suite: str) -> list[ModelInfo]:
    models: list[ModelInfo] = []
    if suite in ("nightbench", "all"):
        models += list_models()
    if suite in ("torchbench", "all"):
        from suite import torchbench

        try:
            models += torchbench.list_models()
        except torchbench.TorchBenchUnavailable as exc:
            print(f"torchbench suite skipped: {exc}", file=sys.stderr)
    return models


def _list(args: argparse.Namespace) -> int:
    models = _selected_models(args.suite)
    if args.json:
        print(json.dumps([m.as_json() for m in models], indent=1))
    else:
        width = max((len(m.name) for m in models), default=10)
        for m in models:
            print(f"{m.name:<{width}}  {m.domain:<22}  {m.task:<24}  "
                  f"{','.join(m.modes):<10}  {','.join(m.devices)}")
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
    )
    # With --out -, stdout carries the record: whatever the model prints goes to stderr instead.
    redirect = (contextlib.redirect_stdout(sys.stderr) if args.out == "-"
                else contextlib.nullcontext())
    with redirect:
        record = run_benchmark(
            args.model, args.mode, args.device,
            compiler=args.compiler, batch_size=args.batch_size, config=cfg,
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


def main(argv: list[str] | None = None) -> int:
    # A hard crash inside torch (a segfault, an abort) leaves its Python stack on stderr, where
    # the worker picks it up as the error's reason.
    faulthandler.enable()
    parser = argparse.ArgumentParser(prog="python -m suite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the suite's models")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_list.add_argument("--suite", default="nightbench",
                        choices=["nightbench", "torchbench", "all"],
                        help="which models: the suite's own, TorchBench's (if installed), or both")
    p_list.set_defaults(func=_list)
    p_run = sub.add_parser("run", help="measure one benchmark")
    p_run.add_argument("--model", required=True)
    p_run.add_argument("--mode", required=True, choices=["train", "eval"])
    p_run.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p_run.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    p_run.add_argument("--batch-size", type=int, default=None)
    p_run.add_argument("--warmup", type=int, default=3, help="minimum warm-up iterations")
    p_run.add_argument("--warmup-seconds", type=float, default=0.5, help="minimum warm-up seconds")
    p_run.add_argument("--iterations", type=int, default=15, help="minimum timed iterations")
    p_run.add_argument("--max-iterations", type=int, default=200)
    p_run.add_argument("--min-seconds", type=float, default=2.0, help="minimum timed seconds")
    p_run.add_argument("--threads", type=int, default=1, help="torch threads on CPU (0: default)")
    p_run.add_argument("--cpus", type=_parse_cpus, default=None,
                       help="pin the process to these CPU ids, e.g. 1 or 0,1 (default: inherited)")
    p_run.add_argument("--inject-work", type=float, default=0.0,
                       help="extra work per iteration, as a fraction of an iteration (calibration)")
    p_run.add_argument("--out", required=True, help="output JSON file, or - for stdout")
    p_run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
