"""A LangGraph agent with tether's tool, as a process of its own (tests/integrations/test_langgraph_adapter.py).

    langgraph_app.py STORE_URL CHECKPOINTS start
    langgraph_app.py STORE_URL CHECKPOINTS approve|decline [APPROVER]

The graph is LangGraph's own: a model node and a ``ToolNode`` with tether's ``execute``, compiled with a
SQLite checkpointer (CHECKPOINTS). The model is a LangChain chat model that emits scripted tool calls: a
program that reads, then writes. ``start`` runs until the write's ``interrupt()``, prints ``paused`` and
waits to be killed; ``approve`` / ``decline`` read the thread's interrupt in a fresh process and resume it
with ``Command(resume=...)``; the last message of the thread is printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from tests.frameworks.desk import PROGRAM, TOOLS
from tests.frameworks.scripted_langchain import graph_of

from tether import Runtime
from tether.integrations.langgraph import decision
from tether.store import open_store

STORE_URL, CHECKPOINTS, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
APPROVER = sys.argv[4] if len(sys.argv) > 4 else None
CONFIG = {"configurable": {"thread_id": "ticket-T1"}}


async def main() -> None:
    async with Runtime(store=open_store(STORE_URL), tools=TOOLS) as rt, \
            AsyncSqliteSaver.from_conn_string(CHECKPOINTS) as saver:
        graph = graph_of(rt, PROGRAM, saver)
        if MODE == "start":
            out = await graph.ainvoke({"messages": [("user", "Comment on ticket T1")]}, CONFIG)
            (pending,) = out["__interrupt__"]
            print("paused", flush=True)
            await asyncio.Event().wait()  # killed here
        state = await graph.aget_state(CONFIG)
        (pending,) = state.interrupts
        out = await graph.ainvoke(Command(resume=decision(pending.value, MODE, approver=APPROVER)), CONFIG)
        print(json.dumps({"last": out["messages"][-1].content, "pause": pending.value}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
