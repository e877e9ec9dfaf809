"""nightbench's error hierarchy (in the manner of ``httpx/_exceptions.py``).

::

    NightbenchError (500)
    ├── NotFound (404)            a run, model, regression... that does not exist
    ├── Conflict (409)            the request clashes with stored state
    ├── InvalidInput (422)        bad input, with the field that was wrong
    ├── Unauthorized (401)        missing or wrong API token
    ├── BenchmarkError (500)      a benchmark could not be measured (stored as an error result)
    └── InfrastructureError (503) broker, database, build or GitHub failure worth a retry
        └── TrackerAccessDenied (503) the tracker refused our credentials (401, 403, 404 on
                                      the repository): a setting to fix, then a retry

Services raise these, never ``HTTPException``; the API maps ``status_code`` to the response.
"""

from __future__ import annotations


class NightbenchError(Exception):
    """Base class; ``status_code`` is the HTTP status the API answers with."""

    status_code = 500

    def __init__(self, message: str) -> None:
        if not message:
            raise ValueError("every nightbench error needs a message")
        super().__init__(message)
        self.message = message


class NotFound(NightbenchError):
    """A requested row does not exist (HTTP 404)."""

    status_code = 404


class Conflict(NightbenchError):
    """The request contradicts what is stored, e.g. a reused idempotency key (HTTP 409)."""

    status_code = 409


class InvalidInput(NightbenchError):
    """The input is malformed or out of range; the message names what was wrong (HTTP 422)."""

    status_code = 422


class Unauthorized(NightbenchError):
    """A write without a valid API token (HTTP 401)."""

    status_code = 401


class BenchmarkError(NightbenchError):
    """A benchmark failed to run; its error text is stored with the job (HTTP 500)."""

    status_code = 500


class InfrastructureError(NightbenchError):
    """A part the service depends on (database, broker, tracker) is unavailable: retry (HTTP 503)."""

    status_code = 503


class TrackerAccessDenied(InfrastructureError):
    """The issue tracker refused the configured credentials or repository (HTTP 503).

    The message names the setting to fix; filing retries once it is fixed.
    """

    status_code = 503
