"""tether's capability in a Pydantic AI agent (tether.integrations.pydantic_ai; docs/integrations.md, D-69, D-70).

The agent's model is Pydantic AI's own ``FunctionModel``, scripted: it writes a program that reads a ticket
and then comments on it. The comment pauses; the agent's run ends with ``DeferredToolRequests``; the
process is killed; a fresh process decides through ``DeferredToolResults`` and the agent's next turn sees
what the program did. The comment tool appends each send to a file, so a send is counted across processes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from tests.frameworks.desk import PROGRAM, TOOLS, sent
from tests.frameworks.processes import env, finished, kill_when_paused, spawn

from tether import Policy, Rule, Runtime
from tether._store.states import RunStatus
from tether.errors import ApprovalElsewhere, ApprovalRefused, InvalidApproval, SelfApproval
from tether.integrations.pydantic_ai import TetherCapability, with_approver


def scripted(program: str = PROGRAM):
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart) and part.tool_name == "execute":
                return ModelResponse(parts=[TextPart(json.dumps({"saw": part.content}))])
        return ModelResponse(parts=[ToolCallPart("execute", {"code": program}, tool_call_id="call-1")])

    return FunctionModel(model)


@pytest.fixture
def desk(tmp_path, monkeypatch):
    monkeypatch.setenv("DESK_SENT", str(tmp_path / "sent.jsonl"))
    return str(tmp_path / "sent.jsonl")


def agent_of(rt: Runtime, program: str = PROGRAM) -> Agent[None, Any]:
    return Agent(scripted(program), capabilities=[TetherCapability(rt)], output_type=[str, DeferredToolRequests])


@pytest.mark.slow
def test_a_paused_write_survives_a_killed_process_and_is_sent_once_when_approved_through_deferred_results(tmp_path):
    store = f"sqlite:///{tmp_path}/tether.db"
    kill_when_paused(spawn("pydantic_ai_app.py", tmp_path, store, str(tmp_path), "start"))
    assert sent(str(tmp_path / "sent.jsonl")) == []  # paused: nothing sent before the kill
    requests = json.loads((tmp_path / "requests.json").read_text())
    (pause,) = requests["metadata"].values()
    # Every argument of the write is shown to whoever decides, and no approval key travels with it.
    assert [(w["address"], w["args"]) for w in pause["writes"]] == [
        ("desk.add_comment", {"ticket_id": "T1", "body": "On it"})]
    assert "key" not in pause["writes"][0]

    out = finished(spawn("pydantic_ai_app.py", tmp_path, store, str(tmp_path), "approve", "alice"))

    seen = json.loads(out["output"])["saw"]  # the agent's next turn sees the program's result
    assert seen["status"] == "completed" and seen["result"] == {"status": "open", "commented": True}
    assert seen["run_id"] == pause["tether_run_id"]
    assert sent(str(tmp_path / "sent.jsonl")) == [{"ticket_id": "T1", "body": "On it"}]


@pytest.mark.slow
def test_a_denial_in_a_fresh_process_declines_the_write_and_the_agent_sees_the_program_fail_on_it(tmp_path):
    store = f"sqlite:///{tmp_path}/tether.db"
    kill_when_paused(spawn("pydantic_ai_app.py", tmp_path, store, str(tmp_path), "start"))

    out = finished(spawn("pydantic_ai_app.py", tmp_path, store, str(tmp_path), "deny"))

    seen = json.loads(out["output"])["saw"]
    assert seen["status"] == "failed" and seen["error"]["code"] == "write_declined"
    assert "not today" in seen["error"]["message"]
    assert sent(str(tmp_path / "sent.jsonl")) == []
    assert env(tmp_path)  # the apps ran with this test's own store and files


async def _paused(rt: Runtime, program: str = PROGRAM) -> tuple[Agent[None, Any], Any, DeferredToolRequests]:
    agent = agent_of(rt, program)
    result = await agent.run("Comment on ticket T1")
    assert isinstance(result.output, DeferredToolRequests)
    return agent, result, result.output


async def test_an_approval_that_names_no_person_is_refused_and_nothing_is_sent(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt)
        results = DeferredToolResults(approvals={"call-1": True}, metadata=requests.metadata)
        with pytest.raises(ApprovalRefused, match="names no person"):
            await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        (run_id,) = [m["tether_run_id"] for m in requests.metadata.values()]
        assert rt.store.get_run(run_id).status == RunStatus.PAUSED and sent(desk) == []


async def test_the_principal_that_ran_the_program_does_not_approve_its_own_write(desk):
    async with Runtime(tools=TOOLS, principal="agent-7") as rt:
        agent, first, requests = await _paused(rt)
        results = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests, "agent-7"))
        with pytest.raises(SelfApproval):
            await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        assert sent(desk) == []


async def test_a_write_whose_rule_needs_a_signed_in_approver_is_not_approved_through_the_framework(desk):
    policy = Policy(rules=[Rule(match="desk.add_*", action="ask", approver="signed_in")])
    async with Runtime(tools=TOOLS, policy=policy) as rt:
        agent, first, requests = await _paused(rt)
        results = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests, "alice"))
        with pytest.raises(ApprovalElsewhere):
            await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        assert sent(desk) == []
        # Declining still works through the framework: it only stops things.
        results = DeferredToolResults(approvals={"call-1": False}, metadata=requests.metadata)
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        assert json.loads(done.output)["saw"]["error"]["code"] == "write_declined" and sent(desk) == []


async def test_an_approval_whose_arguments_were_overridden_to_another_program_decides_nothing(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt)
        other = PROGRAM.replace("On it", "Refund approved")
        results = DeferredToolResults(approvals={"call-1": ToolApproved(override_args={"code": other})},
                                      metadata=with_approver(requests, "alice"))
        with pytest.raises(InvalidApproval, match="another program"):
            await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        assert sent(desk) == []


async def test_a_denial_without_the_pause_metadata_is_refused_rather_than_leaving_the_run_open(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt)
        results = DeferredToolResults(approvals={"call-1": ToolDenied("no")})
        with pytest.raises(InvalidApproval, match="carries no tether pause"):
            await agent.run(message_history=first.all_messages(), deferred_tool_results=results)


async def test_a_program_that_pauses_again_defers_the_same_call_again_until_every_write_is_decided(desk):
    two = PROGRAM.replace('{"status"', 'await tools.desk.add_comment("T1", "Done")\n{"status"')
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt, two)
        approve = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests, "alice"))
        second = await agent.run(message_history=first.all_messages(), deferred_tool_results=approve)
        assert isinstance(second.output, DeferredToolRequests)
        (pause,) = second.output.metadata.values()
        assert [w["args"]["body"] for w in pause["writes"]] == ["Done"]
        assert sent(desk) == [{"ticket_id": "T1", "body": "On it"}]
        approve = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(second.output, "alice"))
        done = await agent.run(message_history=second.all_messages(), deferred_tool_results=approve)
        assert json.loads(done.output)["saw"]["status"] == "completed"
        assert [s["body"] for s in sent(desk)] == ["On it", "Done"]


async def test_the_tool_is_described_by_the_text_tether_prompt_prints(desk):
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(t.description or "" for t in info.function_tools)
        return ModelResponse(parts=[TextPart("ok")])

    async with Runtime(tools=TOOLS) as rt:
        await Agent(FunctionModel(model), capabilities=[TetherCapability(rt)]).run("hi")
        assert seen == [rt.engine.model_description()]
        assert "desk" in seen[0] and "await tools.ns.tool" in seen[0]


async def test_a_program_tether_refuses_to_start_is_a_failed_result_for_the_model_not_a_crash_of_the_host(desk):
    async with Runtime(tools=TOOLS) as rt:
        done = await agent_of(rt, "x = 1\n" * 20_000).run("go")  # past the 64 KiB code limit
        seen = json.loads(done.output)["saw"]
        assert seen["status"] == "failed" and seen["error"]["code"] == "code_too_large"


async def test_an_approver_of_blanks_names_no_person_and_the_runs_own_principal_padded_is_still_itself(desk):
    """D-69: an approve names a person. A name of blanks is none (refused, as an empty one), and the principal
    that ran the program with spaces around it is that principal (self-approval): nothing is sent."""
    async with Runtime(tools=TOOLS, principal="agent-7") as rt:
        agent, first, requests = await _paused(rt)
        for name, refused in (("   ", ApprovalRefused), (" agent-7 ", SelfApproval), ("\tagent-7", SelfApproval)):
            results = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests, name))
            with pytest.raises(refused):
                await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        (run_id,) = [m["tether_run_id"] for m in requests.metadata.values()]
        assert rt.store.get_run(run_id).status == RunStatus.PAUSED and sent(desk) == []


async def test_p36_a_call_id_or_key_the_model_repeats_in_another_conversation_reaches_no_run_of_the_first(desk):
    """P-36: the call's run is named by its conversation and its call id (or the model's key): a second
    conversation of the same principal whose model repeats them gets its own run, not the first one's result."""
    def keyed(key: str | None):
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            for part in messages[-1].parts:
                if isinstance(part, ToolReturnPart):
                    return ModelResponse(parts=[TextPart(json.dumps({"saw": part.content}))])
            return ModelResponse(parts=[ToolCallPart("execute", {"code": "1 + 1", "key": key}, tool_call_id="call-1")])
        return FunctionModel(model)

    async with Runtime(tools=TOOLS) as rt:
        for key in (None, "shared"):
            agent = Agent(keyed(key), capabilities=[TetherCapability(rt)])
            first, second = [json.loads((await agent.run("go")).output)["saw"] for _ in range(2)]
            assert first["status"] == second["status"] == "completed" and first["run_id"] != second["run_id"]


@pytest.mark.parametrize("length, ok", [(180, True), (201, False)])
async def test_p36_the_models_key_is_held_to_the_key_limit_by_its_own_length(desk, length, ok):
    """P-36: a key the model may give over MCP (up to 200 printable characters) is one it may give here, though
    the adapter scopes it to the conversation; a longer one is refused naming the model's own length."""
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(json.dumps({"saw": part.content}))])
        return ModelResponse(parts=[ToolCallPart("execute", {"code": "1 + 1", "key": "k" * length}, tool_call_id="c")])

    async with Runtime(tools=TOOLS) as rt:
        seen = json.loads((await Agent(FunctionModel(model), capabilities=[TetherCapability(rt)]).run("go")).output)["saw"]
        if ok:
            assert seen["status"] == "completed"
        else:
            assert seen["error"]["code"] == "invalid_arguments" and f"got {length} characters" in seen["error"]["message"]


@pytest.mark.parametrize("elsewhere", ["decline", "cancel"])
@pytest.mark.parametrize("answer", [True, ToolDenied("no")], ids=["approve", "deny"])
async def test_p28_a_pause_decided_elsewhere_meanwhile_gives_the_model_the_runs_outcome_not_an_endless_error(
        desk, elsewhere, answer):
    """P-28: the console (or a link, a cancel, the approval time to live) decided the run while the host held
    the deferred call. The host's answer decides nothing, and the agent's run goes on with what the run did;
    an error here would be raised again on every retry, leaving the conversation no way forward."""
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt)
        (pause,) = requests.metadata.values()
        run_id = pause["tether_run_id"]
        if elsewhere == "cancel":
            await rt.cancel(run_id, "ops said no")
        else:
            await rt.decide(run_id, {w["seq"]: ("decline", "ops said no") for w in pause["writes"]}, actor="ops")
        results = DeferredToolResults(approvals={"call-1": answer}, metadata=with_approver(requests, "alice"))
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        seen = json.loads(done.output)["saw"]
        assert seen["run_id"] == run_id and "ops said no" in json.dumps(seen["error"])
        assert seen["status"] == ("cancelled" if elsewhere == "cancel" else "failed")
        assert sent(desk) == []


async def test_p28_a_write_approved_on_the_console_meanwhile_defers_the_call_again_for_the_next_write(desk):
    """The first write was approved elsewhere and the run paused at its next: the host's late denial of the
    old pause decides nothing (not the next write either), and the call is deferred again showing the write
    the run waits on now."""
    two = PROGRAM.replace('{"status"', 'await tools.desk.add_comment("T1", "Done")\n{"status"')
    async with Runtime(tools=TOOLS) as rt:
        agent, first, requests = await _paused(rt, two)
        (pause,) = requests.metadata.values()
        await rt.decide(pause["tether_run_id"], {w["seq"]: "approve" for w in pause["writes"]}, actor="ops")
        results = DeferredToolResults(approvals={"call-1": ToolDenied("too late")},
                                      metadata=with_approver(requests, "alice"))
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        (again,) = done.output.metadata.values()
        assert [w["args"]["body"] for w in again["writes"]] == ["Done"]
        assert [s["body"] for s in sent(desk)] == ["On it"]


async def test_p28_an_approval_after_the_pauses_time_to_live_gives_the_model_the_expired_run(desk):
    """A host that answers after the approval time to live decides nothing: the run ended ``run_expired``,
    nothing sent, and that is what the model reads (not an error raised on every retry)."""
    now = [1_000_000.0]
    async with Runtime(tools=TOOLS, clock=lambda: now[0], approval_ttl_seconds=60) as rt:
        agent, first, requests = await _paused(rt)
        now[0] += 61
        results = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests, "alice"))
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        seen = json.loads(done.output)["saw"]
        assert (seen["status"], seen["error"]["code"]) == ("failed", "run_expired") and sent(desk) == []


async def test_an_approval_carrying_another_conversations_pause_of_the_same_program_decides_nothing(desk):
    """Two conversations paused on the same program: metadata of the first passed back with the second's
    call (a host mixing up what it stored) is refused, though the program matches; nothing is sent."""
    async with Runtime(tools=TOOLS) as rt:
        agent_a, first_a, requests_a = await _paused(rt)
        agent_b, first_b, requests_b = await _paused(rt)
        (pause_a,), (pause_b,) = requests_a.metadata.values(), requests_b.metadata.values()
        assert pause_a["tether_run_id"] != pause_b["tether_run_id"]
        results = DeferredToolResults(approvals={"call-1": True}, metadata=with_approver(requests_a, "alice"))
        with pytest.raises(InvalidApproval, match="another tool call"):
            await agent_b.run(message_history=first_b.all_messages(), deferred_tool_results=results)
        assert sent(desk) == []
        for pause in (pause_a, pause_b):
            assert rt.store.get_run(pause["tether_run_id"]).status == RunStatus.PAUSED
