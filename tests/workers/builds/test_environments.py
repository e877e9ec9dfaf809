"""Environments for builds under test: real venvs, real pip, the cache's LRU budget, its locks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path
from typing import Any

import pytest

from service.errors import InfrastructureError, InvalidInput
from workers.builds import torch_envs as environments
from workers.builds.env_cache import EnvironmentCache
from workers.builds.torch_envs import (
    CURRENT,
    InvalidTorchSpec,
    environment_key,
    parse_torch_spec,
    prepare_environment,
    suite_requirements,
    use_environment,
)

MiB = 2**20
TORCH_SPEC = "torch==2.13.0"


def shared_env_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory per test session, so the torch venv is built once for all modules."""
    return tmp_path_factory.getbasetemp() / "env-cache"


def _bare_venv(path: Path) -> dict[str, Any]:
    """A real venv without pip or torch (milliseconds), with 1 MiB of payload to count."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    (path / "payload.bin").write_bytes(os.urandom(MiB))
    return {"spec": path.name}


def _prefix_of(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out).resolve()


# --- torch specs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "normalised"),
    [
        ("torch==2.13.0", "torch==2.13.0"),
        ("  torch == 2.13.0 ", "torch==2.13.0"),
        ("torch==2.14.0.dev20261121", "torch==2.14.0.dev20261121"),
        ("Torch===2.13.0+cpu", "Torch===2.13.0+cpu"),
        (
            "torch @ file:///wheels/torch-2.13.0-cp311-none-linux_x86_64.whl",
            "torch @ file:///wheels/torch-2.13.0-cp311-none-linux_x86_64.whl",
        ),
        ("current", CURRENT),
    ],
)
def test_parse_torch_spec_accepts_one_pinned_build(spec: str, normalised: str) -> None:
    assert parse_torch_spec(spec) == normalised


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("torch", "does not pin one build"),
        ("torch>=2.4", "does not pin one build"),
        ("torch==2.*", "does not pin one build"),
        ("torch>=2.4,<3", "does not pin one build"),
        ("numpy==1.26.0", "must name the torch package"),
        ("torch==2.13.0; python_version<'3'", "environment marker"),
        ("torch===", "does not pin one build"),
        ("torch==", "is not a pip requirement"),
        ("", "is not a pip requirement"),
    ],
)
def test_parse_torch_spec_names_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises(InvalidTorchSpec, match=words) as caught:
        parse_torch_spec(spec)
    assert isinstance(caught.value, InvalidInput)
    assert caught.value.status_code == 422
    assert repr(spec) in str(caught.value)


def test_environment_key_covers_what_decides_the_venv() -> None:
    def key(spec: str = "torch==2.13.0", **changes: Any) -> str:
        parts: dict[str, Any] = {
            "index_url": None,
            "requirements": ["numpy", "pyyaml"],
            "python_version": "cpython-3.11",
        }
        return environment_key(spec, **{**parts, **changes})

    assert key().startswith("torch-2.13.0-")
    assert key() == key(requirements=["pyyaml", "numpy"])
    others = {
        key("torch==2.13.1"),
        key(index_url="https://example.org/nightly"),
        key(requirements=["numpy"]),
        key(python_version="cpython-3.12"),
    }
    assert key() not in others and len(others) == 4


def test_suite_requirements_come_from_the_suite_extra(tmp_path: Path) -> None:
    names = {req.split(">")[0].split("=")[0].lower() for req in suite_requirements()}
    assert {"numpy", "pyyaml", "transformers"} <= names
    assert "torch" not in names

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\n[project.optional-dependencies]\nsuite = ["a>=1"]\n'
    )
    assert suite_requirements(pyproject) == ["a>=1"]


# --- the cache: locks, LRU eviction within the budget ---------------------------------------


def test_cached_venv_is_built_once_and_reused(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path, budget_bytes=100 * MiB)
    with cache.lease("a", _bare_venv) as (path, created):
        assert created
        assert _prefix_of(path / "bin" / "python") == path
        first = cache.read_metadata("a")
    with cache.lease("a", _bare_venv) as (again, created_again):
        assert again == path and not created_again
    assert cache.read_metadata("a") == first
    assert first["size_bytes"] >= MiB


def test_lru_eviction_within_a_tiny_budget(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path, budget_bytes=int(2.5 * MiB))
    for key in ("a", "b"):
        with cache.lease(key, _bare_venv):
            pass
    with cache.lease("a", _bare_venv) as (_, created):  # "a" is now the most recently used
        assert not created
    with cache.lease("c", _bare_venv) as (_, created):
        assert created

    assert [entry.key for entry in cache.entries()] == ["a", "c"]
    assert not (tmp_path / "b").exists()
    assert cache.total_bytes() <= cache.budget_bytes


def test_a_venv_in_use_is_not_evicted(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path, budget_bytes=int(1.5 * MiB))
    with cache.lease("old", _bare_venv) as (old, _):
        with cache.lease("new", _bare_venv):
            pass
        # Over budget, yet "old" is leased: only "new"'s own build could go, and it is kept.
        assert old.is_dir() and (old / "payload.bin").is_file()
        assert {entry.key for entry in cache.entries()} == {"old", "new"}
    with cache.lease("newer", _bare_venv):
        pass
    assert [entry.key for entry in cache.entries()] == ["newer"]


def test_a_half_built_venv_is_rebuilt(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "junk").write_text("a build that died here")
    cache = EnvironmentCache(tmp_path, budget_bytes=100 * MiB)
    with cache.lease("a", _bare_venv) as (path, created):
        assert created
        assert not (path / "junk").exists() and (path / "payload.bin").is_file()


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def broken(path: Path) -> dict[str, Any]:
        _bare_venv(path)
        raise environments.EnvironmentBuildError("pip install of torch==9 failed")

    cache = EnvironmentCache(tmp_path, budget_bytes=100 * MiB)
    with pytest.raises(environments.EnvironmentBuildError, match="torch==9"):
        with cache.lease("a", broken):
            pass
    assert not (tmp_path / "a").exists()
    assert cache.entries() == []


def test_two_processes_preparing_one_venv_build_it_once(tmp_path: Path) -> None:
    """Two workers ask for the same venv at once: one builds, the other waits and reuses it."""
    log = tmp_path / "builds.log"
    script = textwrap.dedent(
        f"""
        import os, sys, time, venv
        from pathlib import Path
        from workers.builds.env_cache import EnvironmentCache

        def build(path):
            with open({str(log)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            time.sleep(1.0)  # a slow build, so the other process surely waits on the lock
            venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
            return {{}}

        cache = EnvironmentCache(Path({str(tmp_path / "cache")!r}), budget_bytes=2**30)
        with cache.lease("same", build) as (path, created):
            print(path, created)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(environments.REPO_ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120)[0].split() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(log.read_text().splitlines()) == 1
    assert outputs[0][0] == outputs[1][0]
    assert sorted(created for _, created in outputs) == ["False", "True"]


def test_budget_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="budget"):
        EnvironmentCache(tmp_path, budget_bytes=0)


# --- real environments -----------------------------------------------------------------------


def test_current_is_the_running_interpreter() -> None:
    import torch

    env = prepare_environment("current")
    assert env.python == Path(sys.executable) and env.path is None and not env.created
    assert env.identity.torch_version == torch.__version__
    assert env.identity.git_version == torch.version.git_version
    assert env.subprocess_env({})["PYTHONPATH"] == str(environments.REPO_ROOT)


@pytest.mark.slow
def test_torch_spec_gets_a_real_venv_reused_on_the_second_call(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    import torch

    cache_dir = shared_env_cache(tmp_path_factory)
    env = prepare_environment(TORCH_SPEC, cache_dir=cache_dir, budget_bytes=50 * 2**30)

    assert env.path is not None and env.path.parent == cache_dir.resolve()
    assert env.python == env.path / "bin" / "python"
    assert _prefix_of(env.python) == env.path
    # The build's identity, asked of the venv's own interpreter.
    assert env.identity.torch_version.split("+")[0] == "2.13.0"
    assert env.identity.git_version == torch.version.git_version
    assert len(env.identity.git_version or "") == 40
    assert environments.query_identity(env.python) == env.identity

    run_env = env.subprocess_env()
    # The suite and its own needs import there; the worker's packages do not leak in.
    check = subprocess.run(
        [str(env.python), "-c", "import suite, numpy, yaml, transformers; print(suite.__file__)"],
        capture_output=True,
        text=True,
        env=run_env,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    assert Path(check.stdout.strip()).resolve().is_relative_to(environments.REPO_ROOT)
    for foreign in ("celery", "service"):
        leak = subprocess.run(
            [str(env.python), "-c", f"import {foreign}"],
            capture_output=True,
            text=True,
            env=run_env,
            cwd=tmp_path,
        )
        assert leak.returncode != 0 and f"No module named '{foreign}'" in leak.stderr
    listing = subprocess.run(
        [str(env.python), "-m", "suite", "list", "--json"],
        capture_output=True,
        text=True,
        env=run_env,
        cwd=tmp_path,
        timeout=300,
    )
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout)

    built = json.loads((env.path / environments.METADATA_FILE).read_text())
    assert built["spec"] == TORCH_SPEC and built["size_bytes"] > 100 * MiB

    with use_environment(TORCH_SPEC, cache_dir=cache_dir, budget_bytes=50 * 2**30) as again:
        assert again.path == env.path and not again.created
        assert again.identity == env.identity
    assert json.loads((env.path / environments.METADATA_FILE).read_text()) == built


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["torch==2.13.99", "torch==0.0.1"])
def test_a_build_pip_cannot_install_is_a_clear_error(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InvalidTorchSpec, match=f"pip cannot install {spec}") as caught:
        prepare_environment(spec, cache_dir=tmp_path, budget_bytes=2**30, requirements=[])
    assert not isinstance(caught.value, InfrastructureError)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
