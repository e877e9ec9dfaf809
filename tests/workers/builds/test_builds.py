"""Build providers on a generated ``minitok`` repository: checkout, python-overlay, wheel."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import Settings
from service.errors import InvalidInput
from workers.builds.base import BuildEnvironment, BuildError
from workers.builds.checkout import CheckoutProvider
from workers.builds.layered_venv import make_layered_venv
from workers.builds.overlay import PythonOverlayProvider
from workers.builds.registry import KINDS, make_provider, provider_from_spec, spec_from_settings
from workers.builds.wheel import WheelProvider
from workers.demo.minitok import INSTALL_COMMAND, PackageRepository, make_package_repository

PROBE = (
    "import json, importlib.metadata as m, inspect, minitok, minitok.tokenizer as t; "
    "print(json.dumps({'file': minitok.__file__, 'version': m.version('minitok'), "
    "'checks': '_check_word(word)' in inspect.getsource(t.Tokenizer.encode)}))"
)


def probe(env: BuildEnvironment) -> dict:
    """Import minitok the way a probe would and say which one it got."""
    proc = subprocess.run(
        [str(env.python), "-c", PROBE],
        env=env.environ(),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> PackageRepository:
    # k=2 adds the encode check; k=4 bumps the version (pyproject.toml); k=6 breaks the build.
    return make_package_repository(
        tmp_path_factory.mktemp("src") / "minitok", commits=8, encode_culprit=2, broken=[6]
    )


def test_checkout_installs_the_commit_in_its_own_environment(
    repo: PackageRepository, tmp_path: Path
) -> None:
    provider = CheckoutProvider(repo.path, INSTALL_COMMAND, work_dir=tmp_path)
    before, after = provider.prepare(repo.shas[1]), provider.prepare(repo.shas[5])
    assert before.build_seconds > 0 and not before.reused
    seen_before, seen_after = probe(before), probe(after)
    assert seen_before["file"].startswith(str(before.workdir))
    assert seen_after["file"].startswith(str(after.workdir))
    assert (seen_before["checks"], seen_after["checks"]) == (False, True)
    assert (seen_before["version"], seen_after["version"]) == ("0.1.0", "0.1.1")
    # The environment inherits the running interpreter's packages (numpy here).
    subprocess.run([str(after.python), "-c", "import numpy"], env=after.environ(), check=True)
    # A second prepare of the same commit (a retried probe) reuses the build.
    again = provider.prepare(repo.shas[5])
    assert again.reused and again.root == after.root and again.build_seconds == after.build_seconds
    provider.release(after)
    assert not after.root.exists()
    worktrees = subprocess.run(
        ["git", "-C", str(repo.path), "worktree", "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(after.workdir) not in worktrees and str(before.workdir) in worktrees
    provider.release(before)


def test_checkout_of_a_broken_commit_raises_build_error(
    repo: PackageRepository, tmp_path: Path
) -> None:
    provider = CheckoutProvider(repo.path, INSTALL_COMMAND, work_dir=tmp_path)
    with pytest.raises(BuildError, match="exited with status") as info:
        provider.prepare(repo.broken[0])
    assert info.value.sha == repo.broken[0]
    assert "TOMLDecodeError" in info.value.log
    assert not (tmp_path / repo.broken[0]).exists()


def test_checkout_of_an_unknown_commit_raises_build_error(
    repo: PackageRepository, tmp_path: Path
) -> None:
    with pytest.raises(BuildError, match="worktree add failed"):
        CheckoutProvider(repo.path, "", work_dir=tmp_path).prepare("0" * 40)


@pytest.fixture(scope="module")
def installed(repo: PackageRepository, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter with minitok from commit 1 installed (not editable): the 'nightly'."""
    root = tmp_path_factory.mktemp("installed")
    python = make_layered_venv(root / "venv", sys.executable)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo.path),
            "worktree",
            "add",
            "--detach",
            str(root / "src"),
            repo.shas[1],
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            ".",
        ],
        cwd=root / "src",
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["git", "-C", str(repo.path), "worktree", "remove", "--force", str(root / "src")],
        check=True,
    )
    return python


def test_python_overlay_lays_a_commits_python_files_over_the_installed_build(
    repo: PackageRepository, installed: Path, tmp_path: Path
) -> None:
    provider = PythonOverlayProvider(
        repo.path, base_sha=repo.shas[1], package="minitok", python=installed, work_dir=tmp_path
    )
    assert provider.installed.name == "minitok" and "site-packages" in str(provider.installed)
    env = provider.prepare(repo.shas[3])
    seen = probe(env)
    assert seen["file"].startswith(str(env.root))
    assert seen["checks"] is True  # commit 2's change to tokenizer.py is there
    assert seen["version"] == "0.1.0"  # the installed distribution, untouched
    changed = {path for _, path in provider.overlay_changes(repo.shas[3])}
    assert changed == {"minitok/tokenizer.py"}  # docs and tests changed too: ignored
    # The installed package itself is unchanged.
    untouched = subprocess.run(
        [str(installed), "-c", PROBE], capture_output=True, text=True, check=True, cwd="/"
    )
    assert json.loads(untouched.stdout)["checks"] is False


def test_python_overlay_keeps_the_bytecode_of_unchanged_modules_only(
    repo: PackageRepository, installed: Path, tmp_path: Path
) -> None:
    # Each build compiling every module again costs minutes under valgrind (torch); a changed
    # module's cache must go, or the probe could run the installed build's code.
    provider = PythonOverlayProvider(
        repo.path, base_sha=repo.shas[1], package="minitok", python=installed, work_dir=tmp_path
    )
    cached = {p.name for p in (provider.installed / "__pycache__").glob("*.pyc")}
    assert any(name.startswith("tokenizer.") for name in cached)  # pip compiled it
    env = provider.prepare(repo.shas[3])
    overlay_cache = env.root / "site" / "minitok" / "__pycache__"
    kept = {p.name for p in overlay_cache.glob("*.pyc")}
    assert kept == {name for name in cached if not name.startswith("tokenizer.")}
    assert not any(p.is_symlink() for p in overlay_cache.iterdir())  # a probe may rewrite them
    assert probe(env)["checks"] is True  # tokenizer.py compiled from the commit's source


def test_python_overlay_refuses_non_python_changes(
    repo: PackageRepository, installed: Path, tmp_path: Path
) -> None:
    provider = PythonOverlayProvider(
        repo.path, base_sha=repo.shas[1], package="minitok", python=installed, work_dir=tmp_path
    )
    with pytest.raises(BuildError, match=r"non-Python files changed: pyproject\.toml"):
        provider.prepare(repo.shas[4])


@pytest.fixture(scope="module")
def wheel_server(repo: PackageRepository, tmp_path_factory: pytest.TempPathFactory):
    """A local HTTP server publishing one wheel per commit under ``/<sha>/``."""
    root = tmp_path_factory.mktemp("wheels")
    for sha in (repo.shas[1], repo.shas[3]):
        src = root / "src"
        subprocess.run(
            ["git", "-C", str(repo.path), "worktree", "add", "--detach", str(src), sha],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--quiet",
                "-w",
                str(root / sha),
                ".",
            ],
            cwd=src,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["git", "-C", str(repo.path), "worktree", "remove", "--force", str(src)], check=True
        )
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_wheel_provider_installs_the_commits_wheel(
    repo: PackageRepository, wheel_server: str, tmp_path: Path
) -> None:
    provider = WheelProvider(
        wheel_server + "/{sha}/minitok-0.1.0-py3-none-any.whl",
        pip_args=["--no-deps"],
        work_dir=tmp_path,
    )
    wheel = f"/{repo.shas[3]}/minitok-0.1.0-py3-none-any.whl"
    assert provider.url_for(repo.shas[3]).endswith(wheel)
    env = provider.prepare(repo.shas[3])
    seen = probe(env)
    assert seen["checks"] is True and seen["file"].startswith(str(env.root))
    assert probe(provider.prepare(repo.shas[1]))["checks"] is False
    with pytest.raises(BuildError, match="pip install"):
        provider.prepare(repo.shas[2])  # no wheel published: 404


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("https://ci.example/torch.whl", "must contain"),
        ("https://ci.example/{sha}/{arch}.whl", "unknown fields"),
        ("https://ci.example/{sha", "wheel URL template"),
    ],
)
def test_wheel_template_is_checked(template: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=message):
        WheelProvider(template, work_dir=tmp_path)


def test_make_provider_checks_its_options(tmp_path: Path, repo: PackageRepository) -> None:
    with pytest.raises(InvalidInput, match="unknown build provider"):
        make_provider("docker", repo_path=repo.path)
    with pytest.raises(InvalidInput, match="--wheel-url"):
        make_provider("wheel", work_dir=tmp_path)
    with pytest.raises(InvalidInput, match="--package and --base-sha"):
        make_provider("python-overlay", repo_path=repo.path, work_dir=tmp_path)
    with pytest.raises(InvalidInput, match="not a git work tree"):
        make_provider("checkout", repo_path=tmp_path, work_dir=tmp_path)
    assert isinstance(
        make_provider("checkout", repo_path=repo.path, work_dir=tmp_path), CheckoutProvider
    )


def test_the_settings_accept_exactly_the_registered_kinds() -> None:
    # service/config.py cannot import the registry (service never imports workers): its
    # bisect_provider pattern retypes the kinds, and this keeps the two in step.
    assert KINDS == ("checkout", "python-overlay", "wheel")
    for kind in KINDS:
        assert Settings(bisect_provider=kind).bisect_provider == kind
    with pytest.raises(ValidationError):
        Settings(bisect_provider="docker")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("checkout", {"kind": "checkout", "repo": "REPO", "install_command": "pip install -e ."}),
        ("wheel", {"kind": "wheel", "wheel_url": "https://ci/{sha}.whl", "repo": "REPO"}),
        ("python-overlay", {"kind": "python-overlay", "repo": "REPO", "package": "minitok"}),
    ],
)
def test_spec_from_settings_names_the_kind_and_its_options(
    kind: str,
    expected: dict,
    tmp_path: Path,
) -> None:
    options = {
        "bisect_install_command": "pip install -e .",
        "bisect_package": "minitok",
        "bisect_wheel_url": "https://ci/{sha}.whl",
    }
    settings = Settings(
        bisect_provider=kind,
        source_repo_path=tmp_path,
        source_github_repository="org/minitok",
        **options,
    )
    expected = {
        **{k: str(tmp_path) if v == "REPO" else v for k, v in expected.items()},
        "code_url": "https://github.com/org/minitok",
    }
    assert spec_from_settings(settings) == expected
    no_github = settings.model_copy(update={"source_github_repository": None})
    assert spec_from_settings(no_github) == {**expected, "code_url": None}
    # A local clone whose GitHub address is not given: bare shas, not pytorch/pytorch's links.
    unnamed = Settings(bisect_provider=kind, source_repo_path=tmp_path, **options)
    assert spec_from_settings(unnamed) == {**expected, "code_url": None}


def test_spec_from_settings_is_none_without_a_provider_or_an_option(tmp_path: Path) -> None:
    assert spec_from_settings(Settings(bisect_provider=None, source_repo_path=tmp_path)) is None
    for kind in ("checkout", "python-overlay"):
        assert spec_from_settings(Settings(bisect_provider=kind, source_repo_path=None)) is None
    assert spec_from_settings(Settings(bisect_provider="wheel", bisect_wheel_url=None)) is None


def test_provider_from_spec_makes_the_kind(tmp_path: Path, repo: PackageRepository) -> None:
    spec = {
        "kind": "checkout",
        "repo": str(repo.path),
        "install_command": INSTALL_COMMAND,
        "code_url": None,
    }
    provider = provider_from_spec(spec, work_dir=tmp_path)
    assert isinstance(provider, CheckoutProvider)
    assert provider.install_command == INSTALL_COMMAND.strip()
    wheel = provider_from_spec(
        {"kind": "wheel", "wheel_url": "https://ci/{sha}.whl"}, work_dir=tmp_path
    )
    assert (
        isinstance(wheel, WheelProvider) and wheel.url_for("a" * 40) == f"https://ci/{'a' * 40}.whl"
    )
    with pytest.raises(InvalidInput, match="unknown build provider 'docker'"):
        provider_from_spec({"kind": "docker"}, work_dir=tmp_path)
    with pytest.raises(InvalidInput, match="unknown build provider ''"):  # a spec without one
        provider_from_spec({}, work_dir=tmp_path)


def test_environment_drops_an_outer_pythonpath(tmp_path: Path) -> None:
    env = BuildEnvironment(
        sha="a" * 40,
        provider="checkout",
        python=tmp_path / "bin" / "python",
        root=tmp_path,
        workdir=tmp_path,
        pythonpath=("/overlay",),
        venv=tmp_path,
    )
    environ = env.environ({"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere", "PYTHONHOME": "/x"})
    assert environ["PYTHONPATH"] == "/overlay"
    assert environ["PATH"].split(":")[0] == str(tmp_path / "bin")
    assert environ["VIRTUAL_ENV"] == str(tmp_path) and "PYTHONHOME" not in environ


def test_build_error_detail_keeps_the_reason_and_the_end_of_the_log() -> None:
    log = "\n".join(f'  File "frame{i}.py", line {i}' for i in range(400)) + "\nTOMLDecodeError: x"
    error = BuildError("a" * 40, "install command 'pip install -e .' exited with status 2", log=log)
    detail = error.detail(limit=500)
    assert len(detail) <= 500
    assert detail.startswith("install command 'pip install -e .' exited with status 2\n")
    assert detail.endswith("TOMLDecodeError: x")
    assert BuildError("b" * 40, "git worktree add failed").detail() == "git worktree add failed"


def test_the_package_repository_refuses_a_commit_given_two_roles(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unfinished must lie in 1..8, got 9"):
        make_package_repository(tmp_path / "a", commits=8, unfinished=[9])
    with pytest.raises(InvalidInput, match="cannot be two of: a culprit, broken, unfinished"):
        make_package_repository(tmp_path / "b", commits=8, crash_culprit=4, unfinished=[4])
    with pytest.raises(InvalidInput, match="cannot be two of"):
        make_package_repository(tmp_path / "c", commits=8, broken=[3], unfinished=[3])
    assert not (tmp_path / "a").exists()  # refused before anything is written
