"""A Pydantic AI agent with tether's capability, as a process of its own (tests/integrations/test_pydantic_ai_adapter.py).

    pydantic_ai_app.py STORE_URL STATE_DIR start
    pydantic_ai_app.py STORE_URL STATE_DIR approve|deny [APPROVER]

``start`` runs the agent: its scripted model (``FunctionModel``) writes a program that reads, then writes;
the write pauses, the run ends with ``DeferredToolRequests``, and the message history and the requests are
saved under STATE_DIR; then the process waits to be killed. ``approve`` / ``deny`` load them in a fresh
process and decide through Pydantic AI's own ``DeferredToolResults``; the agent's last answer is printed
as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from tests.frameworks.desk import PROGRAM, TOOLS

from tether import Runtime
from tether.integrations.pydantic_ai import TetherCapability, with_approver
from tether.store import open_store

STORE_URL, STATE, MODE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
APPROVER = sys.argv[4] if len(sys.argv) > 4 else None
REQUESTS = TypeAdapter(DeferredToolRequests)


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: a program for tether's execute. Next turn: say what the tool returned."""
    for part in messages[-1].parts:
        if isinstance(part, ToolReturnPart) and part.tool_name == "execute":
            return ModelResponse(parts=[TextPart(json.dumps({"saw": part.content}))])
    assert [t.name for t in info.function_tools] == ["execute"]
    return ModelResponse(parts=[ToolCallPart("execute", {"code": PROGRAM}, tool_call_id="call-1")])


async def main() -> None:
    async with Runtime(store=open_store(STORE_URL), tools=TOOLS) as rt:
        agent = Agent(FunctionModel(model), capabilities=[TetherCapability(rt)],
                      output_type=[str, DeferredToolRequests])
        if MODE == "start":
            result = await agent.run("Comment on ticket T1")
            assert isinstance(result.output, DeferredToolRequests), result.output
            (STATE / "history.json").write_bytes(result.all_messages_json())
            (STATE / "requests.json").write_bytes(REQUESTS.dump_json(result.output))
            print("paused", flush=True)
            await asyncio.Event().wait()  # killed here
        history = ModelMessagesTypeAdapter.validate_json((STATE / "history.json").read_bytes())
        requests = REQUESTS.validate_json((STATE / "requests.json").read_bytes())
        call = requests.approvals[0].tool_call_id
        decided: Any = True if MODE == "approve" else ToolDenied("not today")
        results = DeferredToolResults(approvals={call: decided},
                                      metadata=with_approver(requests, APPROVER) if APPROVER else requests.metadata)
        result = await agent.run(message_history=history, deferred_tool_results=results)
        print(json.dumps({"output": result.output}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
