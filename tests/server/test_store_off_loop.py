"""On Postgres the server's requests read the store in the store's own threads, never on the event loop (D-27).

Each test holds one request's store read (the Postgres store's method waits on a ``threading.Event``) and
has the same server answer another request meanwhile; then lets the read go, and the first request answers
as it always did. A read made on the event loop would hold the loop too: the other request could not be
answered until the hold gave up (``HOLD_SECONDS``), and the test fails on the hold having run out.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Callable

import httpx
import psycopg
import pytest
from mcp import Client
from mcp_types import ElicitResult

from helpers import Recorder
from tether._engine.approvals import APPROVE, RUN, Access, Grant
from tether._engine.rules.limits import Limits
from tether._runtime import Runtime
from tether._server.approvals import link_token
from tether._server.auth import principal_for_token
from tether._server.console import Console
from tether._server.mcp import TetherServer
from tether._store.postgres import PostgresStore
from tether._store.states import RunStatus

# How long a held read waits to be let go: only a read that blocks the loop waits this long (then fails).
HOLD_SECONDS = 15.0
CLOSE_3 = "import tools\nawait tools.helpdesk.close_ticket(id=3)"
TOKEN = "alice-token-0123456789"


class Hold:
    """Holds the first call of one Postgres store method (once armed) whose result ``matches``, until released."""

    def __init__(self, store: PostgresStore, method: str, matches: Callable[[Any], bool] = lambda _r: True) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.ran_out = False  # the hold gave up: nobody released it while it held
        self.armed = False
        self._lock = threading.Lock()
        real = getattr(store, method)

        def held(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            with self._lock:
                take = self.armed and not self.entered.is_set() and matches(result)
                if take:
                    self.entered.set()
            if take:
                self.ran_out = not self.released.wait(HOLD_SECONDS)
            return result

        setattr(store, method, held)

    async def while_held(self, first: Any, other: Callable[[], Any]) -> tuple[Any, Any]:
        """Start ``first``; once its read is held, ``other()`` must be answered; then release ``first``."""
        self.armed = True
        task = asyncio.ensure_future(first)
        try:
            entered = await asyncio.to_thread(self.entered.wait, HOLD_SECONDS)
            assert entered, "the request never made the read this test holds"
            answered = await asyncio.wait_for(other(), HOLD_SECONDS)
            assert not self.ran_out and not task.done(), \
                "the server answered nothing while one request's store read was held: the read ran on the event loop"
        finally:
            self.released.set()
        return await asyncio.wait_for(task, HOLD_SECONDS), answered


@pytest.fixture
def pg_store(pg_url):
    schema = f"t_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(pg_url, schema=schema)
    try:
        yield store
    finally:
        store.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def rt(pg_store):
    assert pg_store.capabilities.offloads
    async with Runtime(store=pg_store, tools=Recorder().tools(), type_check=False,
                       limits=Limits(run_seconds=10, call_timeout_seconds=5)) as runtime:
        yield runtime


def _paused(run: Any) -> bool:
    return run is not None and run.status == RunStatus.PAUSED


async def _answers(server: TetherServer) -> Any:
    async with Client(server.mcp, mode="legacy") as c:
        r = await c.call_tool("execute", {"code": "6 * 7"})
    assert r.structured_content["result"] == 42
    return r


async def test_d27_execute_that_pauses_reads_how_to_approve_off_the_loop(rt, pg_store):
    """execute → paused result: whether the run's principal approves here (``_approves_here``) is read off the loop."""
    server = TetherServer(rt)
    hold = Hold(pg_store, "get_run", _paused)

    async def paused() -> Any:
        async with Client(server.mcp, mode="legacy") as c:
            return await c.call_tool("execute", {"code": CLOSE_3})

    r, _ = await hold.while_held(paused(), lambda: _answers(server))
    data = r.structured_content
    assert data["status"] == "paused" and "helpdesk.close_ticket(id=3)" in r.content[0].text


async def test_d27_execute_whose_write_is_put_as_a_form_reads_the_rules_off_the_loop(rt, pg_store):
    """execute (2026 era, form elicitation) → input-required: whether the write needs a signed-in approver
    (``_needs_sign_in``) is read off the loop; the form's answer then completes the run."""
    server = TetherServer(rt)
    hold = Hold(pg_store, "get_run", _paused)
    asked: list[str] = []

    async def approve(_context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"decision": "approve"})

    async def formed() -> Any:
        async with Client(server.mcp, mode="auto", elicitation_callback=approve) as c:
            return await c.call_tool("execute", {"code": CLOSE_3})

    r, _ = await hold.while_held(formed(), lambda: _answers(server))
    assert r.structured_content["status"] == "completed", r.content[0].text
    assert r.structured_content["result"] == {"id": 3, "status": "closed"} and len(asked) == 1


async def test_d27_a_decline_through_resume_reads_the_run_off_the_loop(rt, pg_store):
    """resume → the decision service reads the paused run (and its pause) off the loop, then continues it."""
    server = TetherServer(rt)
    caught = "import tools\ntry:\n    r = await tools.helpdesk.close_ticket(id=3)\nexcept PermissionError as e:\n" \
             "    r = 'not sent: ' + str(e)\nr"
    async with Client(server.mcp, mode="legacy") as c:
        paused = (await c.call_tool("execute", {"code": caught})).structured_content
        assert paused["status"] == "paused"
        hold = Hold(pg_store, "get_run", _paused)
        r, _ = await hold.while_held(
            c.call_tool("resume", {"run_id": paused["run_id"], "decision": "decline", "seq": paused["pending"]["seq"],
                                   "reason": "not today"}),
            lambda: _answers(server))
    assert r.structured_content["status"] == "completed", r.content[0].text
    assert r.structured_content["result"].startswith("not sent") and "not today" in r.structured_content["result"]


async def test_d27_cell_wait_reads_the_cell_off_the_loop(rt, pg_store):
    """cell_wait → the cell's run and its observation are read off the loop."""
    server = TetherServer(rt)
    async with Client(server.mcp, mode="legacy") as c:
        started = (await c.call_tool("cell_start", {"code": CLOSE_3, "yield_after_ms": 5000})).structured_content
        assert started["status"] == "paused"
        hold = Hold(pg_store, "get_run", _paused)
        r, _ = await hold.while_held(c.call_tool("cell_wait", {"cell_id": started["cell_id"], "timeout_ms": 0}),
                                     lambda: _answers(server))
    assert r.structured_content["status"] == "paused" and r.structured_content["cell_id"] == started["cell_id"]


def _console(rt: Runtime) -> Console:
    return Console(rt, tokens=[TOKEN], access=Access.of([Grant(principal_for_token(TOKEN), "alice",
                                                                frozenset({RUN, APPROVE}))]))


def _client(console: Console) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url="http://127.0.0.1:8000")


async def _sign_in(c: httpx.AsyncClient) -> None:
    import re

    page = await c.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert (await c.post("/console/login", data={"csrf": csrf, "token": TOKEN})).status_code == 303


async def _login_page(console: Console) -> httpx.Response:
    async with _client(console) as other:
        page = await other.get("/console/login")
    assert page.status_code == 200
    return page


async def test_d27_the_console_run_list_reads_off_the_loop(rt, pg_store):
    paused = await rt.execute(CLOSE_3, principal=principal_for_token(TOKEN))
    console = _console(rt)
    try:
        async with _client(console) as c:
            await _sign_in(c)
            listed, _ = await Hold(pg_store, "list_runs").while_held(c.get("/console/"), lambda: _login_page(console))
        assert listed.status_code == 200 and paused.run_id in listed.text and "helpdesk.close_ticket" in listed.text
    finally:
        await console.close()


async def test_d27_the_console_run_page_reads_off_the_loop(rt, pg_store):
    paused = await rt.execute(CLOSE_3, principal=principal_for_token(TOKEN))
    console = _console(rt)
    try:
        async with _client(console) as c:
            await _sign_in(c)
            page, _ = await Hold(pg_store, "get_events").while_held(c.get(f"/console/runs/{paused.run_id}"),
                                                                    lambda: _login_page(console))
        assert page.status_code == 200 and "close_ticket" in page.text and "id=3" in page.text
    finally:
        await console.close()


async def test_d27_an_approval_link_page_reads_its_run_off_the_loop(rt, pg_store):
    paused = await rt.execute(CLOSE_3, principal=principal_for_token(TOKEN))
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    console = _console(rt)
    try:
        async with _client(console) as c:
            page, _ = await Hold(pg_store, "get_run").while_held(c.get(f"/approve/{token}"),
                                                                 lambda: _login_page(console))
        assert page.status_code == 200 and "close_ticket" in page.text
        assert f"/console/login?next=/approve/{token}" in page.text
    finally:
        await console.close()
