"""The model page in headless Chromium, served by ``nightbench serve``: its charts are visible.

Debian's ``chromium`` is driven through Playwright's CDP client (no browser download).
The screenshot is kept next to the test's temporary files (``model_page.png``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from matplotlib import image as mpimg
from sqlalchemy import select

from service.db import get_engine, session_scope
from service.models import Result
from tests.api.conftest import (
    ROOT_DIR,
    add_night,
    flag,
    latency_series,
    make_record,
    night,
)

N = 30
STEP = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(database_url: str, tmp_path: Path) -> Iterator[str]:
    """``nightbench serve`` on a fresh database holding 30 nights of resnet18 with a step."""
    train = latency_series(N, step_at=STEP, seed=5)
    evals = latency_series(N, level=4.0, seed=6)
    with session_scope() as session:
        runs = [
            add_night(
                session,
                night(i),
                [
                    make_record("resnet18", "train", {"latency": train[i]}),
                    make_record("resnet18", "eval", {"latency": evals[i]}),
                ],
            )
            for i in range(N)
        ]
        step = session.scalar(
            select(Result).where(Result.run_id == runs[STEP].id, Result.mode == "train")
        )
        flag(session, step, baseline=10.0)
    get_engine().dispose()
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
        cwd=ROOT_DIR,
        env=dict(os.environ),
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
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _colour_fraction(pixels: np.ndarray, rgb: tuple[int, int, int], tol: int = 40) -> float:
    target = np.array(rgb, dtype=float) / 255
    close = np.abs(pixels[..., :3] - target).max(axis=-1) < tol / 255
    return float(close.mean())


def test_model_page_shows_its_charts(served: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Debian's chromium is needed: apt-get install -y chromium (.ci/run does it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            response = page.goto(f"{served}/models/resnet18", wait_until="networkidle")
            assert response is not None and response.status == 200
            assert page.title() == "nightbench · resnet18"
            sizes = page.eval_on_selector_all(
                "img.chart", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
            )
            assert len(sizes) == 2, sizes
            assert all(done and w > 300 and h > 100 for done, w, h in sizes), sizes
            assert page.locator(".broken").count() == 0
            shot = tmp_path / "model_page.png"
            page.screenshot(path=str(shot), full_page=True)
            chart = tmp_path / "chart.png"
            page.locator("img.chart[alt*='resnet18:train:cpu']").screenshot(path=str(chart))
        finally:
            browser.close()

    pixels = mpimg.imread(str(shot))
    assert pixels.shape[0] >= 900 and pixels.shape[1] == 1200
    assert float(pixels[..., :3].std()) > 0.05  # not a blank page
    chart_px = mpimg.imread(str(chart))
    assert chart_px.shape[1] > 600
    # The median line (#1f5f99), the baseline band (#9aa5b1 blended) and the regression
    # marker (#d64545) are drawn in the visible chart.
    assert _colour_fraction(chart_px, (0x1F, 0x5F, 0x99)) > 0.002
    assert _colour_fraction(chart_px, (0xD6, 0x45, 0x45)) > 0.0002
    assert _colour_fraction(chart_px, (255, 255, 255), tol=8) < 0.97
