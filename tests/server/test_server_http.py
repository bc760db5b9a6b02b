"""``tether serve --http`` in a subprocess, driven by the real ``mcp`` client in both protocol eras.

One server serves the module (bearer tokens ``alpha-token-…`` and ``beta-token-…``,
two run slots, a queue of two). Writes are counted by the ``ledger`` tools the
server loads from a file: each delivery appends a line the test reads back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import ElicitResult

from helpers import free_port
from tether._store import open_store

pytestmark = pytest.mark.slow

ERAS = [pytest.param("legacy", id="legacy"), pytest.param("auto", id="modern")]
ALPHA, BETA = "alpha-token-0123456789", "beta-token-0123456789"

LEDGER_TOOLS = '''\
"""Writes that leave a line in the file named by $LEDGER, so a test can count deliveries."""
import asyncio
import os

from tether._sources.python import tool

TETHER_NAMESPACE = "ledger"


def _append(tag: str) -> None:
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as f:
        f.write(tag + "\\n")


@tool(read_only=True)
async def wait(seconds: float) -> str:
    """Answer after `seconds`."""
    await asyncio.sleep(seconds)
    return "late"


@tool
async def write(tag: str, seconds: float = 0) -> str:
    """Record `tag`, then take `seconds` to answer. Allowed without asking (see the config)."""
    _append(tag)
    await asyncio.sleep(seconds)
    return tag


@tool
async def guarded_write(tag: str) -> str:
    """Record `tag`; asks for approval first."""
    _append(tag)
    return tag
'''

CONFIG = """\
[server]
max_concurrent_runs = 2
queue_depth = 2
queue_timeout_seconds = 30

[sandbox]
max_workers = 2

[[policy.rules]]
match = "ledger.write"
action = "allow"
"""


class Served:
    def __init__(self, proc: subprocess.Popen, url: str, home: Path, ledger: Path, log: Path) -> None:
        self.proc, self.url, self.home, self.ledger, self.log = proc, url, home, ledger, log

    def tags(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def store(self):
        return open_store(f"sqlite:///{self.home}/tether.db")


def start_server(root: Path, *extra: str, token: str | None = None, config: str = CONFIG) -> Served:
    root.mkdir(parents=True, exist_ok=True)
    (root / "ledger_tools.py").write_text(LEDGER_TOOLS)
    (root / "tether.toml").write_text(config)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env.update(TETHER_HOME=str(root / "home"), LEDGER=str(root / "ledger.txt"))
    if token:
        env["TETHER_TOKEN"] = token
    log = root / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), "serve",
             "--http", f"127.0.0.1:{port}", "--tools", "tether.demo.helpdesk",
             "--tools", str(root / "ledger_tools.py"), *extra],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        if time.monotonic() > deadline:
            stop_server(proc)
            raise AssertionError(f"server did not listen: {log.read_text()}")
        time.sleep(0.05)
    return Served(proc, f"http://127.0.0.1:{port}/mcp", root / "home", root / "ledger.txt", log)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("http"), token=f"{ALPHA},{BETA}")
    try:
        yield s
    finally:
        stop_server(s.proc)
    assert s.proc.returncode == 0, s.log.read_text()


@contextlib.asynccontextmanager
async def connect(url: str, token: str | None, mode: str, **kwargs):
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client:
            yield client


async def approve(context, params):
    return ElicitResult(action="accept", content={"decision": "approve"})


# -- auth ------------------------------------------------------------------------------


async def test_a_request_without_a_valid_token_gets_401_and_the_server_keeps_serving(served):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient() as http:
        missing = await http.post(served.url, json=body)
        wrong = await http.post(served.url, json=body, headers={"Authorization": "Bearer nope"})
        basic = await http.post(served.url, json=body, headers={"Authorization": "Basic YWxwaGE="})
    for response, code in ((missing, "missing_token"), (wrong, "invalid_token"), (basic, "missing_token")):
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"
        assert response.headers["www-authenticate"].startswith("Bearer")
        error = response.json()["error"]
        assert error["code"] == code and "TETHER_TOKEN" in error["next_action"]
    async with connect(served.url, ALPHA, "auto") as c:
        assert (await c.call_tool("execute", {"code": "6 * 7"})).structured_content["result"] == 42


# -- runs ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_execute_pause_and_resume_over_http(served, mode):
    tag = f"resume-{mode}"
    progress: list[float] = []

    async def on_progress(value, total, message):
        progress.append(value)

    async with connect(served.url, ALPHA, mode) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert names == {"execute", "resume", "cell_start", "cell_wait", "cell_terminate"}
        r = await c.call_tool("execute", {"code": "import tools\nlen(await tools.helpdesk.list_tickets(status='open'))"},
                              progress_callback=on_progress)
        assert r.structured_content["status"] == "completed" and r.structured_content["result"] > 0
        assert progress and progress[-1] == 1
        r = await c.call_tool("execute", {"code": f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"})
        paused = r.structured_content
        assert paused["status"] == "paused" and "resume" in r.content[0].text
        assert tag not in served.tags()
        # Over HTTP the token that ran the program does not approve its writes (D-31):
        # resume says where a person approves, and sends nothing.
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve",
                                         "seq": paused["pending"]["seq"]})
        assert r.is_error and r.structured_content["error"]["code"] == "approval_elsewhere"
        assert "/console/runs/" + paused["run_id"] in r.structured_content["error"]["message"]
        assert tag not in served.tags()
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "decline", "reason": "not now",
                                         "seq": paused["pending"]["seq"]})
        assert r.structured_content["status"] == "failed"
        assert r.structured_content["error"]["code"] == "write_declined"
    assert tag not in served.tags()


@pytest.mark.parametrize("mode", ERAS)
async def test_p36_a_keyed_execute_over_http_is_one_run_per_token_and_key(served, mode):
    tag = f"keyed-{mode}"
    code = f"import tools\nawait tools.ledger.write(tag='{tag}')"
    async with connect(served.url, ALPHA, mode) as alice, connect(served.url, BETA, mode) as bob:
        first = (await alice.call_tool("execute", {"code": code, "key": tag})).structured_content
        # A new connection, as a client that lost the first one would open: the same run.
        async with connect(served.url, ALPHA, mode) as again:
            retried = (await again.call_tool("execute", {"code": code, "key": tag})).structured_content
        # The key is alice's: bob's request with the same key is his own run.
        theirs = (await bob.call_tool("execute", {"code": code, "key": tag})).structured_content
    assert first["status"] == retried["status"] == theirs["status"] == "completed"
    assert retried["run_id"] == first["run_id"] != theirs["run_id"]
    assert served.tags().count(tag) == 2


@pytest.mark.parametrize("mode", ERAS)
async def test_form_elicitation_over_http_sends_the_write_exactly_once(served, mode):
    tag = f"form-{mode}"
    async with connect(served.url, ALPHA, mode, elicitation_callback=approve) as c:
        r = await c.call_tool("execute", {"code": f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"})
    assert r.structured_content["status"] == "completed", r.content[0].text
    assert served.tags().count(tag) == 1
    store = served.store()
    try:
        calls = store.get_calls(r.structured_content["run_id"])
    finally:
        store.close()
    assert [(c.address, c.state) for c in calls] == [("ledger.guarded_write", "sent")]


@pytest.mark.parametrize("mode", ERAS)
async def test_malformed_arguments_are_named_and_the_server_keeps_serving(served, mode):
    async with connect(served.url, ALPHA, mode) as c:
        for name, args in (("execute", {}), ("execute", {"code": ["x"]}), ("resume", {"run_id": "r"}),
                           ("resume", {"run_id": "r", "decision": "yes"})):
            r = await c.call_tool(name, args)
            assert r.is_error and r.structured_content["error"]["code"] == "invalid_arguments", (name, args)
            assert r.content[0].text.startswith("[invalid_arguments]")
        r = await c.call_tool("resume", {"run_id": "run_0000", "decision": "approve"})
        assert r.structured_content["error"]["code"] == "run_not_found"
        assert (await c.call_tool("execute", {"code": "'alive'"})).structured_content["result"] == "alive"


@pytest.mark.parametrize("mode", ERAS)
async def test_another_principals_run_is_run_not_found(served, mode):
    tag = f"principal-{mode}"
    async with connect(served.url, ALPHA, mode) as alice:
        paused = (await alice.call_tool(
            "execute", {"code": f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"})).structured_content
        async with connect(served.url, BETA, mode) as bob:
            r = await bob.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve"})
            assert r.is_error and r.structured_content["error"]["code"] == "run_not_found"
            r = await bob.call_tool("resume", {"run_id": paused["run_id"], "decision": "cancel"})
            assert r.is_error and r.structured_content["error"]["code"] == "run_not_found"
        assert tag not in served.tags()
        r = await alice.call_tool("resume", {"run_id": paused["run_id"], "decision": "cancel"})
        assert r.structured_content["status"] == "cancelled"
    assert tag not in served.tags()


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_gives_up_cancels_its_run(served, mode):
    tag = f"after-cancel-{mode}"
    code = f"import tools\nawait tools.ledger.wait(seconds=1)\nawait tools.ledger.write(tag='{tag}')"
    async with connect(served.url, ALPHA, mode) as c:
        with anyio.move_on_after(0.5):
            await c.call_tool("execute", {"code": code})
    store = served.store()
    try:
        run = next(r for r in store.list_runs(limit=20) if tag in r.program)
        with anyio.fail_after(10):
            while store.get_run(run.run_id).status != "cancelled":
                await asyncio.sleep(0.05)
    finally:
        store.close()
    await asyncio.sleep(0.2)
    assert tag not in served.tags()


@pytest.mark.parametrize("mode", ERAS)
async def test_overload_two_slots_a_queue_of_two_and_ten_long_runs(served, mode):
    prefix = f"load-{mode}-"

    async def one(i: int):
        async with connect(served.url, ALPHA, mode) as c:
            code = f"import tools\nawait tools.ledger.write(tag='{prefix}{i}', seconds=1)"
            return await c.call_tool("execute", {"code": code})

    results = await asyncio.gather(*[one(i) for i in range(10)])
    ok = [r for r in results if not r.is_error]
    over = [r.structured_content["error"] for r in results if r.is_error]
    assert len(ok) == 4, [r.content[0].text[:200] for r in results]
    assert len(over) == 6
    assert all(e["code"] == "overloaded" and e["details"]["retry_after_ms"] > 0 for e in over)
    delivered = [t for t in served.tags() if t.startswith(prefix)]
    assert len(delivered) == 4 and len(set(delivered)) == 4  # none lost, none twice
    assert sorted(delivered) == sorted(r.structured_content["result"] for r in ok)


async def test_d74_one_token_holding_every_slot_and_the_line_cannot_keep_anothers_run_out(served):
    prefix = "fair-"

    async def one(token: str, tag: str, seconds: float):
        async with connect(served.url, token, "auto") as c:
            code = f"import tools\nawait tools.ledger.write(tag='{tag}', seconds={seconds})"
            return await c.call_tool("execute", {"code": code})

    # Alpha: two long runs in the two slots, two more in the line of two, and a fifth refused.
    # Their runs are long enough for beta's request to arrive while they hold both slots.
    alpha = [asyncio.ensure_future(one(ALPHA, f"{prefix}alpha-{i}", 6)) for i in range(5)]
    done, _ = await asyncio.wait(alpha, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    refused = done.pop().result()
    assert refused.is_error and refused.structured_content["error"]["code"] == "overloaded"
    # Beta's one request still gets in, and runs in the next slot freed.
    beta = await one(BETA, f"{prefix}beta", 0)
    assert not beta.is_error and beta.structured_content["result"] == f"{prefix}beta"
    results = await asyncio.gather(*alpha)
    over = [r.structured_content["error"] for r in results if r.is_error]
    assert len(over) == 2 and all(e["details"]["retry_after_ms"] > 0 for e in over)
    assert sum("gave up its place" in e["message"] for e in over) == 1  # alpha's latest, for beta's
    delivered = [t for t in served.tags() if t.startswith(prefix)]
    assert sorted(delivered) == sorted([f"{prefix}beta"] + [r.structured_content["result"] for r in results
                                                            if not r.is_error])


# -- starting ----------------------------------------------------------------------------


def test_http_without_a_token_refuses_to_start(tmp_path):
    (tmp_path / "tether.toml").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "TETHER_TOKEN"}
    env["TETHER_HOME"] = str(tmp_path / "home")
    cases = [
        (["--http", f"127.0.0.1:{free_port()}"], "needs a bearer token"),
        (["--http", f"0.0.0.0:{free_port()}", "--dev"], "only to a loopback address"),
    ]
    for args, message in cases:
        done = subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"),
                               "serve", *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "next:" in done.stderr


async def test_dev_serves_loopback_without_a_token(tmp_path):
    s = start_server(tmp_path, "--dev")
    try:
        async with connect(s.url, None, "auto") as c:
            r = await c.call_tool("execute", {"code": "import tools\nawait tools.ledger.guarded_write(tag='dev')"})
            assert r.structured_content["status"] == "paused"
        store = s.store()
        try:
            assert store.get_run(r.structured_content["run_id"]).principal == "local"
        finally:
            store.close()
        # DNS rebinding (P-33): under --dev anyone who reaches the console may sign in, so a page
        # under another name that resolved to 127.0.0.1 must reach neither the console nor /mcp.
        base = s.url.rsplit("/mcp", 1)[0]
        forged = {"host": "rebind.attacker.example"}
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/console/login", headers=forged)).status_code == 421
            posted = await http.post("/console/login", headers=forged, data={"token": ""})
            assert posted.status_code == 421 and "set-cookie" not in posted.headers
            assert (await http.post("/mcp", headers={**forged, "content-type": "application/json"},
                                    content=b"{}")).status_code == 421
            assert (await http.get("/console/login")).status_code == 200  # its own name still works
    finally:
        stop_server(s.proc)
    assert s.proc.returncode == 0, s.log.read_text()
    assert s.tags() == []
