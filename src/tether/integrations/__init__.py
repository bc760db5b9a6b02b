"""tether inside agent frameworks: in-process adapters over the Python API (docs/integrations.md).

Each framework has its own module, imported only by whoever uses it, and its own extra
(``pip install 'tether[pydantic-ai]'``, ``[langgraph]``, ``[openai-agents]``):

* :mod:`tether.integrations.pydantic_ai` — a capability giving an agent tether's ``execute``; a paused
  write is a deferred tool call awaiting approval, decided by ``DeferredToolResults``;
* :mod:`tether.integrations.langgraph` — a tool whose pause is an ``interrupt()`` carrying the pending
  writes, resumed with ``Command(resume=...)`` through the graph's checkpointer;
* :mod:`tether.integrations.openai_agents` — a tool whose pause is a run interruption (``needs_approval``),
  decided through ``RunState``.

Importing ``tether`` imports none of them, nor any framework.
"""
