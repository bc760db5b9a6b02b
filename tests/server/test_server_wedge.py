"""``tether serve --http`` stays answerable while host work runs long, says when its loop is stuck, and
stops on SIGTERM whatever a run is doing (D-34).

The slow host work is a real one: describe() asked about 300 misspelled
addresses of a 2,000-operation OpenAPI description compares each with every
address for suggestions, seconds of work. The stuck loop
is a tool that blocks it (a synchronous ``time.sleep`` in a Python tool runs
on the loop): that is operator code, and the watchdog is how it is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from helpers import free_port

pytestmark = pytest.mark.slow

GRACE = 3.0

WEDGE_TOOLS = (Path(__file__).parent.parent / "fixtures" / "wedge_tools.py").read_text()

CONFIG = """\
[server]
max_concurrent_runs = 4
loop_stall_seconds = 1
shutdown_grace_seconds = {grace}

[sandbox]
max_workers = 2

[limits]
run_seconds = 1

[[sources]]
type = "openapi"
namespace = "big"
spec = "{spec}"
start_timeout = 60
"""


def _spec(operations: int) -> dict:
    paths = {f"/reports/{i}": {"get": {"operationId": f"report_{i}_items", "responses": {"200": {
        "description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}}}}
        for i in range(operations)}
    return {"openapi": "3.0.3", "info": {"title": "big", "version": "1"}, "servers": [{"url": "http://127.0.0.1:9"}],
            "paths": paths}


# describe() of 300 misspelled addresses: each is compared with the 2,000 addresses for suggestions.
MISSPELLED = "[f'big.report_{i}_itemz' for i in range(300)]"


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.base = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=GRACE + 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _start(root: Path) -> Served:
    root.mkdir(parents=True, exist_ok=True)
    (root / "wedge_tools.py").write_text(WEDGE_TOOLS)
    spec = root / "big.json"
    spec.write_text(json.dumps(_spec(2000)))
    (root / "tether.toml").write_text(CONFIG.format(grace=GRACE, spec=spec))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env["TETHER_HOME"] = str(root / "home")
    log = root / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), "serve",
             "--http", f"127.0.0.1:{port}", "--dev", "--tools", str(root / "wedge_tools.py")],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    served = Served(proc, port, log)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        if time.monotonic() > deadline:
            served.stop()
            raise AssertionError(f"server did not listen: {log.read_text()}")
        time.sleep(0.05)
    return served


@pytest.fixture
def served(tmp_path):
    s = _start(tmp_path / "srv")
    try:
        yield s
    finally:
        s.stop()


async def _execute(s: Served, code: str) -> dict:
    async with create_mcp_http_client() as http:
        async with Client(streamable_http_client(f"{s.base}/mcp", http_client=http), mode="auto") as client:
            r = await client.call_tool("execute", {"code": code})
            return r.structured_content or {}


async def test_a_long_describe_fails_by_name_while_healthz_and_another_run_answer_then_sigterm_stops(served):
    latencies: list[float] = []
    slow = asyncio.ensure_future(_execute(served, f"await describe({MISSPELLED})"))
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.sleep(0.3)
        other = asyncio.ensure_future(_execute(served, "6 * 7"))
        # Until the describe has both failed and stopped working in the background (seconds after).
        end = time.monotonic() + 6
        while time.monotonic() < end:
            t = time.monotonic()
            assert (await http.get(f"{served.base}/healthz")).status_code == 200
            latencies.append(time.monotonic() - t)
            await asyncio.sleep(0.1)
    result, quick = await slow, await other
    assert quick.get("status") == "completed" and quick.get("result") == 42, quick
    assert result.get("status") == "failed" and result["error"]["code"] == "host_work_timeout", result
    assert max(latencies) < 1.0, latencies
    # SIGTERM during describe work: the server stops within its grace period.
    again = asyncio.ensure_future(_execute(served, f"await describe({MISSPELLED})"))
    await asyncio.sleep(0.5)
    served.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(served.proc.wait, GRACE + 10)
    again.cancel()
    with contextlib.suppress(BaseException):
        await again


async def test_a_stuck_loop_fails_readyz_names_the_run_and_call_and_sigterm_still_stops_the_server(served):
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{served.base}/readyz")).status_code == 200
        wedged = asyncio.ensure_future(_execute(served, "import tools\nawait tools.wedge.block(seconds=3)"))
        await asyncio.sleep(1.0)
        # Sent while the loop is held; answered once it is free, before the watchdog has seen it answer on time.
        during = await http.get(f"{served.base}/readyz")
        assert during.status_code == 503 and during.json() == {"status": "unavailable"}
        assert (await wedged).get("status") == "completed"
        deadline = time.monotonic() + 10
        while (await http.get(f"{served.base}/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "readyz never recovered"
            await asyncio.sleep(0.1)
    log = served.log.read_text()
    assert "event loop stuck" in log and "call 1 (wedge.block)" in log, log
    # A run that holds the loop for good: SIGTERM ends the process after the grace period.
    forever = asyncio.ensure_future(_execute(served, "import tools\nawait tools.wedge.block(seconds=600)"))
    await asyncio.sleep(1.0)
    t = time.monotonic()
    served.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(served.proc.wait, GRACE + 10)
    assert time.monotonic() - t < GRACE + 10
    forever.cancel()
    with contextlib.suppress(BaseException):
        await forever
    assert "exiting now" in served.log.read_text()
