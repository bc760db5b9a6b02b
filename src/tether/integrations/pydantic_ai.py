"""tether's ``execute`` as a Pydantic AI capability; a paused write is a deferred tool call (docs/integrations.md).

    agent = Agent(model, capabilities=[TetherCapability(rt)], output_type=[str, DeferredToolRequests])

The agent gets one tool, ``execute(code, key=None)``, described by the text ``tether prompt`` prints. A
program that pauses at a write ends the agent's run with ``DeferredToolRequests``: the call waits for
approval, and its ``metadata`` is the pause (the run id and every undecided write, secrets hidden). The
host keeps the message history and those requests as long as it likes; in any process with the same
store and tools, ``DeferredToolResults`` decide it (D-69, D-70):

* an approval (``True`` / ``ToolApproved()``) is taken for the person the host names in the call's
  metadata (``approver``, see :func:`with_approver`), and only as tether's rules allow (never the
  principal that ran the program, never a write whose rule needs a signed-in approver);
* a denial (``False`` / ``ToolDenied(message)``) declines the writes with its message as the reason: the
  program gets its ``PermissionError`` and the model reads what the program did next.

Either way the run continues from its snapshot — nothing is run or sent a second time — and the tool's
result is the run's envelope; a run that pauses again defers the same call again. A pause decided
elsewhere meanwhile (the console, a cancel) decides nothing more: the result is the run as it is now.

The call names its run by the conversation (``conversation_id``) and the call id, or the model's key
(P-36): an agent run resumed from a history that ends with the call gets its run, never a second one.

With ``TetherCapability(rt, user_words=True)`` each run started carries the user's prompts of the
conversation (every ``UserPromptPart`` of ``ctx.messages``) as the user's words (D-75, D-76): under
``writes = "guard"`` a destination the user typed goes without a person though a result holds it too.
Off by default: a host that puts retrieved text into user prompts would trust that text.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pydantic_ai import CallToolsNode, DeferredToolRequests, FunctionToolset, RunContext, Tool, ToolApproved, ToolDenied
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from tether.errors import InvalidApproval
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

__all__ = ["TetherCapability", "with_approver"]

# Recorded with each decision (the timeline's origin) so a reader sees which framework carried it.
ORIGIN = "pydantic-ai"


@dataclasses.dataclass
class TetherCapability(AbstractCapability[Any]):
    """Gives the agent tether's ``execute``; pauses become deferred tool calls awaiting approval.

    ``principal`` is whose runs the agent starts (``Runtime(principal=...)``'s by default): an approval by
    that same name is refused, as the agent's own. ``user_words=True`` gives each run the user's prompts
    of the conversation as the user's words (D-76); leave it off where user prompts carry anything but what
    the user wrote.
    """

    runtime: Runtime
    principal: str | None = None
    user_words: bool = False

    def get_toolset(self) -> FunctionToolset[Any]:
        tool = Tool(self._execute, name=TOOL_NAME, description=description(self.runtime))
        return FunctionToolset([tool])

    async def _execute(self, ctx: RunContext[Any], code: str, key: str | None = None) -> dict[str, Any]:
        rt = self.runtime
        if ctx.tool_call_approved:
            # A deferred call decided: the pause it showed rides in its metadata (D-70).
            given = ctx.tool_call_metadata if isinstance(ctx.tool_call_metadata, dict) else {}
            if "decision" not in given:
                approver = given.get("approver")
                given = answer(given, "approve", approver=approver if isinstance(approver, str) else None)
            result = await decide(rt, given, code=code, origin=ORIGIN, principal=self.principal,
                                  key=_run_key(ctx, key))
        else:
            said = _user_prompts(ctx.messages) if self.user_words else None
            result = await start(rt, code, key=_run_key(ctx, key), principal=self.principal, origin=ORIGIN,
                                 user_words=said)
        if result.status == "paused":
            raise ApprovalRequired(metadata=pause_of(rt, result))
        return for_model(result)

    async def before_node_run(self, ctx: RunContext[Any], *, node: Any) -> Any:
        """A denial of a tether call becomes a decline tether takes, instead of leaving the run paused.

        Pydantic AI answers a denied call without calling its tool; a run left paused could still be approved
        on the console after the model was told no. So the denial is turned into the call's own decline.
        """
        if not isinstance(node, CallToolsNode) or not node.tool_call_results:
            return node
        ours = {c.tool_call_id for c in node.model_response.tool_calls if c.tool_name == TOOL_NAME}
        results, metadata = dict(node.tool_call_results), dict(node.tool_call_metadata or {})
        changed = False
        for call_id, result in node.tool_call_results.items():
            if call_id not in ours or not isinstance(result, ToolDenied):
                continue
            pause = metadata.get(call_id)
            if not isinstance(pause, dict) or RUN_ID not in pause:
                raise InvalidApproval(
                    f"the denial of tool call {call_id!r} carries no tether pause: pass the requests' metadata "
                    "in DeferredToolResults(metadata=...) so tether declines the run; nothing was decided")
            approver = pause.get("approver")
            metadata[call_id] = answer(pause, "decline", reason=result.message,
                                       approver=approver if isinstance(approver, str) else None)
            results[call_id] = ToolApproved()
            changed = True
        if not changed:
            return node
        return dataclasses.replace(node, tool_call_results=results, tool_call_metadata=metadata)


def _run_key(ctx: RunContext[Any], key: str | None) -> str | None:
    """The run key (P-36, D-84) of a tool call: the conversation's, with the model's own key or else the call's id.

    A host that runs the same call again (an agent run resumed from a history that ends with it, a durable
    step retried) gets the call's run, never a second one that sends its writes again. The conversation
    (Pydantic AI's ``conversation_id``, carried by the history) scopes both: a call id or a key the model
    names reaches no run of another conversation of the same principal.
    """
    if ctx.conversation_id is None or not ctx.tool_call_id:
        return key  # outside an agent run (a test calling the tool): the model's key as given
    return run_key(ORIGIN, ctx.conversation_id, key, ctx.tool_call_id)


def _user_prompts(messages: list[ModelMessage]) -> list[str] | None:
    """The text of every user prompt in ``messages`` (D-76): a prompt's string, or the strings of its items;
    None when there is none.

    Only ``UserPromptPart``: tool returns, retry prompts, system prompts and instructions are not the user's;
    nor are typed items (``TextContent``, ``StructuredContent``: text the application attaches) or media.
    """
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if not isinstance(part, UserPromptPart):
                continue
            content = part.content
            texts.extend([content] if isinstance(content, str) else [c for c in content if isinstance(c, str)])
    return texts or None


def with_approver(requests: DeferredToolRequests, approver: str) -> dict[str, dict[str, Any]]:
    """The metadata to pass back in ``DeferredToolResults(metadata=...)``: each tether pause, with the
    person the host established decides it (its own sign-in, not anything the agent said)."""
    return {call_id: {**meta, "approver": approver} for call_id, meta in requests.metadata.items()
            if isinstance(meta, dict) and RUN_ID in meta}
