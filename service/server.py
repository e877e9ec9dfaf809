"""How ``nightbench serve`` runs the API on uvicorn, with deadlines for slow clients.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` but waits without
end for a client that sends its request a byte at a time (slowloris): 200 such connections
were all still open after 75 s (docs/reliability.md). :class:`SlowClientTimeouts` gives each
request a deadline to arrive, and :func:`serve` caps concurrent connections and tasks
(``limit_concurrency``: uvicorn answers 503 past it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.config import get_settings

log = logging.getLogger(__name__)


class SlowClientTimeouts(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request.

    A request's headers must arrive within ``api_header_timeout_s`` of the connection opening
    (or of the request's first byte, on a kept-alive connection), and its body within
    ``api_body_timeout_s`` of its headers. A client that misses either is disconnected; an app
    reading the body then sees ``http.disconnect``. Idle kept-alive connections are uvicorn's
    (``api_keep_alive_s``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.header_timeout_s = settings.api_header_timeout_s
        self.body_timeout_s = settings.api_body_timeout_s
        self.read_deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self.read_deadline = self.loop.call_later(seconds, self._too_slow, what, seconds)

    def _disarm(self) -> None:
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None

    def _too_slow(self, what: str, seconds: float) -> None:
        self.read_deadline = None
        if not self.transport.is_closing():
            log.info("%s: %s not received within %g s; closing", self.client, what, seconds)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the headers' deadline."""
        super().connection_made(transport)
        self._arm(self.header_timeout_s, "request headers")

    def on_message_begin(self) -> None:
        """A request's first byte: its headers' deadline (kept-alive connections)."""
        super().on_message_begin()
        if self.read_deadline is None:
            self._arm(self.header_timeout_s, "request headers")

    def on_headers_complete(self) -> None:
        """Headers in: the body's deadline."""
        super().on_headers_complete()
        self._arm(self.body_timeout_s, "request body")

    def on_message_complete(self) -> None:
        """The whole request in: no deadline until the next one begins."""
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._disarm()
        super().connection_lost(exc)


def serve(*, host: str, port: int, workers: int) -> None:
    """Run ``service.main:app`` on uvicorn with the slow-client deadlines and limits.

    Args:
        host: interface to listen on.
        port: TCP port.
        workers: uvicorn worker processes.
    """
    settings = get_settings()
    uvicorn.run(
        "service.main:app",
        host=host,
        port=port,
        workers=workers,
        log_level="info",
        http=f"{__name__}:{SlowClientTimeouts.__name__}",
        timeout_keep_alive=settings.api_keep_alive_s,
        limit_concurrency=settings.api_max_connections,
    )
