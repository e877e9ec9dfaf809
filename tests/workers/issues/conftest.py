"""Fixtures shared by the issue tests: the migrated session, the GitHub stand-in, settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from service.config import Settings
from tests.github_server import FakeGitHub

TOKEN = "ghp_issue_tests_token_0123456789"


@pytest.fixture
def db(session: Session) -> Session:
    """The rolled-back test session on the migrated database (the issue tables included)."""
    return session


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    """The local GitHub stand-in, answering for ``TOKEN``."""
    with FakeGitHub(token=TOKEN) as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings of a deployment that files to an outbox under ``tmp_path``."""
    return Settings(
        outbox_dir=tmp_path / "outbox",
        api_base_url="http://nightbench.test",
        github_labels=["performance", "regression"],
        baseline_nights=14,
    )
