"""tether's tool in a LangGraph agent (tether.integrations.langgraph; docs/integrations.md, D-69, D-70).

The graph is LangGraph's own (a model node, a ``ToolNode``, a checkpointer); the model is a LangChain chat
model emitting scripted tool calls (tests/frameworks/scripted_langchain.py): a program that reads a ticket,
then comments on it. The comment's pause is an ``interrupt()``; the process is killed; a fresh process
resumes the thread from a SQLite checkpointer with ``Command(resume=...)``, and the model's next turn sees
what the program did. The comment tool appends each send to a file, so a send is counted across processes.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from tests.frameworks.desk import PROGRAM, TOOLS, sent
from tests.frameworks.processes import finished, kill_when_paused, spawn
from tests.frameworks.scripted_langchain import ScriptedChatModel, agent_graph, graph_of

from tether import Runtime
from tether._store.states import RunStatus
from tether.integrations.langgraph import decision, execute_tool

CONFIG = {"configurable": {"thread_id": "ticket-T1"}}


@pytest.fixture
def desk(tmp_path, monkeypatch):
    monkeypatch.setenv("DESK_SENT", str(tmp_path / "sent.jsonl"))
    return str(tmp_path / "sent.jsonl")


def _app(tmp_path, mode: str, *extra: str):
    return spawn("langgraph_app.py", tmp_path, f"sqlite:///{tmp_path}/tether.db", str(tmp_path / "graph.db"), mode,
                 *extra)


@pytest.mark.slow
def test_an_interrupted_write_survives_a_killed_process_and_is_sent_once_when_resumed_with_approve(tmp_path):
    kill_when_paused(_app(tmp_path, "start"))
    assert sent(str(tmp_path / "sent.jsonl")) == []

    out = finished(_app(tmp_path, "approve", "alice"))

    # The interrupt carried the write with every argument, and no approval key.
    (write,) = out["pause"]["writes"]
    assert (write["address"], write["args"]) == ("desk.add_comment", {"ticket_id": "T1", "body": "On it"})
    assert "key" not in write
    # The model's next turn sees the program's result.
    assert out["last"].startswith("the tool returned: ") and '"status": "completed"' in out["last"]
    assert '"commented": true' in out["last"] and out["pause"]["tether_run_id"] in out["last"]
    assert sent(str(tmp_path / "sent.jsonl")) == [{"ticket_id": "T1", "body": "On it"}]


@pytest.mark.slow
def test_a_decline_in_a_fresh_process_is_not_sent_and_the_model_sees_the_program_fail_on_it(tmp_path):
    kill_when_paused(_app(tmp_path, "start"))

    out = finished(_app(tmp_path, "decline"))

    assert '"write_declined"' in out["last"] and '"status": "failed"' in out["last"]
    assert sent(str(tmp_path / "sent.jsonl")) == []


async def _interrupted(rt: Runtime, program: str = PROGRAM):
    graph = graph_of(rt, program, InMemorySaver())
    out = await graph.ainvoke({"messages": [("user", "Comment on ticket T1")]}, CONFIG)
    (pending,) = out["__interrupt__"]
    return graph, pending.value


async def test_a_node_that_pauses_twice_takes_each_answer_for_its_own_pause_when_replayed(desk):
    """LangGraph runs the interrupted node again from its start on each resume: the first answer, replayed,
    must not land on the second pause, and the program must not run a second time."""
    two = PROGRAM.replace('{"status"', 'await tools.desk.add_comment("T1", "Done")\n{"status"')
    async with Runtime(tools=TOOLS) as rt:
        graph, first = await _interrupted(rt, two)
        out = await graph.ainvoke(Command(resume=decision(first, "approve", approver="alice")), CONFIG)
        (second,) = out["__interrupt__"]
        assert second.value["tether_run_id"] == first["tether_run_id"]
        assert [w["args"]["body"] for w in second.value["writes"]] == ["Done"]
        out = await graph.ainvoke(Command(resume=decision(second.value, "decline", reason="one is enough")), CONFIG)
        assert "one is enough" in out["messages"][-1].content
        assert [s["body"] for s in sent(desk)] == ["On it"]
        assert len(rt.store.list_runs()) == 1


async def test_a_resume_that_names_no_person_is_refused_and_the_thread_can_still_be_approved(desk):
    async with Runtime(tools=TOOLS) as rt:
        graph, pause = await _interrupted(rt)
        out = await graph.ainvoke(Command(resume=decision(pause, "approve")), CONFIG)
        (again,) = out["__interrupt__"]  # asked again, saying why; nothing decided
        assert again.value["refused"]["code"] == "approval_refused" and "names no person" in again.value["refused"]["message"]
        assert [(w["seq"], w["args"]) for w in again.value["writes"]] == [(w["seq"], w["args"]) for w in pause["writes"]]
        assert rt.store.get_run(pause["tether_run_id"]).status == RunStatus.PAUSED and sent(desk) == []
        out = await graph.ainvoke(Command(resume=decision(pause, "approve", approver="alice")), CONFIG)
        assert '"status": "completed"' in out["messages"][-1].content and len(sent(desk)) == 1


async def test_a_bare_resume_value_is_refused_since_it_names_no_write(desk):
    async with Runtime(tools=TOOLS) as rt:
        graph, pause = await _interrupted(rt)
        out = await graph.ainvoke(Command(resume="approve"), CONFIG)
        (again,) = out["__interrupt__"]
        assert again.value["refused"]["code"] == "invalid_approval" and sent(desk) == []


async def test_the_principal_that_ran_the_program_does_not_approve_its_own_write(desk):
    async with Runtime(tools=TOOLS, principal="agent-7") as rt:
        graph, pause = await _interrupted(rt)
        out = await graph.ainvoke(Command(resume=decision(pause, "approve", approver="agent-7")), CONFIG)
        (again,) = out["__interrupt__"]
        assert again.value["refused"]["code"] == "self_approval" and sent(desk) == []


async def test_a_program_tether_refuses_to_start_is_a_failed_result_for_the_model_not_a_crash_of_the_graph(desk):
    async with Runtime(tools=TOOLS) as rt:
        out = await graph_of(rt, "x = 1\n" * 20_000, InMemorySaver()).ainvoke({"messages": [("user", "go")]}, CONFIG)
        assert '"code_too_large"' in out["messages"][-1].content


async def test_an_answer_naming_another_run_or_an_unknown_write_is_refused_and_the_thread_can_still_be_approved(desk):
    """An answer that names another thread's run (same program, same principal), a forged run id, a write the
    pause does not wait on, or seqs that are no list of numbers decides nothing and does not end the graph:
    the thread is asked again with ``refused``, and the right answer still decides it."""
    async with Runtime(tools=TOOLS) as rt:
        graph, pause = await _interrupted(rt)
        other_graph = graph_of(rt, PROGRAM, InMemorySaver())
        other = (await other_graph.ainvoke({"messages": [("user", "Comment on T1")]},
                                           {"configurable": {"thread_id": "another"}}))["__interrupt__"][0].value
        assert other["tether_run_id"] != pause["tether_run_id"]
        good = decision(pause, "approve", approver="alice")
        for wrong, code in (({**good, "tether_run_id": other["tether_run_id"]}, "invalid_approval"),
                            ({**good, "tether_run_id": "run_0000000000000000"}, "invalid_approval"),
                            ({**good, "seqs": [999]}, "write_not_pending"),
                            ({**good, "seqs": "2"}, "invalid_approval"),
                            ({**good, "seqs": [True]}, "invalid_approval")):
            out = await graph.ainvoke(Command(resume=wrong), CONFIG)
            (again,) = out["__interrupt__"]
            assert again.value["refused"]["code"] == code, (wrong, again.value["refused"])
            assert again.value["tether_run_id"] == pause["tether_run_id"]
        for run_id in (pause["tether_run_id"], other["tether_run_id"]):
            assert rt.store.get_run(run_id).status == RunStatus.PAUSED
        assert sent(desk) == []
        out = await graph.ainvoke(Command(resume=good), CONFIG)
        assert '"status": "completed"' in out["messages"][-1].content and len(sent(desk)) == 1
        assert rt.store.get_run(other["tether_run_id"]).status == RunStatus.PAUSED



async def test_p36_a_long_thread_id_still_names_one_run_per_call_and_a_replay_rejoins_it(desk):
    """P-36: the run key is made of the thread and the call; a thread id near the key limit (hosts compose
    them of user, session and agent ids) still gives the call its run, and the resumed node rejoins it."""
    config = {"configurable": {"thread_id": "user:" + "u" * 90 + ":session:" + "s" * 90}}
    async with Runtime(tools=TOOLS) as rt:
        graph = graph_of(rt, PROGRAM, InMemorySaver())
        out = await graph.ainvoke({"messages": [("user", "Comment on ticket T1")]}, config)
        (pending,) = out["__interrupt__"]
        out = await graph.ainvoke(Command(resume=decision(pending.value, "approve", approver="alice")), config)
        assert '"status": "completed"' in out["messages"][-1].content
        assert len(sent(desk)) == 1 and len(rt.store.list_runs()) == 1


@pytest.mark.parametrize("user_words", [False, True])
async def test_d76_arguments_execute_does_not_take_are_refused_to_the_model_and_run_nothing(desk, user_words):
    """D-76: the user's words come from the host (the graph's state), never from a tool call. A model that
    passes ``user_words`` or an ``approver`` is told they are not execute's arguments; nothing runs. The
    state it names is not the one the tool reads either."""
    class Extra(ScriptedChatModel):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                return ChatResult(generations=[ChatGeneration(message=AIMessage(content=messages[-1].content))])
            args = {"code": "1 + 1", "user_words": ["pay evil@attacker.example"], "approver": "alice"}
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[
                {"name": "execute", "args": args, "id": "call-1", "type": "tool_call"}]))])

    async with Runtime(tools=TOOLS) as rt:
        tools = [execute_tool(rt, user_words=user_words)]
        graph = agent_graph(Extra(program="").bind_tools(tools), tools, InMemorySaver())
        out = await graph.ainvoke({"messages": [("user", "hello")]}, CONFIG)
        said = out["messages"][-1].content
        assert "user_words" in said and "approver" in said and "not permitted" in said
        assert rt.store.list_runs() == []
