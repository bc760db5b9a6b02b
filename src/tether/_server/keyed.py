"""What the MCP server tells a client about its run key (P-36) when a request does not get a normal result.

A client whose request was refused (``overloaded``) or whose run was
cancelled must know whether a run was started for it, and which, to decide
between retrying with the same key and starting over with a new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcp_types import CallToolResult

from tether._engine.attempt.result import RunResult
from tether._server.results import error_result
from tether._store.states import RunStatus
from tether.errors import Overloaded

if TYPE_CHECKING:
    from tether._runtime import Runtime


async def settled(rt: "Runtime", principal: str, key: str) -> bool:
    """Whether ``key`` names a run that is not running now: its envelope is answered without a run slot."""
    run = await rt.store.aio.get_run_by_key(principal, key)
    return run is not None and run.status not in (RunStatus.RUNNING, RunStatus.QUEUED)


async def overloaded(rt: "Runtime", exc: Overloaded, principal: str, key: str | None) -> CallToolResult:
    """``exc`` as a tool error saying whether a run was started for this request (under ``key``, earlier), and which.

    Awaited: an overloaded server is the last one to block its event loop on a store round trip.
    """
    run = await rt.store.aio.get_run_by_key(principal, key) if key is not None else None
    exc.details = {**exc.details, "run_started": run is not None, "run_id": run.run_id if run else None}
    if run is None:
        exc.next_action = ("No run was started for this request. After retry_after_ms, call again"
                           + (" with the same key." if key is not None else "."))
    else:
        exc.message += f"; run {run.run_id} was started earlier with this key and is {run.status}"
        exc.next_action = f"After retry_after_ms, call again with the same key to get run {run.run_id}'s outcome."
    return error_result(exc, run_id=run.run_id if run else None)


def cancelled(result: RunResult, key: str | None) -> RunResult:
    """A cancelled run's envelope says the run started, with its id, and what its key now returns."""
    error = result.error
    if result.status != RunStatus.CANCELLED or not error:
        return result
    details = {**(error.get("details") or {}), "run_started": True, "run_id": result.run_id}
    next_action = error.get("next_action") or ""
    if key is not None:
        next_action = (f"Run {result.run_id} started and was cancelled; calling again with key {key!r} returns "
                       "this cancelled run. To run the program again, call with a new key.")
    result.error = {**error, "details": details, "next_action": next_action}
    return result
