"""nightbench's error hierarchy (in the manner of ``httpx/_exceptions.py``).

::

    NightbenchError (500)
    ├── NotFound (404)            a run, model, regression... that does not exist
    ├── Conflict (409)            the request clashes with stored state
    ├── InvalidInput (422)        bad input, with the field that was wrong
    │   ├── DetectionInputError (422)  a series the detector cannot judge, naming the field
    │   ├── InvalidTorchSpec (422)     a torch spec that is not one pinned build
    │   └── UnknownMetric (422)        a metric name that is not a row of the metric table
    ├── Unauthorized (401)        missing or wrong API token
    ├── BenchmarkError (500)      a benchmark could not be measured (stored as an error result)
    ├── MeasureError (500)        a benchmark could not be measured at a bisection's probe
    ├── BuildError (500)          a commit could not be made runnable (a probe skips it)
    ├── InvalidSettings (500)     a NIGHTBENCH_* variable the settings refuse, one line each
    └── InfrastructureError (503) broker, database, build or GitHub failure worth a retry
        ├── EnvironmentBuildError (503) creating a venv or installing into it failed
        └── TrackerAccessDenied (503) the tracker refused our credentials (401, 403, 404 on
                                      the repository): a setting to fix, then a retry

Services raise these, never ``HTTPException``; the API maps ``status_code`` to the response.
The one HTTP exception of the service is ``service/main.py``'s ``_TooLarge``, HTTP 413: the
request-size middleware raises it while a body is read, before any route or service runs.

The suite's errors are its own: ``suite/`` imports no ``service``, and none of them reaches
the API. Each ends in the suite's process as a record's ``error`` or ``skipped`` reason, or as
an exit status; ``nightbench torchbench ...`` turns the last three into one line and exit 2::

    RuntimeError
    ├── SetupUnavailable       suite/cpu_setup.py: a forced allocator not installed (exit 2)
    ├── CountUnavailable       suite/counting.py: no valgrind here (the count is skipped)
    ├── ProfileFailed          suite/profiling.py: the benchmark could not be profiled
    └── TorchBenchUnavailable  suite/torchbench_checkout.py: no checkout (the model is not
                               available; its run is an error record)
    LookupError
    └── UnknownModelError      suite/registry.py: no suite model of that name (error record)
    ValueError
    ├── InvalidCheckout        suite/torchbench_checkout.py: not a pytorch/benchmark checkout
    ├── TorchBenchFormatError  suite/torchbench_results.py: a result file in neither format
    └── InstallInputError      suite/torchbench_install.py: bad input for an install

``suite/torchbench_probe.py``'s ``_Sized`` and ``_TimedOut`` are control flow inside one
model's check, never raised out of it.
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


class DetectionInputError(InvalidInput, ValueError):
    """Bad detection input; the message names the offending field (HTTP 422)."""

    status_code = 422


class InvalidTorchSpec(InvalidInput):
    """The torch spec is not one pinned torch build (or names a build no index has) (HTTP 422)."""

    status_code = 422


class UnknownMetric(InvalidInput, ValueError):
    """A metric name that is not a row of the metric table, or not one detection judges; the
    message names those there are (HTTP 422)."""

    status_code = 422


class MeasureError(NightbenchError):
    """A benchmark could not be measured at a probe (recorded as that benchmark's error)."""

    status_code = 500


class BuildError(NightbenchError):
    """A commit could not be made runnable; the bisection skips it and reports why (HTTP 500).

    Attributes:
        sha: the commit.
        reason: what failed, in one line.
        log: the tail of the build's output (may be empty).
    """

    status_code = 500

    def __init__(self, sha: str, message: str, *, log: str = "") -> None:
        super().__init__(f"{sha[:10]}: {message}")
        self.sha = sha
        self.reason = message
        self.log = log

    def detail(self, limit: int = 2000) -> str:
        """The reason in full, then as much of the log's end as fits in ``limit`` characters.

        The reason (what failed: ``install command 'pip install -e .' exited with status 2``)
        is never cut; a long traceback in the log is trimmed from its start, where the frames
        that matter least are.
        """
        if not self.log:
            return self.reason
        room = max(limit - len(self.reason) - 1, 0)
        log = self.log.strip()
        return f"{self.reason}\n{log[-room:] if room else ''}".strip()


class InvalidSettings(NightbenchError):
    """A ``NIGHTBENCH_*`` variable holds a value the settings refuse (HTTP 500: the deployment's
    to fix, not the client's).

    The message has one line per refused variable, naming it, the value given and what was
    wrong (:func:`service.config.get_settings`); the command line prints it and exits with
    code 2, without a traceback (:mod:`workers.main`).

    Attributes:
        lines: the message's lines.
    """

    status_code = 500

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = tuple(lines)


class EnvironmentBuildError(InfrastructureError):
    """Creating the venv or installing into it failed for a reason other than the spec (503)."""

    status_code = 503
