"""``nightbench torchbench install``: the chosen models' requirements through the checkout's own
``install.py``, on the fixture checkout (whose ``install.py`` records what it was asked)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from suite import torchbench_install
from tests.suite.helpers import FIXTURES
from workers.cli import app

CHECKOUT = FIXTURES / "torchbench"


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "install-record.json"
    monkeypatch.setenv("NIGHTBENCH_FIXTURE_INSTALL_RECORD", str(path))
    monkeypatch.delenv("NIGHTBENCH_FIXTURE_INSTALL_EXIT", raising=False)
    monkeypatch.delenv("NIGHTBENCH_TORCHBENCH_PATH", raising=False)
    # The test environment has torch without torchvision and torchaudio: check what it has.
    monkeypatch.setattr(torchbench_install, "TORCH_DEPS", ("numpy", "torch"))
    return path


def _install(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["torchbench", "install", *args])
    return result.exit_code, " ".join(result.output.split())


def test_installs_the_chosen_models_and_names_those_still_unavailable(record: Path) -> None:
    code, output = _install(
        "--torchbench", str(CHECKOUT), "--models", "torchbench.tiny_mlp,torchbench.needs_*,resnet18"
    )
    assert code == 0, output
    asked = json.loads(record.read_text())
    assert asked["models"] == ["needs_tensorboardx", "tiny_mlp"]
    assert asked["continue_on_fail"] is True and asked["torch"] is False
    assert asked["extra"] == []
    assert Path(asked["cwd"]) == CHECKOUT.resolve()
    assert asked["python"] == sys.executable
    assert "resnet18: nothing to install" in output
    assert (
        "torchbench.needs_tensorboardx still unavailable: missing requirement(s): "
        "nightbench-fixture-tensorboardx-not-installed"
    ) in output
    assert "torchbench.tiny_mlp still unavailable" not in output
    assert "1 of 2 TorchBench model(s)" in output


def test_every_model_by_default_from_the_environment_variable(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(CHECKOUT))
    code, output = _install()
    assert code == 0, output
    asked = json.loads(record.read_text())
    assert asked["models"] == ["cpu_unsupported", "needs_tensorboardx", "staged_mlp", "tiny_mlp"]


def test_own_models_only_run_no_installer(record: Path) -> None:
    code, output = _install("--torchbench", str(CHECKOUT), "--models", "resnet18")
    assert code == 0, output
    assert not record.exists()


def _checkout_without_installer(tmp_path: Path) -> Path:
    root = tmp_path / "partial"
    shutil.copytree(CHECKOUT / "torchbenchmark", root / "torchbenchmark")
    return root


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--models", "torchbench.tiny_mlp"], "no TorchBench checkout"),
        (
            ["--torchbench", "{tmp}", "--models", "torchbench.tiny_mlp"],
            "{tmp} is not a pytorch/benchmark checkout",
        ),
        (["--torchbench", "{partial}"], "{partial} has no install.py at its root"),
        (
            [
                "--torchbench",
                str(CHECKOUT),
                "--models",
                "torchbench.tiny_mlp,torchbench.nope*,nope",
            ],
            "unknown model(s): torchbench.nope*, nope",
        ),
    ],
)
def test_bad_input_is_named_exits_2_and_installs_nothing(
    record: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    partial = _checkout_without_installer(tmp_path)
    fill = {"tmp": str(tmp_path), "partial": str(partial)}
    code, output = _install(*[a.format(**fill) for a in args])
    assert code == 2, output
    # rich folds a long path across lines: compare without whitespace
    assert "".join(message.format(**fill).split()) in "".join(output.split()), output
    assert not record.exists()


def test_a_failing_installer_exits_1_naming_its_code(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTBENCH_FIXTURE_INSTALL_EXIT", "3")
    code, output = _install("--torchbench", str(CHECKOUT), "--models", "torchbench.tiny_mlp")
    assert code == 1
    assert "install.py exited with code 3" in output
    assert json.loads(record.read_text())["models"] == ["tiny_mlp"]


def test_missing_torch_builds_are_named_before_the_installer_runs(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        torchbench_install,
        "TORCH_DEPS",
        ("numpy", "torch", "nightbench-fixture-torchaudio-not-installed"),
    )
    code, output = _install("--torchbench", str(CHECKOUT), "--models", "torchbench.tiny_mlp")
    assert code == 2, output
    assert "nightbench-fixture-torchaudio-not-installed not installed here" in output
    assert "install the torchvision and torchaudio builds that match this torch" in output
    assert not record.exists()
