"""MCP Tasks (P-47): what a client hammering tasks/update costs the run's timeline, and what ttlMs says (D-90).

An answer through ``tasks/update`` that decides nothing is recorded in the run's timeline (``task_answered``) so a
person sees that the client tried, and the task stops putting the question. Before, every such request recorded
one more event: a client sending the same refused approve in a loop filled the run's timeline. Now one event is
recorded per distinct answer (the write, what the client did, the channel, why it was refused), on SQLite and
Postgres, however many requests repeat it, one after another or at once.

``ttlMs`` said the approval time to live for every task, paused or not; a client may drop a task once
``createdAt + ttlMs`` has passed, so a run parked on a week-long wait, or an ended one kept for days, was given
up after a day. It now says how long the task is kept: as long as its run's row.
"""

from __future__ import annotations

import asyncio

import pytest
from fastmcp import Client as FastMCPClient
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client_models import UpdateTaskRequest, UpdateTaskRequestParams
from mcp_types import Result

from helpers import Recorder, StoreBackend, each_store_backend, store_backend_params
from tether._engine.rules.limits import Limits
from tether._runtime import Runtime
from tether._server import tasks
from tether._server.mcp import TetherServer
from tether._store.retention import RetentionRules

CLOSE = "import tools\nr = await tools.helpdesk.close_ticket(id=3)\nr"


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    yield from each_store_backend(request, tmp_path, monkeypatch, StoreBackend)


def answer(task_id: str, action: str, content: dict | None = None) -> UpdateTaskRequest:
    reply = {"action": action, **({"content": content} if content is not None else {})}
    return UpdateTaskRequest(params=UpdateTaskRequestParams(task_id=task_id,
                                                            input_responses={tasks.input_key(1): reply}))


async def test_d90_a_client_repeating_a_refused_answer_records_it_once_per_distinct_answer(backend):
    rec = Recorder()
    async with Runtime(store=backend.store(), tools=rec.tools(), type_check=False,
                       limits=Limits(run_seconds=10, call_timeout_seconds=5)) as rt:
        server = TetherServer(rt, approvals="form")
        async with FastMCPClient(server.mcp) as client:  # no elicitation: the write is put to nobody here
            task = await call_tool_task(client, "execute", {"code": CLOSE})
            run_id = task.task_id.rpartition(".")[0]
            approve = answer(task.task_id, "accept", {"decision": "approve"})
            for _ in range(30):
                await client.session.send_request(approve, Result)
            await asyncio.gather(*(client.session.send_request(approve, Result) for _ in range(30)))
            # Another answer is another thing a person may need to see: recorded once too.
            for _ in range(10):
                await client.session.send_request(answer(task.task_id, "cancel"), Result)
            after = await task.status()
        answered = [e.data for e in rt.store.get_events(run_id) if e.type == tasks.ANSWERED]
        assert answered == [{"seq": 1, "action": "accept", "channel": "none", "refused": "approval_elsewhere"},
                            {"seq": 1, "action": "cancel", "channel": "none"}]
        assert rec.deliveries == [] and rt.store.get_run(run_id).status == "paused"
        assert after.status == "working"
        # A person still decides, and the task follows: nothing the client sent stood in the way.
        done = await rt.decide(run_id, {1: "approve"}, actor="ann")
        assert done.status == "completed" and rec.deliveries == [("close_ticket", {"id": 3})]


def test_d90_ttl_ms_is_how_long_the_task_is_kept_which_is_as_long_as_its_run():
    day = 86400.0
    kept = RetentionRules({"completed": 7.0, "failed": None, "cancelled": 0.5})
    # Not ended: never forgotten while it lasts, however long a person or a wait takes.
    for status in ("queued", "running", "paused", "waiting"):
        assert tasks.ttl_ms(status, 1000.0, 5000.0, kept) is None
    # Ended: its status's days from its end, counted from the task's creation.
    assert tasks.ttl_ms("completed", 1000.0, 1000.0 + 2 * day, kept) == int((2 + 7) * day * 1000)
    assert tasks.ttl_ms("cancelled", 1000.0, 1000.0, kept) == int(0.5 * day * 1000)
    assert tasks.ttl_ms("failed", 1000.0, 2000.0, kept) is None  # kept for ever
    assert tasks.ttl_ms("completed", 1000.0, 2000.0, None) is None  # no [retention]
    assert tasks.ttl_ms("completed", 1000.0, 2000.0, RetentionRules({"completed": 7.0}, keep_journals=True)) is None


async def test_d90_a_paused_task_does_not_claim_to_expire_with_its_approval(rt):
    """ttlMs was the approval time to live (a day) for every task; a paused run is kept until it ends."""
    server = TetherServer(rt, approvals="form")
    async with FastMCPClient(server.mcp) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        status = await task.status()
    assert status.status == "working" and status.ttl_ms is None
