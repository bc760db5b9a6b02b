"""Connection hygiene ([server]): slow headers, slow bodies and idle keep-alive connections are closed.

A real uvicorn listener on a free port with tether's protocol and middleware, driven over raw sockets.
The timeouts are short; the bounds the test waits are long, so they only tell a close from a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

import pytest
import uvicorn

from tether._config import Config
from tether._logs import configure
from tether._server.connections import BodyDeadline, uvicorn_options

HANG = 10.0  # far above every timeout set here


async def _echo(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def listening(max_body: int = 1 << 20, **server):
    settings = Config.from_dict({"server": {"header_timeout_seconds": 0.3, "body_timeout_seconds": 0.3,
                                            "keep_alive_seconds": 0.3, **server}}).server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(BodyDeadline(_echo, settings.body_timeout_seconds, max_body), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off", **uvicorn_options(settings))
    srv = uvicorn.Server(config)
    task = asyncio.ensure_future(srv.serve())
    while not srv.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        await task


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (a hang fails the test)."""
    return await asyncio.wait_for(reader.read(), HANG)


async def test_headers_that_never_finish_are_cut_off():
    async with listening() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        await writer.drain()
        assert await _closed(reader) == b""
        writer.close()


async def test_a_silent_connection_is_cut_off():
    async with listening() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed(reader) == b""
        writer.close()


async def test_a_body_that_never_finishes_gets_408_and_the_app_never_sees_it():
    async with listening() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        answer = await _closed(reader)
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"request_timeout" in answer and b"nothing was done" in answer
        writer.close()


async def test_a_body_past_the_bound_gets_413():
    async with listening(max_body=1000) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000)
        await writer.drain()
        answer = await _closed(reader)
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
        writer.close()


async def test_a_prompt_request_is_served_and_an_idle_keep_alive_is_then_closed():
    async with listening() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        answer = await _closed(reader)  # served, then closed once idle past keep_alive_seconds
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
        writer.close()


def test_connection_settings_are_validated():
    from tether.errors import ConfigError

    with pytest.raises(ConfigError, match="header_timeout_seconds"):
        Config.from_dict({"server": {"header_timeout_seconds": 0}})


def test_json_logs_carry_the_run_id_and_correlation_id():
    import io

    stream = io.StringIO()
    handler = configure("json", "info", stream)
    try:
        logging.getLogger("tether.runs").error("internal error in run r1", extra={"run_id": "r1",
                                                                                   "correlation_id": "c0ffee"})
        logging.getLogger("tether.runs").debug("not shown at info")
    finally:
        logger = logging.getLogger("tether")
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    (line,) = stream.getvalue().splitlines()
    data = json.loads(line)
    assert data["run_id"] == "r1" and data["correlation_id"] == "c0ffee"
    assert data["level"] == "error" and data["logger"] == "tether.runs" and data["ts"].endswith("Z")


def test_json_logs_are_json_from_the_servers_first_line_to_its_last(tmp_path):
    """With [log] format = "json" a log pipeline reads every line `serve` writes: what it serves, and the
    warnings about its settings (a webhook left off for want of its secret, a short token under --dev)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "tether.toml").write_text(
        '[log]\nformat = "json"\n\n[[notify]]\nurl = "http://127.0.0.1:9/hook"\nsecret_env = "UNSET_HOOK_SECRET"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "UNSET_HOOK_SECRET")}
    env.update(TETHER_HOME=str(tmp_path / "home"), TETHER_TOKEN="short")
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"),
                                 "serve", "--http", f"127.0.0.1:{port}", "--dev"],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    messages = [(d["level"], d["message"]) for d in lines]
    assert any(level == "warning" and "notify[0]" in m and "is off" in m for level, m in messages), messages
    assert any(level == "warning" and "shorter than" in m for level, m in messages), messages
    assert any(level == "info" and m.startswith("tether: serving MCP at") for level, m in messages), messages
