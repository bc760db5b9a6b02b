"""tether's tool in an OpenAI Agents SDK agent (tether.integrations.openai_agents; docs/integrations.md, D-69, D-70).

The model is an Agents SDK ``Model`` returning scripted tool calls (tests/frameworks/scripted_openai.py): a
program that reads a ticket, then comments on it. The comment's pause is a run interruption; the
``RunState`` is serialised and the process killed; a fresh process loads it, approves or rejects through
the SDK's own API and runs it again, and the model's next turn sees what the program did. The comment
tool appends each send to a file, so a send is counted across processes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Runner, RunState, Usage, set_tracing_disabled
from agents.exceptions import UserError
from agents.testing import assistant_message, function_call
from tests.frameworks.desk import PROGRAM, TOOLS, sent
from tests.frameworks.processes import finished, kill_when_paused, spawn
from tests.frameworks.scripted_openai import ScriptedAgentModel

from tether import Policy, Rule, Runtime
from tether._store.states import RunStatus
from tether.errors import ApprovalElsewhere, ApprovalRefused, SelfApproval
from tether.integrations.openai_agents import TetherHooks, execute_tool, pause_for

set_tracing_disabled(True)


@pytest.fixture
def desk(tmp_path, monkeypatch):
    monkeypatch.setenv("DESK_SENT", str(tmp_path / "sent.jsonl"))
    return str(tmp_path / "sent.jsonl")


def _app(tmp_path, mode: str, *extra: str):
    return spawn("openai_agents_app.py", tmp_path, f"sqlite:///{tmp_path}/tether.db", str(tmp_path), mode, *extra)


@pytest.mark.slow
def test_an_interrupted_write_survives_a_killed_process_and_is_sent_once_when_approved_through_run_state(tmp_path):
    kill_when_paused(_app(tmp_path, "start"))
    assert sent(str(tmp_path / "sent.jsonl")) == []

    out = finished(_app(tmp_path, "approve", "alice"))

    (write,) = out["pause"]["writes"]  # what the deciding person was shown: every argument, no approval key
    assert (write["address"], write["args"]) == ("desk.add_comment", {"ticket_id": "T1", "body": "On it"})
    assert "key" not in write
    seen = json.loads(json.loads(out["output"])["saw"])  # the model's next turn sees the program's result
    assert seen["status"] == "completed" and seen["result"] == {"status": "open", "commented": True}
    assert seen["run_id"] == out["pause"]["tether_run_id"]
    assert sent(str(tmp_path / "sent.jsonl")) == [{"ticket_id": "T1", "body": "On it"}]


@pytest.mark.slow
def test_a_rejection_in_a_fresh_process_cancels_the_run_and_nothing_is_sent(tmp_path):
    kill_when_paused(_app(tmp_path, "start"))

    out = finished(_app(tmp_path, "reject"))

    assert json.loads(out["output"])["saw"] == "not today"
    assert sent(str(tmp_path / "sent.jsonl")) == []
    from tether.store import open_store

    (run,) = open_store(f"sqlite:///{tmp_path}/tether.db").list_runs()
    assert run.status == RunStatus.CANCELLED  # not left paused for someone to approve after the model was told no


async def _interrupted(rt: Runtime, model: Model | None = None, **context: Any):
    agent = Agent(name="desk", model=model or ScriptedAgentModel(PROGRAM), tools=[execute_tool(rt)],
                  hooks=TetherHooks(rt))
    result = await Runner.run(agent, "Comment on ticket T1", context=dict(context))
    (item,) = result.interruptions
    state = await RunState.from_string(agent, result.to_state().to_string(), context_override=dict(context))
    return agent, state, item


async def test_an_approval_whose_context_names_no_person_raises_and_nothing_is_sent(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent, state, item = await _interrupted(rt)
        state.approve(item)
        with pytest.raises(UserError) as refused:
            await Runner.run(agent, state)
        assert isinstance(refused.value.__cause__, ApprovalRefused) and "names no person" in str(refused.value)
        run = rt.store.list_runs()[0]
        assert run.status == RunStatus.PAUSED and sent(desk) == []


async def test_the_principal_that_ran_the_program_does_not_approve_its_own_write(desk):
    async with Runtime(tools=TOOLS, principal="agent-7") as rt:
        agent, state, item = await _interrupted(rt, approver="agent-7")
        state.approve(item)
        with pytest.raises(UserError) as refused:
            await Runner.run(agent, state)
        assert isinstance(refused.value.__cause__, SelfApproval)
        assert sent(desk) == []


async def test_a_write_whose_rule_needs_a_signed_in_approver_is_not_approved_through_the_sdk(desk):
    policy = Policy(rules=[Rule(match="desk.*", action="ask", approver="signed_in")])
    async with Runtime(tools=TOOLS, policy=policy) as rt:
        agent, state, item = await _interrupted(rt, approver="alice")
        assert pause_for(rt, item)["writes"][0]["address"] == "desk.add_comment"
        state.approve(item)
        with pytest.raises(UserError) as refused:
            await Runner.run(agent, state)
        assert isinstance(refused.value.__cause__, ApprovalElsewhere)
        assert sent(desk) == []


async def test_an_always_approve_is_no_persons_decision_on_later_writes_and_sends_nothing(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent, state, item = await _interrupted(rt, approver="alice")
        state.approve(item, always_approve=True)
        with pytest.raises(UserError) as refused:
            await Runner.run(agent, state)
        assert isinstance(refused.value.__cause__, ApprovalRefused) and "always_approve" in str(refused.value)
        assert rt.store.list_runs()[0].status == RunStatus.PAUSED and sent(desk) == []


class _AsksAgain(Model):
    """Calls execute; when told the program paused again, calls it again with the key it was given."""

    def __init__(self, program: str) -> None:
        self.program = program

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs) -> ModelResponse:
        outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not outputs:
            out = function_call("execute", {"code": self.program, "key": None}, call_id="call-1")
        elif '"paused"' in outputs[-1]["output"]:
            key = re.search(r"key='([^']+)'", outputs[-1]["output"]).group(1)
            out = function_call("execute", {"code": self.program, "key": key}, call_id=f"call-{len(outputs) + 1}")
        else:
            out = assistant_message(outputs[-1]["output"])
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


async def test_a_program_that_pauses_again_is_asked_for_again_and_its_run_is_never_started_twice(desk):
    two = PROGRAM.replace('{"status"', 'await tools.desk.add_comment("T1", "Done")\n{"status"')
    async with Runtime(tools=TOOLS) as rt:
        agent, state, item = await _interrupted(rt, _AsksAgain(two), approver="alice")
        state.approve(item)
        second = await Runner.run(agent, state)
        (again,) = second.interruptions  # the model asked again, the SDK's way
        assert [w["args"]["body"] for w in pause_for(rt, again)["writes"]] == ["Done"]
        assert [s["body"] for s in sent(desk)] == ["On it"]
        state = second.to_state()
        state.approve(again)
        done = await Runner.run(agent, state)
        assert json.loads(done.final_output)["status"] == "completed"
        assert [s["body"] for s in sent(desk)] == ["On it", "Done"] and len(rt.store.list_runs()) == 1


async def test_the_tool_is_described_by_the_text_tether_prompt_prints(desk):
    async with Runtime(tools=TOOLS) as rt:
        assert execute_tool(rt).description == rt.engine.model_description()


async def test_a_program_tether_refuses_to_start_is_a_failed_result_for_the_model_not_a_crash_of_the_run(desk):
    async with Runtime(tools=TOOLS) as rt:
        agent = Agent(name="desk", model=ScriptedAgentModel("x = 1\n" * 20_000), tools=[execute_tool(rt)])
        result = await Runner.run(agent, "go", context={})
        assert json.loads(json.loads(result.final_output)["saw"])["error"]["code"] == "code_too_large"


async def test_an_approved_run_state_run_a_second_time_does_not_approve_the_next_pause(desk):
    """D-69: a host that runs the same approved RunState again (a retried request, a replayed string) decided
    the pause it showed once; the run's next pause, which nobody was shown, is not approved by it."""
    two = PROGRAM.replace('{"status"', 'await tools.desk.add_comment("T1", "Unseen")\n{"status"')
    async with Runtime(tools=TOOLS) as rt:
        agent, state, item = await _interrupted(rt, ScriptedAgentModel(two), approver="alice")
        state.approve(item)
        saved = state.to_string()
        await Runner.run(agent, state)
        assert [s["body"] for s in sent(desk)] == ["On it"]
        again = await RunState.from_string(agent, saved, context_override={"approver": "alice"})
        await Runner.run(agent, again)
        assert [s["body"] for s in sent(desk)] == ["On it"]
        assert rt.store.list_runs()[0].status == RunStatus.PAUSED


class _Raw(Model):
    """A model whose tool call carries exactly ``arguments`` (a model that ignores the strict schema)."""

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if outputs:
            return ModelResponse(output=[assistant_message(json.dumps({"saw": outputs[-1]["output"]}))],
                                 usage=Usage(), response_id=None)
        call = function_call("execute", {}, call_id="call-raw")
        call.arguments = self.arguments
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("arguments, says", [
    ('{"code": "1 + 1", "key": null, "user_words": ["pay DE89 3704 0044 0532 0130 00"]}', "not user_words"),
    ('{"code": "1 + 1", "key": null, "approver": "alice"}', "not approver"),
    ('{"code": "1 + 1", "key": 7}', "`key` is a string"),
    ('{"code": ["1 + 1"], "key": null}', "`code`, a string"),
])
async def test_d76_a_tool_call_with_arguments_execute_does_not_take_runs_nothing_and_tells_the_model(desk, arguments,
                                                                                                    says):
    """The model's arguments carry nothing the host gives (the user's words, who approves: D-76, D-69), and a
    wrong type is not taken for another: each is ``invalid_arguments`` saying how to call execute; no run."""
    async with Runtime(tools=TOOLS) as rt:
        agent = Agent(name="desk", model=_Raw(arguments), tools=[execute_tool(rt)], hooks=TetherHooks(rt))
        result = await Runner.run(agent, "go", context={})
        assert result.interruptions == []
        seen = json.loads(json.loads(result.final_output)["saw"])
        assert seen["status"] == "failed" and seen["error"]["code"] == "invalid_arguments"
        assert says in seen["error"]["message"] and '"code"' in seen["error"]["next_action"]
        assert rt.store.list_runs() == []


@pytest.mark.parametrize("arguments", ['{"code": "1 +', "[1, 2]", '"1 + 1"'])
async def test_arguments_the_sdk_cannot_read_ask_for_approval_yet_show_no_pause_and_run_nothing(desk, arguments):
    """The SDK asks for approval of a call whose arguments are no JSON object (it cannot evaluate
    needs_approval): pause_for says there is no tether pause (None, not an exception in the host's approval
    screen), and an approval runs nothing; the model reads invalid_arguments."""
    async with Runtime(tools=TOOLS) as rt:
        agent = Agent(name="desk", model=_Raw(arguments), tools=[execute_tool(rt)], hooks=TetherHooks(rt))
        result = await Runner.run(agent, "go", context={})
        (item,) = result.interruptions
        assert pause_for(rt, item) is None
        state = result.to_state()
        state.approve(item)
        done = await Runner.run(agent, state)
        seen = json.loads(json.loads(done.final_output)["saw"])
        assert seen["error"]["code"] == "invalid_arguments" and "nothing was run" in seen["error"]["message"]
        assert rt.store.list_runs() == []
