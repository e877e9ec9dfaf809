"""Acceptance: `nightbench dispatch --torch torch==2.13.0` measures in a venv built from that spec.

Two nights on the same spec: the first prepares (or finds) the cached venv and runs the suite with
its interpreter, recording the build's version and git commit on the run; the second night reuses
that venv as it is, without rebuilding it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.db import normalise_url
from service.models import Result, Run
from tests.workers.builds.test_environments import TORCH_SPEC, shared_env_cache
from workers.builds import env_cache
from workers.builds import torch_envs as environments

ROOT = Path(__file__).resolve().parents[3]
# A small RL policy, and BERT built from a transformers config: the suite's own requirements
# (transformers) must be importable in the build's venv too.
MODELS = ("dqn", "bert")


def _dispatch(night: str, env: dict[str, str]) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "dispatch",
            "--date",
            night,
            "--torch",
            TORCH_SPEC,
            "--models",
            ",".join(MODELS),
            "--modes",
            "eval",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_id,) = json.loads(proc.stdout.strip().splitlines()[-1])["runs"]
    return int(run_id)


def _venvs_for(cache_dir: Path, spec: str) -> dict[Path, dict[str, Any]]:
    found = {}
    for meta in cache_dir.glob(f"*/{environments.METADATA_FILE}"):
        data = json.loads(meta.read_text())
        if data["spec"] == spec:
            found[meta.parent] = data
    return found


def _stored(url: str, run_id: int) -> tuple[Run, list[Result]]:
    engine = create_engine(normalise_url(url))
    try:
        with Session(engine) as session:
            run = session.get_one(Run, run_id)
            results = list(session.scalars(select(Result).where(Result.run_id == run_id)))
            session.expunge_all()
            return run, results
    finally:
        engine.dispose()


@pytest.mark.slow
def test_dispatch_measures_in_the_specs_venv_and_reuses_it_the_next_night(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import torch

    cache_dir = shared_env_cache(tmp_path_factory)
    env = {**os.environ, "NIGHTBENCH_ENV_CACHE_DIR": str(cache_dir)}
    env.pop("NIGHTBENCH_BROKER_URL", None)

    first = _dispatch("2026-11-20", env)

    (venv_dir, built), *others = _venvs_for(cache_dir.resolve(), TORCH_SPEC).items()
    assert not others, "one venv per spec"
    assert built["identity"]["torch_version"].split("+")[0] == "2.13.0"
    inode = venv_dir.stat().st_ino
    last_used = (venv_dir / env_cache.LAST_USED_FILE).stat().st_mtime_ns

    run, results = _stored(database_url, first)
    assert run.torch_spec == TORCH_SPEC and run.status == "complete"
    # The run's identity is the build measured: the venv's torch, version and git commit.
    assert run.torch_version == built["identity"]["torch_version"]
    assert run.torch_git_commit == built["identity"]["git_version"] == torch.version.git_version
    assert len(run.torch_git_commit or "") == 40
    assert {r.model for r in results} == set(MODELS)
    assert {r.model for r in results if r.metric == "latency"} == set(MODELS)
    for result in results:
        assert result.error is None, result.error
        assert result.samples and result.median is not None
        if result.metric == "latency":
            assert result.unit == "ms" and result.median > 0
        # The suite ran with the venv's interpreter, not the one running nightbench.
        executable = Path(result.environment["executable"])
        assert executable.parent.parent.resolve() == venv_dir.resolve(), executable
        assert result.environment["torch_git_version"] == run.torch_git_commit

    second = _dispatch("2026-11-21", env)

    again = _venvs_for(cache_dir.resolve(), TORCH_SPEC)
    assert list(again) == [venv_dir]
    assert again[venv_dir] == built, "the venv was rebuilt"
    assert venv_dir.stat().st_ino == inode
    assert (venv_dir / env_cache.LAST_USED_FILE).stat().st_mtime_ns > last_used

    run2, results2 = _stored(database_url, second)
    assert run2.status == "complete" and run2.torch_git_commit == run.torch_git_commit
    assert {r.model for r in results2} == set(MODELS)
    for result in results2:
        assert result.error is None, result.error
        assert Path(result.environment["executable"]).parent.parent.resolve() == venv_dir.resolve()
