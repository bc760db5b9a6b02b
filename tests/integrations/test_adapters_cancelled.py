"""A framework that cancels its agent run while tether's ``execute`` runs (docs/integrations.md, P-8, P-36).

A timeout around ``agent.run`` / ``graph.ainvoke`` / ``Runner.run``, an abandoned request, a task cancelled:
the tool call is cancelled under the adapter. The run it awaited is cancelled with it, as a cancelled MCP
request's is: it ends ``cancelled`` (not ``running`` in a process that no longer awaits it), a write already
on the wire finishes and is journaled, nothing further is sent; and the same tool call run again (an agent run
resumed from its history, a LangGraph thread invoked again) reads that run, never sends a write a second time.

The tools are gates the test opens: a read and a write that wait until released, so the cancel lands while
one of them is on the wire, without timing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from tests.frameworks.scripted_langchain import graph_of
from tests.frameworks.scripted_openai import ScriptedAgentModel

from tether import Policy, Rule, Runtime, tool
from tether._store.states import RunStatus
from tether.integrations.langgraph import decision
from tether.integrations.openai_agents import TetherHooks, execute_tool
from tether.integrations.pydantic_ai import TetherCapability

set_tracing_disabled(True)

# Reads a record, then sends two messages: a cancel lands on the read or on the first send.
PROGRAM = ('import tools\n'
           'await tools.gate.read("r1")\n'
           'await tools.gate.send("first")\n'
           'await tools.gate.send("second")\n'
           '"done"\n')
POLICY = Policy(rules=[Rule(match="gate.send", action="allow")])


class Gates:
    """The tools' gates: each call says it started, then waits until the test opens its gate."""

    def __init__(self, hold: str) -> None:
        self.hold = hold  # "read" or "send": which call waits for the test
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[str] = []

        @tool(read_only=True, namespace="gate")
        async def read(name: str) -> str:
            """Read a record."""
            await self._gate("read")
            return name

        @tool(namespace="gate")
        async def send(body: str) -> str:
            """Send a message."""
            await self._gate("send")
            self.sent.append(body)
            return "sent"

        self.tools = [read, send]

    async def _gate(self, kind: str) -> None:
        if kind == self.hold and not self.release.is_set():
            self.started.set()
            await self.release.wait()


async def _cancel_on_the_wire(gates: Gates, work: Any) -> None:
    """Run ``work`` until the held call is on the wire, cancel it there, then let the held call finish."""
    task = asyncio.ensure_future(work)
    await gates.started.wait()
    task.cancel()
    for _ in range(50):  # let the cancel reach the run before the held call answers (no clock involved)
        await asyncio.sleep(0)
    gates.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


def _only_run(rt: Runtime) -> Any:
    (run,) = rt.store.list_runs()
    return run


def _pydantic_model() -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(json.dumps({"saw": part.content}))])
        return ModelResponse(parts=[ToolCallPart("execute", {"code": PROGRAM}, tool_call_id="call-1")])

    return FunctionModel(model)


@pytest.mark.parametrize("hold", ["read", "send"])
async def test_p8_a_cancelled_pydantic_ai_run_cancels_its_tether_run_and_a_resumed_history_sends_nothing_again(hold):
    gates = Gates(hold)
    async with Runtime(tools=gates.tools, policy=POLICY) as rt:
        agent = PydanticAgent(_pydantic_model(), capabilities=[TetherCapability(rt)],
                              output_type=[str, DeferredToolRequests])
        history: list[ModelMessage] = []

        async def run() -> None:
            async with agent.iter("send it") as steps:
                async for _ in steps:
                    history[:] = steps.all_messages()

        await _cancel_on_the_wire(gates, run())

        run_record = _only_run(rt)
        assert run_record.status == RunStatus.CANCELLED
        assert gates.sent == ([] if hold == "read" else ["first"])  # the write on the wire finished; no other
        # The host resumes the agent run from its history, which ends with the call: the call's run answers.
        assert isinstance(history[-1], ModelResponse)
        done = await agent.run(message_history=history)
        seen = json.loads(done.output)["saw"]
        assert (seen["status"], seen["run_id"]) == ("cancelled", run_record.run_id)
        assert "pydantic-ai" in seen["error"]["message"]
        assert gates.sent == ([] if hold == "read" else ["first"]) and len(rt.store.list_runs()) == 1


@pytest.mark.parametrize("hold", ["read", "send"])
async def test_p8_a_cancelled_langgraph_invoke_cancels_its_tether_run_and_invoking_the_thread_again_sends_nothing(hold):
    gates = Gates(hold)
    config = {"configurable": {"thread_id": "t-1"}}
    async with Runtime(tools=gates.tools, policy=POLICY) as rt:
        graph = graph_of(rt, PROGRAM, InMemorySaver())
        await _cancel_on_the_wire(gates, graph.ainvoke({"messages": [("user", "send it")]}, config))

        run_record = _only_run(rt)
        assert run_record.status == RunStatus.CANCELLED
        assert gates.sent == ([] if hold == "read" else ["first"])
        # The thread goes on from its checkpoint: the tool node runs the same call again and reads its run.
        out = await graph.ainvoke(None, config)
        assert '"status": "cancelled"' in out["messages"][-1].content and run_record.run_id in out["messages"][-1].content
        assert gates.sent == ([] if hold == "read" else ["first"]) and len(rt.store.list_runs()) == 1


@pytest.mark.parametrize("hold", ["read", "send"])
async def test_p8_a_cancelled_agents_sdk_run_cancels_its_tether_run(hold):
    gates = Gates(hold)
    async with Runtime(tools=gates.tools, policy=POLICY) as rt:
        agent = Agent(name="desk", model=ScriptedAgentModel(PROGRAM), tools=[execute_tool(rt)], hooks=TetherHooks(rt))
        await _cancel_on_the_wire(gates, Runner.run(agent, "send it", context={}))

        # The SDK cancels the task that ran needs_approval without awaiting it: the run ends soon after.
        ended = await rt.engine.wait_for_run(_only_run(rt).run_id, timeout=10)
        run_record = _only_run(rt)
        assert ended.status == run_record.status == RunStatus.CANCELLED
        assert gates.sent == ([] if hold == "read" else ["first"])
        assert "openai-agents" in (run_record.result or {}).get("error", {}).get("message", "")


async def test_p8_a_langgraph_resume_cancelled_while_the_approved_write_is_on_the_wire_sends_it_once():
    """The cancel lands on a decision's continuation (the approved write on the wire), not on a start: the
    run is cancelled the same way, the write sent once, and the thread invoked again reads the cancelled run."""
    gates = Gates("send")
    config = {"configurable": {"thread_id": "t-2"}}
    async with Runtime(tools=gates.tools) as rt:  # no policy: the sends ask a person
        graph = graph_of(rt, PROGRAM, InMemorySaver())
        gates.release.set()  # the read passes; the send waits for its approval, not for a gate
        out = await graph.ainvoke({"messages": [("user", "send it")]}, config)
        (waiting,) = out["__interrupt__"]
        gates.release.clear()
        await _cancel_on_the_wire(gates, graph.ainvoke(
            Command(resume=decision(waiting.value, "approve", approver="alice")), config))

        run_record = _only_run(rt)
        assert run_record.status == RunStatus.CANCELLED and gates.sent == ["first"]
        out = await graph.ainvoke(None, config)
        assert '"status": "cancelled"' in out["messages"][-1].content
        assert gates.sent == ["first"] and len(rt.store.list_runs()) == 1
