"""P-46 through MCP: `resume` with decision "decline_and_undo", through the real MCP client. The agent's own
call may undo only where it may approve (P-37): an undo sends writes of its own."""

from __future__ import annotations

from mcp import Client

from tether import Policy, Runtime, tool
from tether._engine.approvals import APPROVE, RUN, Access, Grant
from tether._server.auth import principal_for_token
from tether._server.mcp import TetherServer

effects: list[tuple[str, str]] = []


@tool(namespace="shop", undo="shop.refund", undo_args={"charge_id": "result.id"})
def charge(order: str) -> dict:
    """Charge an order."""
    effects.append(("charge", order))
    return {"id": f"ch_{order}"}


@tool(namespace="shop")
def refund(charge_id: str) -> dict:
    """Refund a charge."""
    effects.append(("refund", charge_id))
    return {"refunded": charge_id}


PROGRAM = "import tools\nawait tools.shop.charge(order='a')\nawait tools.shop.charge(order='b')\n"
POLICY = Policy(writes="allow", rules=[{"match": "shop.charge", "action": "ask"},
                                       {"match": "shop.refund", "action": "allow"}])
ALICE = "alice-token-0123456789"


def access(self_approval: bool) -> Access:
    return Access.of([Grant(principal_for_token(ALICE), "alice", frozenset({RUN, APPROVE}))],
                     self_approval=self_approval, links="signed_in")


async def test_p46_resume_decline_and_undo_through_mcp_only_where_the_agent_may_approve():
    effects.clear()
    principal = principal_for_token(ALICE)
    async with Runtime(tools=[charge, refund], policy=POLICY, type_check=False) as rt:
        for self_approval in (True, False):
            server = TetherServer(rt, principal_of=lambda ctx: principal, access=access(self_approval))
            async with Client(server.mcp) as c:
                schema = {t.name: t for t in (await c.list_tools()).tools}["resume"].input_schema
                assert "decline_and_undo" in str(schema["properties"]["decision"])
                paused = (await c.call_tool("execute", {"code": PROGRAM})).structured_content
                run_id = paused["run_id"]
                first = (await c.call_tool("resume", {"run_id": run_id, "decision": "approve", "seq": 1}))
                if not self_approval:
                    # Its own approve is refused, and so is its own undo: nothing decided, nothing sent.
                    assert first.is_error and first.structured_content["error"]["code"] == "approval_elsewhere"
                    r = await c.call_tool("resume", {"run_id": run_id, "decision": "decline_and_undo", "seq": 1})
                    assert r.is_error and r.structured_content["error"]["code"] == "approval_elsewhere"
                    assert rt.store.get_run(run_id).status == "paused"
                    continue
                assert first.structured_content["status"] == "paused"
                r = await c.call_tool("resume", {"run_id": run_id, "decision": "decline_and_undo", "seq": 2,
                                                 "reason": "wrong order"})
                out = r.structured_content
                assert out["status"] == "rolled_back", out
                assert out["error"]["code"] == "rolled_back"
                assert "undone: call 1 shop.charge" in out["error"]["message"]
    assert effects == [("charge", "a"), ("refund", "ch_a")]


async def test_p46_an_agent_that_may_approve_its_own_writes_does_not_undo_into_a_write_kept_for_signed_in_people():
    """D-68: an undo is a write. Where the undo's tool is one only a signed-in person approves, the agent's own
    resume (self_approval) does not send it by declining and undoing: nothing is decided, nothing sent."""
    effects.clear()
    principal = principal_for_token(ALICE)
    policy = Policy(writes="allow", rules=[{"match": "shop.charge", "action": "ask"},
                                           {"match": "shop.refund", "action": "ask", "approver": "signed_in"}])
    async with Runtime(tools=[charge, refund], policy=policy, type_check=False) as rt:
        server = TetherServer(rt, principal_of=lambda ctx: principal, access=access(True))
        async with Client(server.mcp) as c:
            run_id = (await c.call_tool("execute", {"code": PROGRAM})).structured_content["run_id"]
            first = await c.call_tool("resume", {"run_id": run_id, "decision": "approve", "seq": 1})
            assert first.structured_content["status"] == "paused"
            r = await c.call_tool("resume", {"run_id": run_id, "decision": "decline_and_undo", "seq": 2})
            assert r.is_error and r.structured_content["error"]["code"] == "approval_elsewhere", r.structured_content
            assert rt.store.get_run(run_id).status == "paused"
    assert effects == [("charge", "a")]
