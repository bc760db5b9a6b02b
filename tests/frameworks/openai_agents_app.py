"""An OpenAI Agents SDK agent with tether's tool, as a process of its own (tests/integrations/test_openai_agents_adapter.py).

    openai_agents_app.py STORE_URL STATE_DIR start
    openai_agents_app.py STORE_URL STATE_DIR approve|reject [APPROVER]

The model is an Agents SDK ``Model`` returning scripted tool calls (tests/frameworks/scripted_openai.py): a
program that reads, then writes. ``start`` runs the agent until the write's interruption, serialises the
``RunState`` to STATE_DIR, prints ``paused`` and waits to be killed. ``approve`` / ``reject`` load the state
in a fresh process, decide with ``state.approve`` / ``state.reject`` and run it again; the agent's final
output and what ``pause_for`` showed are printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from agents import Agent, Runner, RunState, set_tracing_disabled
from tests.frameworks.desk import PROGRAM, TOOLS
from tests.frameworks.scripted_openai import ScriptedAgentModel

from tether import Runtime
from tether.integrations.openai_agents import TetherHooks, execute_tool, pause_for
from tether.store import open_store

STORE_URL, STATE, MODE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
APPROVER = sys.argv[4] if len(sys.argv) > 4 else None
set_tracing_disabled(True)  # no trace export: the test runs offline


async def main() -> None:
    async with Runtime(store=open_store(STORE_URL), tools=TOOLS) as rt:
        agent = Agent(name="desk", model=ScriptedAgentModel(PROGRAM), tools=[execute_tool(rt)], hooks=TetherHooks(rt))
        if MODE == "start":
            result = await Runner.run(agent, "Comment on ticket T1", context={})
            assert result.interruptions, result.final_output
            (STATE / "state.json").write_text(result.to_state().to_string())
            print("paused", flush=True)
            await asyncio.Event().wait()  # killed here
        # The approving person is the host's own sign-in, carried in the run's context.
        state = await RunState.from_string(agent, (STATE / "state.json").read_text(),
                                           context_override={"approver": APPROVER} if APPROVER else {})
        (item,) = state.get_interruptions()
        shown = pause_for(rt, item)
        if MODE == "approve":
            state.approve(item)
        else:
            state.reject(item, rejection_message="not today")
        result = await Runner.run(agent, state)
        print(json.dumps({"output": result.final_output, "pause": shown}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
