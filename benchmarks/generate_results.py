"""Fill a Postgres database with years of nightly results, for the API benchmarks.

Shape (defaults: 10,008,672 result rows):

* ``--nights`` nights (1096 = three years), two nightly runs per night (a CPU host and a GPU
  host: one run per device class, as ``nightbench dispatch`` creates them);
* ``--models`` models, each with 12 series: modes train/eval x {cpu eager, cuda eager,
  cuda inductor} x {latency, peak memory (cpu_peak_mem on the CPU host, gpu_peak_mem on the
  GPU host)};
* latency: 15 raw samples a night around the night level (1% noise), the level a per-model
  log-uniform 0.5 to 500 ms with 0.5% night-to-night jitter; peak memory: one exact sample;
* about one persistent step (+-8% to +-40%) per series-year, each stored as a ``Regression``
  row (reproduced) on the night it starts, as the nightly detector stores it;
* the torch build of each night (``2.x.0.devYYYYMMDD+cu124`` and a commit sha) on its runs,
  and a realistic environment document on every result.

Rows go in with ``COPY`` (psycopg 3), with the results table's secondary indexes, foreign
keys and triggers dropped or disabled during the load and rebuilt after it; ``series_months``
(the history packed by month) is then filled by one ``series_months_rebuild()``. The ``jobs``
table is left empty (``results.job_id`` is NULL), which the history and ingest paths do not
read.

Usage::

    python benchmarks/generate_results.py --dbname nightbench_bench            # 10M rows
    python benchmarks/generate_results.py --dbname nb_small --models 20 --nights 200
    python benchmarks/generate_results.py --dbname nightbench_bench --drop      # clean up
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import time
from datetime import UTC, date, datetime, timedelta

import numpy as np
import psycopg
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import service.models  # noqa: F401  (registers every table)
from service.db import Base, normalise_url
from service.migrate import upgrade
from service.results.records import machine_fingerprint, series_key

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
MODES = ("train", "eval")
HOSTS = {
    "cpu": {
        "device": "cpu",
        "compilers": ("eager",),
        "mem": "cpu_peak_mem",
        "env": {
            "cpu_model": "AMD EPYC 7763 64-Core Processor",
            "threads": 1,
            "cpu_count": 128,
            "hostname": "bench-cpu-1",
            "device_class": "cpu",
            "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
            "python": "3.11.9",
        },
    },
    "a100": {
        "device": "cuda",
        "compilers": ("eager", "inductor"),
        "mem": "gpu_peak_mem",
        "env": {
            "cpu_model": "AMD EPYC 7742 64-Core Processor",
            "threads": 1,
            "cpu_count": 128,
            "hostname": "bench-gpu-1",
            "device_class": "a100",
            "gpu_name": "NVIDIA A100-SXM4-80GB",
            "driver": "550.54.15",
            "cuda": "12.4",
            "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
            "python": "3.11.9",
        },
    },
}
SAMPLES = 15
RESULT_COLUMNS = (
    "id",
    "run_id",
    "machine_id",
    "night",
    "model",
    "mode",
    "device",
    "compiler",
    "batch_size",
    "metric",
    "unit",
    "samples",
    "sample_count",
    "median",
    "iqr",
    "environment",
    "benchmark_version",
    "series_key",
    "created_at",
)
REGRESSION_COLUMNS = (
    "id",
    "run_id",
    "result_id",
    "series_key",
    "model",
    "mode",
    "device",
    "compiler",
    "metric",
    "unit",
    "direction",
    "baseline",
    "value",
    "change",
    "p_value",
    "threshold",
    "alertable",
    "confirmation",
    "state",
    "reason",
    "created_at",
    "updated_at",
)


def _url(dbname: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + dbname


def _admin(sql: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(sql)


def _copy_text(value: object) -> str:
    if value is None:
        return "\\N"
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _drop_secondary(conn: psycopg.Connection) -> list[str]:
    """Drop the results table's non-primary indexes and constraints; return how to rebuild."""
    rebuild: list[str] = []
    for name, definition in conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'results'::regclass AND contype IN ('f', 'u')"
    ).fetchall():
        conn.execute(f'ALTER TABLE results DROP CONSTRAINT "{name}"')
        rebuild.append(f'ALTER TABLE results ADD CONSTRAINT "{name}" {definition}')
    for name, definition in conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'results' "
        "AND indexname NOT IN (SELECT conname FROM pg_constraint "
        "WHERE conrelid = 'results'::regclass AND contype = 'p')"
    ).fetchall():
        conn.execute(f'DROP INDEX "{name}"')
        rebuild.insert(0, definition)
    return rebuild


def generate(dbname: str, *, nights: int, models: int, start: date, seed: int) -> None:
    console = Console()
    rng = np.random.default_rng(seed)
    _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{dbname}"')
    url = _url(dbname)
    upgrade(url)
    # Tables declared in the models but not yet in a migration.
    from sqlalchemy import create_engine

    engine = create_engine(normalise_url(url))
    Base.metadata.create_all(engine, checkfirst=True)
    engine.dispose()

    names = [f"model_{i:04d}" for i in range(models)]
    # Series: (model index, mode, host, compiler, metric, unit)
    series: list[tuple[int, str, str, str, str, str]] = []
    for m in range(models):
        for host, spec in HOSTS.items():
            for mode in MODES:
                for compiler in spec["compilers"]:
                    series.append((m, mode, host, compiler, "latency", "ms"))
                    series.append((m, mode, host, compiler, str(spec["mem"]), "bytes"))
    n_series = len(series)
    console.print(
        f"{dbname}: {models} models, {n_series} series, {nights} nights -> "
        f"{n_series * nights:,} results"
    )

    lat = np.array([s[4] == "latency" for s in series])
    base_level = np.where(
        lat,
        np.exp(rng.uniform(math.log(0.5), math.log(500), n_series)),
        np.round(np.exp(rng.uniform(math.log(50e6), math.log(40e9), n_series)) / 512) * 512,
    )
    # About one persistent step per series-year, sizes +-8% to +-40%.
    steps = rng.random((n_series, nights)) < 1 / 365
    steps[:, :60] = False
    sizes = rng.uniform(0.08, 0.4, (n_series, nights)) * rng.choice([-1, 1], (n_series, nights))
    factor = np.cumprod(np.where(steps, 1 + sizes, 1.0), axis=1)
    jitter = np.where(lat[:, None], rng.normal(1, 0.005, (n_series, nights)), 1.0)
    levels = base_level[:, None] * factor * jitter
    levels[~lat] = np.round(levels[~lat] / 512) * 512

    machine_ids: dict[str, int] = {}
    envs = {}
    with psycopg.connect(url) as conn:
        for i, (host, spec) in enumerate(HOSTS.items(), start=1):
            env = dict(spec["env"])
            fp = machine_fingerprint(env, str(spec["device"]))
            conn.execute(
                "INSERT INTO machines (id, fingerprint, device_class, cpu_model, gpu_name, driver,"
                " hostname, details, created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,now())",
                (
                    i,
                    fp,
                    env["device_class"],
                    env.get("cpu_model"),
                    env.get("gpu_name"),
                    env.get("driver"),
                    env.get("hostname"),
                    json.dumps({"threads": 1}),
                ),
            )
            machine_ids[host] = i
            envs[host] = (env, fp)
        conn.execute("SELECT setval('machines_id_seq', 10)")
        keys = [
            series_key(
                model=names[m],
                mode=mode,
                device=str(HOSTS[host]["device"]),
                compiler=compiler,
                metric=metric,
                batch_size=4 if mode == "train" else 8,
                benchmark_version="b" * 16,
                machine=envs[host][1],
            )
            for m, mode, host, compiler, metric, _ in series
        ]
        rebuild = _drop_secondary(conn)
        # series_months is filled once after the load (one aggregate) instead of by the
        # triggers night by night.
        conn.execute("ALTER TABLE results DISABLE TRIGGER USER")
        conn.commit()

        by_host = {h: [i for i, s in enumerate(series) if s[2] == h] for h in HOSTS}
        result_id = 0
        run_id = 0
        reg_id = 0
        t0 = time.perf_counter()
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as progress:
            bar = progress.add_task("nights", total=nights)
            for j in range(nights):
                night = start + timedelta(days=j)
                stamp = datetime(night.year, night.month, night.day, 6, tzinfo=UTC).isoformat()
                version = f"2.{6 + j // 180}.0.dev{night:%Y%m%d}+cu124"
                commit = hashlib.sha1(night.isoformat().encode()).hexdigest()
                runs_buf = io.StringIO()
                results_buf = io.StringIO()
                regs_buf = io.StringIO()
                for host, idx in by_host.items():
                    run_id += 1
                    runs_buf.write(
                        "\t".join(
                            _copy_text(v)
                            for v in (
                                run_id,
                                night,
                                "nightly",
                                None,
                                "nightly",
                                version,
                                commit,
                                "complete",
                                len(idx) // 2,
                                None,
                                None,
                                "{}",
                                None,
                                stamp,
                                stamp,
                                stamp,
                                None,
                            )
                        )
                        + "\n"
                    )
                    env, _ = envs[host]
                    env_json = json.dumps(
                        {**env, "torch_version": version, "torch_git_version": commit},
                        separators=(",", ":"),
                    )
                    idx_arr = np.array(idx)
                    lv = levels[idx_arr, j]
                    samp = lv[:, None] * rng.normal(1, 0.01, (len(idx), SAMPLES))
                    med = np.median(samp, axis=1).tolist()
                    q75, q25 = np.percentile(samp, [75, 25], axis=1)
                    iqrs = (q75 - q25).tolist()
                    lv_list = lv.tolist()
                    for k, s in enumerate(idx):
                        m, mode, _, compiler, metric, unit = series[s]
                        result_id += 1
                        if lat[s]:
                            samples = "[" + ",".join(f"{x:.5f}" for x in samp[k].tolist()) + "]"
                            median, iqr, count = med[k], iqrs[k], SAMPLES
                        else:
                            samples = f"[{lv_list[k]:.1f}]"
                            median, iqr, count = lv_list[k], 0.0, 1
                        results_buf.write(
                            "\t".join(
                                (
                                    str(result_id),
                                    str(run_id),
                                    str(machine_ids[host]),
                                    str(night),
                                    names[m],
                                    mode,
                                    str(HOSTS[host]["device"]),
                                    compiler,
                                    "4" if mode == "train" else "8",
                                    metric,
                                    unit,
                                    samples,
                                    str(count),
                                    repr(median),
                                    repr(iqr),
                                    env_json,
                                    "b" * 16,
                                    keys[s],
                                    stamp,
                                )
                            )
                            + "\n"
                        )
                        if steps[s, j]:
                            reg_id += 1
                            before = float(levels[s, j - 1])
                            change = median / before - 1
                            regs_buf.write(
                                "\t".join(
                                    _copy_text(v)
                                    for v in (
                                        reg_id,
                                        run_id,
                                        result_id,
                                        keys[s],
                                        names[m],
                                        mode,
                                        HOSTS[host]["device"],
                                        compiler,
                                        metric,
                                        unit,
                                        "regression" if change > 0 else "improvement",
                                        before,
                                        median,
                                        change,
                                        0.001 if lat[s] else None,
                                        0.07,
                                        "t" if change > 0 else "f",
                                        "reproduced" if change > 0 else "not_possible",
                                        "untriaged" if change > 0 else "improvement",
                                        "generated step",
                                        stamp,
                                        stamp,
                                    )
                                )
                                + "\n"
                            )
                with conn.cursor() as cur:
                    with cur.copy(
                        "COPY runs (id, night, kind, parent_run_id, torch_spec, "
                        "torch_version, torch_git_commit, status, expected_jobs, "
                        "previous_run_id, commit_range, options, deadline_at, "
                        "started_at, finished_at, created_at, note) FROM STDIN"
                    ) as cp:
                        cp.write(runs_buf.getvalue())
                    with cur.copy(f"COPY results ({', '.join(RESULT_COLUMNS)}) FROM STDIN") as cp:
                        cp.write(results_buf.getvalue())
                    if regs_buf.tell():
                        with cur.copy(
                            f"COPY regressions ({', '.join(REGRESSION_COLUMNS)}) FROM STDIN"
                        ) as cp:
                            cp.write(regs_buf.getvalue())
                conn.commit()
                progress.update(
                    bar,
                    advance=1,
                    description=f"nights ({result_id / (time.perf_counter() - t0):,.0f} rows/s)",
                )
        console.print(
            f"loaded {result_id:,} results, {reg_id:,} regressions in "
            f"{time.perf_counter() - t0:,.0f} s; rebuilding indexes and keys"
        )
        t1 = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '512MB'")
        for statement in rebuild:
            console.print(f"  {statement[:110]}")
            conn.execute(statement)
            conn.commit()
        for table, column in (("results", "id"), ("runs", "id"), ("regressions", "id")):
            conn.execute(
                f"SELECT setval('{table}_{column}_seq', (SELECT max({column}) FROM {table}))"
            )
        conn.execute("ALTER TABLE results ENABLE TRIGGER USER")
        conn.commit()
        console.print(f"indexes and keys rebuilt in {time.perf_counter() - t1:,.0f} s")
        t2 = time.perf_counter()
        months = conn.execute("SELECT series_months_rebuild()").fetchone()
        conn.commit()
        console.print(
            f"series_months filled in {time.perf_counter() - t2:,.0f} s "
            f"({months[0] if months else 0:,} rows)"
        )
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE results")
        conn.execute("VACUUM ANALYZE series_months")
        conn.execute("VACUUM ANALYZE runs")
        conn.execute("VACUUM ANALYZE regressions")
        size = conn.execute(
            "SELECT pg_size_pretty(pg_database_size(current_database()))"
        ).fetchone()
        console.print(f"database size {size[0] if size else '?'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dbname", default="nightbench_bench")
    parser.add_argument("--nights", type=int, default=1096)
    parser.add_argument("--models", type=int, default=761)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 11, 23))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drop", action="store_true", help="drop the database and exit")
    args = parser.parse_args()
    if args.drop:
        _admin(f'DROP DATABASE IF EXISTS "{args.dbname}" WITH (FORCE)')
        print(f"dropped {args.dbname}")
        return
    generate(args.dbname, nights=args.nights, models=args.models, start=args.start, seed=args.seed)


if __name__ == "__main__":
    main()
