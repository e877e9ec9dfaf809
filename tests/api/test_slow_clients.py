"""``nightbench serve`` disconnects clients that send a request too slowly (slowloris) and keeps
answering others meanwhile (issue 40, finding 9). A real server process on a fresh database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.auth import create_token
from service.db import get_engine, session_scope
from tests.api.conftest import ROOT_DIR

SLOW_CLIENTS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(database_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``nightbench serve`` with 1 s for headers and 2 s for a body; its URL and a token."""
    with session_scope() as session:
        _, token = create_token(session, name="slow-test")
    get_engine().dispose()
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    env = {
        **os.environ,
        "NIGHTBENCH_API_HEADER_TIMEOUT_S": "1",
        "NIGHTBENCH_API_BODY_TIMEOUT_S": "2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
        cwd=ROOT_DIR,
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
                pytest.fail(
                    f"nightbench serve did not come up: {(tmp_path / 'serve.log').read_text()}"
                )
            time.sleep(0.3)
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset) after answering or not."""
    try:
        sock.setblocking(False)
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _trickle(socks: list[socket.socket], byte: bytes, until: float) -> list[bool]:
    """Send one byte a second on every socket until all are closed or ``until`` passes."""
    closed = [False] * len(socks)
    while not all(closed) and time.monotonic() < until:
        for i, s in enumerate(socks):
            if closed[i] or _closed(s):
                closed[i] = True
                continue
            try:
                s.send(byte)
            except OSError:
                closed[i] = True
        time.sleep(0.5)
    return closed


def test_slow_clients_are_disconnected_while_others_are_served(served: tuple[str, str]) -> None:
    base, token = served
    port = int(base.rsplit(":", 1)[1])
    headers = []
    for _ in range(SLOW_CLIENTS):
        s = socket.create_connection(("127.0.0.1", port))
        s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        headers.append(s)
    bodies = []
    for _ in range(SLOW_CLIENTS // 2):
        s = socket.create_connection(("127.0.0.1", port))
        s.send(
            b"POST /api/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 100000\r\n\r\n{"
        )
        bodies.append(s)
    # Others are answered meanwhile, on kept-alive connections too.
    with httpx.Client(base_url=base, timeout=10) as c:
        assert [c.get("/healthz").status_code for _ in range(3)] == [200] * 3
    # Without deadlines they would trickle for ever; the test gives up after 60 s.
    until = time.monotonic() + 60
    assert all(_trickle(headers, b"a", until)), "slow headers kept their connections"
    assert all(_trickle(bodies, b" ", until)), "slow bodies kept their connections"
    with httpx.Client(base_url=base, timeout=10) as c:
        assert c.get("/healthz").status_code == 200
    for s in headers + bodies:
        s.close()
