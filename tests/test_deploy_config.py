"""Deployment files: actionlint on every workflow, `docker compose config`, and the house rules
(pinned actions, least privilege, no default secrets) that neither tool checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
_BIN_DIRS = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _actionlint() -> str:
    exe = shutil.which("actionlint", path=_BIN_DIRS)
    if exe is None:
        pytest.skip("actionlint is not installed (the dev extra brings it: pip install -e .[dev])")
    return exe


def _compose() -> list[str]:
    """`docker compose` where the plugin works, else the standalone `docker-compose` v2 binary."""
    docker = shutil.which("docker", path=_BIN_DIRS)
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    standalone = shutil.which("docker-compose", path=_BIN_DIRS)
    if standalone is not None:
        return [standalone]
    pytest.skip("neither `docker compose` nor docker-compose is installed (dev extra)")


def _compose_run(
    *args: str, password: str | None = "placeholder", **extra: str
) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "POSTGRES_PASSWORD" and not k.startswith("NIGHTBENCH_TORCHBENCH_")
    }
    if password is not None:
        env["POSTGRES_PASSWORD"] = password
    env.update(extra)
    return subprocess.run(
        [
            *_compose(),
            "--project-directory",
            str(ROOT),
            "-f",
            str(ROOT / "docker-compose.yml"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def _workflow(name: str) -> dict:
    data = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    # YAML 1.1 reads the bare key `on` as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


# --- workflows ---------------------------------------------------------------------------------


def test_expected_workflows_exist() -> None:
    names = {path.name for path in WORKFLOWS}
    assert {"nightly.yml", "ci.yml", "bisect.yml", "nightly-matrix.yml", "ab.yml"} <= names


def test_actionlint_passes_on_every_workflow() -> None:
    proc = subprocess.run(
        [_actionlint(), "-no-color", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_does_catch_a_broken_workflow(tmp_path: Path) -> None:
    """The check above means something: the same call fails on a workflow with real mistakes."""
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.event.pull_request.titel }}\n"
        "        timeout-minutes: ten\n"
    )
    proc = subprocess.run(
        [_actionlint(), "-no-color", str(broken)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 1
    assert "timeout-minutes" in proc.stdout


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_to_full_commit_shas(path: Path) -> None:
    uses = re.findall(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", path.read_text(), flags=re.M)
    for action, comment in uses:
        if action.startswith("./"):
            continue
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action), f"{path.name}: {action}"
        assert re.search(r"#\s*v\d", comment), f"{path.name}: {action} needs a # vX.Y.Z comment"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_ask_for_least_privilege(path: Path) -> None:
    data = _workflow(path.name)
    assert data.get("permissions") == {"contents": "read"}, path.name
    for name, job in data["jobs"].items():
        granted = job.get("permissions", {})
        assert all(level != "write" for level in granted.values()), f"{path.name}:{name}"


def test_nightly_dispatches_on_a_schedule_and_by_hand() -> None:
    data = _workflow("nightly.yml")
    assert data["on"]["schedule"][0]["cron"]
    inputs = data["on"]["workflow_dispatch"]["inputs"]
    assert {"date", "torch", "models", "device_classes", "suite"} <= set(inputs)
    assert inputs["suite"]["options"] == ["own", "torchbench", "all"]
    assert data["concurrency"]["cancel-in-progress"] is False
    steps = data["jobs"]["dispatch"]["steps"]
    dispatch = next(step for step in steps if step.get("name") == "Dispatch the night")
    assert dispatch["env"]["NIGHTBENCH_DATABASE_URL"] == "${{ secrets.NIGHTBENCH_DATABASE_URL }}"
    assert dispatch["env"]["NIGHTBENCH_BROKER_URL"] == "${{ secrets.NIGHTBENCH_BROKER_URL }}"
    assert 'nightbench "${args[@]}"' in dispatch["run"]
    assert "sed 's/^warning: /::warning::/'" in dispatch["run"]  # unheard queues annotated
    assert '(dispatch --date "$NIGHT" --torch "$TORCH_SPEC" --suite "$SUITE")' in dispatch["run"]
    assert "args+=(--torchbench benchmark)" in dispatch["run"]
    checkout = next(
        step for step in steps if step.get("with", {}).get("repository") == "pytorch/benchmark"
    )
    assert checkout["with"]["ref"] == "${{ vars.NIGHTBENCH_TORCHBENCH_COMMIT || 'main' }}"
    assert checkout["with"]["path"] == "benchmark"
    install = next(step for step in steps if "torchbench install" in step.get("run", ""))
    assert steps.index(checkout) < steps.index(install) < steps.index(dispatch)
    assert install["if"] == checkout["if"]
    assert "(torchbench install --torchbench benchmark" in install["run"]
    assert 'args+=(--models "$MODELS")' in install["run"]
    assert install["env"]["MODELS"] == "${{ inputs.models }}"
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") for step in steps)


def test_ci_runs_the_linters_and_the_tests_on_real_services() -> None:
    data = _workflow("ci.yml")
    lint_runs = " ".join(step.get("run", "") for step in data["jobs"]["lint"]["steps"])
    for tool in ("ruff check", "mypy", "lint-imports", "actionlint", "docker compose config -q"):
        assert tool in lint_runs, tool
    test_job = data["jobs"]["test"]
    assert {"postgres", "redis"} <= set(test_job["services"])
    assert any(step.get("run") == "make test" for step in test_job["steps"])


def test_bisect_runs_on_a_self_hosted_gpu_runner() -> None:
    data = _workflow("bisect.yml")
    assert {"repo", "good", "bad", "benchmark", "install"} <= set(
        data["on"]["workflow_dispatch"]["inputs"]
    )
    job = data["jobs"]["bisect"]
    assert "self-hosted" in job["runs-on"]
    assert any("(bisect --repo" in step.get("run", "") for step in job["steps"])


def _ab_steps() -> list[dict]:
    return _workflow("ab.yml")["jobs"]["request"]["steps"]


def test_ab_is_asked_for_by_the_label_a_comment_or_by_hand() -> None:
    data = _workflow("ab.yml")
    assert data["on"]["pull_request_target"] == {"types": ["labeled"]}
    assert data["on"]["issue_comment"] == {"types": ["created"]}
    assert {"pr", "models", "modes", "device_class"} <= set(
        data["on"]["workflow_dispatch"]["inputs"]
    )
    assert "pull_request" not in data["on"]  # the PR's own workflow context: never wanted here
    job = data["jobs"]["request"]
    condition = " ".join(job["if"].split())
    assert "github.event.label.name == (vars.NIGHTBENCH_AB_LABEL || 'nightbench')" in condition
    assert "startsWith(github.event.comment.body, '/nightbench run')" in condition
    assert "github.event.issue.pull_request" in condition
    # A comment counts only from someone the repository trusts.
    assert '["OWNER", "MEMBER", "COLLABORATOR"]' in condition
    assert "github.event.comment.author_association" in condition
    assert job["concurrency"]["cancel-in-progress"] is False
    assert "github.event.pull_request.number" in job["concurrency"]["group"]
    assert "github.event.issue.number" in job["concurrency"]["group"]
    # The dispatch runner of the nightly: inside the network that reaches Postgres and Redis.
    assert job["runs-on"] == _workflow("nightly.yml")["jobs"]["dispatch"]["runs-on"]


def test_ab_never_checks_out_or_runs_the_pull_requests_code() -> None:
    text = (ROOT / ".github" / "workflows" / "ab.yml").read_text()
    for forbidden in (
        "github.event.pull_request.head",
        "github.head_ref",
        "refs/pull/",
        "github.event.pull_request.merge_commit_sha",
    ):
        assert forbidden not in text, forbidden
    checkouts = [s for s in _ab_steps() if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert len(checkouts) == 1
    (checkout,) = checkouts
    assert checkout["with"] == {
        "ref": "${{ github.event.repository.default_branch }}",
        "persist-credentials": False,
    }


def test_ab_passes_untrusted_text_through_env_only() -> None:
    steps = _ab_steps()
    for step in steps:
        # No expression inside a script: what a user wrote reaches it as an env variable.
        assert "${{" not in step.get("run", ""), step.get("name")
    parse = next(step for step in steps if step.get("id") == "request")
    assert parse["env"]["COMMENT_BODY"] == "${{ github.event.comment.body }}"
    assert "^[A-Za-z0-9_,.-]+$" in parse["run"]
    # The comment's words are split by `read`, never evaluated.
    assert 'read -r -a words <<< "$first_line"' in parse["run"]
    assert "eval " not in parse["run"]


def test_ab_comment_options_are_parsed_and_validated(tmp_path: Path) -> None:
    parse = next(step for step in _ab_steps() if step.get("id") == "request")
    marker = tmp_path / "pwned"

    def run(body: str) -> tuple[int, dict[str, str]]:
        output = tmp_path / "output"
        output.write_text("")
        env = {
            "PATH": os.environ["PATH"],
            "EVENT": "issue_comment",
            "PR_NUMBER": "42",
            "REQUESTED_BY": "octocat",
            "COMMENT_BODY": body,
            "INPUT_MODELS": "",
            "INPUT_MODES": "",
            "INPUT_DEVICE_CLASS": "",
            "GITHUB_OUTPUT": str(output),
        }
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", parse["run"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = output.read_text().splitlines()
        return proc.returncode, dict(line.split("=", 1) for line in lines)

    code, out = run("/nightbench run")
    assert code == 0
    assert out == {
        "pr": "42",
        "requested_by": "octocat",
        "models": "",
        "modes": "",
        "queue": "cpu",
        "device": "cpu",
    }
    code, out = run(
        "/nightbench run --models resnet18,bert --modes=train,eval --device-class a100\r\n"
        "and some words after"
    )
    assert code == 0
    assert (out["models"], out["modes"], out["queue"], out["device"]) == (
        "resnet18,bert",
        "train,eval",
        "gpu.a100",
        "cuda",
    )
    for body in (
        f"/nightbench run --models $(touch {marker})",
        f"/nightbench run --models a;touch${{IFS}}{marker}",
        "/nightbench run --models `id`",
        "/nightbench run --modes '*'",
        "/nightbench run --device-class ../cpu",
        "/nightbench run --frobnicate yes",
        "/nightbench running",
    ):
        code, out = run(body)
        assert code == 1 and out == {}, body
    assert not marker.exists()


def test_ab_sends_the_pr_and_the_requester_to_nightbench_ab() -> None:
    steps = _ab_steps()
    ask = next(step for step in steps if 'nightbench "${args[@]}"' in step.get("run", ""))
    assert '(ab --pr "$PR" --requested-by "$REQUESTED_BY" --queue "$QUEUE")' in ask["run"]
    env = ask["env"]
    for secret in ("NIGHTBENCH_DATABASE_URL", "NIGHTBENCH_BROKER_URL", "NIGHTBENCH_GITHUB_TOKEN"):
        assert env[secret] == f"${{{{ secrets.{secret} }}}}"
    assert env["NIGHTBENCH_GITHUB_REPOSITORY"] == "${{ github.repository }}"
    assert env["NIGHTBENCH_BISECT_PROVIDER"] == "${{ vars.NIGHTBENCH_BISECT_PROVIDER }}"
    parse = next(step for step in steps if step.get("id") == "request")
    # The label's adder or the commenter: nightbench checks their permission again.
    assert parse["env"]["REQUESTED_BY"] == (
        "${{ github.event.comment.user.login || github.event.sender.login }}"
    )
    assert steps.index(parse) < steps.index(ask)
    # The secrets only where nightbench runs, never beside the parsing of the comment.
    assert not any("secrets." in str(v) for v in parse["env"].values())


# --- docker compose ------------------------------------------------------------------------------


def test_compose_config_is_valid_with_and_without_the_gpu_profile() -> None:
    for args in (["config", "-q"], ["--profile", "gpu", "config", "-q"]):
        proc = _compose_run(*args)
        assert proc.returncode == 0, proc.stderr


def test_compose_has_no_default_secret() -> None:
    proc = _compose_run("config", "-q", password=None)
    assert proc.returncode != 0
    assert "POSTGRES_PASSWORD" in proc.stderr


def test_compose_services_are_wired_as_deployed() -> None:
    proc = _compose_run("--profile", "gpu", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    expected = {
        "postgres",
        "redis",
        "api",
        "worker-cpu",
        "worker-control",
        "worker-gpu",
        "beat",
        "flower",
    }
    assert expected <= set(services)

    for infra in ("postgres", "redis"):
        assert services[infra]["healthcheck"]["test"], infra
    api = " ".join(services["api"]["command"])
    assert api.index("nightbench db upgrade") < api.index("nightbench serve --host 0.0.0.0")
    assert services["worker-cpu"]["command"][-2:] == ["--queue", "cpu"]
    # Every queue the app routes to has a consumer.
    assert services["worker-control"]["command"][2:4] == ["--queue", "control"]

    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["command"][2:4] == ["--queue", "gpu.a100"] and "--gpu" in gpu["command"]
    assert "cu1" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    assert services["api"]["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")

    assert services["beat"]["command"][:4] == ["celery", "-A", "workers.app", "beat"]
    assert services["flower"]["command"][:4] == ["celery", "-A", "workers.app", "flower"]
    for name in ("api", "worker-cpu", "worker-control", "worker-gpu", "beat", "flower"):
        environment = services[name]["environment"]
        assert environment["NIGHTBENCH_BROKER_URL"].startswith("redis://redis:6379")
        assert environment["NIGHTBENCH_DATABASE_URL"].startswith("postgresql+psycopg://")
    # Without the gpu profile the GPU worker stays out.
    cpu_only = json.loads(_compose_run("config", "--format", "json").stdout)["services"]
    assert "worker-gpu" not in cpu_only


def test_compose_builds_a_pinned_torchbench_checkout_into_the_workers_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.config import Settings

    commit = "0e83c440a51cd63464fee34724d01b7c814ce39b"
    models = "torchbench.lennard_jones,torchbench.soft_actor_critic"
    pinned = json.loads(
        _compose_run(
            "--profile",
            "gpu",
            "config",
            "--format",
            "json",
            NIGHTBENCH_TORCHBENCH_COMMIT=commit,
            NIGHTBENCH_TORCHBENCH_MODELS=models,
        ).stdout
    )["services"]
    plain = json.loads(_compose_run("--profile", "gpu", "config", "--format", "json").stdout)[
        "services"
    ]
    for name in ("worker-cpu", "worker-gpu", "beat"):
        assert pinned[name]["environment"]["NIGHTBENCH_TORCHBENCH_PATH"] == "/opt/torchbench"
        assert pinned[name]["build"]["args"]["TORCHBENCH_COMMIT"] == commit
        assert pinned[name]["build"]["args"]["TORCHBENCH_MODELS"] == models
        assert plain[name]["environment"]["NIGHTBENCH_TORCHBENCH_PATH"] == ""
        assert plain[name]["build"]["args"]["TORCHBENCH_COMMIT"] == ""
    # The empty value compose passes without a checkout reads as unset.
    monkeypatch.setenv("NIGHTBENCH_TORCHBENCH_PATH", "")
    assert Settings().torchbench_path is None
    dockerfile = (ROOT / "Dockerfile").read_text()
    for needed in (
        "ARG TORCHBENCH_COMMIT",
        "https://github.com/pytorch/benchmark",
        "nightbench torchbench install --torchbench /opt/torchbench",
    ):
        assert needed in dockerfile, needed
    assert dockerfile.index("nightbench torchbench install") < dockerfile.index("USER nightbench")


def _fake_commands(tmp_path: Path, names: tuple[str, ...]) -> tuple[Path, dict[str, str]]:
    """A bin folder of scripts named ``names``: each appends its name and arguments to
    ``calls.log`` and exits with ``$FAKE_RC_<NAME>`` (0 when unset); returns the log and an
    environment whose PATH finds them first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for name in names:
        script = bin_dir / name
        script.write_text(
            "#!/bin/sh\n"
            f'printf "%s" "{name}" >> "{log}"\n'
            f'for a in "$@"; do printf " [%s]" "$a" >> "{log}"; done\n'
            f'echo >> "{log}"\n'
            f'exit "${{FAKE_RC_{name.upper()}:-0}}"\n'
        )
        script.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    return log, env


@pytest.mark.parametrize(("install_rc", "step_rc"), [(0, 0), (1, 0), (2, 2), (3, 3)])
def test_nightly_goes_on_when_torchbench_models_are_unavailable_and_stops_on_a_refusal(
    tmp_path: Path, install_rc: int, step_rc: int
) -> None:
    """The install step as the runner runs it (bash -e -o pipefail), with ``nightbench``
    replaced by a script: exit 1 (models named as unavailable) leaves the night going with a
    warning; a refusal (2) or any other failure stops it."""
    steps = _workflow("nightly.yml")["jobs"]["dispatch"]["steps"]
    install = next(step for step in steps if "torchbench install" in step.get("run", ""))
    log, env = _fake_commands(tmp_path, ("nightbench",))
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install["run"]],
        env={**env, "MODELS": "torchbench.alexnet", "FAKE_RC_NIGHTBENCH": str(install_rc)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == step_rc, proc.stderr
    assert ("::warning::" in proc.stdout) == (install_rc == 1)
    assert log.read_text().splitlines() == [
        "nightbench [torchbench] [install] [--torchbench] [benchmark] [--torch-index]"
        " [https://download.pytorch.org/whl/cpu] [--models] [torchbench.alexnet]"
    ]


def _dockerfile_torchbench_script() -> str:
    """The shell of the Dockerfile's TorchBench ``RUN`` (line continuations kept: sh reads them)."""
    text = (ROOT / "Dockerfile").read_text()
    start = text.index('RUN if [ -n "${TORCHBENCH_COMMIT}" ]') + len("RUN ")
    end = text.index("\n    fi\n", start) + len("\n    fi")
    return text[start:end]


@pytest.mark.parametrize(
    ("models", "install_rc", "build_rc"),
    [("", 0, 0), ("torchbench.alexnet,torchbench.dcgan", 1, 0), ("", 2, 2)],
)
def test_the_image_is_built_when_torchbench_models_are_unavailable_and_not_on_a_refusal(
    tmp_path: Path, models: str, install_rc: int, build_rc: int
) -> None:
    """The Dockerfile's TorchBench step under /bin/sh, with git, nightbench and chown replaced
    by scripts: the install gets the image's torch index and the chosen models; models named
    unavailable (exit 1) leave the image built, a refusal (exit 2) fails the build."""
    log, env = _fake_commands(tmp_path, ("git", "nightbench", "chown"))
    proc = subprocess.run(
        ["/bin/sh", "-c", _dockerfile_torchbench_script()],
        env={
            **env,
            "TORCHBENCH_COMMIT": "0e83c440a51cd63464fee34724d01b7c814ce39b",
            "TORCHBENCH_MODELS": models,
            "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu",
            "FAKE_RC_NIGHTBENCH": str(install_rc),
        },
        capture_output=True,
        text=True,
    )
    assert proc.returncode == build_rc, proc.stderr
    calls = log.read_text().splitlines()
    install = next(c for c in calls if c.startswith("nightbench"))
    assert install.startswith(
        "nightbench [torchbench] [install] [--torchbench] [/opt/torchbench] [--torch-index]"
        " [https://download.pytorch.org/whl/cpu]"
    )
    assert install.endswith(f" [--models] [{models}]") == bool(models)
    assert any(c.startswith("chown") for c in calls) == (build_rc == 0)
    # Without a commit nothing runs at all.
    log.unlink()
    skipped = subprocess.run(
        ["/bin/sh", "-c", _dockerfile_torchbench_script()],
        env={**env, "TORCHBENCH_COMMIT": ""},
        capture_output=True,
        text=True,
    )
    assert skipped.returncode == 0 and not log.exists()


def test_nightly_matrix_points_its_shards_at_a_pinned_torchbench_checkout() -> None:
    data = _workflow("nightly-matrix.yml")
    assert data["on"]["workflow_dispatch"]["inputs"]["suite"]["options"] == [
        "own",
        "torchbench",
        "all",
    ]
    assert data["env"]["SUITE"] == "${{ inputs.suite || vars.NIGHTBENCH_SUITE || 'own' }}"
    for name in ("plan", "shard"):
        steps = data["jobs"][name]["steps"]
        checkout = next(
            step for step in steps if step.get("with", {}).get("repository") == "pytorch/benchmark"
        )
        assert checkout["with"]["ref"] == "${{ vars.NIGHTBENCH_TORCHBENCH_COMMIT || 'main' }}"
        assert checkout["with"]["path"] == "benchmark"
        listing = " ".join(step.get("run", "") for step in steps)
        assert 'suite list --json --suite "$SUITE"' in listing, name
    shard = data["jobs"]["shard"]
    assert "/benchmark" in shard["env"]["NIGHTBENCH_TORCHBENCH_PATH"]
    steps = shard["steps"]
    install = next(step for step in steps if "torchbench install" in step.get("run", ""))
    measure = next(step for step in steps if "suite run --model" in step.get("run", ""))
    assert steps.index(install) < steps.index(measure)
    assert install["if"] == checkout["if"]
    assert "nightbench torchbench install --torchbench benchmark" in install["run"]
    assert '--python "$BUILD_PYTHON"' in install["run"]
    assert '--torch-index "$TORCH_NIGHTLY_INDEX" --models "$models"' in install["run"]
    assert "install.py" not in install["run"]  # through nightbench's installer only
    assert "--check-imports" in measure["run"] and "/skipped" in measure["run"]
