"""Fixtures of the suite's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from suite.registry import EXTRA_MODELS_ENV
from tests.suite.helpers import FIXTURE_MODELS


@pytest.fixture
def fixture_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Make the test-only models (planted leak, crashes, ...) resolvable in this process."""
    monkeypatch.setenv(EXTRA_MODELS_ENV, str(FIXTURE_MODELS))
    yield FIXTURE_MODELS
