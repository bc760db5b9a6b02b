"""Batch pauses and decisions that name their write, through the real MCP client (P-27..P-29)."""

from __future__ import annotations

import pytest
from mcp import Client
from mcp_types import ElicitResult

from tether._server.mcp import TetherServer

ERAS = [pytest.param("legacy", id="legacy"), pytest.param("auto", id="modern")]

GATHER3 = """
import asyncio
import tools

async def close(i):
    try:
        await tools.helpdesk.close_ticket(id=i)
        return "closed"
    except PermissionError as e:
        return str(e)

await asyncio.gather(close(1), close(2), close(3))
"""


@pytest.fixture
async def rt(rt):
    rt.engine.settings.batch_window_seconds = 0.2  # a starved CI machine must not split a batch (D-16)
    return rt


@pytest.mark.parametrize("mode", ERAS)
async def test_p27_p28_a_batch_is_listed_and_decided_per_write_through_resume(rt, rec, mode):
    async with Client(TetherServer(rt, principal_of=lambda ctx: "token:alice").mcp, mode=mode) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert "seq" in tools["resume"].input_schema["properties"]
        paused = (await c.call_tool("execute", {"code": GATHER3})).structured_content
        assert paused["status"] == "paused"
        seqs = [w["seq"] for w in paused["pending"]["writes"]]
        assert len(seqs) == 3 and all(w["args"]["id"] in (1, 2, 3) for w in paused["pending"]["writes"])
        assert f'"seq": {seqs}' in paused["instructions"]
        # No seq: refused, naming what waits; nothing decided.
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve"})
        assert r.is_error and r.structured_content["error"]["code"] == "seq_required"
        assert [p["seq"] for p in r.structured_content["error"]["details"]["pending"]] == seqs
        # Approve two in one call: the run still waits on the third.
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve",
                                         "seq": [seqs[0], seqs[2]]})
        data = r.structured_content
        assert data["status"] == "paused" and rec.deliveries == []
        assert f'"seq": {seqs[1]}' in data["instructions"]
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "decline", "reason": "not 2",
                                         "seq": seqs[1]})
        data = r.structured_content
        assert data["status"] == "completed", r.content[0].text
        assert data["result"][0] == "closed" and data["result"][2] == "closed" and "not 2" in data["result"][1]
    assert sorted(d[1]["id"] for d in rec.deliveries) == [1, 3]
    decided = [e.data for e in rt.store.get_events(paused["run_id"]) if e.type == "decided"]
    assert {(d["actor"], d["via"]) for d in decided} == {("token:alice", "mcp")}


async def test_p27_modern_forms_ask_each_write_of_a_batch_in_turn(rt, rec):
    shown: list[str] = []

    async def forms(context, params):
        shown.append(params.message)
        decision = "decline" if "id=2" in params.message else "approve"
        return ElicitResult(action="accept", content={"decision": decision})

    async with Client(TetherServer(rt).mcp, mode="auto", elicitation_callback=forms) as c:
        r = await c.call_tool("execute", {"code": GATHER3})
    data = r.structured_content
    assert data["status"] == "completed", r.content[0].text
    assert data["result"][0] == "closed" and data["result"][2] == "closed"
    assert data["result"][1].startswith("[write_declined]")
    assert len(shown) == 3 and sorted(d[1]["id"] for d in rec.deliveries) == [1, 3]


async def test_p29_a_legacy_form_records_the_principal_and_mcp(rt, rec):
    async def forms(context, params):
        return ElicitResult(action="accept", content={"decision": "approve"})

    server = TetherServer(rt, principal_of=lambda ctx: "token:carol")
    async with Client(server.mcp, mode="legacy", elicitation_callback=forms) as c:
        r = await c.call_tool("execute", {"code": GATHER3})
    assert r.structured_content["result"] == ["closed", "closed", "closed"]
    decided = [e.data for e in rt.store.get_events(r.structured_content["run_id"]) if e.type == "decided"]
    assert len(decided) == 3 and {(d["actor"], d["via"]) for d in decided} == {("token:carol", "mcp")}
