"""nightbench's error hierarchy (in the manner of ``httpx/_exceptions.py``).

::

    NightbenchError (500)
    ├── NotFound (404)            a run, model, regression... that does not exist
    ├── Conflict (409)            the request clashes with stored state
    ├── InvalidInput (422)        bad input, with the field that was wrong
    ├── Unauthorized (401)        missing or wrong API token
    ├── BenchmarkError (500)      a benchmark could not be measured (stored as an error result)
    └── InfrastructureError (503) broker, database, build or GitHub failure worth a retry

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
    status_code = 404


class Conflict(NightbenchError):
    status_code = 409


class InvalidInput(NightbenchError):
    status_code = 422


class Unauthorized(NightbenchError):
    status_code = 401


class BenchmarkError(NightbenchError):
    status_code = 500


class InfrastructureError(NightbenchError):
    status_code = 503
