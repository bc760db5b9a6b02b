"""Re-sending a write by its idempotency key (P-31): when, how often, how long between.

Only a write to a tool that dedupes by key is ever sent again, and only
while its outcome is unknown. The effect boundary journals each send; this
module decides.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from tether.errors import TetherError, UnknownTool

if TYPE_CHECKING:
    from tether._engine.rules.limits import Limits
    from tether._store.base import CallRecord
    from tether._tools.catalog import Catalog
    from tether._tools.model import Tool

# How a source says a request's outcome is not known: it may not have
# arrived ("not_sent"), arrived and been lost ("unknown"), or be still
# processing under its key ("in_progress"). Any of them is worth a re-send
# with the same key to a callee that dedupes by it, and only to such a callee.
UNKNOWN_OUTCOMES = ("unknown", "not_sent", "in_progress")

# The longest pause between two sends.
MAX_BACKOFF_SECONDS = 5.0


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a send that raised ``exc`` may or may not have taken effect."""
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    return isinstance(exc, TetherError) and exc.details.get("outcome") in UNKNOWN_OUTCOMES


def sent_unanswered(exc: BaseException) -> bool:
    """Whether a source reports that the request left and its answer was lost.

    For a write that is not declared to dedupe by key this is not a failure
    but an unknown outcome (P-8): it may have happened, and is never re-sent.
    """
    return isinstance(exc, TetherError) and exc.details.get("outcome") == "unknown"


def resendable(catalog: Catalog, entry: "CallRecord", limits: "Limits") -> "Tool | None":
    """The tool, when a write left `sending` may be sent again with its recorded key."""
    if entry.op != "tool" or entry.kind != "write" or max(entry.sends, 1) >= limits.key_sends:
        return None
    try:
        tool = catalog.get(entry.address)
    except UnknownTool:  # the tool is gone: nothing promises a repeat is harmless
        return None
    return tool if tool.dedupes_by_key and tool.is_write else None


def backoff(limits: "Limits", send: int) -> float:
    """Seconds to wait after send number ``send`` before the next: doubling, capped, jittered."""
    pause: float = min(MAX_BACKOFF_SECONDS, limits.key_backoff_seconds * 2 ** (send - 1))
    return pause * random.uniform(0.5, 1.0)


async def deliver(tool: "Tool", send: int, limits: "Limits", invoke: Callable[[int], Awaitable[Any]],
                  mark_send: Callable[[int], Awaitable[bool]]) -> Any:
    """Send with ``invoke(n)``; to a tool that dedupes by key, send again while the outcome is unknown.

    ``mark_send(n)`` journals send number ``n`` before it leaves and says
    whether the write is still ours to send; the last exception is raised when
    the sends run out or it is not.
    """
    while True:
        try:
            return await invoke(send)
        except Exception as exc:
            if not (tool.dedupes_by_key and outcome_unknown(exc) and send < limits.key_sends):
                raise
            last = exc
        await asyncio.sleep(backoff(limits, send))
        if not await mark_send(send + 1):
            raise last  # another process settled it
        send += 1


def unknown_message(address: str, why: str, sends: int, key: str) -> str:
    """What the program is told about a write whose outcome stayed unknown."""
    if sends > 1:
        return (f"{address}: sent {sends} times with idempotency key {key}, its outcome is still unknown "
                f"(last send: {why}); it may or may not have happened and tether will not send it again")
    return f"{address}: {why}; it may or may not have happened and tether will not re-send it"
