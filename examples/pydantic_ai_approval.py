"""tether's execute in a Pydantic AI agent: a paused write is a deferred tool call, decided later elsewhere.

Runs offline as it is (``python examples/pydantic_ai_approval.py``, with ``pip install 'tether[pydantic-ai]'``):
the model is Pydantic AI's own FunctionModel, scripted to write one program. The agent's run ends with the
write waiting; the message history and the deferred requests go to files; then a fresh runtime and agent
(another process, days later, in real use) approve it through DeferredToolResults, and the agent's next
turn reads the program's result.
"""

import asyncio
import json
import tempfile
from pathlib import Path

from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from tether import Runtime
from tether.demo.helpdesk import make_helpdesk  # the demo's help desk: reads, and writes that ask
from tether.integrations.pydantic_ai import TetherCapability, with_approver
from tether.store import open_store


PROGRAM = """
import tools
ticket = await tools.helpdesk.get_ticket("T1004")
await tools.helpdesk.add_comment("T1004", "On it: " + ticket["title"])
ticket["status"]
"""


def model(messages, info):
    """Stands in for a real model: first a program for tether's execute, then a reply saying what it got."""
    for part in messages[-1].parts:
        if isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"{part.content['status']}: {json.dumps(part.content['result'])}")])
    return ModelResponse(parts=[ToolCallPart("execute", {"code": PROGRAM}, tool_call_id="call-1")])


def agent(rt: Runtime) -> Agent:
    return Agent(FunctionModel(model), capabilities=[TetherCapability(rt)], output_type=[str, DeferredToolRequests])


REQUESTS = TypeAdapter(DeferredToolRequests)


async def ask(store: str, saved: Path) -> None:
    async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
        result = await agent(rt).run("Tell the customer on T1 we are on it")
        requests = result.output  # DeferredToolRequests: the write waits
        for pause in requests.metadata.values():
            for write in pause["writes"]:
                print("waiting for approval:", write["shown"].splitlines()[0], write["args"])
        (saved / "history.json").write_bytes(result.all_messages_json())
        (saved / "requests.json").write_bytes(REQUESTS.dump_json(requests))


async def approve(store: str, saved: Path, person: str) -> None:
    # Another process, another day: the same store and tools, the saved history and requests.
    async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
        history = ModelMessagesTypeAdapter.validate_json((saved / "history.json").read_bytes())
        requests = REQUESTS.validate_json((saved / "requests.json").read_bytes())
        results = DeferredToolResults(approvals={call.tool_call_id: True for call in requests.approvals},
                                      metadata=with_approver(requests, person))  # who the host signed in
        result = await agent(rt).run(message_history=history, deferred_tool_results=results)
        print(result.output)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/runs.db"
        await ask(store, Path(tmp))
        await approve(store, Path(tmp), person="alice")


asyncio.run(main())
