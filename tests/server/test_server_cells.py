"""Cells and REPL sessions through the real MCP client (P-20, P-21)."""

from __future__ import annotations

import pytest
from mcp import Client

from helpers import Recorder
from tether._runtime import Runtime
from tether._server.mcp import TetherServer

ERAS = [pytest.param("legacy", id="legacy"), pytest.param("auto", id="modern")]

JOB = """
import tools
n = 0
for i in range(6):
    await tools.helpdesk.get_ticket(id=i)
    n += 1
    if n % 3 == 0:
        emit({"progress": n, "total": 6})
        await yield_control()
n
"""


@pytest.fixture
async def server():
    async with Runtime(tools=Recorder().tools(), type_check=False) as rt:
        yield TetherServer(rt)


@pytest.mark.parametrize("mode", ERAS)
async def test_p20_cell_start_wait_over_mcp(server, mode):
    async with Client(server.mcp, mode=mode) as c:
        r = await c.call_tool("cell_start", {"code": JOB, "yield_after_ms": 10_000})
        obs = r.structured_content
        assert not r.is_error and obs["status"] == "running"
        assert [e["type"] for e in obs["events"]] == ["output", "yielded"]
        types = []
        while obs["status"] == "running":
            r = await c.call_tool("cell_wait", {"cell_id": obs["cell_id"], "after": obs["cursor"], "timeout_ms": 10_000})
            obs = r.structured_content
            types += [e["type"] for e in obs["events"]]
        assert obs["status"] == "completed" and obs["result"] == 6
        assert types == ["output", "yielded", "completed"]


@pytest.mark.parametrize("mode", ERAS)
async def test_p20_cell_terminate_and_bad_input_over_mcp(server, mode):
    async with Client(server.mcp, mode=mode) as c:
        r = await c.call_tool("cell_start", {"code": "import asyncio\nwhile True:\n    await asyncio.sleep(0.5)\n",
                                              "yield_after_ms": 50})
        cell = r.structured_content["cell_id"]
        r = await c.call_tool("cell_terminate", {"cell_id": cell})
        assert r.structured_content["status"] == "terminated"
        r = await c.call_tool("cell_wait", {"cell_id": "run_nope"})
        assert r.is_error and r.structured_content["error"]["code"] == "run_not_found"
        r = await c.call_tool("cell_start", {"code": 5})
        assert r.is_error and r.structured_content["error"]["code"] == "invalid_arguments"


@pytest.mark.parametrize("mode", ERAS)
async def test_p21_execute_with_a_session_keeps_globals(server, mode):
    async with Client(server.mcp, mode=mode) as c:
        r = await c.call_tool("execute", {"code": "x = 20", "session": "nb"})
        assert not r.is_error
        r = await c.call_tool("execute", {"code": "x + 1", "session": "nb"})
        assert r.structured_content["result"] == 21


@pytest.mark.parametrize("mode", ERAS)
async def test_p36_cell_start_with_a_key_twice_observes_one_cell(server, mode):
    async with Client(server.mcp, mode=mode) as c:
        first = (await c.call_tool("cell_start", {"code": JOB, "yield_after_ms": 10_000, "key": "c1"})).structured_content
        again = (await c.call_tool("cell_start", {"code": JOB, "yield_after_ms": 10_000, "key": "c1"})).structured_content
        assert again["cell_id"] == first["cell_id"]
        # Observed from its first event, as the first request saw it.
        assert again["events"][0] == first["events"][0]
        refused = await c.call_tool("cell_start", {"code": JOB + "\n1", "key": "c1"})
        assert refused.is_error and refused.structured_content["error"]["code"] == "idempotency_conflict"
        obs = again
        while obs["status"] == "running":
            obs = (await c.call_tool("cell_wait", {"cell_id": obs["cell_id"], "after": obs["cursor"],
                                                   "timeout_ms": 10_000})).structured_content
        assert obs["status"] == "completed" and obs["result"] == 6
    assert len(server.rt.store.list_runs()) == 1


WRITE_CELL = """
import tools
await tools.helpdesk.close_ticket(id=7)
'closed'
"""


@pytest.mark.parametrize("mode", ERAS)
async def test_the_agent_sees_who_decided_its_write_but_not_from_where(server, mode):
    """A `decided` event names the approver and the channel for the agent following its cell; the client
    address a person decided from (the console's `origin`) is the person's, not the agent's to read."""
    async with Client(server.mcp, mode=mode) as c:
        r = await c.call_tool("cell_start", {"code": WRITE_CELL, "yield_after_ms": 10_000})
        obs = r.structured_content
        while obs["status"] == "running":
            obs = (await c.call_tool("cell_wait", {"cell_id": obs["cell_id"], "after": obs["cursor"],
                                                   "timeout_ms": 10_000})).structured_content
        assert obs["status"] == "paused"
        await server.rt.decide(obs["cell_id"], {1: "approve"}, actor="pat", via="console", origin="203.0.113.7")
        seen = []
        while obs["status"] in ("paused", "running"):
            r = await c.call_tool("cell_wait", {"cell_id": obs["cell_id"], "after": obs["cursor"],
                                                "timeout_ms": 10_000})
            obs = r.structured_content
            seen += obs["events"]
            assert "203.0.113.7" not in r.content[0].text
    decided = [e for e in seen if e["type"] == "decided"]
    assert obs["status"] == "completed" and decided
    assert decided[0]["actor"] == "pat" and decided[0]["via"] == "console" and "origin" not in decided[0]
