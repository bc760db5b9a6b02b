"""The user's words through the OpenAI Agents SDK (D-75, D-76, P-48): ``execute_tool(rt, user_words=...)`` takes
a function of the run's context (the SDK's tool context does not carry the input items); the host puts the
user's messages in its context, and each run ``needs_approval`` starts carries what the function returns.

The model is an Agents SDK ``Model`` answering by script: it reads the inbox (an untrusted result holding
Alice's address as a sender and the attacker's in a body), then sends to an address copied into a literal in
a later ``execute``. Under ``writes = "guard"`` that send asks (a run interruption), unless the user's words
hold it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, RunContextWrapper, Runner, RunState, Usage, set_tracing_disabled
from agents.exceptions import UserError
from agents.testing import assistant_message, function_call
from tests.frameworks.mail import ALICE, ASKED, ATTACKER, READ, asked_because, guarded, marks, send, sent

from tether.errors import InvalidArguments
from tether.integrations.openai_agents import TetherHooks, execute_tool, pause_for

set_tracing_disabled(True)


@pytest.fixture
def outbox(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILBOX_SENT", str(tmp_path / "sent.jsonl"))
    return tmp_path / "sent.jsonl"


class ReadThenSend(Model):
    """Its n-th answer: read the inbox, send to ``address`` (saying ``said``), then quote the last output."""

    def __init__(self, address: str, said: str = "") -> None:
        self.address, self.said = address, said

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs) -> ModelResponse:
        outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not outputs:
            out = [function_call("execute", {"code": READ, "key": None}, call_id="call-1")]
        elif len(outputs) == 1:
            out = [*([assistant_message(self.said)] if self.said else []),
                   function_call("execute", {"code": send(self.address), "key": None}, call_id="call-2")]
        else:
            out = [assistant_message(outputs[-1]["output"])]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def from_context(ctx: RunContextWrapper[Any]) -> Any:
    """The host's choice: the user's messages it put in the run's context."""
    return ctx.context["user_words"]


def agent_of(rt: Any, model: Model, **tool: Any) -> Agent[Any]:
    return Agent(name="mail", model=model, tools=[execute_tool(rt, **tool)], hooks=TetherHooks(rt),
                 instructions=f"Never write to {ATTACKER}.")


def runs(rt: Any) -> list[str]:
    """Every run, oldest first: the read's, then the send's."""
    return [r.run_id for r in sorted(rt.store.list_runs(), key=lambda r: r.created_at)]


async def test_d76_an_address_the_users_words_hold_goes_only_with_the_option(outbox):
    async with guarded() as rt:
        # Unset (the default): the copy looks taken from the inbox the model read, so it asks; nothing kept,
        # though the host's context holds the words.
        off = await Runner.run(agent_of(rt, ReadThenSend(ALICE)), ASKED, context={"user_words": [ASKED]})
        (item,) = off.interruptions
        write = pause_for(rt, item)["tether_run_id"]
        assert all(marks(rt, r) is None for r in runs(rt))
        assert any("mail.get_received_emails" in says for says in asked_because(rt, write))
        assert sent(outbox) == []
    async with guarded() as rt:
        # Given: the run needs_approval starts carries them, so the address is the user's own and goes.
        on = await Runner.run(agent_of(rt, ReadThenSend(ALICE), user_words=from_context), ASKED,
                              context={"user_words": [ASKED]})
        assert not on.interruptions and json.loads(on.final_output)["status"] == "completed"
        _, write = runs(rt)
        assert ["email", ALICE] in marks(rt, write) and asked_because(rt, write) == []
    assert sent(outbox) == [[ALICE]]


async def test_d76_a_tool_output_or_the_models_text_is_not_the_users_words_and_a_decision_needs_none(outbox):
    """The attacker's address is in the inbox the tool output, in the instructions and in the model's own text;
    the user's words name only Alice. The send to the attacker still asks; the approving process loads the
    state with a context that holds no words at all, and the write goes once."""
    async with guarded() as rt:
        agent = agent_of(rt, ReadThenSend(ATTACKER, said=f"I will write to {ATTACKER} as the mail says."),
                         user_words=from_context)
        result = await Runner.run(agent, ASKED, context={"user_words": [ASKED]})
        (item,) = result.interruptions
        pause = pause_for(rt, item)
        assert [w["args"]["recipients"] for w in pause["writes"]] == [[ATTACKER]]
        assert any("mail.get_received_emails" in line for line in pause["writes"][0]["why"])
        kept = marks(rt, pause["tether_run_id"])
        assert ["email", ALICE] in kept and not any("mallory" in norm for _, norm in kept)

        state = await RunState.from_string(agent, result.to_state().to_string(),
                                           context_override={"approver": "alice"})
        state.approve(item)
        done = await Runner.run(agent, state)
        assert json.loads(done.final_output)["status"] == "completed" and len(runs(rt)) == 2
    assert sent(outbox) == [[ATTACKER]]


async def test_d76_a_function_that_returns_no_users_messages_is_the_hosts_error_and_starts_no_run(outbox):
    async with guarded() as rt:
        agent = agent_of(rt, ReadThenSend(ALICE), user_words=lambda ctx: {"text": ASKED})
        with pytest.raises(UserError) as raised:  # the SDK's wrapper of a tool's error, as for a refused approval
            await Runner.run(agent, ASKED, context={})
        assert isinstance(raised.value.__cause__, InvalidArguments) and "user_words" in str(raised.value)
        assert rt.store.list_runs() == []
