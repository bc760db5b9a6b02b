"""tether's ``execute`` as an OpenAI Agents SDK tool; a paused write is a run interruption (docs/integrations.md).

    agent = Agent(name="desk", model=model, tools=[execute_tool(rt)], hooks=TetherHooks(rt))

The tool's ``needs_approval`` runs the program: a program that pauses at a write asks for approval, so
the agent's run ends with ``result.interruptions``; :func:`pause_for` shows the deciding person each write
(secrets hidden). The host serialises ``result.to_state()`` and, in any process with the same store and
tools, loads it (``RunState.from_string``), decides with ``state.approve(item)`` / ``state.reject(item)``
and runs it again (D-69, D-70):

* an approve is taken for the person ``approver(ctx)`` names (by default ``context["approver"]`` of a
  mapping context, which the host sets from its own sign-in), never the principal that ran the program,
  never a write whose rule needs a signed-in approver, never an ``always_approve`` (no person saw the
  later calls' writes); a refused approve raises, and nothing is sent;
* a reject cancels the run, nothing of it sent (the model reads the rejection message); :class:`TetherHooks`
  takes it on the agent's next model call, so the run is not left paused for someone to approve later.

The run continues from its snapshot, never sending twice, and the tool's output is the run's envelope. The
SDK asks once per tool call: a program that pauses again returns its pause to the model, which calls
``execute`` again with the same code and ``key`` to ask for the next write.

The SDK's tool context does not carry the run's input items, so the user's words (D-75, D-76) come from the
host: ``execute_tool(rt, user_words=lambda ctx: ctx.context["user_words"])`` gives each run started what that
function returns from the run's context (the user's messages, which the host puts there). None by default:
a host that puts retrieved text among them would trust that text.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agents import AgentHooks, FunctionTool, RunContextWrapper, ToolApprovalItem
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext

from tether._store.states import RunStatus
from tether.errors import ApprovalRefused, InvalidArguments
from tether.integrations._core import TOOL_NAME, answer, decide, description, for_model, pause_of, start

if TYPE_CHECKING:
    from tether import RunResult, Runtime

__all__ = ["TetherHooks", "execute_tool", "pause_for"]

ORIGIN = "openai-agents"
# The run's timeline event naming the writes an interruption of a tool call asked about: its approval
# decides those and no others (D-69), however often the approved RunState is run.
ASKED = "openai_agents_asked"
# How the run's timeline is read for that event: pages of PAGE, at most MAX_PAGES.
PAGE, MAX_PAGES = 1000, 1000
# A call id no model issues: an approval that reaches it too was given for every call, not this one.
_NEVER_ISSUED = "tether-never-issued-call"
_PARAMS = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python program to run."},
                   "key": {"type": ["string", "null"], "description": "Names the run: the same key and code "
                           "get the same run, never a second one."}},
    "required": ["code", "key"],
    "additionalProperties": False,
}


def _context_approver(ctx: RunContextWrapper[Any]) -> str | None:
    value = ctx.context.get("approver") if isinstance(ctx.context, Mapping) else None
    return value if isinstance(value, str) and value else None


# What a model that called execute wrongly reads next (the error's own advice is for tools inside a program).
_CALL_IT_SO = 'Call execute again with {"code": "<the Python program>", "key": null} (or a key string).'


def _wrong(message: str) -> InvalidArguments:
    return InvalidArguments(message, next_action=_CALL_IT_SO)


def _call(arguments: str | Mapping[str, Any], call_id: str) -> tuple[str, str]:
    """(code, run key) of a tool call: the model's own key, else one made of the call id (P-36).

    The arguments are the model's: anything but ``{"code": str, "key": str | null}`` raises InvalidArguments
    saying so (the SDK's strict schema binds only models that honour it), and nothing is run.
    """
    try:
        params = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested past the parser's depth
        raise _wrong(f"execute's arguments are not JSON ({type(exc).__name__}); nothing was run") from None
    if not isinstance(params, dict):
        raise _wrong(f"execute's arguments are a JSON object, not a JSON {type(params).__name__}; nothing was run")
    extra = sorted(str(k)[:40] for k in params if k not in ("code", "key"))
    if extra:
        # Who approves and what the user said come from the host, never from a tool call's arguments (D-76).
        raise _wrong(f"execute takes `code` and `key` only, not {', '.join(extra)[:200]}; nothing was run")
    code, key = params.get("code"), params.get("key")
    if not isinstance(code, str):
        raise _wrong("execute takes the program as `code`, a string; nothing was run")
    if key is not None and not isinstance(key, str):
        raise _wrong("execute's `key` is a string naming the run, or null; nothing was run")
    return code, key if key else f"openai-agents:{call_id}"


def execute_tool(rt: Runtime, *, principal: str | None = None,
                 approver: Callable[[RunContextWrapper[Any]], str | None] = _context_approver,
                 user_words: Callable[[RunContextWrapper[Any]], str | Sequence[str] | None] | None = None,
                 ) -> FunctionTool:
    """The ``execute`` tool, described by the text ``tether prompt`` prints.

    ``principal`` is whose runs it starts (the runtime's by default); ``approver`` gives the person the host
    established approves, from the run's context. ``user_words`` gives the user's messages from the run's
    context, for each run started (D-76); leave it unset where they hold anything but what the user wrote.
    """

    async def run(code: str, key: str, said: str | Sequence[str] | None = None) -> RunResult:
        return await start(rt, code, key=key, principal=principal, origin=ORIGIN, user_words=said)

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        # The program runs here: whether the call needs a person is whether it paused at a write.
        try:
            code, key = _call(params, call_id)
        except InvalidArguments:
            return False  # nothing to run: the call itself tells the model
        # The run starts here, so the user's words are read here; the tool's own call rejoins the run by its
        # key (P-36), words and all: a RunState loaded to decide needs none in its context (D-76).
        result = await run(code, key, user_words(ctx) if user_words is not None else None)
        if result.status != RunStatus.PAUSED:
            return False
        await rt.engine.events.emit_awaited(result.run_id, ASKED, {"call_id": call_id, "seqs": _seqs(rt, result)})
        return True

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        try:
            code, key = _call(arguments, ctx.tool_call_id)
        except InvalidArguments as exc:
            return json.dumps({"status": "failed", "error": exc.to_dict()})
        result = await run(code, key)  # the run needs_approval started (P-36), not a second one
        if result.status == RunStatus.PAUSED:
            if ctx.is_tool_approved(TOOL_NAME, ctx.tool_call_id) is not True:
                # Asked again by the model after a pause this call did not ask about: ask the SDK's way.
                return json.dumps(_paused_for_model(rt, result, key))
            if ctx.is_tool_approved(TOOL_NAME, _NEVER_ISSUED) is True:
                # state.approve(item, always_approve=True): every later call reads approved, and no person
                # was shown their writes.
                raise ApprovalRefused(
                    f"execute is approved for every call (always_approve), which is no person's decision on "
                    f"these writes; approve each interruption instead. Nothing was decided and nothing was "
                    f"sent; run {result.run_id} stays paused")
            pause = pause_of(rt, result)
            if await _asked(rt, result.run_id, ctx.tool_call_id) != _seqs(rt, result, pause):
                # Approved for writes this run has decided since (a RunState run again, a twin call of the same
                # run): no person was shown these. Ask for them the SDK's way.
                return json.dumps(_paused_for_model(rt, result, key))
            given = answer(pause, "approve", approver=approver(ctx))
            result = await decide(rt, given, code=code, origin=ORIGIN, principal=principal)
            if result.status == RunStatus.PAUSED:
                return json.dumps(_paused_for_model(rt, result, key))
        return json.dumps(for_model(result), ensure_ascii=False, default=str)

    tool = FunctionTool(name=TOOL_NAME, description=description(rt), params_json_schema=_PARAMS,
                        on_invoke_tool=invoke, needs_approval=needs_approval, strict_json_schema=True)
    # A refused approval is the host's error to see, not a message for the model: nothing was decided.
    return set_function_tool_failure_error_function(tool, None)


def _seqs(rt: Runtime, result: RunResult, pause: Mapping[str, Any] | None = None) -> list[int]:
    """The undecided writes of a paused run, as its interruption shows them."""
    return [int(w["seq"]) for w in (pause or pause_of(rt, result))["writes"]]


async def _asked(rt: Runtime, run_id: str, call_id: str) -> list[int] | None:
    """The writes the latest interruption of tool call ``call_id`` asked about (recorded, any process)."""
    asked, after = None, 0
    for _ in range(MAX_PAGES):
        page = await rt.store.aio.get_events(run_id, after=after, limit=PAGE)
        for event in page:
            data = event.data or {}
            if event.type == ASKED and data.get("call_id") == call_id and isinstance(data.get("seqs"), list):
                asked = data["seqs"]
        if len(page) < PAGE or page[-1].event_id <= after:
            break
        after = page[-1].event_id
    return asked


def _paused_for_model(rt: Runtime, result: RunResult, key: str) -> dict[str, Any]:
    writes = [w["shown"].splitlines()[0] + "(...)" for w in pause_of(rt, result)["writes"]]
    return {"status": "paused", "run_id": result.run_id,
            "instructions": f"The program paused before {len(writes)} more write(s) ({', '.join(writes)}); nothing "
                            f"of them was sent. Call execute again with the same code and key={key!r} to ask the "
                            "user to approve them."}


def pause_for(rt: Runtime, item: ToolApprovalItem, *, principal: str | None = None) -> dict[str, Any] | None:
    """What an interruption of ``execute`` waits on, to show the deciding person: the run id and every
    undecided write with every argument (secrets hidden); None for another tool's or a finished run."""
    raw = item.raw_item
    call_id = raw.get("call_id") if isinstance(raw, Mapping) else getattr(raw, "call_id", None)
    arguments = raw.get("arguments") if isinstance(raw, Mapping) else getattr(raw, "arguments", None)
    if item.tool_name != TOOL_NAME or not isinstance(call_id, str) or not isinstance(arguments, str):
        return None
    try:
        _, key = _call(arguments, call_id)
    except InvalidArguments:
        return None  # arguments the SDK could not read ask for approval too; they run no program
    run = rt.store.get_run_by_key(principal or rt.principal, key)
    if run is None or run.status != RunStatus.PAUSED:
        return None
    return pause_of(rt, rt.engine.recorded(run))


class TetherHooks(AgentHooks[Any]):
    """Cancels a rejected ``execute`` call's run on the agent's next model call (``Agent(hooks=...)``).

    The SDK answers a rejected call with its rejection message and never calls the tool; without this the
    run would stay paused after the model was told no.
    """

    def __init__(self, rt: Runtime, *, principal: str | None = None) -> None:
        self.rt, self.principal = rt, principal

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Any, system_prompt: str | None,
                           input_items: list[Any]) -> None:
        outputs = {i.get("call_id"): i.get("output") for i in input_items
                   if isinstance(i, Mapping) and i.get("type") == "function_call_output"}
        for item in input_items:
            if not (isinstance(item, Mapping) and item.get("type") == "function_call"
                    and item.get("name") == TOOL_NAME and isinstance(item.get("call_id"), str)):
                continue
            call_id = item["call_id"]
            if context.is_tool_approved(TOOL_NAME, call_id) is not False:
                continue
            try:
                code, key = _call(str(item.get("arguments") or "{}"), call_id)
            except InvalidArguments:
                continue
            run = await self.rt.store.aio.get_run_by_key(self.principal or self.rt.principal, key)
            if run is None or run.status != RunStatus.PAUSED or run.program != code:
                continue  # never started, decided already, or not this call's
            output = outputs.get(call_id)
            # The call was rejected whole: the model reads the rejection, never what the program would do next,
            # so the run stops rather than continue past a declined write (D-70).
            await self.rt.cancel(run.run_id, output if isinstance(output, str) else "rejected",
                                 principal=self.principal)
