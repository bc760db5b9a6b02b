"""A message that reaches an MCP session just after it ended: one quiet line, not two tracebacks (D-92).

The Python MCP SDK's client, cancelling a call and closing at once, sends ``notifications/cancelled`` and its
session's ``DELETE`` together; when the ``DELETE`` is handled first, the SDK's streamable HTTP transport answers
the notification 202, then finds the session's stream closed (``anyio.ClosedResourceError``). It logs that with a
traceback ("Error handling POST request"), tries to answer 500 on the response it already completed, and the
server logs a second traceback ("Exception in ASGI application"). Nothing is lost — the session, and the call the
notification cancelled, were already gone — so an operator is told in one line.

Narrow on purpose, so real errors keep their tracebacks: only the SDK's record for that handler whose exception is
``ClosedResourceError``, and only an exception raised after the response was complete whose chain holds one.
"""

from __future__ import annotations

import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether._logs import say

SDK_LOGGER = "mcp.server.streamable_http"
SDK_MESSAGE = "Error handling POST request"


def _closed_stream(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 16:  # a chain is short; a cycle must not loop
        if isinstance(exc, anyio.ClosedResourceError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _EndedSessionRecord(logging.Filter):
    """Drops the SDK's traceback for a message its ended session could not take; EndedSessions says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (record.msg == SDK_MESSAGE and isinstance(exc, anyio.ClosedResourceError))


_FILTER = _EndedSessionRecord()


def quiet_sdk_record() -> None:
    """Install the filter on the SDK's transport logger (once per process)."""
    logger = logging.getLogger(SDK_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


class EndedSessions:
    """Around the SDK's MCP app: an exception after the response was complete, caused by the session's closed
    stream, is one line instead of a traceback; anything else goes on as it was."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        quiet_sdk_record()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                answered = True

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if not (answered and _closed_stream(exc)):
                raise
            session = next((v.decode("latin-1")[:64] for k, v in scope.get("headers", [])
                            if k.lower() == b"mcp-session-id"), "?")
            say(f"tether: a message for MCP session {session} arrived as the session ended (its client closed it); "
                "the session was gone, so it was dropped", level=logging.INFO)
