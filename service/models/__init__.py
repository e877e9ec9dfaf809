"""Every SQLAlchemy table, imported in one place so Alembic sees them all."""

from service.db import Base
from service.models.ab import ABStatus, ABTest, ReportState
from service.models.bisection import (
    BISECTION_OUTCOMES,
    BISECTION_STATUSES,
    PROBE_ENDED,
    PROBE_STATUSES,
    Bisection,
    BisectionOutcome,
    BisectionProfile,
    BisectionStatus,
    Probe,
    ProbeStatus,
    ProfileStatus,
)
from service.models.catalog import CatalogModel
from service.models.issue import ISSUE_STATES, TRACKERS, IssueRecord, IssueRegression
from service.models.machine import Machine
from service.models.regression import (
    ALERT_KINDS,
    CONFIRMATIONS,
    FILING_UNFILED,
    TRIAGE_STATES,
    Alert,
    AlertKind,
    AlertStatus,
    Confirmation,
    FilingState,
    Regression,
)
from service.models.result import POINT_BYTES, POINT_FIELDS, Result, SeriesMonth
from service.models.run import (
    JOB_ENDED,
    JOB_STATUSES,
    RUN_KINDS,
    RUN_OPEN,
    RUN_STATUSES,
    Job,
    JobStatus,
    Run,
    RunKind,
    RunStatus,
)
from service.models.stability import BenchmarkStability
from service.models.token import ApiToken

__all__ = [
    "ABStatus",
    "ABTest",
    "ReportState",
    "BisectionOutcome",
    "BisectionProfile",
    "ProfileStatus",
    "BisectionStatus",
    "Confirmation",
    "ProbeStatus",
    "CatalogModel",
    "BISECTION_OUTCOMES",
    "BISECTION_STATUSES",
    "POINT_BYTES",
    "POINT_FIELDS",
    "PROBE_ENDED",
    "PROBE_STATUSES",
    "Bisection",
    "Probe",
    "ALERT_KINDS",
    "AlertKind",
    "AlertStatus",
    "FILING_UNFILED",
    "FilingState",
    "CONFIRMATIONS",
    "JOB_ENDED",
    "JobStatus",
    "RUN_OPEN",
    "RunKind",
    "RunStatus",
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
