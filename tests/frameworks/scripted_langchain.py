"""A LangChain chat model that emits scripted tool calls, and the LangGraph agent graph around it.

The model's answer is a function of the conversation (not of a counter), so a graph resumed in another
process asks it the same thing and gets the same answer: first a call to ``execute`` with the program,
then, once a tool message is in, a message quoting what the tool returned.
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tether.integrations.langgraph import execute_tool


class ScriptedChatModel(BaseChatModel):
    program: str
    tool_names: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "ScriptedChatModel":
        return self.model_copy(update={"tool_names": [t.name for t in tools]})

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            message = AIMessage(content=f"the tool returned: {last.content}")
        else:
            assert self.tool_names == ["execute"], self.tool_names
            message = AIMessage(content="", tool_calls=[
                {"name": "execute", "args": {"code": self.program}, "id": "call-1", "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


def graph_of(rt: Any, program: str, checkpointer: Any) -> Any:
    """The usual tool-calling agent: model -> tools -> model, until the model calls no tool."""
    tools = [execute_tool(rt)]
    return agent_graph(ScriptedChatModel(program=program).bind_tools(tools), tools, checkpointer)


def agent_graph(model: Any, tools: list[Any], checkpointer: Any) -> Any:
    """LangGraph's own agent loop around ``model`` (already bound to ``tools``): model -> ToolNode -> model."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)
