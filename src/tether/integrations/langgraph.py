"""tether's ``execute`` as a LangGraph tool; a paused write is an ``interrupt()`` (docs/integrations.md).

    tools = [execute_tool(rt)]
    graph = builder.compile(checkpointer=checkpointer)   # ToolNode(tools), the model bound to tools

The tool runs the program; a pause calls ``interrupt(pause)`` with the run id and every undecided write
(secrets hidden, no approval key), so the graph stops and its checkpointer keeps the thread. In any
process with the same store, tools and checkpointer, ``graph.ainvoke(Command(resume=decision(pause,
"approve", approver="alice")), config)`` decides it (D-69, D-70): an approve only for the person the host
names, never the principal that ran the program, never a write whose rule needs a signed-in approver; a
decline gives the program its ``PermissionError``. The run continues from its snapshot, nothing sent
twice, and the tool's message is the run's envelope. An answer tether refuses decides nothing: the graph
is interrupted again with the same pause and ``refused`` (the error's code, message and next action),
as is an answer naming another run than the call's own.

LangGraph runs an interrupted node again from its start when it resumes, so the tool names its run with a
run key (P-36) made of the thread and the tool call: the repeat gets the same run, never a second one; and
a decision names its run and writes, so a node that paused twice takes each answer for its own pause.

With ``execute_tool(rt, user_words=True)`` the tool reads the graph's state (``InjectedState``) and each run
it starts carries the text of every ``HumanMessage`` in the state's ``messages`` as the user's words (D-75,
D-76). Off by default: a host that puts retrieved text into human messages would trust that text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Mapping, Sequence

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, StructuredTool
from langgraph.prebuilt import InjectedState
from langgraph.types import interrupt
from pydantic import BaseModel, ConfigDict

from tether.errors import InvalidApproval, UsageError
from tether.integrations._core import (
    RUN_ID,
    TOOL_NAME,
    answer,
    decide,
    description,
    for_model,
    pause_of,
    run_key,
    start,
)

if TYPE_CHECKING:
    from tether import Runtime

__all__ = ["decision", "execute_tool"]

ORIGIN = "langgraph"


def decision(pause: Mapping[str, Any], verdict: str | bool, *, approver: str | None = None,
             reason: str | None = None) -> dict[str, Any]:
    """The resume value deciding every write of ``pause`` (the interrupt's value): ``Command(resume=...)``.

    ``approver`` is the person the host established decides (its own sign-in); an approve without one is
    refused when the graph resumes, and nothing is sent.
    """
    return answer(pause, verdict, approver=approver, reason=reason)


def _human_words(state: Any) -> list[str] | None:
    """The text of every ``HumanMessage`` in ``state``'s ``messages`` (D-76); None for a state without any.

    A message's string content, or the text blocks of a list content; tool, AI and system messages are not
    the user's, nor are images or other blocks.
    """
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    texts: list[str] = []
    for message in messages if isinstance(messages, Sequence) and not isinstance(messages, str) else ():
        if not isinstance(message, HumanMessage):
            continue
        content = message.content
        for block in [content] if isinstance(content, str) else content:
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
    return texts or None


def execute_tool(rt: Runtime, *, principal: str | None = None, user_words: bool = False) -> StructuredTool:
    """The ``execute`` tool for a ToolNode, described by the text ``tether prompt`` prints.

    ``principal`` is whose runs it starts (the runtime's by default): an approval by that name is refused.
    ``user_words=True`` gives each run the text of the state's human messages as the user's words (D-76);
    leave it off where human messages carry anything but what the user wrote.
    """

    async def run(code: str, tool_call_id: str, config: RunnableConfig, key: str | None,
                  said: list[str] | None) -> dict[str, Any]:
        thread = (config.get("configurable") or {}).get("thread_id")
        # The same on every replay of this node for this call, different for every other call (P-36).
        # The model's own key (P-36) is scoped to the thread too: it names a run of this conversation only.
        named = run_key(ORIGIN, thread, key, tool_call_id)
        # A replay after an interrupt rejoins the run this key names, with the words it was started with.
        result = await start(rt, code, key=named, principal=principal, origin=ORIGIN, user_words=said)
        refused: dict[str, Any] | None = None
        while result.status == "paused":
            # A refused answer asks again, saying why: raised out of the node, it would stay recorded as this
            # interrupt's answer and be refused on every resume of the thread.
            pause = pause_of(rt, result) if refused is None else {**pause_of(rt, result), "refused": refused}
            given = interrupt(pause)
            try:
                if not isinstance(given, Mapping) or RUN_ID not in given:
                    raise InvalidApproval(
                        "resume a paused tether call with Command(resume=decision(pause, 'approve' | 'decline', "
                        f"approver=...)), which names its run and writes; got {given!r:.200}; nothing was decided")
                if given[RUN_ID] != result.run_id:
                    # An answer to another thread's pause, or a forged id: this node's run is the one it decides.
                    raise InvalidApproval(
                        f"this answer decides run {given[RUN_ID]!r:.80}, and this tool call's pause is of run "
                        f"{result.run_id}; resume with decision(pause, ...) of the pause the thread shows; "
                        "nothing was decided")
                result = await decide(rt, given, code=code, origin=ORIGIN, principal=principal)
                refused = None
            except UsageError as exc:
                # Any refusal of the answer (a person's rights, its shape, a write decided since, a run that
                # expired): raised, it would end the graph and stay this interrupt's answer on every resume.
                refused = exc.to_dict()
        return for_model(result)

    async def execute(code: str, tool_call_id: Annotated[str, InjectedToolCallId], config: RunnableConfig,
                      key: str | None = None) -> dict[str, Any]:
        return await run(code, tool_call_id, config, key, None)

    async def execute_with_words(code: str, tool_call_id: Annotated[str, InjectedToolCallId], config: RunnableConfig,
                                 state: Annotated[Any, InjectedState], key: str | None = None) -> dict[str, Any]:
        return await run(code, tool_call_id, config, key, _human_words(state))

    # Only the opted-in tool asks for the state: without the option the tool is what it always was.
    return StructuredTool.from_function(coroutine=execute_with_words if user_words else execute, name=TOOL_NAME,
                                        description=description(rt),
                                        args_schema=_ArgsWithState if user_words else _Args)


class _Args(BaseModel):
    """execute's arguments: ``code`` and ``key`` from the model, the call id injected by LangGraph.

    Nothing else: a model that adds arguments (``user_words``, ``approver``) is told they are not taken,
    rather than have them dropped without a word (D-76: the user's words come from the host only).
    """

    model_config = ConfigDict(extra="forbid")
    code: str
    tool_call_id: Annotated[str, InjectedToolCallId]
    key: str | None = None


class _ArgsWithState(_Args):
    state: Annotated[Any, InjectedState]
