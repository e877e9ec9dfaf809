"""Build identity: a spec's variant, the wheel it resolved to, the frozen requirements, the series.

``torch==2.13.0`` matches ``2.13.0+cpu`` and ``2.13.0+cu130``. Here two local find-links
directories each hold one tiny fake torch wheel of that version, and the host's pip
configuration (``PIP_FIND_LINKS``) picks which one a venv gets; no real torch is installed.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from service.config import get_settings
from service.db import session_scope
from service.results.records import build_identity, result_rows, series_key, torch_variant
from service.results.service import store_record
from service.runs import service as runs
from service.runs.report import environment_changes, run_report
from service.runs.service import BenchmarkSpec
from workers.builds.build_lock import LOCK_FILE, read_install_report
from workers.builds.torch_envs import environment_key, pip_sources, use_environment
from workers.cli import app
from workers.night.jobs import with_build

GIT_VERSION = "a" * 40


def _wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """Write a minimal pure-Python wheel (``name-version-py3-none-any.whl``) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    dist = f"{stem}.dist-info"
    contents = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = directory / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in {**contents, f"{dist}/RECORD": "\n".join(record) + "\n"}.items():
            zf.writestr(path, text)
    return wheel


def _fake_torch(directory: Path, version: str) -> Path:
    return _wheel(
        directory,
        "torch",
        version,
        {
            "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n",
            "torch/version.py": f"git_version = {GIT_VERSION!r}\ncuda = None\n",
        },
    )


@pytest.fixture(scope="module")
def wheel_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``cpu`` and ``cu130``: one torch 2.13.0 wheel each; ``shared``: the suite's fake need."""
    root = tmp_path_factory.mktemp("wheels")
    _fake_torch(root / "cpu", "2.13.0+cpu")
    _fake_torch(root / "cu130", "2.13.0+cu130")
    _wheel(root / "shared", "nb-fake-suite-need", "1.0", {"nb_fake_suite_need.py": "X = 1\n"})
    return {name: root / name for name in ("cpu", "cu130", "shared")}


# --- the variant ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "variant"),
    [
        ("2.13.0+cpu", "cpu"),
        ("2.13.0", ""),
        ("2.13.0+cu130", "cu130"),
        ("2.14.0.dev20261121+CU130", "cu130"),
        ("2.13.0+rocm6.4", "rocm6.4"),
        (None, ""),
    ],
)
def test_torch_variant_is_the_local_tag(version: str | None, variant: str) -> None:
    assert torch_variant(version) == variant


def test_build_identity_prefers_the_recorded_variant() -> None:
    assert build_identity({"torch_version": "2.13.0+cpu"}) == ("cpu", "")
    assert build_identity(
        {"torch_version": "2.13.0+cpu", "torch_variant": "cu130", "requirements_hash": "f" * 16}
    ) == ("cu130", "f" * 16)
    assert build_identity({}) == ("", "")


def test_series_key_splits_on_variant_and_requirements_only() -> None:
    def key(build: tuple[str, str] = ("", "")) -> str:
        return series_key(
            model="m",
            mode="eval",
            device="cpu",
            compiler="eager",
            metric="latency",
            batch_size=None,
            benchmark_version="v1",
            machine="fp",
            build=build,
        )

    # No build identity: the key of every series stored before it was part of the key.
    assert key() == key(("", ""))
    keys = {
        key(),
        key(("cpu", "")),
        key(("cu130", "")),
        key(("cpu", "1" * 16)),
        key(("cpu", "2" * 16)),
    }
    assert len(keys) == 5


def test_report_lines_name_the_environment_change() -> None:
    cpu = {"torch_version": "2.13.0+cpu", "requirements_hash": "0123456789abcdef"}
    cu = {"torch_version": "2.13.0+cu130", "requirements_hash": "0123456789abcdef"}
    assert environment_changes(cpu, cu) == [
        "build variant cpu → cu130: an environment change, not a regression"
    ]
    assert environment_changes(cpu, {**cpu, "torch_version": "2.13.0"}) == [
        "build variant cpu → none: an environment change, not a regression"
    ]
    moved = environment_changes(cpu, {**cpu, "requirements_hash": "fedcba9876543210"})
    assert moved == [
        "suite requirements 0123456789ab → fedcba987654: an environment change, not a regression"
    ]
    assert environment_changes(cpu, dict(cpu)) == []
    assert environment_changes(None, cu) == [] and environment_changes(cpu, None) == []


def test_pip_sources_enter_the_cache_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/cpu")
    cpu = pip_sources()
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/cu130")
    cu = pip_sources()
    assert cpu["PIP_FIND_LINKS"] == "/wheels/cpu" and cpu != cu
    parts: dict[str, Any] = {"index_url": None, "requirements": [], "python_version": "py"}
    assert environment_key("torch==2.13.0", pip_config=cpu, **parts) != environment_key(
        "torch==2.13.0", pip_config=cu, **parts
    )
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nextra-index-url = https://download.example/whl/cu130\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert "cu130" in pip_sources()[str(config)]


def test_install_report_without_hashes_reads_as_empty(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(
        '{"install": [{"metadata": {"name": "Torch", "version": "2.13.0+cpu"},'
        ' "download_info": {"url": "file:///w/t.whl",'
        ' "archive_info": {"hash": "sha256=abc"}}},'
        ' {"metadata": {"name": "x", "version": "1"}, "download_info": {}}]}'
    )
    assert read_install_report(report) == {
        "torch": {"version": "2.13.0+cpu", "url": "file:///w/t.whl", "sha256": "abc"},
        "x": {"version": "1", "url": "", "sha256": ""},
    }


# --- one spec, two variants: two environments, two series, a report that says so -----------


def _prepare(
    variant: str, dirs: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", f"{dirs[variant]} {dirs['shared']}")
    with use_environment(
        "torch==2.13.0", cache_dir=cache, budget_bytes=2**34, requirements=["nb-fake-suite-need"]
    ) as env:
        return env


def _record(environment: dict[str, Any], median: float) -> dict[str, Any]:
    return {
        "model": "dqn",
        "mode": "eval",
        "device": "cpu",
        "benchmark_version": "v1",
        "environment": {"cpu_model": "test-cpu", "threads": 1, **environment},
        "metrics": [
            {
                "metric": "latency",
                "unit": "ms",
                "samples": [median] * 5,
                "median": median,
                "iqr": 0.0,
            }
        ],
    }


def test_one_spec_two_variants_gives_two_environments_and_series(
    wheel_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    session: Session,
) -> None:
    cpu = _prepare("cpu", wheel_dirs, tmp_path / "envs", monkeypatch)
    cu = _prepare("cu130", wheel_dirs, tmp_path / "envs", monkeypatch)
    assert cpu.key != cu.key and cpu.path != cu.path and cu.created
    assert (cpu.identity.torch_version, cu.identity.torch_version) == ("2.13.0+cpu", "2.13.0+cu130")
    assert cpu.build is not None and cu.build is not None
    assert (cpu.build.torch_variant, cu.build.torch_variant) == ("cpu", "cu130")
    # The exact wheel: where it came from and its sha256.
    wheel = next(wheel_dirs["cu130"].glob("*.whl"))
    assert cu.build.source.startswith("file://") and unquote(cu.build.source).endswith(wheel.name)
    assert cu.build.digest_of == "wheel"
    assert cu.build.torch_sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # The frozen requirements, in the cache entry; the suite's are the same on both sides.
    assert cu.path is not None
    lock = (cu.path / LOCK_FILE).read_text().splitlines()
    assert lock == ["nb-fake-suite-need==1.0", "torch==2.13.0+cu130"]
    assert cu.build.requirements == tuple(lock)
    assert cpu.build.requirements_hash == cu.build.requirements_hash
    # The same spec and configuration again: the cached entry, not a new build.
    again = _prepare("cu130", wheel_dirs, tmp_path / "envs", monkeypatch)
    assert again.key == cu.key and not again.created and again.build == cu.build

    # Each night's records carry the build; the variant change starts another series.
    suite_env = {"torch_version": "2.13.0+cpu", "torch_git_version": GIT_VERSION}
    night1 = with_build(_record(suite_env, 10.0), cpu.build)
    night2 = with_build(_record({**suite_env, "torch_version": "2.13.0+cu130"}, 10.0), cu.build)
    assert night2["environment"]["torch_variant"] == "cu130"
    assert night2["environment"]["requirements_hash"] == cu.build.requirements_hash
    [row1], [row2] = result_rows(night1, machine=None), result_rows(night2, machine=None)
    assert row1["series_key"] != row2["series_key"]

    spec = BenchmarkSpec(model="dqn", mode="eval")
    for day, record in ((1, night1), (2, night2)):
        run = runs.create_run(
            session, night=date(2026, 10, day), benchmarks=[spec], torch_spec="torch==2.13.0"
        )
        store_record(session, run=run, job=None, record=record)
    report = run_report(session, run_id=run.id, settings=get_settings())
    assert report["environment_changes"] == [
        "build variant cpu → cu130: an environment change, not a regression"
    ]
    assert [r["verdict"] for r in report["results"]] == ["no_baseline"]


def test_nightbench_report_prints_the_variant_change(database_url: str) -> None:
    spec = BenchmarkSpec(model="dqn", mode="eval")
    with session_scope() as session:
        for day, version in ((1, "2.13.0+cpu"), (2, "2.13.0+cu130")):
            run = runs.create_run(
                session, night=date(2026, 10, day), benchmarks=[spec], torch_spec="torch==2.13.0"
            )
            store_record(
                session,
                run=run,
                job=None,
                record=_record(
                    {
                        "torch_version": version,
                        "torch_variant": torch_variant(version),
                        "requirements_hash": "0" * 16,
                    },
                    10.0,
                ),
            )
        run_id = run.id
    out = CliRunner().invoke(app, ["report", "--run", str(run_id)])
    assert out.exit_code == 0, out.output
    assert "build variant cpu → cu130: an environment change, not a regression" in out.output
