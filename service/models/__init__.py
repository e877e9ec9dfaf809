"""Every SQLAlchemy table, imported in one place so Alembic sees them all."""

from service.db import Base
from service.models.bisection import (
    BISECTION_OUTCOMES,
    BISECTION_STATUSES,
    PROBE_ENDED,
    PROBE_STATUSES,
    Bisection,
    Probe,
)
from service.models.issue import ISSUE_STATES, TRACKERS, IssueRecord, IssueRegression
from service.models.machine import Machine
from service.models.regression import ALERT_KINDS, CONFIRMATIONS, TRIAGE_STATES, Alert, Regression
from service.models.result import POINT_BYTES, POINT_FIELDS, Result, SeriesMonth
from service.models.run import JOB_ENDED, JOB_STATUSES, RUN_KINDS, RUN_STATUSES, Job, Run
from service.models.stability import BenchmarkStability
from service.models.token import ApiToken

__all__ = [
    "BISECTION_OUTCOMES",
    "BISECTION_STATUSES",
    "POINT_BYTES",
    "POINT_FIELDS",
    "PROBE_ENDED",
    "PROBE_STATUSES",
    "Bisection",
    "Probe",
    "ALERT_KINDS",
    "CONFIRMATIONS",
    "JOB_ENDED",
    "JOB_STATUSES",
    "RUN_KINDS",
    "RUN_STATUSES",
    "TRIAGE_STATES",
    "ISSUE_STATES",
    "TRACKERS",
    "Alert",
    "ApiToken",
    "Base",
    "BenchmarkStability",
    "IssueRecord",
    "IssueRegression",
    "Job",
    "Machine",
    "Regression",
    "Result",
    "Run",
    "SeriesMonth",
]
