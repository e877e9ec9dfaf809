"""The ``nightbench`` console script: the command line (:mod:`workers.cli`), where a refused
setting ends any command with one line per refused variable and exit code 2, not a traceback.

The settings are first read while :mod:`workers.cli` is imported (the Celery app,
:mod:`workers.app`, is configured from them), before typer has a command to run; a command can
also read them later (tests, ``--torchbench``). So the one place that catches
:class:`~service.errors.InvalidSettings` for every command wraps the import and the command
both, and lives outside the ``workers.cli`` package, whose import it guards (``python -m
workers.cli`` imports the package before its ``__main__`` runs: ``python -m workers.main`` is the
guarded equivalent).
"""

from __future__ import annotations

import sys

from service.errors import InvalidSettings

REFUSED_EXIT_CODE = 2
"""Bad input, as typer's own usage errors."""


def main() -> None:
    """Run the ``nightbench`` command line (``sys.argv``).

    Raises:
        SystemExit: the command's exit code; :data:`REFUSED_EXIT_CODE` when the settings
            refused a ``NIGHTBENCH_*`` variable, after ``error: <line>`` on stderr for each.
    """
    try:
        from workers.cli import app

        app()
    except InvalidSettings as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(REFUSED_EXIT_CODE) from None


if __name__ == "__main__":
    main()
