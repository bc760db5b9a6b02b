"""The call a tool is serving right now, and its idempotency key (P-25).

The effect boundary sets the context around each tool dispatch; a tool's
handler (a Python function, or a source building an HTTP or MCP request)
reads it with :func:`current_call`. It is a context variable, so calls
running concurrently in one process each see their own.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Callable

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


# The call being served: its CallContext, or the fields to build it from when a tool first asks (``enter_call``).
_CURRENT: contextvars.ContextVar[CallContext | tuple[Any, ...] | None] = contextvars.ContextVar(
    "tether_call", default=None)


def current_call() -> CallContext | None:
    """The call being served, or None outside a tool call made by a run."""
    held = _CURRENT.get()
    if type(held) is tuple:
        run_id, seq, address, key_of, send, kind = held
        return CallContext(run_id, seq, address, key_of(seq), send, kind)
    return held  # type: ignore[return-value]


def idempotency_key(run_id: str, seq: int) -> str:
    """The idempotency key of call ``seq`` of run ``run_id`` (P-25).

    Readable on purpose: whoever reads an API's logs can tell which run and
    which call sent a request. Nothing in it changes between attempts, so a
    replay, a restore and another process sharing the store derive the same
    key; the journal records it all the same, and a re-send uses the recorded
    one.
    """
    return f"tether-{run_id}-{seq}"


def enter(ctx: CallContext) -> contextvars.Token[CallContext | tuple[Any, ...] | None]:
    return _CURRENT.set(ctx)


def enter_call(run_id: str, seq: int, address: str, key_of: Callable[[int], str], send: int,
               kind: str) -> contextvars.Token[CallContext | tuple[Any, ...] | None]:
    """:func:`enter` for the boundary's every dispatch: the context is built only if the tool asks for it
    (most never do; a frozen dataclass and the idempotency key cost ~1 µs a host call, core_bench)."""
    return _CURRENT.set((run_id, seq, address, key_of, send, kind))


def leave(token: contextvars.Token[CallContext | tuple[Any, ...] | None]) -> None:
    _CURRENT.reset(token)
