"""Helpers of the suite's tests: running ``python -m suite`` for real, reading records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from suite.registry import EXTRA_MODELS_ENV

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_MODELS = FIXTURES / "models"
# Few samples: these tests check behaviour, not speed.
QUICK = ["--iterations", "5", "--min-seconds", "0.05", "--warmup", "1", "--warmup-seconds", "0"]


def suite_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.pop(EXTRA_MODELS_ENV, None)
    env.pop("NIGHTBENCH_TORCHBENCH_PATH", None)  # a test names the checkout it means
    env.update(extra)
    return env


def run_suite(
    args: Sequence[str], *, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m suite ARGS`` in a fresh process from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "suite", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=suite_env(**env),
    )


def run_record(
    model: str, mode: str, *extra: str, fixtures: bool = False, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m suite run --out -`` for one benchmark; returns the process and its record."""
    if fixtures:
        env[EXTRA_MODELS_ENV] = str(FIXTURE_MODELS)
    proc = run_suite(["run", "--model", model, "--mode", mode, "--out", "-", *QUICK, *extra], **env)
    try:
        record = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"stdout is not a record: {proc.stdout[:500]!r}\n{proc.stderr}"
        ) from exc
    return proc, record


def metric(record: dict[str, Any], name: str) -> dict[str, Any]:
    for m in record["metrics"]:
        if m["metric"] == name:
            return m
    raise AssertionError(f"no metric {name!r} in {[m['metric'] for m in record['metrics']]}")
