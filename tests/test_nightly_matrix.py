"""The matrix workflow's shard steps as a runner runs them (bash -e -o pipefail), with the
build's python, nightbench and curl replaced by scripts: the shard's share comes from the plan's
catalogue, its TorchBench models go through ``nightbench torchbench install`` (exit 1 goes on,
2 stops), and what the runner cannot run is withdrawn with its reason through
``POST /api/runs/{id}/skipped`` (a body the API takes) instead of measured into error records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from service.runs.schemas import SkipIn

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-matrix.yml"
SETUP_FAILED = "TorchBench's setup FAILED here: \x1b[31mRuntimeError\x1b[0m: download failed\n"
NO_DETECTRON = "No module named 'detectron2' (missing framework library)"
TRAIN_CPU = "TorchBench's metadata.yaml marks train on cpu as not_implemented"

# The plan's catalogue as its job output passes it: every model, in the listing's order.
CATALOG = [
    {"name": "torchbench.alexnet", "modes": ["train", "eval"], "devices": ["cpu", "cuda"]},
    {"name": "dcgan", "modes": ["train", "eval"], "devices": ["cpu"]},  # shard 1
    {"name": "torchbench.detectron2_maskrcnn", "modes": ["train", "eval"], "devices": ["cpu"]},
    {"name": "torchbench.hf_Bert", "modes": ["train", "eval"], "devices": ["cpu"]},  # shard 1
    {"name": "resnet18", "modes": ["train", "eval"], "devices": ["cpu"]},
    {"name": "gpt2", "modes": ["eval"], "devices": ["cpu"]},  # shard 1
    {"name": "torchbench.cuda_only", "modes": ["train", "eval"], "devices": ["cuda"]},
    {"name": "bert", "modes": ["eval"], "devices": ["cpu"]},  # shard 1
    {"name": "torchbench.unlisted", "modes": ["eval"], "devices": ["cpu"]},
    {"name": "llama", "modes": ["eval"], "devices": ["cpu"]},  # shard 1
    {"name": "torchbench.setup_failed", "modes": ["eval"], "devices": ["cpu"]},
]
# What `python -m suite list --json --check-imports` says on this runner after the install.
RUNNABLE = [
    {
        "name": "torchbench.alexnet",
        "modes": ["train", "eval"],
        "devices": ["cpu", "cuda"],
        "available": True,
        "reason": None,
        "not_implemented": ["train:cpu"],
        "not_offered": {"train:cpu": TRAIN_CPU},
    },
    {"name": "dcgan", "modes": ["train", "eval"], "devices": ["cpu"], "available": True},
    {
        "name": "torchbench.detectron2_maskrcnn",
        "modes": ["train", "eval"],
        "devices": ["cpu"],
        "available": False,
        "reason": NO_DETECTRON,
        "not_implemented": [],
        "not_offered": {},
    },
    {"name": "resnet18", "modes": ["train", "eval"], "devices": ["cpu"], "available": True},
    {
        "name": "torchbench.setup_failed",
        "modes": ["eval"],
        "devices": ["cpu"],
        "available": False,
        "reason": SETUP_FAILED,
    },
]

FAKE_PYTHON = """\
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["python", *sys.argv[1:]]) + "\\n")
args = sys.argv[1:]
if args[:3] == ["-m", "suite", "list"]:
    sys.stdout.write(open(os.environ["FAKE_RUNNABLE"]).read())
elif args[:3] == ["-m", "suite", "run"]:
    opt = dict(zip(args[3::2], args[4::2]))
    record = {"model": opt["--model"], "mode": opt["--mode"], "device": opt["--device"],
              "metrics": [], "error": "boom"}
    open(opt["--out"], "w").write(json.dumps(record))
    sys.exit(1)
"""

FAKE_CURL = """\
import json, os, sys
args = sys.argv[1:]
takes_value = {"-H", "-o", "-w", "--data", "--data-binary", "--retry", "--retry-delay"}
opts, url, i = {}, None, 0
while i < len(args):
    if args[i] in takes_value:
        opts.setdefault(args[i], []).append(args[i + 1])
        i += 2
        continue
    if args[i].startswith("http"):
        url = args[i]
    opts.setdefault(args[i], []).append(None)
    i += 1
data = opts["--data-binary"][0]
body = sys.stdin.read() if data == "@-" else open(data[1:]).read()
endpoint = url.rsplit("/", 1)[1]
status = int(os.environ.get("FAKE_STATUS_" + endpoint.upper(), "200"))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["curl", url, json.loads(body), sorted(opts)]) + "\\n")
answer = json.dumps({"skipped": 0} if status == 200 else {"detail": "refused"})
if "-o" in opts:
    open(opts["-o"][0], "w").write(answer)
else:
    sys.stdout.write(answer)
if "-w" in opts:
    sys.stdout.write(opts["-w"][0].replace("%{http_code}", str(status)))
sys.exit(22 if status >= 400 and "--fail-with-body" in opts else 0)
"""

FAKE_NIGHTBENCH = """\
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["nightbench", *sys.argv[1:]]) + "\\n")
sys.exit(int(os.environ.get("FAKE_RC_NIGHTBENCH", "0")))
"""


def _steps() -> dict[str, dict]:
    data = yaml.safe_load(WORKFLOW.read_text())
    return {step.get("name", ""): step for step in data["jobs"]["shard"]["steps"]}


class Runner:
    """A shard job's workspace and environment, its commands replaced by logging scripts."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.root = tmp_path
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, source in (
            ("python-build", FAKE_PYTHON),
            ("curl", FAKE_CURL),
            ("nightbench", FAKE_NIGHTBENCH),
        ):
            script = bin_dir / name
            script.write_text(f"#!{sys.executable}\n{source}")
            script.chmod(0o755)
        (tmp_path / "temp").mkdir()
        (tmp_path / "work").mkdir()
        (tmp_path / "runnable.json").write_text(json.dumps(RUNNABLE))
        self.log = tmp_path / "calls.log"
        self.files = {
            name: tmp_path / name for name in ("github_env", "github_path", "summary", "output")
        }
        for path in self.files.values():
            path.write_text("")
        self.env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "RUNNER_TEMP": str(tmp_path / "temp"),
            "GITHUB_ENV": str(self.files["github_env"]),
            "GITHUB_PATH": str(self.files["github_path"]),
            "GITHUB_STEP_SUMMARY": str(self.files["summary"]),
            "GITHUB_OUTPUT": str(self.files["output"]),
            "BUILD_PYTHON": str(bin_dir / "python-build"),
            "RUN_ID": "41",
            "DEVICE_CLASS": "cpu",
            "DEVICE": "cpu",
            "SHARD": "0",
            "SHARDS": "[0, 1]",
            "SUITE": "all",
            "CATALOG": json.dumps(CATALOG),
            "TORCH_NIGHTLY_INDEX": "https://download.pytorch.org/whl/nightly/cpu",
            "NIGHTBENCH_API_URL": "https://nightbench.test",
            "NIGHTBENCH_API_TOKEN": "nb_secret",
            "FAKE_LOG": str(self.log),
            "FAKE_RUNNABLE": str(tmp_path / "runnable.json"),
            **env,
        }

    def run(self, step: str, **env: str) -> subprocess.CompletedProcess:
        """Run the shard step named ``step``; what it wrote to ``$GITHUB_ENV`` is kept."""
        script = _steps()[step]["run"]
        for line in self.files["github_env"].read_text().splitlines():
            key, value = line.split("=", 1)
            self.env[key] = value
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            cwd=self.root / "work",
            timeout=120,
        )

    def calls(self, command: str) -> list[list[Any]]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c[1:] for c in calls if c[0] == command]


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    runner = Runner(tmp_path)
    proc = runner.run("This shard's share of the run")
    assert proc.returncode == 0, proc.stderr
    return runner


def test_the_share_is_the_plan_s_catalogue_split_by_shard(runner: Runner) -> None:
    share = json.loads(Path(runner.env["RUNNER_TEMP"], "share.json").read_text())
    # Every other model from the first, the modes the run expects of it on cpu; a cuda-only
    # model is not in a cpu run.
    assert [f"{b['model']}:{b['mode']}" for b in share] == [
        "torchbench.alexnet:train",
        "torchbench.alexnet:eval",
        "torchbench.detectron2_maskrcnn:train",
        "torchbench.detectron2_maskrcnn:eval",
        "resnet18:train",
        "resnet18:eval",
        "torchbench.unlisted:eval",
        "torchbench.setup_failed:eval",
    ]
    proc = runner.run("This shard's share of the run", CATALOG="")
    assert proc.returncode == 1 and "no catalogue" in proc.stdout


@pytest.mark.parametrize(("install_rc", "step_rc"), [(0, 0), (1, 0), (2, 2), (3, 3)])
def test_the_shard_installs_its_torchbench_models_and_stops_only_on_a_refusal(
    runner: Runner, install_rc: int, step_rc: int
) -> None:
    proc = runner.run("Install this shard's TorchBench models", FAKE_RC_NIGHTBENCH=str(install_rc))
    assert proc.returncode == step_rc, proc.stdout + proc.stderr
    assert ("::warning::" in proc.stdout) == (install_rc == 1)
    assert runner.calls("nightbench") == [
        [
            "torchbench",
            "install",
            "--torchbench",
            "benchmark",
            "--python",
            runner.env["BUILD_PYTHON"],
            "--torch-index",
            "https://download.pytorch.org/whl/nightly/cpu",
            "--models",
            "torchbench.alexnet,torchbench.detectron2_maskrcnn,torchbench.setup_failed,"
            "torchbench.unlisted",
        ]
    ]


def test_a_shard_without_torchbench_models_installs_none(tmp_path: Path) -> None:
    runner = Runner(tmp_path, CATALOG=json.dumps(CATALOG[1:2]))
    assert runner.run("This shard's share of the run").returncode == 0
    proc = runner.run("Install this shard's TorchBench models")
    assert proc.returncode == 0 and runner.calls("nightbench") == []


def test_the_shard_withdraws_what_it_cannot_run_and_measures_the_rest(runner: Runner) -> None:
    proc = runner.run("Measure this shard and post its results")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python = runner.calls("python")
    assert python[0] == ["-m", "suite", "list", "--json", "--suite", "all", "--check-imports"]
    measured = [(c[4], c[6], c[8]) for c in python[1:]]
    # Offered and available here; a model the runner's listing does not name is measured (its
    # error record says why).
    assert measured == [
        ("torchbench.alexnet", "eval", "cpu"),
        ("resnet18", "train", "cpu"),
        ("resnet18", "eval", "cpu"),
        ("torchbench.unlisted", "eval", "cpu"),
    ]
    curls = runner.calls("curl")
    skipped = [c for c in curls if c[0].endswith("/skipped")]
    posted = [c for c in curls if c[0].endswith("/results")]
    # Withdrawn first, in one request, with each benchmark's reason.
    assert curls[0] == skipped[0] and len(skipped) == 1
    url, body, flags = skipped[0]
    assert url == "https://nightbench.test/api/runs/41/skipped"
    assert {"--fail-with-body", "--retry", "--retry-all-errors", "--retry-delay"} <= set(flags)
    assert body == [
        {
            "model": "torchbench.alexnet",
            "mode": "train",
            "device": "cpu",
            "reason": f"not offered: {TRAIN_CPU}",
        },
        {
            "model": "torchbench.detectron2_maskrcnn",
            "mode": "train",
            "device": "cpu",
            "reason": NO_DETECTRON,
        },
        {
            "model": "torchbench.detectron2_maskrcnn",
            "mode": "eval",
            "device": "cpu",
            "reason": NO_DETECTRON,
        },
        {
            "model": "torchbench.setup_failed",
            "mode": "eval",
            "device": "cpu",
            # Control characters (a terminal's colours) become spaces: the API stores text.
            "reason": "TorchBench's setup FAILED here:  [31mRuntimeError [0m: download failed",
        },
    ]
    TypeAdapter(list[SkipIn]).validate_python(body)  # what the API takes
    assert [(c[1][0]["model"], c[1][0]["mode"]) for c in posted] == [m[:2] for m in measured]
    summary = runner.files["summary"].read_text()
    assert "4 measured, 4 failed, 0 not posted, 4 skipped" in summary


@pytest.mark.parametrize(
    ("status", "step_rc", "annotation"), [(409, 0, "::warning::"), (503, 1, "::error::")]
)
def test_a_refused_withdrawal_is_told_and_the_records_still_posted(
    runner: Runner, status: int, step_rc: int, annotation: str
) -> None:
    """409: the run holds a result for one of them (a re-run), a warning; any other failure
    fails the step at its end, after every record was posted."""
    proc = runner.run("Measure this shard and post its results", FAKE_STATUS_SKIPPED=str(status))
    assert proc.returncode == step_rc, proc.stdout + proc.stderr
    assert annotation in proc.stdout and "refused" in proc.stdout
    assert len([c for c in runner.calls("curl") if c[0].endswith("/results")]) == 4


def test_the_plan_passes_its_catalogue_to_the_shards() -> None:
    data = yaml.safe_load(WORKFLOW.read_text())
    plan, shard = data["jobs"]["plan"], data["jobs"]["shard"]
    assert plan["outputs"]["catalog"] == "${{ steps.catalog.outputs.catalog }}"
    listing = next(step for step in plan["steps"] if step.get("id") == "catalog")
    assert 'suite list --json --suite "$SUITE" > "$RUNNER_TEMP/catalog.json"' in listing["run"]
    assert "[.[] | {name, modes, devices}]" in listing["run"]
    assert shard["env"]["CATALOG"] == "${{ needs.plan.outputs.catalog }}"
    steps = list(_steps())
    assert steps.index("Install nightbench") < steps.index("Install this shard's TorchBench models")
    assert steps.index("Install this shard's TorchBench models") < steps.index(
        "Measure this shard and post its results"
    )
    install = _steps()["Install nightbench"]["run"]
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in install
    assert "python -m pip install ." in install
