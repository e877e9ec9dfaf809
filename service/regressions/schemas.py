"""Wire shapes of the regressions and alerts endpoints."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.api import StrictBody
from service.models import TRIAGE_STATES

TriageState = Literal[TRIAGE_STATES]  # type: ignore[valid-type]


class RegressionRead(BaseModel):
    """A change of one series in one run beyond its threshold (values in ``unit``)."""

    id: int
    run_id: int
    night: date
    first_night: date = Field(
        description="the step's first night at the new level (the night "
        "whose build brought it); earlier than night when it was raised "
        "once it persisted"
    )
    alert_id: int | None
    series_key: str
    benchmark: str
    model: str
    mode: str
    device: str
    compiler: str
    metric: str
    unit: str
    direction: Literal["regression", "improvement"]
    baseline: float
    value: float
    change: float = Field(description="value / baseline - 1 (0.12 = +12%)")
    p_value: float | None
    threshold: float
    alertable: bool
    confirmation: str
    state: str
    reason: str
    culprit: str | None = Field(description="culprit commit named by a bisection")
    bisection_ids: list[int]
    back_night: date | None = Field(
        None,
        description="the night the series was found back at "
        "its level from before the regression (the step did not "
        "persist, or a later improvement undid it)",
    )
    back_reason: str | None = Field(None, description="why it counts as back")
    created_at: datetime | None
    updated_at: datetime | None
    chart_url: str


class RegressionsPage(BaseModel):
    """One page of regressions, newest first; ``next_cursor`` fetches the next."""

    items: list[RegressionRead]
    next_cursor: int | None


class RegressionPatch(StrictBody):
    """A triage update of one regression: its new state."""

    state: TriageState = Field(description="the triage state")


class AlertRead(BaseModel):
    """An alert: the regressions of one run raised together, and where it was filed."""

    id: int
    run_id: int
    night: date
    kind: str
    status: str
    summary: str
    created_at: datetime | None
    regressions: list[RegressionRead]
