"""``nightbench ab`` on a local clone, as a developer runs it before opening the PR."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.db import session_scope
from service.models import ABTest
from workers.cli import app
from workers.demo.minitok import INSTALL_COMMAND, make_package_repository
from workers.demo.run import DEMO_MODELS


@pytest.mark.slow
@pytest.mark.measured
def test_a_local_a_b_prints_stores_and_fails_on_a_regression(
    configure: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_package_repository(tmp_path / "minitok", commits=2, encode_culprit=2)
    monkeypatch.setenv("NIGHTBENCH_SUITE_EXTRA_MODELS", str(DEMO_MODELS))
    args = ["ab", "--repo", str(repo.path), "--base", repo.shas[1], "--head", repo.shas[2]]
    args += ["--models", "tokbag", "--install", INSTALL_COMMAND, "--work-dir", str(tmp_path / "b")]
    out = CliRunner().invoke(
        app, [*args, "--processes", "5", "--samples", "6", "--no-profile", "--json"]
    )
    assert out.exit_code == 1, out.output  # a regression fails the command
    doc = json.loads(out.stdout[out.stdout.index("{") :])
    latency = next(r for r in doc["rows"] if r["metric"] == "latency")
    assert latency["benchmark"] == "tokbag:eval:cpu" and latency["verdict"] == "regression"
    assert doc["rows"][0]["flagged"] is True  # flagged rows first
    with session_scope() as session:
        ab = session.get(ABTest, doc["id"])
        assert ab is not None and ab.status == "done" and ab.requested_by == "cli"
        assert ab.report_state == "none" and ab.base_run_id and ab.head_run_id


def test_a_local_a_b_needs_its_commits(configure: Callable[..., None]) -> None:
    out = CliRunner().invoke(app, ["ab", "--base", "abc", "--benchmark", "dqn:eval:cpu"])
    assert out.exit_code == 2 and "needs --repo, --base and --head" in out.output
    bad = CliRunner().invoke(app, ["ab", "--pr", "3", "--benchmark", "dqn"])
    assert bad.exit_code == 2 and "MODEL:MODE:DEVICE" in bad.output
