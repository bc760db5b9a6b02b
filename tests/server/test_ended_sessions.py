"""A message that reaches an MCP session as its client ends it is one quiet line on the server, never a traceback
(D-92).

The Python MCP SDK's client, cancelling a call and closing at once, sends ``notifications/cancelled`` and its
session's ``DELETE`` together. When the ``DELETE`` is handled first, the SDK's transport finds the session's stream
closed: before, ``tether serve`` logged two tracebacks for it ("Error handling POST request" with
``ClosedResourceError``, then uvicorn's "Exception in ASGI application", which also dropped the connection). An
error that is not this one keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging

import anyio
import httpx
import pytest

from tether._runtime import Runtime
from tether._server.ended_sessions import EndedSessions
from tether._server.mcp import TetherServer
from tether._server.start import mcp_asgi

VERSION = "2025-11-25"
HEADERS = {"Accept": "application/json, text/event-stream",
           "Content-Type": "application/json"}
ENDED = "arrived as the session ended"


async def test_d92_a_cancel_arriving_after_its_sessions_delete_is_one_line_not_a_traceback(caplog, capsys):
    """The served ``/mcp`` app (``mcp_asgi``, as ``tether serve --http`` builds it) with the SDK's session manager,
    in this process so the race is decided, not hoped for: the notification reaches the session before the DELETE
    is handled, and is handed to it only after the DELETE ended the session."""
    caplog.set_level(logging.DEBUG)
    async with Runtime(type_check=False) as rt:
        server = TetherServer(rt)
        served = mcp_asgi(server, "127.0.0.1", False, None)
        deleted, holding = asyncio.Event(), asyncio.Event()

        async def app(scope, receive, send):
            # The cancel's answer leaves as slowly as over a busy network: the SDK has found the session, still
            # open, and answers 202 before handing the message on; the DELETE is handled meanwhile.
            async def slow(message):
                if message["type"] == "http.response.start":
                    holding.set()
                    await deleted.wait()
                await send(message)

            held = scope["type"] == "http" and (b"x-slow", b"1") in scope["headers"]
            await served(scope, receive, slow if held else send)

        async with server.mcp.session_manager.run(), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000", timeout=30) as http:
            r = await http.post("/mcp", headers=HEADERS, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
            assert r.status_code == 200, r.text
            h = {**HEADERS, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": VERSION}
            assert (await http.post("/mcp", headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
                    ).status_code == 202
            cancel = asyncio.ensure_future(http.post("/mcp", headers={**h, "x-slow": "1"}, json={
                "jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 2, "reason": "the client gave up"}}))
            await asyncio.wait_for(holding.wait(), 30)
            assert (await http.delete("/mcp", headers=h)).status_code == 200
            deleted.set()
            cancelled = await asyncio.wait_for(cancel, 30)
    assert cancelled.status_code == 202  # answered before the SDK found the session gone
    tracebacks = [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.ERROR]
    assert tracebacks == [], [(rec.name, rec.getMessage(), rec.exc_info) for rec in tracebacks]
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count(ENDED) == 1, err


async def _answered_then(exc: BaseException):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        raise exc
    return app


@pytest.mark.parametrize("exc", [ValueError("a real bug"), RuntimeError("after the answer")])
async def test_d92_any_other_error_after_the_answer_still_propagates(exc):
    """Only an error the session's closed stream caused is quieted: any other reaches the server's log."""
    app = EndedSessions(await _answered_then(exc))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        with pytest.raises(type(exc)):
            await http.post("/mcp", json={})


async def test_d92_a_closed_stream_before_any_answer_still_propagates():
    """A closed stream before the client was answered is not this case: the error propagates (uvicorn answers 500
    and logs it)."""
    async def app(scope, receive, send):
        raise anyio.ClosedResourceError

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=EndedSessions(app)), base_url="http://t") as http:
        with pytest.raises(anyio.ClosedResourceError):
            await http.post("/mcp", json={})


async def test_d92_a_closed_stream_after_the_answer_is_quiet(capsys):
    app = EndedSessions(await _answered_then(anyio.ClosedResourceError()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        r = await http.post("/mcp", json={}, headers={"mcp-session-id": "abc"})
    assert r.status_code == 202
    assert "a message for MCP session abc arrived as the session ended" in capsys.readouterr().err
