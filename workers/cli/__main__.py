"""``python -m workers.cli``: the ``nightbench`` command line."""

from workers.cli import app

app()
