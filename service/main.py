"""The FastAPI application: ``create_app()`` and the module-level ``app`` (``nightbench serve``).

Errors answer ``{"detail": "<message>"}``: a :class:`~service.errors.NightbenchError` with its
``status_code``; request validation with 422 and a message naming each bad field; a clash with
a unique constraint with 409; a value the database refuses with 422; an unreachable database
with 503. Routes are plain ``def`` on sync SQLAlchemy sessions (run in the thread pool).
"""

from __future__ import annotations

import gc
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from sqlalchemy import text
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.ab.routes import router as ab_router
from service.api import errors
from service.auth import find_token
from service.bisections.routes import router as bisections_router
from service.config import Settings, get_settings
from service.db import get_sessionmaker
from service.deps import SessionDep
from service.errors import NightbenchError, Unauthorized
from service.regressions.routes import router as regressions_router
from service.results.routes import pages as pages_router
from service.results.routes import router as history_router
from service.runs.routes import router as runs_router
from service.status.routes import router as status_router

log = logging.getLogger(__name__)


POOL_EXHAUSTED = "every database connection is busy; try again shortly"
POOL_RETRY_AFTER_S = 2


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ())]
        where = f"{loc[0]} {'.'.join(loc[1:])}".strip() if loc else "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:10]) or "invalid request"


def _template_pattern(template: str) -> re.Pattern[str]:
    """A regex matching the paths of an OpenAPI path template (``{name}`` is one segment)."""
    return re.compile("^" + re.sub(r"\\{[^/}]+\\}", "[^/]+", re.escape(template)) + "$")


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Methods the OpenAPI schema documents for ``path`` (templates matched segment-wise)."""
    table = getattr(app.state, "allowed_methods", None)
    if table is None:
        table = [
            (
                _template_pattern(template),
                sorted(m.upper() for m in ops),
            )
            for template, ops in app.openapi().get("paths", {}).items()
        ]
        app.state.allowed_methods = table
    return sorted({m for pattern, methods in table if pattern.match(path) for m in methods})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(NightbenchError)
    def _nightbench(request: Request, exc: NightbenchError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return _error(exc.status_code, exc.message, headers)

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route matching the path; list every method the
            # path supports (GET and PATCH on one regression are two routes).
            methods = _allowed_methods(request.app, request.url.path)
            if methods:
                headers["Allow"] = ", ".join(methods)
        return _error(exc.status_code, str(exc.detail), headers or None)

    @app.exception_handler(RequestValidationError)
    def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        malformed = [e for e in exc.errors() if e.get("type") == "json_invalid"]
        if malformed:  # not JSON at all: a bad request, not a bad value (docs/api.md)
            ctx = malformed[0].get("ctx") or {}
            return _error(400, f"request body: malformed JSON ({ctx.get('error', 'invalid')})")
        return _error(422, _validation_message(exc))

    @app.exception_handler(IntegrityError)
    def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        # Two writers raced for the same unique row; the loser is told, nothing is half-stored.
        return _error(409, f"conflicts with stored data: {exc.orig}".splitlines()[0])

    @app.exception_handler(DataError)
    def _data(request: Request, exc: DataError) -> JSONResponse:
        return _error(422, f"the database refused a value: {exc.orig}".splitlines()[0])

    @app.exception_handler(OperationalError)
    def _operational(request: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database error: %s", exc)
        return _error(503, "the database is unreachable; try again shortly")

    @app.exception_handler(PoolTimeout)
    def _pool_timeout(request: Request, exc: PoolTimeout) -> JSONResponse:
        log.warning("database pool exhausted: %s", exc)
        return _error(503, POOL_EXHAUSTED, {"Retry-After": str(POOL_RETRY_AFTER_S)})


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Everything imported at start-up lives for the whole process: moving it out of the
    # collector's reach keeps full collections short (gc.freeze, as large Python services do).
    gc.freeze()
    yield


class ServerTiming:
    """ASGI middleware adding ``Server-Timing: app;dur=<ms>, cpu;dur=<ms>`` (W3C Server Timing)
    to every response: the wall time from the request to the response's headers, and the CPU
    time the API process spent meanwhile (all its threads), as browsers' developer tools and
    the benchmarks read them. On a busy machine the two tell waiting from working."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry: time HTTP requests (wall and CPU, ms) and pass everything through."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, cpu_start = time.perf_counter(), time.process_time()

        async def send_with_timing(message: Any) -> None:
            if message["type"] == "http.response.start":
                wall = (time.perf_counter() - start) * 1e3
                cpu = (time.process_time() - cpu_start) * 1e3
                message.setdefault("headers", []).append(
                    (b"server-timing", f"app;dur={wall:.1f}, cpu;dur={cpu:.1f}".encode())
                )
            await send(message)

        await self.app(scope, receive, send_with_timing)


class _TooLarge(StarletteHTTPException):
    """The body being read went past the limit (413; FastAPI passes HTTP errors through)."""

    def __init__(self, limit: int, *, route: bool) -> None:
        super().__init__(413, _too_large_message(limit, route=route))


def _too_large_message(limit: int, *, route: bool) -> str:
    why = "the most this route needs" if route else "NIGHTBENCH_API_MAX_REQUEST_BYTES"
    return f"request body over {limit} bytes ({why})"


class BodyLimit:
    """ASGI middleware refusing a request body over the limit with 413, before it is read.

    A declared ``Content-Length`` over the limit is refused at once; a body sent without one
    (chunked) is counted as it arrives and refused once it passes the limit, so no route ever
    parses more than ``api_max_request_bytes`` (the app's settings), or the lower limit its
    operation declares (``x-max-request-bytes``), whatever a client sends.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry: pass through what fits, answer 413 for what does not."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = (scope["app"].state.settings or get_settings()).api_max_request_bytes
        own = _route_limit(scope)
        route = own is not None and own < limit
        limit = own if own is not None and route else limit
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_too_large(send, limit, route=route)
            return
        seen = 0
        started = False

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit, route=route)
            return message

        async def tracking(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracking)
        except _TooLarge:
            if not started:
                await _send_too_large(send, limit, route=route)


async def _send_too_large(send: Any, limit: int, *, route: bool) -> None:
    await _send_error(send, 413, _too_large_message(limit, route=route))


async def _send_error(
    send: Any, status: int, message: str, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"detail": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _needs_token(scope: Any) -> bool:
    """Whether the operation ``scope`` asks for takes an API token (the OpenAPI schema names
    the bearer scheme on every route with ``TokenDep``)."""
    app = scope["app"]
    table = getattr(app.state, "token_operations", None)
    if table is None:
        table = [
            (_template_pattern(template), method.upper())
            for template, ops in app.openapi().get("paths", {}).items()
            for method, op in ops.items()
            if op.get("security")
        ]
        app.state.token_operations = table
    return any(m == scope["method"] and p.match(scope["path"]) for p, m in table)


def _route_limit(scope: Any) -> int | None:
    """The body limit of the operation ``scope`` asks for, when its OpenAPI operation sets one
    (``x-max-request-bytes``: a route whose bodies are small by nature refuses big ones)."""
    app = scope["app"]
    table = getattr(app.state, "route_limits", None)
    if table is None:
        table = [
            (_template_pattern(template), method.upper(), int(op["x-max-request-bytes"]))
            for template, ops in app.openapi().get("paths", {}).items()
            for method, op in ops.items()
            if "x-max-request-bytes" in op
        ]
        app.state.route_limits = table
    return next((n for p, m, n in table if m == scope["method"] and p.match(scope["path"])), None)


def _bearer(scope: Any) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as FastAPI's HTTPBearer reads it."""
    header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _check_token(app: FastAPI, token: str | None) -> None:
    session = app.state.session_factory()
    try:
        find_token(session, token=token)
    finally:
        session.rollback()
        session.close()


class TokenFirst:
    """ASGI middleware checking the API token of a request to a token route before its body is
    read: FastAPI reads and validates a body before it resolves dependencies, so without this a
    client with no token could make the server parse 32 MiB (+785 MB, the event loop blocked
    3.96 s; docs/reliability.md). The lookup runs in a worker thread; the route's own
    ``TokenDep`` then records the token's use as before."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI entry: answer 401 (or 503) for a token route without a valid token."""
        if scope["type"] != "http" or not _needs_token(scope):
            await self.app(scope, receive, send)
            return
        try:
            await anyio.to_thread.run_sync(_check_token, scope["app"], _bearer(scope))
        except Unauthorized as exc:
            await _send_error(send, 401, exc.message, {"WWW-Authenticate": "Bearer"})
            return
        except OperationalError:
            await _send_error(send, 503, "the database is unreachable; try again shortly")
            return
        except PoolTimeout:
            headers = {"Retry-After": str(POOL_RETRY_AFTER_S)}
            await _send_error(send, 503, POOL_EXHAUSTED, headers)
            return
        await self.app(scope, receive, send)


def create_app(
    *,
    settings: Settings | None = None,
    session_factory: Callable[[], Session] | None = None,
) -> FastAPI:
    """Build the API.

    Args:
        settings: configuration (default: the process settings, read on first use).
        session_factory: makes one session per request (default: sessions on the configured
            database; tests pass sessions bound to a connection they roll back).
    """
    app = FastAPI(
        lifespan=_lifespan,
        title="nightbench",
        version="0.1.0",
        description="Nightly performance-regression checks for PyTorch: per-model history, "
        "runs, regressions, bisections and charts. Writes need an API token "
        "(`nightbench token create --name NAME`).",
    )
    app.state.settings = settings
    app.state.session_factory = session_factory or (
        lambda: get_sessionmaker(settings.effective_database_url if settings else None)()
    )
    _install_error_handlers(app)
    app.add_middleware(TokenFirst)
    app.add_middleware(BodyLimit)
    app.add_middleware(ServerTiming)
    for router in (
        history_router,
        runs_router,
        regressions_router,
        bisections_router,
        ab_router,
        status_router,
        pages_router,
    ):
        app.include_router(router)

    @app.get("/healthz", tags=["health"], responses=errors(503), response_model=dict[str, str])
    def healthz(session: SessionDep) -> dict[str, Any]:
        """Liveness and database reachability."""
        session.execute(text("SELECT 1"))
        return {"status": "ok", "database": "ok"}

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/docs")

    return app


app = create_app()
