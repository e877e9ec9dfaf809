"""Extract night levels from asv result directories of a local git clone into the compact file
that ``benchmarks.real_series`` reads (``benchmarks/data/real_series.json.gz``).

Usage (from the repository root; the clones are local, nothing is downloaded)::

    python -m benchmarks.real_extract --out benchmarks/data/real_series.json.gz \\
        --source django/django-asv=/path/to/django-asv:results/ubuntu-latest \\
        --source conda/conda-benchmarks=/path/to/conda-benchmarks:.asv/results/benchmarkers-MacBook-Pro.local

Each asv result file (asv's results format version 2: one file per benchmarked commit and
environment, ``result_columns`` naming the columns of each benchmark's row; version 1 files map
a benchmark to its value) contributes, for every timing (``time_*``) and peak memory
(``peakmem_*``) benchmark without parameters, its ``result``: for timings asv's median over
the benchmark's repeats, in seconds; for peak memory the process's peak resident size, in
bytes. A *history* is one machine and one environment (asv
``env_name``); its nights are its result files ordered by commit date (asv's ``date``, ms),
the order asv's own step detection reads them in. Levels are kept to 5 significant digits.

Output (gzip JSON)::

    {"sources": {"owner/name": {"commit": <40 hex>, "results": <dir>}},
     "histories": [{"source", "machine", "env", "dates": [ms], "commits": [10 hex],
                    "series": {benchmark: [seconds or bytes, or null]}}]}
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

KINDS = ("time_", "peakmem_")


def _blobs(repo: Path, results: str):
    """Yield the parsed result files under ``results`` at the clone's HEAD."""
    names = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", results],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = [
        n
        for n in names
        if n.endswith(".json") and not n.endswith(("machine.json", "benchmarks.json"))
    ]
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for name in names:
            proc.stdin.write(f"HEAD:{name}\n".encode())
            proc.stdin.flush()
            size = int(proc.stdout.readline().split()[2])
            body = proc.stdout.read(size)
            proc.stdout.read(1)
            yield json.loads(body)
    finally:
        proc.stdin.close()
        proc.wait()


def _rows(doc: dict):
    """(benchmark, {"result": ..., "params": ...}) of a version 1 or 2 result file."""
    if doc["version"] == 2:
        cols = doc["result_columns"]
        for bench, row in doc["results"].items():
            yield bench, dict(zip(cols, row, strict=False))
        return
    for bench, value in doc["results"].items():  # version 1: a value, or a dict with params
        yield bench, value if isinstance(value, dict) else {"result": value}


def extract(repo: Path, results: str, source: str) -> tuple[dict, list[dict]]:
    """Histories of one asv results directory (see the module docstring)."""
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    by_env: dict[str, dict] = defaultdict(lambda: {"nights": {}, "values": defaultdict(dict)})
    for doc in _blobs(repo, results):
        if doc.get("version") not in (1, 2):
            continue
        h = by_env[doc["env_name"]]
        key = (int(doc["date"]), doc["commit_hash"][:10])
        h["nights"][key] = doc["params"].get("machine", "")
        for bench, r in _rows(doc):
            value = r.get("result")
            if not bench.rsplit(".", 1)[-1].startswith(KINDS) or r.get("params"):
                continue
            if isinstance(value, list):
                if len(value) != 1:
                    continue
                value = value[0]
            if isinstance(value, int | float) and value > 0:
                h["values"][bench][key] = float(f"{value:.5g}")
    histories = []
    for env, h in sorted(by_env.items()):
        keys = sorted(h["nights"])
        machine = next(iter(h["nights"].values()), "")
        series = {b: [v.get(k) for k in keys] for b, v in sorted(h["values"].items())}
        histories.append(
            {
                "source": source,
                "machine": machine,
                "env": env,
                "dates": [k[0] for k in keys],
                "commits": [k[1] for k in keys],
                "series": series,
            }
        )
    return {"commit": head, "results": results}, histories


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--source",
        action="append",
        required=True,
        help="owner/name=/path/to/clone:results/dir (repeatable)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    sources, histories = {}, []
    for spec in args.source:
        name, _, rest = spec.partition("=")
        path, _, results = rest.partition(":")
        if not (name and path and results and Path(path).is_dir()):
            print(
                f"--source: expected owner/name=/path/to/clone:results/dir, got {spec!r}",
                file=sys.stderr,
            )
            return 2
        sources[name], found = extract(Path(path), results, name)
        histories += found
    with gzip.open(args.out, "wt") as fh:
        json.dump({"sources": sources, "histories": histories}, fh, separators=(",", ":"))
    n = sum(len(h["series"]) for h in histories)
    print(f"{len(histories)} histories, {n} series -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
