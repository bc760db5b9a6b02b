"""An OpenAPI source against a hostile API: real uvicorn servers on 127.0.0.1, each its own origin.

What the operator configured (auth, headers) goes only to the API's origin; what
the API answers (cookies, a body of any size) cannot outlive the call or fill
the host's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from helpers import served_in_thread
from tether._sources._openapi_http import RESPONSE_LIMIT
from tether._sources.openapi import OpenAPISource
from tether.errors import ToolError

KEY = "k3y-" + "h" * 20
MiB = 1 << 20


class _Api:
    """One origin that records what reached it and answers as the test tells it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str | None]] = []
        self.url = ""

    async def endpoint(self, request: Request) -> Response:
        self.seen.append({"path": request.url.path, "key": request.headers.get("x-api-key"),
                          "client": request.headers.get("x-client"), "cookie": request.headers.get("cookie"),
                          "query_key": request.query_params.get("api_key")})
        if request.url.path == "/login":
            answer = JSONResponse({"signed_in": True})
            answer.set_cookie("session", "first-callers-session")
            return answer
        return JSONResponse({"ok": True})


@pytest.fixture
def origins(monkeypatch):
    """The API and another origin (same host, another port: another origin, as browsers and httpx count them)."""
    monkeypatch.setenv("TETHER_TEST_HOSTILE_KEY", KEY)
    apis = [_Api(), _Api()]
    with contextlib.ExitStack() as running:
        for api in apis:
            app = Starlette(routes=[Route("/{rest:path}", api.endpoint, methods=["GET", "POST"])])
            api.url = running.enter_context(served_in_thread(app))
        yield apis


@pytest.fixture
def endless():
    """A server that answers every request 200 with a body three times the limit, and counts what it wrote.

    Raw sockets, not uvicorn: an ASGI server keeps consuming a streamed body after
    its client has gone, so only the socket shows when the reader stopped.
    """
    written = {"bytes": 0}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        size = RESPONSE_LIMIT * 3
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % size)
        chunk = b"x" * MiB
        try:
            for _ in range(size // MiB):
                writer.write(chunk)
                await writer.drain()
                written["bytes"] += len(chunk)
        except OSError:
            pass  # the reader hung up: what this fixture waits for
        writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(answer, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", written
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    server.close()
    loop.close()


def _get(operation_id: str, **extra: object) -> dict[str, object]:
    return {"get": {"operationId": operation_id, "responses": {"200": {"description": "ok"}}, **extra}}


def _spec(elsewhere: str) -> dict[str, object]:
    return {"openapi": "3.0.3", "info": {"title": "hostile", "version": "1"}, "paths": {
        "/login": _get("login"), "/whoami": _get("whoami"), "/huge": _get("huge"),
        # A description may give one operation its own server; this one names another origin.
        "/upload": _get("upload", servers=[{"url": elsewhere}]),
    }}


async def _source(api: _Api, elsewhere: _Api, auth: list[dict[str, str]]) -> OpenAPISource:
    source = OpenAPISource("hostile", _spec(elsewhere.url), base_url=api.url, auth=auth,
                           headers={"X-Client": "tether ${TETHER_TEST_HOSTILE_KEY}"})
    await source.start()
    return source


HEADER_AUTH = [{"type": "header", "name": "X-API-Key", "value_env": "TETHER_TEST_HOSTILE_KEY"}]
QUERY_AUTH = [{"type": "query", "name": "api_key", "value_env": "TETHER_TEST_HOSTILE_KEY"}]


async def test_a_cookie_the_api_sets_is_not_sent_with_later_calls(origins):
    # One source serves every run and principal of the process: a session cookie
    # kept from one call would make the next caller's calls act as the first.
    api, other = origins
    source = await _source(api, other, HEADER_AUTH)
    try:
        tools = {t.name: t for t in source.tools()}
        assert await tools["login"].handler({}) == {"signed_in": True}
        await tools["whoami"].handler({})
    finally:
        await source.close()
    assert [seen["cookie"] for seen in api.seen] == [None, None]


@pytest.mark.parametrize("auth", [HEADER_AUTH, QUERY_AUTH], ids=["header", "query"])
async def test_credentials_go_only_to_the_configured_origin(origins, auth):
    api, other = origins
    source = await _source(api, other, auth)
    try:
        tools = {t.name: t for t in source.tools()}
        await tools["whoami"].handler({})
        assert await tools["upload"].handler({}) == {"ok": True}  # the call itself still goes where the spec says
    finally:
        await source.close()
    at_api, = api.seen
    assert KEY in (at_api["key"], at_api["query_key"]) and at_api["client"] == f"tether {KEY}"
    elsewhere, = other.seen
    assert elsewhere["path"] == "/upload"
    assert (elsewhere["key"], elsewhere["query_key"], elsewhere["client"]) == (None, None, None)


async def test_an_answer_larger_than_the_limit_is_refused_while_reading(endless, monkeypatch):
    url, written = endless
    monkeypatch.setenv("TETHER_TEST_HOSTILE_KEY", KEY)
    source = OpenAPISource("hostile", _spec(url), base_url=url, auth=HEADER_AUTH)
    await source.start()
    try:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError) as caught:
            await tools["huge"].handler({})
    finally:
        await source.close()
    assert caught.value.details["code"] == "response_too_large"
    assert caught.value.details["sent"] is True and caught.value.details["status"] == 200
    assert "the request was sent" in caught.value.message
    # Reading stopped near the limit (the rest is socket buffers): the host never held the whole answer.
    await asyncio.sleep(0.5)
    assert written["bytes"] < RESPONSE_LIMIT * 2
