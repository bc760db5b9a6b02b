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
  link) waits the same way and answers with the run's next result; when the
  wait ends with the write still undecided, with the paused envelope (run id,
  link, how to resume), not the same link again.

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

from tether._engine.attempt.result import RunResult
from tether._server.approvals import approval_url, pending_writes
from tether._store.states import RunStatus

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._server.channels import (
        ApprovalHost,  # what channels use of the server; never mcp.py, which imports this
    )

# How long a call waits for a decision on the approval page before it returns
# the paused result (the run keeps waiting; the link keeps working). Under
# the minute or two MCP clients give a tool call.
URL_WAIT_SECONDS = 50.0
DECLINED_TO_OPEN = "the user declined to open the approval page"


async def waiting_write(server: "ApprovalHost", run_id: str) -> dict[str, Any] | None:
    """The first write the run still waits on (of its batch), or None.

    Read in the store's own thread when it offloads (D-27): the run and its journal, a round trip each on
    Postgres, while the server goes on serving other requests.
    """
    return await server.rt.store.aio.call(_waiting_write, server.rt, run_id)


def _waiting_write(rt: Runtime, run_id: str) -> dict[str, Any] | None:
    run = rt.store.get_run(run_id)
    if run is None or run.status != RunStatus.PAUSED:
        return None
    writes = pending_writes(rt, run)
    return {**writes[0], "expires_at": run.expires_at} if writes else None


def link_to(server: "ApprovalHost", run_id: str, write: dict[str, Any]) -> str | None:
    if write.get("expires_at") is None:
        return None
    # Through the agent's own client: a rogue client could open it itself, so it is never a capability (D-57).
    return approval_url(server.public_url, server.rt.engine.keyring.current, run_id, int(write["seq"]),
                        float(write["expires_at"]), in_band=True)


async def link_of(server: "ApprovalHost", result: RunResult) -> str | None:
    """The approval link of the first write a paused result still waits on."""
    if result.status != RunStatus.PAUSED or not server.public_url:
        return None
    write = await waiting_write(server, result.run_id)
    return link_to(server, result.run_id, write) if write else None


def message(server: "ApprovalHost", write: dict[str, Any]) -> str:
    return server.approval_message_for(write) + "\n\nOpen the page to approve or decline it."


async def decided(rt: Runtime, run_id: str, seq: int, timeout: float) -> bool:
    """Wait until write ``seq`` is decided (on the page, or anywhere), or the run stops waiting."""
    from tether._engine.approvals.model import taken

    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        run = await rt.store.aio.get_run(run_id)
        if run is None or run.status != RunStatus.PAUSED or taken(await rt.store.aio.get_call(run_id, seq)) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)


async def settled(server: "ApprovalHost", run_id: str) -> RunResult:
    """The run's next result after a decision: paused on the rest of its batch, or where it went next."""
    for _ in range(200):
        run = await server.rt.store.aio.get_run(run_id)
        if run is not None and run.status == RunStatus.PAUSED and await waiting_write(server, run_id) is None:
            # Every write is decided and the run is about to continue.
            await asyncio.sleep(0.05)
            continue
        break
    return await server.rt.engine.wait_for_run(run_id)


async def legacy(server: "ApprovalHost", ctx: Any, result: RunResult, principal: str) -> RunResult:
    """Put each write the run waits on to the user as its link, within this call, until the run moves on."""
    while result.status == RunStatus.PAUSED and (write := await waiting_write(server, result.run_id)) is not None:
        link = link_to(server, result.run_id, write)
        if link is None:
            return result
        run_id, seq = result.run_id, int(write["seq"])
        eid = f"{run_id}:{seq}"
        try:
            reply = await ctx.elicit_url(message(server, write), link, eid)
        except Exception:  # the client could not ask: the run stays paused, the link still works
            return result
        if isinstance(reply, AcceptedUrlElicitation):
            if not await decided(server.rt, run_id, seq, server.url_wait_seconds):
                return result
            with contextlib.suppress(Exception):
                await ctx.request_context.session.send_elicit_complete(eid, related_request_id=ctx.request_id)
            result = await settled(server, run_id)
        elif isinstance(reply, DeclinedElicitation):
            # The lambda runs inside this await, before the loop rebinds run_id and seq.
            result = await server.run_in_slot(
                lambda progress: server.rt.resume(run_id, "decline", DECLINED_TO_OPEN, seq=seq,  # noqa: B023
                                                  principal=principal,
                                                  actor=principal, via="mcp", on_progress=progress),
                ctx, principal, run_id=run_id)
        else:  # dismissed: nothing decided
            return result
    return result


async def still_waits_on(server: "ApprovalHost", result: RunResult, seq: int) -> bool:
    """The run is still paused on write ``seq``: the page was not used in time."""
    if result.status != RunStatus.PAUSED:
        return False
    write = await waiting_write(server, result.run_id)
    return write is not None and int(write["seq"]) == seq


async def input_required(server: "ApprovalHost", result: RunResult, principal: str) -> Any:
    write = await waiting_write(server, result.run_id)
    link = link_to(server, result.run_id, write) if write else None
    if link is None or write is None:
        return await server.paused_result(result, diagnostics=False)
    request = ElicitRequest(params=ElicitRequestURLParams(message=message(server, write), url=link,
                                                          elicitation_id=f"{result.run_id}:{write['seq']}"))
    state = server.sign_state(result.run_id, int(write["seq"]), principal, mode="url")
    return InputRequiredResult(input_requests={"approval": request}, request_state=state)


async def answer(server: "ApprovalHost", ctx: Any, run_id: str, seq: int, reply: Any, principal: str) -> RunResult:
    """A modern client's retry after a URL request: the decision was (or is being) taken on the page."""
    action = getattr(reply, "action", None)
    if action == "accept":
        if await decided(server.rt, run_id, seq, server.url_wait_seconds):
            return await settled(server, run_id)
    elif action == "decline":
        return await server.run_in_slot(
            lambda progress: server.rt.resume(run_id, "decline", DECLINED_TO_OPEN, seq=seq, principal=principal,
                                              actor=principal, via="mcp", on_progress=progress),
            ctx, principal, run_id=run_id)
    return server.rt.engine.recorded(await server.rt.store.aio.call(server.rt.engine.get_run, run_id, principal))
