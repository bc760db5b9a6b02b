"""The call a tool is serving right now, and its idempotency key (P-25).

The effect boundary sets the context around each tool dispatch; a tool's
handler (a Python function, or a source building an HTTP or MCP request)
reads it with :func:`current_call`. It is a context variable, so calls
running concurrently in one process each see their own.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["CallContext", "current_call", "idempotency_key"]


@dataclass(frozen=True)
class CallContext:
    """What a tool may know about the call it serves.

    ``key`` is the call's idempotency key: the same on every send of this
    call, in every process, on replay and on restore. ``send`` counts the
    times this call has been sent: 1 for the first, 2 and up when a write to
    a tool that dedupes by key is sent again (P-31).
    """

    run_id: str
    seq: int
    address: str
    key: str
    send: int = 1
    # "read" or "write", as the policy sees the tool.
    kind: str = "write"


_CURRENT: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("tether_call", default=None)


def current_call() -> CallContext | None:
    """The call being served, or None outside a tool call made by a run."""
    return _CURRENT.get()


def idempotency_key(run_id: str, seq: int) -> str:
    """The idempotency key of call ``seq`` of run ``run_id`` (P-25).

    Readable on purpose: whoever reads an API's logs can tell which run and
    which call sent a request. Nothing in it changes between attempts, so a
    replay, a restore and another process sharing the store derive the same
    key; the journal records it all the same, and a re-send uses the recorded
    one.
    """
    return f"tether-{run_id}-{seq}"


def enter(ctx: CallContext) -> contextvars.Token[CallContext | None]:
    return _CURRENT.set(ctx)


def leave(token: contextvars.Token[CallContext | None]) -> None:
    _CURRENT.reset(token)
