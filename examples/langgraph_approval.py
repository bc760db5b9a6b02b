"""tether's execute in a LangGraph agent: a paused write is an interrupt(), resumed with Command(resume=...).

Runs offline as it is (``python examples/langgraph_approval.py``, with ``pip install 'tether[langgraph]'``):
the model is a LangChain chat model that emits a scripted tool call. The graph is the usual tool-calling
loop (a model node, LangGraph's ToolNode, a checkpointer). It stops at the write's interrupt; a fresh
runtime and graph on the same checkpointer (another process, days later, in real use: give it a durable
checkpointer, e.g. langgraph-checkpoint-sqlite's or -postgres's) resume the thread with the decision.
"""

import asyncio
import json
import tempfile
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from tether import Runtime
from tether.demo.helpdesk import make_helpdesk  # the demo's help desk: reads, and writes that ask
from tether.integrations.langgraph import decision, execute_tool
from tether.store import open_store


PROGRAM = """
import tools
ticket = await tools.helpdesk.get_ticket("T1004")
await tools.helpdesk.add_comment("T1004", "On it: " + ticket["title"])
ticket["status"]
"""


class ScriptedModel(BaseChatModel):
    """Stands in for a real model: first a program for tether's execute, then a reply quoting its result."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            result = json.loads(messages[-1].content)
            reply = AIMessage(content=f"{result['status']}: {json.dumps(result['result'])}")
        else:
            reply = AIMessage(content="", tool_calls=[{"name": "execute", "args": {"code": PROGRAM}, "id": "call-1"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def graph(rt: Runtime, checkpointer: Any) -> Any:
    tools = [execute_tool(rt)]
    model = ScriptedModel().bind_tools(tools)

    async def agent(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


async def main() -> None:
    config = {"configurable": {"thread_id": "ticket-T1"}}
    checkpointer = InMemorySaver()  # a durable one keeps the thread across processes
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/runs.db"
        async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
            out = await graph(rt, checkpointer).ainvoke({"messages": [("user", "Tell T1 we are on it")]}, config)
            (waiting,) = out["__interrupt__"]  # the write waits; its interrupt shows every argument
            for write in waiting.value["writes"]:
                print("waiting for approval:", write["shown"].splitlines()[0], write["args"])

        # Later, in a fresh runtime on the same store and checkpointer: the person the host signed in decides.
        async with Runtime(store=open_store(store), tools=make_helpdesk()) as rt:
            app = graph(rt, checkpointer)
            (waiting,) = (await app.aget_state(config)).interrupts
            out = await app.ainvoke(Command(resume=decision(waiting.value, "approve", approver="alice")), config)
            print(out["messages"][-1].content)


asyncio.run(main())
