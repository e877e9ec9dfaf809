"""Apply and check Alembic migrations from code (``nightbench db upgrade``, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from service.config import get_settings
from service.db import normalise_url

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for this project's ``migrations/`` pointed at ``url`` (default: settings)."""
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option(
        "sqlalchemy.url", normalise_url(url or get_settings().effective_database_url)
    )
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def upgrade_embedded_store() -> bool:
    """Create or migrate the embedded SQLite store on first use (commands that read or write it).

    A configured database (Postgres) is left alone: deployments migrate it once with
    ``nightbench db upgrade``. Returns whether the embedded store was upgraded.
    """
    settings = get_settings()
    if not (settings.embedded and settings.effective_database_url.startswith("sqlite")):
        return False
    upgrade()
    return True
