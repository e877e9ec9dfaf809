"""What the groups of the ``nightbench`` command line share: consoles, errors, build options."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from service.metrics import format_value

if TYPE_CHECKING:
    from workers.builds.base import BuildProvider

console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
# Rich draws for 80 columns when the output is not a terminal (a CI log, a file, `make nightly
# | tee`), and the night's table then wraps every benchmark name. Logs are read wide.
LOG_WIDTH = 160


def fit_to_output() -> None:
    """Give both consoles :data:`LOG_WIDTH` columns where their stream is not a terminal and
    ``COLUMNS`` is not set (a terminal, or ``COLUMNS``, keeps Rich's own width)."""
    for con, stream in ((console, sys.stdout), (err_console, sys.stderr)):
        isatty = getattr(stream, "isatty", None)
        wide = "COLUMNS" not in os.environ and not (isatty is not None and isatty())
        con.width = LOG_WIDTH if wide else None  # type: ignore[assignment]


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr and end the command with exit code ``code``.

    The message is printed as it is: brackets in it (a value given, a JSON list) are not Rich
    markup, and a long line is not broken at the console's width.

    Raises:
        typer.Exit: always (exit code 2 by default: bad input, as typer's own usage errors).
    """
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def csv(value: str | None) -> list[str] | None:
    """``"a, b,,c"`` → ``["a", "b", "c"]``; None or empty → None."""
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def with_unit(value: float | None, unit: str) -> str:
    """A value for a table, in its unit as the metric table prints it (``—`` for None)."""
    return format_value(value, unit)


# The build provider's options, as ``nightbench bisect`` and ``nightbench ab`` take them.
ProviderOption = Annotated[
    str, typer.Option("--provider", help="build provider: checkout | python-overlay | wheel")
]
InstallOption = Annotated[
    str,
    typer.Option(
        "--install", help='checkout: install command run in each build, e.g. "pip install -e ."'
    ),
]
WheelUrlOption = Annotated[
    str | None, typer.Option("--wheel-url", help="wheel provider: URL template with {sha}")
]
PackageOption = Annotated[
    str | None,
    typer.Option(
        "--package", help="python-overlay: the installed package to lay the commit's .py files over"
    ),
]
BaseShaOption = Annotated[
    str | None,
    typer.Option(
        "--base-sha", help="python-overlay: the commit the installed package was built from"
    ),
]
WorkDirOption = Annotated[
    Path | None, typer.Option("--work-dir", help="where builds go (default: temporary)")
]


@dataclass(frozen=True)
class BuildOptions:
    """The build provider's options as declared above (``--provider`` .. ``--work-dir``).

    Attributes:
        provider: the kind: ``checkout`` | ``python-overlay`` | ``wheel``.
        install: ``checkout``: the install command run in each build.
        wheel_url: ``wheel``: the URL template with ``{sha}``.
        package: ``python-overlay``: the installed package laid over.
        base_sha: ``python-overlay``: the commit the installed package was built from.
        work_dir: where builds go (None: a temporary directory).
    """

    provider: str = "checkout"
    install: str = ""
    wheel_url: str | None = None
    package: str | None = None
    base_sha: str | None = None
    work_dir: Path | None = None


def build_provider(
    repo: Path, options: BuildOptions
) -> tuple[BuildProvider, dict[str, str | None]]:
    """The build provider the options make for the clone ``repo``, and its spec as stored with
    an A/B (``kind``, ``repo``, ``install_command``, ``package``).

    Raises:
        NightbenchError: an option is missing or wrong for the kind
            (:func:`workers.builds.registry.make_provider`).
    """
    from workers.builds.registry import make_provider

    provider = make_provider(
        options.provider,
        repo_path=repo,
        install_command=options.install,
        wheel_url=options.wheel_url,
        package=options.package,
        base_sha=options.base_sha,
        work_dir=options.work_dir,
    )
    spec = {
        "kind": options.provider,
        "repo": str(repo),
        "install_command": options.install,
        "package": options.package,
    }
    return provider, spec
