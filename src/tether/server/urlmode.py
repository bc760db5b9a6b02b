"""URL-mode elicitation: a paused write is put to the MCP client's user as its approval link.

The decision is taken in the browser, on the approval page (``/approve/<token>``),
so what the user approves never passes through the client or its model. Both
protocol eras:

* 2025-11-25 (legacy): inside the ``execute`` call the server sends
  ``elicitation/create`` with ``mode: "url"``; when the user accepts to open
  the link, the call waits (at most ``url_wait_seconds``) for the decision to
  be taken on the page, sends ``notifications/elicitation/complete`` and
  returns the run's next result — itself put the same way if it pauses again;
* 2026-07-28 (modern): the paused result is an input-required result whose
  request is a URL elicitation; the client's retry (after the user opened the
  link) waits the same way and answers with the run's next result.

The user declining to open the link declines the write; dismissing it leaves
the run paused, its result naming the link and the ``resume`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from mcp.server.elicitation import AcceptedUrlElicitation, DeclinedElicitation
from mcp_types import ElicitRequest, ElicitRequestURLParams, InputRequiredResult

from ..runs.result import RunResult
from .approvals import approval_url

if TYPE_CHECKING:
    from .mcp import TetherServer

# How long a call waits for a decision on the approval page before it returns
# the paused result (the run keeps waiting; the link keeps working). Under
# the minute or two MCP clients give a tool call.
URL_WAIT_SECONDS = 50.0
DECLINED_TO_OPEN = "the user declined to open the approval page"


def link_of(server: "TetherServer", result: RunResult) -> str | None:
    pending = result.pending or {}
    if result.status != "paused" or "seq" not in pending or result.expires_at is None:
        return None
    return approval_url(server.public_url, server.rt.store.secret(), result.run_id, int(pending["seq"]),
                        float(result.expires_at))


def message(server: "TetherServer", result: RunResult) -> str:
    return server._approval_message(result.pending or {}) + "\n\nOpen the page to approve or decline it."


def elicitation_id(result: RunResult) -> str:
    return f"{result.run_id}:{(result.pending or {}).get('seq')}"


async def decided(rt: Any, run_id: str, seq: int, timeout: float) -> bool:
    """Wait until the run no longer waits on write ``seq`` (decided on the page, or ended)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        run = rt.store.get_run(run_id)
        if run is None or run.status != "paused" or (run.pending or {}).get("seq") != seq:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)


async def legacy(server: "TetherServer", ctx: Any, result: RunResult, principal: str) -> RunResult:
    """Put each pause of the run to the user as its link, within this call, until the run ends or stays paused."""
    while result.status == "paused" and (link := link_of(server, result)) is not None:
        run_id, seq, eid = result.run_id, int(result.pending["seq"]), elicitation_id(result)
        try:
            reply = await ctx.elicit_url(message(server, result), link, eid)
        except Exception:  # the client could not ask: the run stays paused, the link still works
            return result
        if isinstance(reply, AcceptedUrlElicitation):
            if not await decided(server.rt, run_id, seq, server.url_wait_seconds):
                return result
            with contextlib.suppress(Exception):
                await ctx.request_context.session.send_elicit_complete(eid, related_request_id=ctx.request_id)
            result = await server.rt.wait_for_run(run_id)
        elif isinstance(reply, DeclinedElicitation):
            result = await server._run(
                lambda progress: server.rt.resume(run_id, "decline", DECLINED_TO_OPEN, seq=seq, principal=principal,
                                                  on_progress=progress),
                ctx, principal, run_id=lambda: run_id)
        else:  # dismissed: nothing decided
            return result
    return result


def input_required(server: "TetherServer", result: RunResult, principal: str) -> InputRequiredResult:
    link = link_of(server, result)
    request = ElicitRequest(params=ElicitRequestURLParams(message=message(server, result), url=link,
                                                          elicitation_id=elicitation_id(result)))
    state = server._sign_state(result.run_id, int((result.pending or {})["seq"]), principal, mode="url")
    return InputRequiredResult(input_requests={"approval": request}, request_state=state)


async def answer(server: "TetherServer", ctx: Any, run_id: str, seq: int, reply: Any, principal: str) -> RunResult:
    """A modern client's retry after a URL request: the decision was (or is being) taken on the page."""
    action = getattr(reply, "action", None)
    if action == "accept":
        if await decided(server.rt, run_id, seq, server.url_wait_seconds):
            return await server.rt.wait_for_run(run_id)
    elif action == "decline":
        return await server._run(
            lambda progress: server.rt.resume(run_id, "decline", DECLINED_TO_OPEN, seq=seq, principal=principal,
                                              on_progress=progress),
            ctx, principal, run_id=lambda: run_id)
    run = server.rt.get_run(run_id, principal)
    return RunResult.from_dict(run.result) if run.result else RunResult(status=run.status, run_id=run_id)
