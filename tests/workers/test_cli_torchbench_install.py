"""``nightbench torchbench install``: the chosen models' requirements through the checkout's own
``install.py``, on the fixture checkout (whose ``install.py`` records what it was asked)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from suite import torchbench_install
from tests.suite.helpers import FIXTURES, run_suite
from tests.suite.test_suite_torchbench import PLANTED_FILES
from workers.cli import app

CHECKOUT = FIXTURES / "torchbench"


FAKE_LIBRARY = "# a stand-in: the test environment has torch without torchvision/torchaudio\n"
BROKEN_TORCHVISION = 'raise RuntimeError("operator torchvision::nms does not exist")\n'
FAILING_SETUP = (
    "import sys\n\nprint('Collecting nightbench-fixture-nope')\n"
    "print('ERROR: Could not find a version that satisfies the requirement "
    "nightbench-fixture-nope (from versions: none)')\n"
    "print('ERROR: No matching distribution found for nightbench-fixture-nope')\n"
    "sys.exit(1)\n"
)


def _site(tmp_path: Path, **libraries: str) -> Path:
    site = tmp_path / "site"
    for name, source in libraries.items():
        (site / name).mkdir(parents=True, exist_ok=True)
        (site / name / "__init__.py").write_text(source)
    return site


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "install-record.json"
    monkeypatch.setenv("NIGHTBENCH_FIXTURE_INSTALL_RECORD", str(path))
    monkeypatch.delenv("NIGHTBENCH_FIXTURE_INSTALL_EXIT", raising=False)
    monkeypatch.delenv("NIGHTBENCH_TORCHBENCH_PATH", raising=False)
    monkeypatch.delenv("NIGHTBENCH_TORCH_INDEX_URL", raising=False)
    # pip, where a test makes it run, finds nothing and installs nothing: no index, no links.
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_DRY_RUN", "1")
    site = _site(tmp_path, torchvision=FAKE_LIBRARY, torchaudio=FAKE_LIBRARY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return path


def _checkout(tmp_path: Path) -> Path:
    """A copy of the fixture checkout with a model whose setup fails as pip fails."""
    copy = tmp_path / "benchmark"
    shutil.copytree(CHECKOUT, copy)
    folder = copy / "torchbenchmark" / "models" / "broken_setup"
    folder.mkdir()
    (folder / "__init__.py").write_text("from ..tiny_mlp import Model  # noqa: F401\n")
    (folder / "install.py").write_text(FAILING_SETUP)
    return copy


def _install(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["torchbench", "install", *args])
    return result.exit_code, " ".join(result.output.split())


def test_names_failed_setups_and_models_that_do_not_import_and_exits_1(
    record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NIGHTBENCH_TORCHBENCH_PATH", raising=False)
    copy = _checkout(tmp_path)
    code, output = _install(
        "--torchbench",
        str(copy),
        "--models",
        "torchbench.tiny_mlp,torchbench.needs_*,torchbench.broken_*,resnet18",
    )
    assert code == 1, output
    # --torchbench is the command's own: the environment of its caller is not written.
    assert "NIGHTBENCH_TORCHBENCH_PATH" not in os.environ
    asked = json.loads(record.read_text())
    assert asked["models"] == ["broken_setup", "needs_tensorboardx", "tiny_mlp"]
    assert asked["continue_on_fail"] is True and asked["torch"] is False
    assert asked["extra"] == []
    assert Path(asked["cwd"]) == copy.resolve()
    assert asked["python"] == sys.executable
    assert "resnet18: nothing to install" in output
    # TorchBench's own verdict, with its last error line, and the import check after it.
    assert (
        "torchbench.broken_setup: setup FAILED: ERROR: No matching distribution found for "
        "nightbench-fixture-nope"
    ) in output
    assert (
        "torchbench.needs_tensorboardx does not import: missing module "
        "nightbench_fixture_tensorboardx_not_installed"
    ) in output
    assert "torchbench.tiny_mlp does not import" not in output
    assert (
        "2 of 3 TorchBench model(s) import after install; 1 setup(s) FAILED, 1 do not import"
        in (output)
    )
    # The listing in that environment: a model whose setup FAILED is not available.
    listing = run_suite(
        ["list", "--json", "--suite", "torchbench"], NIGHTBENCH_TORCHBENCH_PATH=str(copy)
    )
    entries = {e["name"]: e for e in json.loads(listing.stdout)}
    assert entries["torchbench.tiny_mlp"]["available"], json.dumps(entries["torchbench.tiny_mlp"])
    assert entries["torchbench.broken_setup"]["reason"] == (
        "TorchBench's setup FAILED here: ERROR: No matching distribution found for "
        "nightbench-fixture-nope"
    )
    # The models installed with everything installed before them held where it was.
    held = Path(asked["pip_constraint"].split()[-1])
    assert held.name == "nightbench-constraints.txt"
    assert f"torch=={importlib.metadata.version('torch')}" in held.read_text().splitlines()


def test_every_model_by_default_and_exit_0_when_all_import(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", str(CHECKOUT))
    code, output = _install()
    asked = json.loads(record.read_text())
    assert asked["models"] == ["cpu_unsupported", "needs_tensorboardx", "staged_mlp", "tiny_mlp"]
    assert code == 1 and "1 do not import" in output  # needs_tensorboardx
    code, output = _install("--models", "torchbench.tiny_mlp,torchbench.staged_mlp")
    assert code == 0, output
    assert "2 of 2 TorchBench model(s) import after install; 0 setup(s) FAILED" in output


def test_a_torchvision_of_another_torch_is_named_and_fails_the_install(
    record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _site(tmp_path / "broken", torchvision=BROKEN_TORCHVISION, torchaudio=FAKE_LIBRARY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    code, output = _install(
        "--torchbench",
        str(CHECKOUT),
        "--models",
        "torchbench.tiny_mlp",
        "--torch-index",
        "https://example.invalid/whl/cpu",
    )
    assert code == 1, output
    assert (
        "torchvision does not import: RuntimeError: operator torchvision::nms does not exist "
        "(not a build of torch"
    ) in output
    assert "triedhttps://example.invalid/whl/cpu" in "".join(output.split())
    assert "torchvision torchaudio torch==" in output  # it tried to install the right build


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
    record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _site(tmp_path / "partial", torchvision=FAKE_LIBRARY)
    monkeypatch.setenv("PYTHONPATH", str(site))
    code, output = _install("--torchbench", str(CHECKOUT), "--models", "torchbench.tiny_mlp")
    assert code == 2, output
    assert "torchaudio not installed for torch" in output
    assert "triedhttps://download.pytorch.org/whl/cpu" in "".join(output.split())
    assert not record.exists()


@pytest.mark.parametrize(
    ("version", "configured", "index"),
    [
        ("2.13.0+cpu", None, "https://download.pytorch.org/whl/cpu"),
        ("2.13.0+cu130", None, "https://download.pytorch.org/whl/cu130"),
        ("2.13.0+rocm6.4", None, "https://download.pytorch.org/whl/rocm6.4"),
        ("2.13.0", None, None),
        ("2.13.0+cpu", "https://mirror.example/whl/cpu", "https://mirror.example/whl/cpu"),
    ],
)
def test_the_torch_index_follows_the_variant(
    version: str, configured: str | None, index: str | None
) -> None:
    assert torchbench_install.torch_index(version, configured) == index


def test_torchbench_s_installer_output_is_read_per_model() -> None:
    # As torchbenchmark.setup prints it (pytorch/benchmark 0e83c440), abridged.
    text = """checking packages numpy, torch, torchvision, torchaudio are installed...OK
running setup for /b/torchbenchmark/models/BERT_pytorch...OK
running setup for /b/torchbenchmark/models/Background_Matting...FAIL
running setup for /b/torchbenchmark/models/basic_gnn_gcn...FAIL
running setup for /b/torchbenchmark/models/alexnet...SKIP - No install.py is found
Warning: some benchmarks were not installed due to failure
Error for /b/torchbenchmark/models/Background_Matting:
---------------------------------------------------------------------------
Collecting tensorboardX
ERROR: Could not find a version that satisfies the requirement tensorboardX (from versions: none)
ERROR: No matching distribution found for tensorboardX
Traceback (most recent call last):
subprocess.CalledProcessError: Command '['pip', 'install']' returned non-zero exit status 1.

---------------------------------------------------------------------------

Error for /b/torchbenchmark/models/basic_gnn_gcn:
---------------------------------------------------------------------------
Building wheel for torch_scatter
...
  note: This error originates from a subprocess, and is likely not a problem with pip.
  ERROR: Failed building wheel for torch_scatter

---------------------------------------------------------------------------
"""
    found = torchbench_install.parse_setup_output(text)
    assert {n: o.status for n, o in found.items()} == {
        "BERT_pytorch": "OK",
        "Background_Matting": "FAIL",
        "basic_gnn_gcn": "FAIL",
        "alexnet": "SKIP",
    }
    assert found["Background_Matting"].error == (
        "subprocess.CalledProcessError: Command '['pip', 'install']' returned non-zero exit "
        "status 1."
    )
    assert found["basic_gnn_gcn"].error == "ERROR: Failed building wheel for torch_scatter"
    assert found["BERT_pytorch"].error is None


def test_check_prints_the_matrix_with_each_cause(record: Path, tmp_path: Path) -> None:
    copy = _checkout(tmp_path)
    (copy / "torchbenchmark" / "models" / "eval_only").mkdir()
    (copy / "torchbenchmark" / "models" / "eval_only" / "__init__.py").write_text(
        PLANTED_FILES["models/eval_only/__init__.py"]
    )
    result = CliRunner().invoke(
        app,
        [
            "torchbench",
            "check",
            "--torchbench",
            str(copy),
            "--models",
            "torchbench.cpu_unsupported,torchbench.needs_*,torchbench.eval_only,"
            "torchbench.tiny_mlp",
            "--run",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = {r["model"].removeprefix("torchbench."): r for r in doc["models"]}
    assert rows["needs_tensorboardx"]["installed"].startswith("missing requirement(s)")
    assert rows["needs_tensorboardx"]["importable"] == "-"
    assert rows["cpu_unsupported"]["eval"].startswith(
        "not offered: TorchBench's metadata.yaml marks eval on cpu"
    )
    # The one model run (--run 1) is the first that offers a test here.
    assert rows["eval_only"] == {
        "model": "torchbench.eval_only",
        "installed": "yes",
        "importable": "yes",
        "eval": "ok",
        "train": "not offered: TorchBench gives no train batch size on cpu "
        "(DEFAULT_TRAIN_BSIZE unset)",
    }
    assert rows["tiny_mlp"]["eval"] == rows["tiny_mlp"]["train"] == "not run"
    assert doc["counts"] == {
        "listed": 4,
        "installed": 3,
        "importable": 3,
        "eval_offered": 2,
        "eval_run": 1,
        "eval_ok": 1,
        "train_offered": 1,
        "train_run": 0,
        "train_ok": 0,
    }


def test_a_matrix_row_tells_imported_but_nothing_offered_from_not_importable() -> None:
    from workers.cli.torchbench import matrix_row

    whisper = {
        "name": "torchbench.hf_Whisper",
        "available": False,
        "reason": "TorchBench offers no test: train:cpu: marked; eval:cpu: marked",
        "modes": [],
        "devices": [],
        "not_offered": {"train:cpu": "marked", "eval:cpu": "marked"},
    }
    row = matrix_row(whisper, {}, "cpu")
    assert (row["importable"], row["eval"], row["train"]) == (
        "yes",
        "not offered: marked",
        "not offered: marked",
    )
    broken = {**whisper, "reason": "broken torchvision: RuntimeError: ...", "not_offered": {}}
    assert matrix_row(broken, {}, "cpu")["importable"] == "broken torchvision: RuntimeError: ..."
    assert matrix_row(broken, {}, "cpu")["eval"] == "-"


def test_a_matrix_row_of_a_model_whose_setup_failed_here() -> None:
    from workers.cli.torchbench import matrix_row

    entry = {
        "name": "torchbench.hf_Bert",
        "available": False,
        "reason": "TorchBench's setup FAILED here: OSError: We couldn't connect",
        "modes": ["train", "eval"],
        "devices": ["cpu"],
        "not_offered": {},
    }
    row = matrix_row(entry, {}, "cpu")
    assert row["importable"] == "yes"
    assert (
        row["eval"] == "unavailable: TorchBench's setup FAILED here: OSError: We couldn't connect"
    )


def test_a_matrix_row_of_a_model_that_imports_but_needs_its_config_downloaded() -> None:
    from workers.cli.torchbench import matrix_row

    reason = (
        "needs huggingface.co: the config of 't5-small' is not in the local HuggingFace cache "
        "(TorchBench downloads it when the model is built; ...)"
    )
    entry = {
        "name": "torchbench.hf_T5_generate",
        "available": False,
        "reason": reason,
        "modes": ["eval"],
        "devices": ["cpu"],
        "not_offered": {},
    }
    row = matrix_row(entry, {}, "cpu")
    assert row["importable"] == "yes"
    assert row["eval"] == f"unavailable: {reason}" and row["train"] == f"unavailable: {reason}"
