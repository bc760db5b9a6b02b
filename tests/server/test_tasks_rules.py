"""MCP Tasks (P-47): the pure decisions of tether._server.tasks, and the extension in memory.

The end-to-end cases (real processes, restarts, replicas, people deciding) are in test_server_tasks.py.
"""

from __future__ import annotations

import pytest
from fastmcp import Client as FastMCPClient
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client_models import (
    GetTaskRequest,
    GetTaskRequestParams,
    UpdateTaskRequest,
    UpdateTaskRequestParams,
)
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY, Result
from pydantic import ValidationError

from tether._engine.approvals.capabilities import Keyring
from tether._server import tasks
from tether._server.mcp import TetherServer

KEYS = Keyring(b"k" * 32, ())
CLOSE = "import tools\nr = await tools.helpdesk.close_ticket(id=3)\nr"


def test_p47_a_task_id_names_its_run_for_its_principal_only():
    task_id = tasks.task_id_for("run_0123456789abcdef", "token:alice", KEYS.sign)
    assert tasks.run_of_task(task_id, "token:alice", KEYS.verifies) == ("run_0123456789abcdef", None)
    cell = tasks.task_id_for("run_0123456789abcdef", "token:alice", KEYS.sign, cursor=7)
    assert tasks.run_of_task(cell, "token:alice", KEYS.verifies) == ("run_0123456789abcdef", 7)
    assert tasks.run_of_task(cell.replace(".c7.", ".c8."), "token:alice", KEYS.verifies) is None
    assert tasks.run_of_task(task_id, "token:bob", KEYS.verifies) is None
    # Made under the store's secret: another store's (or a rotated-away) key opens nothing.
    assert tasks.run_of_task(task_id, "token:alice", Keyring(b"o" * 32, ()).verifies) is None
    for junk in (None, 7, "", "run_x", "run_x.", "." + "0" * 32, "a" * 300):
        assert tasks.run_of_task(junk, "token:alice", KEYS.verifies) is None


@given(st.integers(min_value=0, max_value=52), st.sampled_from("0af.xZ_"))
def test_p47_a_task_id_altered_by_one_character_names_no_run(i, ch):
    task_id = tasks.task_id_for("run_0123456789abcdef", "token:alice", KEYS.sign)
    altered = task_id[:i] + ch + task_id[i + 1:]
    if altered != task_id:
        assert tasks.run_of_task(altered, "token:alice", KEYS.verifies) is None


def test_p47_which_runs_become_tasks_and_their_status():
    assert [tasks.becomes_task(s) for s in (None, "running", "queued", "paused", "waiting")] == [True] * 5
    assert [tasks.becomes_task(s) for s in ("completed", "failed", "cancelled")] == [False] * 3
    assert tasks.task_status("paused", asks=True) == "input_required"
    assert tasks.task_status("paused", asks=False) == "working"
    assert tasks.task_status("waiting", asks=True) == "working"
    assert tasks.task_status("failed", asks=False) == "completed"  # a tool error result, as without a task
    assert tasks.task_status("cancelled", asks=False) == "cancelled"
    # A cell's task is its pause: past it, complete (the cell goes on; the client follows it with cell_wait).
    assert tasks.task_status("running", asks=False, cell=True) == "completed"
    assert tasks.task_status("paused", asks=True, cell=True) == "input_required"


def test_d72_a_question_is_the_channels_and_a_signed_in_write_is_never_a_form():
    assert tasks.question_kind("url", signed_in=True) == "url"  # the page asks for a sign-in
    assert tasks.question_kind("form", signed_in=False) == "form"
    assert tasks.question_kind("form", signed_in=True) is None
    assert tasks.question_kind(None, signed_in=False) is None


def test_d72_what_an_answer_decides():
    assert tasks.answer_of("form", "accept", {"decision": "approve"}) == ("approve", None)
    assert tasks.answer_of("form", "accept", {"decision": "decline", "reason": "no"}) == ("decline", "no")
    assert tasks.answer_of("form", "cancel", None) == (None, None)
    assert tasks.answer_of("url", "accept", {"decision": "approve"}) == (None, None)  # the page decides
    assert tasks.answer_of("url", "decline", None)[0] == "decline"
    # Read as the form wherever no link was asked, and taken only where a form was put.
    assert tasks.answer_of(None, "accept", {"decision": "approve"}) == ("approve", None)
    assert [tasks.may_approve_by_form(k) for k in ("form", "url", None)] == [True, False, False]
    with pytest.raises(ValidationError):
        tasks.answer_of("form", "accept", {"decision": "sure"})
    assert tasks.seq_of_key(tasks.input_key(4)) == 4
    assert [tasks.seq_of_key(k) for k in ("approval", "approval:", "approval:x", "other:1", "approval:" + "9" * 12)] \
        == [None] * 5


async def test_p47_tasks_methods_need_the_extension_declared(rt):
    """The official SDK's client declares no tasks extension: tasks/get is refused with -32021 (SEP-2663)."""
    server = TetherServer(rt, approvals="form")
    async with Client(server.mcp, mode="auto") as client:
        request = GetTaskRequest(params=GetTaskRequestParams(task_id="run_x." + "0" * 32))
        with pytest.raises(MCPError) as refused:
            await client.session.send_request(request, Result)
    assert refused.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_p47_an_answer_that_decided_nothing_is_found_past_many_pages_of_events(rt):
    """The timeline scan pages through a long run's events and ends, with or without the marker."""
    server = TetherServer(rt, approvals="form")

    async def say_no(message, response_type, params, context):
        return {"decision": "decline"}

    async with FastMCPClient(server.mcp, elicitation_handler=say_no) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
    run_id = task.task_id.rpartition(".")[0]
    for n in range(tasks.PAGE * 2 + 5):
        rt.store.add_event(run_id, "output", {"n": n}, 0.0)
    assert not await tasks._answered(rt, run_id, 1)
    rt.store.add_event(run_id, tasks.ANSWERED, {"seq": 1}, 0.0)
    assert await tasks._answered(rt, run_id, 1) and not await tasks._answered(rt, run_id, 2)


async def test_d87_polling_a_paused_task_reads_only_the_events_since_the_last_poll(rt, monkeypatch):
    """A program that fills its timeline before it pauses does not make every tasks/get read it all again."""
    server = TetherServer(rt, approvals="form")
    reads: list[tuple[str, int]] = []
    real = rt.store.aio.get_events

    async def counted(run_id, after=0, limit=1000):
        reads.append((run_id, after))
        return await real(run_id, after=after, limit=limit)

    monkeypatch.setattr(rt.store.aio, "get_events", counted)
    async with FastMCPClient(server.mcp, elicitation_handler=never_answered) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        run_id = task.task_id.rpartition(".")[0]
        for n in range(tasks.PAGE * 3):
            rt.store.add_event(run_id, "output", {"n": n}, 0.0)
        reads.clear()
        for _ in range(5):
            assert (await task.status()).status == "input_required"
        # The first poll reads the timeline once (4 pages of PAGE); each later poll one page, from where it was.
        run_reads = [after for r, after in reads if r == run_id]
        assert len(run_reads) == 4 + 4 and run_reads[4:] == [run_reads[3]] * 4
        # An answer recorded after the last poll is still found.
        rt.store.add_event(run_id, tasks.ANSWERED, {"seq": 1}, 0.0)
        assert (await task.status()).status == "working"


def test_d87_the_read_positions_kept_are_bounded():
    scans = tasks.Scans(limit=3)
    for i in range(10):
        scans.put(f"run_{i}", i, frozenset())
    assert list(scans.runs) == ["run_7", "run_8", "run_9"]
    assert scans.take("run_0") == (0, frozenset())


async def never_answered(message, response_type, params, context):
    raise AssertionError("the test polls; nobody answers")


# The client's own serializer warns about the wrong types this test sends on purpose.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_p47_a_signed_task_id_of_no_run_and_malformed_ids_are_not_found_and_crash_nothing(rt):
    """A task id correctly signed for this principal but naming no run is "Task not found" (run_not_found); a
    task id that is too long or not a string is refused as invalid params; the server answers on."""
    server = TetherServer(rt, approvals="form")
    async with FastMCPClient(server.mcp) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        principal = rt.store.get_run(task.task_id.rpartition(".")[0]).principal
        ghost = tasks.task_id_for("run_0000000000000000", principal, rt.engine.keyring.derive(tasks.TASK_ID_PURPOSE).sign)
        with pytest.raises(MCPError, match="Task not found") as missing:
            await client.session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=ghost)), Result)
        assert missing.value.error.data["code"] == "run_not_found"
        for bad in ("run_x." + "0" * 100_000, 12345, None, ["run_x"]):
            request = GetTaskRequest(params=GetTaskRequestParams.model_construct(task_id=bad))
            with pytest.raises(MCPError) as refused:
                await client.session.send_request(request, Result)
            assert refused.value.error.code == -32602
        assert (await task.status()).status == "working"


async def test_p47_a_legacy_client_is_offered_no_tasks_and_tasks_methods_do_not_exist_for_it(rt):
    """Tasks are the modern protocol's extension only: a 2025-11-25 client sees no tasks capability, and
    tasks/get, tasks/list, tasks/result and tasks/cancel are unknown methods to it (nothing is looked up)."""
    from mcp_types import (
        METHOD_NOT_FOUND,
        CancelTaskRequest,
        CancelTaskRequestParams,
        GetTaskPayloadRequest,
        GetTaskPayloadRequestParams,
        ListTasksRequest,
    )

    server = TetherServer(rt, approvals="form")
    async with Client(server.mcp, mode="legacy") as client:
        assert client.session.server_capabilities.tasks is None
        assert not client.session.server_capabilities.extensions
        for request in (GetTaskRequest(params=GetTaskRequestParams(task_id="x")), ListTasksRequest(),
                        GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id="x")),
                        CancelTaskRequest(params=CancelTaskRequestParams(task_id="x"))):
            with pytest.raises(MCPError) as refused:
                await client.session.send_request(request, Result)
            assert refused.value.error.code == METHOD_NOT_FOUND


async def test_d87_a_reason_given_through_tasks_update_is_kept_to_the_consoles_length(rt, rec):
    """A decline's reason through tasks/update is stored and told to the program as the console's is: at most
    MAX_REASON_CHARS; a client's megabyte of reason is not written into the run's journal and timeline."""
    from tether._engine.approvals.model import MAX_REASON_CHARS

    server = TetherServer(rt, approvals="form")

    async def say_no_at_length(message, response_type, params, context):
        return {"decision": "decline", "reason": "no" + "!" * 200_000}

    async with FastMCPClient(server.mcp, elicitation_handler=say_no_at_length) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE}, raise_on_error=False)
        await task.result()
    run_id = task.task_id.rpartition(".")[0]
    [decided] = [e.data for e in rt.store.get_events(run_id) if e.type == "decided"]
    assert decided["decision"] == "decline" and decided["reason"].startswith("no!")
    assert len(decided["reason"]) == MAX_REASON_CHARS and rec.deliveries == []


def forged_approve(task_id: str, key: str) -> UpdateTaskRequest:
    return UpdateTaskRequest(params=UpdateTaskRequestParams(
        task_id=task_id, input_responses={key: {"action": "accept", "content": {"decision": "approve"}}}))


async def test_d72_a_client_cannot_choose_the_form_channel_by_the_shape_of_its_answer(rt, rec):
    """A client that declared no elicitation is asked nothing (working); a form-shaped approve it sends through
    tasks/update anyway is refused (approval_elsewhere) and recorded, and nothing is sent."""
    server = TetherServer(rt, approvals="form")
    async with FastMCPClient(server.mcp) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        assert (await task.status()).status == "working"
        await client.session.send_request(forged_approve(task.task_id, tasks.input_key(1)), Result)
        after = await task.status()
    run_id = task.task_id.rpartition(".")[0]
    answered = [e.data for e in rt.store.get_events(run_id) if e.type == tasks.ANSWERED]
    assert rec.deliveries == [] and rt.store.get_run(run_id).status == "paused"
    assert answered == [{"seq": 1, "action": "accept", "channel": "none", "refused": "approval_elsewhere"}]
    assert after.status == "working" and "resume" in (after.status_message or "")


async def test_d87_one_tasks_update_answers_the_waiting_write_once(rt, rec):
    """A write's key has one spelling, and one request answers the one write the run waits on once: a client
    cannot make one tasks/update write thousands of timeline events (approval:1, approval:01, ...)."""
    server = TetherServer(rt, approvals="form")
    async with FastMCPClient(server.mcp) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        keys = ["approval:1"] + ["approval:" + "0" * n + "1" for n in range(1, 6)]
        update = UpdateTaskRequest(params=UpdateTaskRequestParams(
            task_id=task.task_id, input_responses={k: {"action": "accept", "content": {"decision": "approve"}}
                                                   for k in keys}))
        await client.session.send_request(update, Result)
    run_id = task.task_id.rpartition(".")[0]
    answered = [e.data for e in rt.store.get_events(run_id) if e.type == tasks.ANSWERED]
    assert rec.deliveries == [] and rt.store.get_run(run_id).status == "paused"
    assert answered == [{"seq": 1, "action": "accept", "channel": "none", "refused": "approval_elsewhere"}]
    assert tasks.seq_of_key("approval:01") is None and tasks.seq_of_key("approval:10") == 10


async def test_d72_an_approve_answering_a_link_decides_nothing(rt, rec):
    """The server put the write as its approval link: an accept is the user going to the page; the approve it
    carries is not read; the task stops asking and waits for the page."""
    server = TetherServer(rt, approvals="url", public_url="https://tether.example.com")

    async def opens(message, response_type, params, context):
        raise AssertionError("the test answers itself")

    async with FastMCPClient(server.mcp, elicitation_handler=opens) as client:
        task = await call_tool_task(client, "execute", {"code": CLOSE})
        parked = await task.status()
        assert parked.status == "input_required"
        [(key, request)] = parked.input_requests.items()
        assert request["params"]["mode"] == "url"
        assert request["params"]["url"].startswith("https://tether.example.com/approve/")
        await client.session.send_request(forged_approve(task.task_id, key), Result)
        after = await task.status()
    run_id = task.task_id.rpartition(".")[0]
    answered = [e.data for e in rt.store.get_events(run_id) if e.type == tasks.ANSWERED]
    assert rec.deliveries == [] and rt.store.get_run(run_id).status == "paused"
    assert answered == [{"seq": 1, "action": "accept", "channel": "url"}] and after.status == "working"


async def test_p47_a_cell_that_pauses_is_a_task_and_the_client_follows_it_with_cell_wait(rt, rec):
    """cell_start answers as before unless its cell pauses; the pause is a task whose question the client's
    user answers, and the task's result is the cell's observation since the pause."""
    server = TetherServer(rt, approvals="form")

    async def yes(message, response_type, params, context):
        return {"decision": "approve"}

    code = "import tools\nr = await tools.helpdesk.close_ticket(id=3)\nemit('closed')\nr['status']"
    async with FastMCPClient(server.mcp, elicitation_handler=yes) as client:
        plain = await client.call_tool("cell_start", {"code": "emit('hi')\n1", "yield_after_ms": 5000})
        assert plain.structured_content["status"] == "completed"
        task = await call_tool_task(client, "cell_start", {"code": code, "yield_after_ms": 5000})
        assert ".c" in task.task_id and (await task.status()).status == "input_required"
        after_pause = (await task.result()).structured_content
        cell_id = after_pause["cell_id"]
        obs = after_pause
        while obs["status"] not in ("completed", "failed"):
            obs = (await client.call_tool("cell_wait", {"cell_id": cell_id, "after": obs["cursor"]})).structured_content
    assert cell_id == task.task_id.split(".")[0] and obs["status"] == "completed" and obs["result"] == "closed"
    assert rec.deliveries == [("close_ticket", {"id": 3})]


async def test_p47_a_parked_run_is_a_working_task_until_its_signal_ends_it(rt):
    """A run parked on a durable wait (P-18) is a task: working while it waits, completed with the run's
    result once a signal wakes it — here in this process, as any process on the store would."""
    server = TetherServer(rt, approvals="form")
    async with FastMCPClient(server.mcp) as client:
        task = await call_tool_task(client, "execute", {"code": "v = await wait_for_signal('go')\nv * 2"})
        waiting = await task.status()
        run_id = task.task_id.rpartition(".")[0]
        assert waiting.status == "working" and rt.store.get_run(run_id).status == "waiting"
        await rt.signal(run_id, "go", 21)
        final = await task.wait(timeout=30)
    assert final.status == "completed" and final.result["structuredContent"]["result"] == 42
