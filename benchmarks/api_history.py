"""API benchmark: one model's full history, and ingest throughput, over real HTTP.

Starts ``nightbench serve`` (one uvicorn process) on a database filled by
``benchmarks/generate_results.py`` and measures, from a client on the same machine:

* ``GET /api/models/{model}/history`` (JSON, every series, every night) for models drawn at
  random: latency percentiles over ``--requests`` requests after ``--warmup`` requests;
* ``GET /api/models`` (the default 30-night window) and one series' SVG chart, for reference;
* ingest: ``POST /api/runs`` then ``POST /api/runs/{id}/results`` in batches of ``--batch``
  suite records (4 metrics each, so 4 results per record), ``--rounds`` rounds of
  ``--records`` records on fresh runs; results stored per second of wall time;
* ingest of one more night into the existing series, with and without the ``series_months``
  triggers (rolled back);
* the Postgres plans of the history's queries (``EXPLAIN (ANALYZE, BUFFERS)``), naming their
  indexes.

Usage::

    python benchmarks/generate_results.py --dbname nightbench_bench
    python benchmarks/api_history.py --dbname nightbench_bench
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path

import httpx
import numpy as np
import psycopg
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
console = Console()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "NIGHTBENCH_DATABASE_URL": url, "NIGHTBENCH_BROKER_URL": ""}
    env.pop("NIGHTBENCH_BROKER_URL")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("nightbench serve did not start")


def _timed_get(client: httpx.Client, path: str, **params: object) -> tuple[float, httpx.Response]:
    t = time.perf_counter()
    r = client.get(path, params=params)
    r.read()
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"GET {path} -> {r.status_code}: {r.text[:300]}")
    return dt, r


def bench_history(
    client: httpx.Client, models: list[str], *, requests: int, warmup: int, seed: int
) -> dict[str, float]:
    rng = random.Random(seed)
    for model in rng.sample(models, min(warmup, len(models))):
        _timed_get(client, f"/api/models/{model}/history")
    times, server, cpu, sizes, points, series = [], [], [], [], [], []
    for _ in range(requests):
        model = rng.choice(models)
        dt, r = _timed_get(client, f"/api/models/{model}/history")
        body = r.json()
        times.append(dt * 1e3)
        timing = dict(part.strip().split(";dur=") for part in r.headers["server-timing"].split(","))
        server.append(float(timing["app"]))
        cpu.append(float(timing["cpu"]))
        sizes.append(len(r.content))
        series.append(len(body["series"]))
        points.append(sum(len(s["points"]["night"]) for s in body["series"]))
    return {
        "requests": requests,
        "p50": _pct(times, 50),
        "p95": _pct(times, 95),
        "p99": _pct(times, 99),
        "max": max(times),
        "server_p50": _pct(server, 50),
        "server_p95": _pct(server, 95),
        "cpu_p50": _pct(cpu, 50),
        "cpu_p95": _pct(cpu, 95),
        "mean_points": statistics.mean(points),
        "mean_series": statistics.mean(series),
        "mean_mb": statistics.mean(sizes) / 2**20,
    }


def _record(model: str, mode: str, rng: np.random.Generator) -> dict:
    lat = (rng.normal(10, 0.1, 15)).tolist()
    env = {
        "cpu_model": "AMD EPYC 7763 64-Core Processor",
        "threads": 1,
        "cpu_count": 128,
        "hostname": "bench-cpu-1",
        "device_class": "cpu",
        "torch_version": "2.13.0.dev20261123+cu124",
        "torch_git_version": "e" * 40,
    }
    return {
        "model": model,
        "mode": mode,
        "device": "cpu",
        "compiler": "eager",
        "batch_size": 4,
        "benchmark_version": "c" * 16,
        "environment": env,
        "metrics": [
            {
                "metric": "latency",
                "unit": "ms",
                "samples": lat,
                "median": float(np.median(lat)),
                "iqr": 0.12,
            },
            {
                "metric": "cpu_peak_mem",
                "unit": "bytes",
                "samples": [3.2e9],
                "median": 3.2e9,
                "iqr": 0.0,
            },
            {
                "metric": "cpu_peak_mem_total",
                "unit": "bytes",
                "samples": [3.9e9],
                "median": 3.9e9,
                "iqr": 0.0,
            },
            {"metric": "mem_growth", "unit": "bytes", "samples": [0.0], "median": 0.0, "iqr": 0.0},
        ],
        "error": None,
    }


def bench_ingest(
    base: str, token: str, *, rounds: int, records: int, batch: int, night: date, posters: int = 1
) -> dict[str, float]:
    """Ingest rounds: each poster creates its own run of ``records`` benchmarks and posts them
    in batches of ``batch``; posters run at once (threads, one HTTP client each). Returns
    results stored per second of wall time over the rounds (median, min, max)."""
    headers = {"Authorization": f"Bearer {token}"}
    rates = []
    for k in range(rounds):
        plans = []
        for p in range(posters):
            with httpx.Client(base_url=base, timeout=300) as client:
                benches = [
                    {"model": f"ingest_{k}_{p}_{i:05d}", "mode": "eval"} for i in range(records)
                ]
                r = client.post(
                    "/api/runs",
                    headers=headers,
                    json={
                        "night": (night + timedelta(days=k)).isoformat(),
                        "benchmarks": benches,
                        "torch_version": "2.13.0.dev20261123+cu124",
                        "key": f"bench-{night}-{k}-{p}-{time.time_ns()}",
                    },
                )
                if r.status_code != 201:
                    raise SystemExit(f"POST /api/runs -> {r.status_code}: {r.text[:300]}")
                rng = np.random.default_rng(k * 100 + p)
                payloads = [
                    [_record(b["model"], "eval", rng) for b in benches[i : i + batch]]
                    for i in range(0, records, batch)
                ]
                plans.append((r.json()["id"], payloads))

        def post(plan: tuple[int, list[list[dict]]]) -> int:
            run_id, payloads = plan
            stored = 0
            with httpx.Client(base_url=base, timeout=300) as client:
                for payload in payloads:
                    r = client.post(f"/api/runs/{run_id}/results", headers=headers, json=payload)
                    if r.status_code != 200:
                        raise SystemExit(f"POST results -> {r.status_code}: {r.text[:300]}")
                    stored += r.json()["results"]
            return stored

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=posters) as pool:
            stored = sum(pool.map(post, plans))
        dt = time.perf_counter() - t
        rates.append(stored / dt)
        console.print(
            f"  ingest round {k + 1} ({posters} poster(s)): {stored:,} results in "
            f"{dt:.2f} s = {stored / dt:,.0f} results/s"
        )
    return {
        "rounds": rounds,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }


def ingest_existing(url: str, models: list[str], night: date, *, triggers: bool) -> float:
    """Results/s of the ingest path (``ingest_records``, one ``COPY``) storing one more night of
        every CPU benchmark of ``models`` into their existing three-year series (the generator's CPU
    host: same environment, batch sizes and benchmark version, hence the same series keys), in a transaction
        rolled back at the end; ``triggers=False`` stores it with the ``series_months`` triggers
        disabled (their cost is the difference). Each record holds latency and peak memory, the
        two metrics the generated series have."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from service.db import make_engine
    from service.runs.ingest import create_ingest_run, ingest_records
    from service.runs.service import BenchmarkSpec

    env = {
        "cpu_model": "AMD EPYC 7763 64-Core Processor",
        "threads": 1,
        "cpu_count": 128,
        "hostname": "bench-cpu-1",
        "device_class": "cpu",
        "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
        "python": "3.11.9",
    }
    records = [
        {
            "model": m,
            "mode": mode,
            "device": "cpu",
            "compiler": "eager",
            "batch_size": 4 if mode == "train" else 8,
            "benchmark_version": "b" * 16,
            "environment": env,
            "error": None,
            "metrics": [
                {
                    "metric": "latency",
                    "unit": "ms",
                    "samples": [10.0 + i * 0.01 for i in range(15)],
                    "median": 10.07,
                    "iqr": 0.07,
                },
                {
                    "metric": "cpu_peak_mem",
                    "unit": "bytes",
                    "samples": [3.2e9],
                    "median": 3.2e9,
                    "iqr": 0.0,
                },
            ],
        }
        for m in models
        for mode in ("train", "eval")
    ]
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            trans = conn.begin()
            session = Session(bind=conn)
            if not triggers:
                session.execute(text("ALTER TABLE results DISABLE TRIGGER USER"))
            run, _ = create_ingest_run(
                session,
                night=night,
                torch_spec="current",
                torch_version=None,
                torch_git_commit=None,
                key=None,
                benchmarks=[BenchmarkSpec(model=r["model"], mode=r["mode"]) for r in records],
            )
            t = time.perf_counter()
            outcome = ingest_records(session, run_id=run.id, records=records)
            dt = time.perf_counter() - t
            session.close()
            trans.rollback()
    finally:
        engine.dispose()
    return outcome.results / dt


def _packed_sql(model: str) -> list[tuple[str, dict]]:
    """Text and parameters of the queries the history endpoint runs (months, errors)."""
    from sqlalchemy.dialects import postgresql

    from service.results.points import HistoryFilter, history_sql, packed_statements

    months, errors, params = packed_statements(model, HistoryFilter())
    dialect = postgresql.psycopg.dialect()
    return [history_sql(dialect, months, params), history_sql(dialect, errors, params)]


def explain_history(url: str, model: str) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the queries the history endpoint runs."""
    out = []
    with psycopg.connect(url) as conn:
        for sql, params in _packed_sql(model):
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params).fetchall()
            out.extend(row[0] for row in rows)
    return "\n".join(out)


def history_query_ms(url: str, models: list[str], seed: int, n: int = 30) -> list[float]:
    """Postgres execution time (ms, EXPLAIN ANALYZE) of the history's queries (months and
    errors together) for random models."""
    rng = random.Random(seed + 1)
    out = []
    with psycopg.connect(url) as conn:
        for model in rng.sample(models, min(n, len(models))):
            total = 0.0
            for sql, params in _packed_sql(model):
                rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params).fetchall()
                total += float(rows[-1][0].split(":")[1].split()[0])
            out.append(total)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dbname", default="nightbench_bench")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=2000, help="suite records per round")
    parser.add_argument("--batch", type=int, default=100, help="records per request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    url = ADMIN.rsplit("/", 1)[0] + "/" + args.dbname

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT count(*) FROM results").fetchone()
        last = conn.execute("SELECT max(night) FROM runs WHERE kind = 'nightly'").fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('results'))").fetchone()
    console.print(
        f"{args.dbname}: {rows[0]:,} results (results table {size[0]} with indexes), "
        f"last night {last[0]}; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )

    os.environ["NIGHTBENCH_DATABASE_URL"] = url
    from service.auth import create_token
    from service.db import session_scope

    with session_scope(url) as session:
        _, token = create_token(session, name=f"bench-{time.time_ns()}")

    proc, base = _serve(url)
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            since = (last[0] - timedelta(days=7)).isoformat()
            models_times = [
                _timed_get(client, "/api/models", since=since)[0] * 1e3 for _ in range(5)
            ]
            models = [
                m["name"]
                for m in client.get("/api/models", params={"since": since}).json()["models"]
                if not m["name"].startswith("ingest_")
            ]
            console.print(
                f"GET /api/models: {len(models)} models, median "
                f"{statistics.median(models_times):.0f} ms over 5 requests"
            )
            hist = bench_history(
                client, models, requests=args.requests, warmup=args.warmup, seed=args.seed
            )
            one = client.get(f"/api/models/{models[0]}/history").json()["series"][0]["series_key"]
            svg_times = [
                _timed_get(client, f"/api/models/{models[0]}/history.svg", series=one)[0] * 1e3
                for _ in range(5)
            ]
            ingest = bench_ingest(
                base,
                token,
                rounds=args.rounds,
                records=args.records,
                batch=args.batch,
                night=last[0] + timedelta(days=1),
            )
            ingest2 = bench_ingest(
                base,
                token,
                rounds=args.rounds,
                records=args.records // 2,
                batch=args.batch,
                night=last[0] + timedelta(days=1),
                posters=2,
            )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    table = Table(title=f"nightbench API on {rows[0]:,} results")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("history requests (random models)", f"{hist['requests']}")
    table.add_row(
        "series / points per history", f"{hist['mean_series']:.0f} / {hist['mean_points']:,.0f}"
    )
    table.add_row("history body", f"{hist['mean_mb']:.2f} MiB")
    for q in ("p50", "p95", "p99", "max"):
        table.add_row(f"history latency {q} (client)", f"{hist[q]:.1f} ms")
    for q in ("p50", "p95"):
        table.add_row(f"history {q} in the server (Server-Timing)", f"{hist['server_' + q]:.1f} ms")
    for q in ("p50", "p95"):
        table.add_row(f"history {q} CPU of the API process", f"{hist['cpu_' + q]:.1f} ms")
    table.add_row("one series SVG (median of 5)", f"{statistics.median(svg_times):.0f} ms")
    table.add_row(
        "GET /api/models, 7 nights (median of 5)", f"{statistics.median(models_times):.0f} ms"
    )
    table.add_row(
        f"ingest, {args.batch} records/request (median of {args.rounds})",
        f"{ingest['median']:,.0f} results/s",
    )
    table.add_row("ingest min / max", f"{ingest['min']:,.0f} / {ingest['max']:,.0f} results/s")
    table.add_row(
        f"ingest, 2 posters at once (median of {args.rounds})",
        f"{ingest2['median']:,.0f} results/s",
    )
    for triggers in (True, False):
        rates = [
            ingest_existing(url, models, last[0] + timedelta(days=1), triggers=triggers)
            for _ in range(args.rounds)
        ]
        table.add_row(
            f"ingest into {2 * len(models):,} existing series pairs, "
            f"{'with' if triggers else 'without'} series_months triggers "
            f"(median of {args.rounds})",
            f"{statistics.median(rates):,.0f} results/s",
        )
    pg = history_query_ms(url, models, args.seed)
    table.add_row(
        "history queries in Postgres p50 / p95 (EXPLAIN ANALYZE)",
        f"{_pct(pg, 50):.1f} / {_pct(pg, 95):.1f} ms",
    )
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.1f}")
    console.print("history query plans:")
    console.print(explain_history(url, models[len(models) // 2]))


if __name__ == "__main__":
    main()
