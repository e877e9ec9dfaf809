"""Asking for an A/B and its run task failing for good: what is stored and what is sent."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from service.db import session_scope
from service.errors import InvalidInput
from service.models import ABTest
from workers.ab.flow import request_ab
from workers.ab.run import ABRequest
from workers.enqueue import Step
from workers.tasks import run_ab

BASE, HEAD = "1" * 40, "2" * 40


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    path = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_a_local_a_b_is_stored_queued_and_sent_to_its_queue(
    configure: Callable[..., None], clone: Path
) -> None:
    configure(bisect_provider="python-overlay", source_repo_path=clone, bisect_package="minitok")
    request = ABRequest(BASE, HEAD, benchmarks=("dqn:eval:cuda",), processes=4)
    ab_id, steps = request_ab(request, requested_by="cli", queue="gpu.a100")
    assert steps == [Step("ab.run", (ab_id,), queue="gpu.a100")]
    with session_scope() as session:
        ab = session.get(ABTest, ab_id)
        assert ab is not None and (ab.status, ab.report_state) == ("queued", "none")
        assert ab.options["benchmarks"] == ["dqn:eval:cuda"] and ab.options["processes"] == 4
        # The overlay lays each side's files over the installed build, taken to be the base's.
        assert ab.options["provider"]["kind"] == "python-overlay"
        assert ab.options["provider"]["base_sha"] == BASE


def test_without_a_build_provider_an_a_b_is_refused_naming_the_setting(
    configure: Callable[..., None],
) -> None:
    configure(source_repo_path="")  # and no NIGHTBENCH_BISECT_PROVIDER
    with pytest.raises(InvalidInput, match="NIGHTBENCH_BISECT_PROVIDER"):
        request_ab(ABRequest(BASE, HEAD, benchmarks=("dqn:eval:cpu",)))
    with session_scope() as session:
        assert session.query(ABTest).count() == 0


def test_a_run_task_past_its_time_limit_stores_why(
    configure: Callable[..., None], clone: Path
) -> None:
    configure(bisect_provider="checkout", source_repo_path=clone)
    ab_id, _ = request_ab(ABRequest(BASE, HEAD, benchmarks=("dqn:eval:cpu",)))
    run_ab.on_failure(SoftTimeLimitExceeded(), "task-id", (ab_id,), {}, None)
    with session_scope() as session:
        ab = session.get(ABTest, ab_id)
        assert ab is not None and ab.status == "failed"
        assert "did not finish within the task's soft time limit" in (ab.error or "")
        assert "NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S" in (ab.error or "")
    # Told twice (a redelivered failure): the stored reason stays.
    run_ab.on_failure(RuntimeError("other"), "task-id", (ab_id,), {}, None)
    with session_scope() as session:
        ab = session.get(ABTest, ab_id)
        assert ab is not None and "soft time limit" in (ab.error or "")


def test_bad_requests_are_refused_before_anything_is_stored() -> None:
    with pytest.raises(InvalidInput, match="either benchmarks"):
        ABRequest(BASE, HEAD)
    with pytest.raises(InvalidInput, match="MODEL:MODE:DEVICE"):
        ABRequest(BASE, HEAD, benchmarks=("resnet18",))
    with pytest.raises(InvalidInput, match="at least 2"):
        ABRequest(BASE, HEAD, benchmarks=("resnet18:eval:cpu",), processes=1)
