"""What the MCP server returns: a run's envelope, a cell's observation, an error, as tool results.

Pure functions of tether's own values, kept apart from the server so that
urlmode.py and the server both use them without importing each other.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from mcp_types import CallToolResult, TextContent

from tether._engine.attempt.redaction import shown_args
from tether._engine.attempt.result import RunResult
from tether._engine.lineage.why import why_text
from tether._store.states import RunStatus
from tether._tools.shown import show_call
from tether.errors import TetherError

# Room for the values of the writes shown in an approval message or instructions (_tools/shown.py).
MAX_ARGS_CHARS = 600


def approval_message(pending: Mapping[str, Any], description: str | None = None,
                     schema: Mapping[str, Any] | None = None) -> str:
    """The question an MCP form asks: every argument named and escaped, secrets hidden (by name, by
    ``schema``'s ``format: password`` / ``writeOnly``, and by the names the pause recorded), the tool's
    description last."""
    shown = show_call(str(pending.get("address")), shown_args(pending), description=description,
                      budget=MAX_ARGS_CHARS, schema=schema)
    text = f"A program wants to call {shown.line()}. Allow this write?"
    if (pending.get("annotations") or {}).get("destructive"):
        text += " The tool is marked destructive."
    why = why_text(pending.get("reasons") or (), pending.get("args") or {})
    if why:
        text += f"\n\n{why}"
    about = shown.about()
    return text + (f"\n\n{about}" if about else "")


def resume_instructions(result: RunResult, *, approve_here: bool = True, elsewhere: str | None = None) -> str:
    """What the model is told about a paused run. It never carries an approval link (D-32).

    ``approve_here``: whether an approve through ``resume`` would be taken;
    otherwise ``elsewhere`` says where a person approves, and resume is named
    only for declining and cancelling.
    """
    pending = result.pending or {}
    writes = [w for w in (pending.get("writes") or [pending]) if not w.get("decision")] or [pending]

    def show(w: Mapping[str, Any]) -> str:
        line = show_call(str(w.get("address")), shown_args(w), budget=MAX_ARGS_CHARS // len(writes)).line()
        why = why_text(w.get("reasons") or (), w.get("args") or {}, lead=" — it waits because ")
        return f"{line} [seq {w.get('seq')}]{why.removesuffix('.')}"

    seq: Any = writes[0].get("seq") if len(writes) == 1 else [w.get("seq") for w in writes]
    if len(writes) == 1:
        head = f"The program paused before the write {show(writes[0])}; nothing has been sent. "
    else:
        head = (f"The program paused before {len(writes)} writes: " + "; ".join(show(w) for w in writes)
                + ". Nothing has been sent. ")
    if not approve_here:
        call = json.dumps({"run_id": result.run_id, "seq": seq, "decision": "decline"})
        return (head + f"It waits for a person's approval: {elsewhere or 'a person approves it elsewhere'}. "
                "Tell the user it waits for them; you cannot approve it yourself (resume answers an approve with "
                f"approval_elsewhere). To stop it instead, call the resume tool with {call} and a \"reason\" "
                "(the program gets a PermissionError and goes on), or \"decision\": \"cancel\" (the run stops).")
    call = json.dumps({"run_id": result.run_id, "seq": seq, "decision": "approve"})
    if len(writes) == 1:
        ask = "Ask the user whether to allow it. "
    else:
        ask = ("Ask the user about each; decide them together or one seq at a time (the run continues once "
               "all are decided). ")
    return (
        head + ask + f"Then call the resume tool with {call}, or with "
        "\"decision\": \"decline\" and a \"reason\" (the program gets a PermissionError and goes on), "
        "or \"decision\": \"cancel\" (the run stops)."
    )


def _without_capabilities(data: dict[str, Any]) -> dict[str, Any]:
    """A paused envelope without approval links or approval wait keys: the model's copy decides nothing."""
    pending = data.get("pending")
    if not isinstance(pending, dict):
        return data
    drop = ("approval_url", "key")
    pending = {k: v for k, v in pending.items() if k not in drop}
    if isinstance(pending.get("writes"), list):
        pending["writes"] = [{k: v for k, v in w.items() if k not in drop} if isinstance(w, dict) else w
                             for w in pending["writes"]]
    return {**data, "pending": pending}


def _decided_as_shown(event: dict[str, Any]) -> dict[str, Any]:
    """A decision as the agent following its cell sees it: who and through what, not the address the person
    decided from (the console's client address is the person's, not the agent's to read)."""
    return {k: v for k, v in event.items() if k != "origin"}


def run_result(result: RunResult, *, diagnostics: bool, approve_here: bool = True,
               elsewhere: str | None = None) -> CallToolResult:
    data = result.to_dict()
    if not diagnostics:
        data.pop("diagnostics", None)
    lead = ""
    if result.status == RunStatus.PAUSED:
        data = _without_capabilities(data)
        data["instructions"] = resume_instructions(result, approve_here=approve_here, elsewhere=elsewhere)
        lead = data["instructions"] + "\n"
    elif result.error:
        err = result.error
        lead = f"[{err.get('code')}] {err.get('message')}\nnext: {err.get('next_action')}\n"
    text = lead + json.dumps(data, ensure_ascii=False, default=str)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data,
                          is_error=result.status in (RunStatus.FAILED, RunStatus.CANCELLED))


def observation_result(obs: dict[str, Any], *, approve_here: bool = True,
                       elsewhere: str | None = None) -> CallToolResult:
    """A cell observation as text (outputs first) and structured content.

    A paused cell's pending writes, in the observation and in its ``paused``
    events, lose their approval keys, and its instructions are the MCP ones
    (D-32): what the model reads decides nothing.
    """
    events = [_without_capabilities(e) if e.get("type") == "paused" else _decided_as_shown(e) if e.get("type") == "decided"
              else e for e in obs.get("events") or []]
    obs = {**_without_capabilities(obs), "events": events}
    if obs.get("status") == "paused" and isinstance(obs.get("pending"), dict):
        paused = RunResult(status=RunStatus.PAUSED, run_id=obs["cell_id"], pending=obs["pending"])
        obs["instructions"] = resume_instructions(paused, approve_here=approve_here, elsewhere=elsewhere)
    lines = [f"[{obs['status']}] cell {obs['cell_id']} cursor {obs['cursor']}"]
    for e in obs["events"]:
        if e["type"] == "output":
            v = e.get("value")
            lines.append(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
        else:
            lines.append(f"<{e['type']}>")
    text = "\n".join(lines) + "\n" + json.dumps(obs, ensure_ascii=False, default=str)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=obs,
                          is_error=obs["status"] == "failed")


def error_result(exc: TetherError, *, run_id: str | None = None) -> CallToolResult:
    """A tool error for what stopped a request before or around a run (bad input, overload, unknown run)."""
    data = {"status": "error", "run_id": run_id, "error": exc.to_dict()}
    text = f"[{exc.code}] {exc.message}\nnext: {exc.next_action}\n" + json.dumps(data, ensure_ascii=False, default=str)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data, is_error=True)
