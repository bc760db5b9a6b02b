"""Connection hygiene for the HTTP listener: slow or idle clients do not hold connections ([server]).

uvicorn closes a keep-alive connection idle between requests, and refuses
connections past a limit, but a client that opens a connection and sends
its headers a byte at a time (slowloris), or never finishes a body, holds
it forever. Here:

* ``header_timeout_seconds``: a request's headers must be complete this long
  after the connection opened, or after the previous response; else the
  connection is closed (nothing reached the application).
* ``body_timeout_seconds``: a request's body must be complete this long after
  its headers, else the answer is ``408`` and the application never sees it.
* ``keep_alive_seconds`` and ``max_connections``: uvicorn's own.

A proxy in front (docs/deploy.md "Behind a proxy") should time clients out
first, with shorter limits; these are the backstop when it does not.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol


def protocol_with_header_timeout(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers take longer than ``seconds``."""

    class HeaderTimedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request's headers arrived: the application has it

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers are due in time too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimedH11


# Bodies are read here before the application sees them, so they are bounded here too: well above the
# MCP SDK's own 4 MiB (which answers 413 itself) and anything the console posts.
MAX_BODY_BYTES = 16 * 1024 * 1024


class BodyDeadline:
    """ASGI middleware: a request body is read in full within ``seconds`` of its headers, or answered 408
    (413 past ``max_bytes``); the application gets it only once complete."""

    def __init__(self, app: ASGIApp, seconds: float, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.seconds, self.max_bytes = app, seconds, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        try:
            async with asyncio.timeout(self.seconds):
                while True:
                    message = await receive()
                    messages.append(message)
                    size += len(message.get("body", b""))
                    if size > self.max_bytes:
                        await _refuse(send, 413, "request_too_large",
                                      f"the request body is larger than {self.max_bytes} bytes; nothing was done")
                        return
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        break
        except TimeoutError:
            await _refuse(send, 408, "request_timeout",
                          f"the request body did not arrive within {self.seconds:g} s; nothing was done")
            return
        replay = iter(messages)

        async def replayed() -> Message:
            for message in replay:
                return message
            return await receive()

        await self.app(scope, replayed, send)


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def uvicorn_options(server: Any) -> dict[str, Any]:
    """The uvicorn.Config arguments [server]'s connection settings make."""
    return {"http": protocol_with_header_timeout(server.header_timeout_seconds),
            "timeout_keep_alive": server.keep_alive_seconds,
            "limit_concurrency": server.max_connections}


__all__ = ["MAX_BODY_BYTES", "BodyDeadline", "protocol_with_header_timeout", "uvicorn_options"]
