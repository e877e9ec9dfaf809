"""Layered virtual environments, and build commands whose output goes to a log.

An environment is created without pip and sees a base interpreter's site-packages through a
``.pth`` file (as ``virtualenv --system-site-packages`` would), so the suite and its
requirements are at hand while what a build installs shadows them. A ``pip`` launcher in the
environment's ``bin`` runs the inherited pip, which installs into the environment.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from service.errors import InvalidInput
from workers.builds.base import BuildError, log_tail


def site_directories(python: str | Path) -> list[str]:
    """The site-packages directories an interpreter imports from.

    Args:
        python: the interpreter.

    Returns:
        Absolute paths, in ``sys.path`` order.

    Raises:
        InvalidInput: the interpreter does not run.
    """
    code = (
        "import json, os, sys; print(json.dumps([p for p in sys.path "
        "if os.path.basename(p) in ('site-packages', 'dist-packages')]))"
    )
    try:
        proc = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InvalidInput(f"python: cannot run {python}: {exc}") from exc
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PIP_LAUNCHER = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


def make_layered_venv(dest: Path, python: str | Path, *, sha: str = "-") -> Path:
    """Create a virtual environment that also sees ``python``'s installed packages.

    Packages installed into the new environment come first on ``sys.path``; the base
    interpreter's site-packages follow through a ``.pth`` file that calls ``site.addsitedir`` (so
    their own ``.pth`` files, editable installs included, take effect too).

    Args:
        dest: the directory to create.
        python: the interpreter whose packages are inherited.
        sha: the commit the environment is for (named in errors).

    Returns:
        The new environment's interpreter, ``dest/bin/python``.

    Raises:
        BuildError: ``venv`` failed.
    """
    sites = site_directories(python)
    proc = subprocess.run(
        [str(python), "-m", "venv", "--without-pip", str(dest)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(sha, f"could not create a venv at {dest}", log=log_tail(proc.stderr))
    new_python = dest / "bin" / "python"
    probe = subprocess.run(
        [str(new_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    purelib = Path(probe.stdout.strip())
    purelib.mkdir(parents=True, exist_ok=True)
    lines = [f"import site; site.addsitedir({s!r})" for s in sites]
    (purelib / "_nightbench_inherit.pth").write_text("\n".join(lines) + "\n")
    launcher = dest / "bin" / "pip"
    launcher.write_text(_PIP_LAUNCHER.format(python=new_python))
    launcher.chmod(0o755)
    return new_python


def run_logged(
    command: str | Sequence[str],
    *,
    sha: str,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    log_path: Path,
    what: str,
) -> None:
    """Run a build step with its output appended to ``log_path``.

    Args:
        command: a shell command (a string) or an argument list.
        sha: the commit built (named in errors).
        cwd: the working directory.
        env: the process environment.
        timeout_s: seconds the step may take.
        log_path: the build's log, appended to.
        what: the step, as errors name it.

    Raises:
        BuildError: the step timed out or exited with a non-zero status.
    """
    try:
        proc = subprocess.run(
            command,
            shell=isinstance(command, str),
            cwd=cwd,
            env=dict(env),
            timeout=timeout_s,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(sha, f"{what} did not finish in {timeout_s:.0f} s") from exc
    with open(log_path, "a") as fh:
        fh.write(proc.stdout)
    if proc.returncode != 0:
        raise BuildError(
            sha, f"{what} exited with status {proc.returncode}", log=log_tail(proc.stdout)
        )
