"""tether's execute in an OpenAI Agents SDK agent: a paused write is a run interruption, decided on RunState.

Runs offline as it is (``python examples/openai_agents_approval.py``, with ``pip install
'tether[openai-agents]'``): the model is an Agents SDK Model returning a scripted tool call. The run ends
with an interruption; its RunState is serialised; a fresh runtime and agent (another process, days later,
in real use) load it, approve as the person the host signed in, and run it again.
"""

import asyncio
import json
import tempfile
from typing import Any

from agents import Agent, Model, ModelResponse, RunState, Runner, Usage, set_tracing_disabled
from agents.testing import assistant_message, function_call

from tether import Runtime
from tether.demo.helpdesk import make_helpdesk  # the demo's help desk: reads, and writes that ask
from tether.integrations.openai_agents import TetherHooks, execute_tool, pause_for
from tether.store import open_store


PROGRAM = """
import tools
ticket = await tools.helpdesk.get_ticket("T1004")
await tools.helpdesk.add_comment("T1004", "On it: " + ticket["title"])
ticket["status"]
"""


class ScriptedModel(Model):
    """Stands in for a real model: first a program for tether's execute, then a reply quoting its result."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if outputs:
            result = json.loads(outputs[-1]["output"])
            out = assistant_message(f"{result['status']}: {json.dumps(result['result'])}")
        else:
            out = function_call("execute", {"code": PROGRAM, "key": None}, call_id="call-1")
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def agent(rt: Runtime) -> Agent:
    return Agent(name="helpdesk", model=ScriptedModel(), tools=[execute_tool(rt)], hooks=TetherHooks(rt))


async def main() -> None:
    set_tracing_disabled(True)  # offline: no trace export
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/runs.db"
        async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
            result = await Runner.run(agent(rt), "Tell T1 we are on it", context={})
            for item in result.interruptions:  # the write waits; pause_for shows every argument
                for write in pause_for(rt, item)["writes"]:
                    print("waiting for approval:", write["shown"].splitlines()[0], write["args"])
            saved = result.to_state().to_string()

        # Later, in a fresh runtime on the same store: the person the host signed in approves.
        async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
            helpdesk = agent(rt)
            state = await RunState.from_string(helpdesk, saved, context_override={"approver": "alice"})
            for item in state.get_interruptions():
                state.approve(item)
            result = await Runner.run(helpdesk, state)
            print(result.final_output)


asyncio.run(main())
