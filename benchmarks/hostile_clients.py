"""The API under hostile clients: ``/healthz`` latency and the server's memory while 80 clients
call ``GET /api/status`` in a loop and 200 slow clients trickle request headers (slowloris).

Starts ``nightbench serve`` (one uvicorn process) on a fresh migrated database, with the local
Redis as broker and one message waiting in a queue no worker consumes, so each status
computation asks the workers and waits the full 2 s for answers (the costly case). Slow clients
send one header byte a second and reconnect when the server drops them, so 200 are always
trying. Reports /healthz latency percentiles, status answers by HTTP status, connections the
server dropped, and the server's resident memory before and at its peak (``/proc``).

With ``--bodies`` it measures hostile bodies instead: 31 MiB without a token, and with a valid
token a 16 MiB object of unknown keys, each posted to ``POST /api/runs``: the answer, its time,
the server's memory after, and the longest ``/healthz`` answer meanwhile.

Usage::

    python benchmarks/hostile_clients.py --duration 30
    python benchmarks/hostile_clients.py --bodies
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BROKER = os.environ.get("NIGHTBENCH_TEST_REDIS", "redis://127.0.0.1:6379/4")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class SlowClients(threading.Thread):
    """``n`` connections sending one header byte a second; a dropped one reconnects."""

    def __init__(self, port: int, n: int) -> None:
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.dropped = 0
        self.stop = threading.Event()

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port))
        s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.setblocking(False)
        return s

    def run(self) -> None:
        socks = [self._open() for _ in range(self.n)]
        sel = selectors.DefaultSelector()
        while not self.stop.is_set():
            for i, s in enumerate(socks):
                try:
                    data = s.recv(4096)
                    closed = not data
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if not closed:
                    try:
                        s.send(b"a")
                    except OSError:
                        closed = True
                if closed:
                    self.dropped += 1
                    s.close()
                    socks[i] = self._open()
            self.stop.wait(1.0)
        for s in socks:
            s.close()
        sel.close()


def _bodies(base: str, url: str, pid: int) -> dict[str, object]:
    from service.auth import create_token
    from service.db import session_scope

    with session_scope(url) as session:
        _, token = create_token(session, name="hostile")
    auth = {"Authorization": f"Bearer {token}"}

    def unknown_keys(n: int) -> bytes:
        return (
            b'{"night": "2026-03-01", "benchmarks": [{"model": "m", "mode": "eval"}], '
            + b", ".join(f'"k{i}": 0'.encode() for i in range(n))
            + b"}"
        )

    cases = {
        "POST /api/runs/1/results, 31 MiB, no token": (
            "/api/runs/1/results",
            b"[" + b" " * (31 * 2**20) + b"]",
            {},
        ),
        "POST /api/runs, 31 MiB, no token": ("/api/runs", b"[" + b" " * (31 * 2**20) + b"]", {}),
        "POST /api/runs, 16 MiB object of unknown keys, valid token": (
            "/api/runs",
            unknown_keys(1_300_000),
            auth,
        ),
        "POST /api/runs, 3.9 MiB object of unknown keys, valid token": (
            "/api/runs",
            unknown_keys(300_000),
            auth,
        ),
        "POST /api/runs/1/results, 31 MiB list of empty objects, valid token": (
            "/api/runs/1/results",
            b"[" + b",".join([b"{}"] * (31 * 2**20 // 3)) + b"]",
            auth,
        ),
    }
    out: dict[str, object] = {}
    for name, (path, body, headers) in cases.items():
        health: list[float] = []
        stop = threading.Event()

        def probe(health: list[float] = health, stop: threading.Event = stop) -> None:
            with httpx.Client(base_url=base, timeout=120) as c:
                while not stop.is_set():
                    t = time.perf_counter()
                    c.get("/healthz")
                    health.append((time.perf_counter() - t) * 1e3)
                    time.sleep(0.05)

        before = _rss_mb(pid)
        prober = threading.Thread(target=probe)
        prober.start()
        t = time.perf_counter()
        r = httpx.post(
            f"{base}{path}",
            content=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=120,
        )
        took = time.perf_counter() - t
        stop.set()
        prober.join()
        out[name] = {
            "bytes": len(body),
            "status": r.status_code,
            "detail": r.json()["detail"][:120],
            "seconds": round(took, 2),
            "rss_mb_before_after": (round(before, 1), round(_rss_mb(pid), 1)),
            "healthz_max_ms": round(max(health), 1) if health else None,
        }
    out["load_average"] = os.getloadavg()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds under load")
    parser.add_argument("--status-clients", type=int, default=80)
    parser.add_argument("--slow-clients", type=int, default=200)
    parser.add_argument("--bodies", action="store_true", help="hostile bodies instead of load")
    args = parser.parse_args()

    dbname = f"nb_hostile_{os.getpid()}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = ADMIN.rsplit("/", 1)[0] + f"/{dbname}"
    sys.path.insert(0, str(ROOT))
    from service.migrate import upgrade

    upgrade(url)
    prefix = f"nbhostile{os.getpid()}:"
    broker = redis.Redis.from_url(BROKER)
    broker.lpush(f"{prefix}gpu.h100", b"{}")  # nobody consumes it: every status asks
    port = _free_port()
    env = {
        **os.environ,
        "NIGHTBENCH_DATABASE_URL": url,
        "NIGHTBENCH_BROKER_URL": BROKER,
        "NIGHTBENCH_QUEUE_PREFIX": prefix,
    }
    log = open(f"/tmp/{dbname}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("nightbench serve did not come up")
            time.sleep(0.3)
        if args.bodies:
            print(json.dumps(_bodies(base, url, proc.pid), indent=1, default=str))
            return
        with httpx.Client(base_url=base, timeout=60) as c:
            idle = []
            for _ in range(20):
                t = time.perf_counter()
                c.get("/healthz")
                idle.append((time.perf_counter() - t) * 1e3)
        rss_before = _rss_mb(proc.pid)

        stop = threading.Event()
        status_codes: Counter[int | str] = Counter()
        status_ms: list[float] = []
        lock = threading.Lock()

        def status_loop() -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                while not stop.is_set():
                    t = time.perf_counter()
                    try:
                        code: int | str = c.get("/api/status").status_code
                    except httpx.HTTPError as exc:
                        code = type(exc).__name__
                    with lock:
                        status_codes[code] += 1
                        status_ms.append((time.perf_counter() - t) * 1e3)

        slow = SlowClients(port, args.slow_clients)
        slow.start()
        threads = [threading.Thread(target=status_loop) for _ in range(args.status_clients)]
        for t in threads:
            t.start()
        health_ms: list[float] = []
        health_codes: Counter[int | str] = Counter()
        rss_peak = rss_before
        end = time.monotonic() + args.duration
        with httpx.Client(base_url=base, timeout=60) as c:
            while time.monotonic() < end:
                t = time.perf_counter()
                try:
                    health_codes[c.get("/healthz").status_code] += 1
                except httpx.HTTPError as exc:
                    health_codes[type(exc).__name__] += 1
                health_ms.append((time.perf_counter() - t) * 1e3)
                rss_peak = max(rss_peak, _rss_mb(proc.pid))
                time.sleep(0.25)
        stop.set()
        slow.stop.set()
        for t in threads:
            t.join(timeout=70)
        slow.join(timeout=10)
        out = {
            "duration_s": args.duration,
            "status_clients": args.status_clients,
            "slow_clients": args.slow_clients,
            "healthz_idle_ms": {"p50": statistics.median(idle), "max": max(idle)},
            "healthz_under_load_ms": {
                "n": len(health_ms),
                "p50": round(_pct(health_ms, 0.5), 1),
                "p95": round(_pct(health_ms, 0.95), 1),
                "max": round(max(health_ms), 1),
            },
            "healthz_answers": dict(health_codes),
            "status_answers": dict(status_codes),
            "status_ms": {
                "p50": round(_pct(status_ms, 0.5), 1),
                "p95": round(_pct(status_ms, 0.95), 1),
                "max": round(max(status_ms), 1),
            },
            "slow_connections_dropped_by_server": slow.dropped,
            "server_rss_mb": {"before": round(rss_before, 1), "peak": round(rss_peak, 1)},
            "load_average": os.getloadavg(),
        }
        print(json.dumps(out, indent=1, default=str))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
        for key in broker.scan_iter(f"{prefix}*"):
            broker.delete(key)
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
