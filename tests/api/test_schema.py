"""Property-based checks of every operation against the app's own OpenAPI schema (schemathesis).

Each operation gets a modest number of generated requests (valid and invalid), sent with a
valid token so the write paths are reached too: no answer may be a 5xx, and every answer must
match the schema (status, content type, headers, body); invalid data must be rejected.
``positive_data_acceptance`` is left out: some schema-valid requests break rules a schema
cannot state (the same benchmark listed twice with two batch sizes, more series than one chart
holds) and rightly get a 422 naming the problem.

The schema is loaded at import (``from_asgi``) from an app whose sessions bind to the current
test's rolled-back connection; schemathesis' lazy ``from_fixture`` loader does not run on this
pytest.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from sqlalchemy.orm import Session

from service.main import create_app
from tests.api.conftest import add_night, latency_series, make_record, night

_bound: dict[str, Any] = {}
app = create_app(
    session_factory=lambda: Session(
        bind=_bound["connection"], join_transaction_mode="create_savepoint", expire_on_commit=False
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(autouse=True)
def _bind_app(db: Session) -> Any:
    series = latency_series(9, seed=11)
    for i in range(9):
        add_night(db, night(i), [make_record("resnet18", "train", {"latency": series[i]})])
    _bound["connection"] = db.connection()
    yield
    _bound.clear()


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_matches_its_schema(case: schemathesis.Case, auth: dict[str, str]) -> None:
    case.call_and_validate(
        headers=auth, excluded_checks=[schemathesis.checks.positive_data_acceptance]
    )
