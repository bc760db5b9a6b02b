"""A call's deadlines stop while a person answers a question the call asked (D-89).

An upstream tool may ask its caller's user something mid-call (an MCP
elicitation, D-13). The person's time is not the tool's: a call timed to 15 s
must not fail `write_outcome_unknown` because someone took a minute to fill in
a form. Whoever times a call registers its ``asyncio.Timeout`` here (the effect
boundary's per-call timeout through :func:`enter_deadline`, an MCP source its
own no-progress and ceiling clock); whoever puts a question to a person holds
them with :meth:`CallClocks.held`. The question itself has a deadline of its
own (the source's), so a hold never lasts for ever.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["CallClocks", "call_deadline", "enter_deadline", "leave_deadline"]

# The effect boundary's timeout scope of the call being served. A bare scope, not a CallClocks: most tools
# never ask a person, and a context variable set costs the boundary next to nothing a host call.
_DEADLINE: contextvars.ContextVar[asyncio.Timeout | None] = contextvars.ContextVar("tether_call_deadline",
                                                                                   default=None)


def enter_deadline(scope: asyncio.Timeout) -> contextvars.Token[asyncio.Timeout | None]:
    return _DEADLINE.set(scope)


def leave_deadline(token: contextvars.Token[asyncio.Timeout | None]) -> None:
    _DEADLINE.reset(token)


def call_deadline() -> asyncio.Timeout | None:
    """The boundary's timeout scope of the call this task is serving, if any."""
    return _DEADLINE.get()


class CallClocks:
    """The timeout scopes of one call, held together while a person is asked.

    ``now`` is the clock the scopes run on (the event loop's); injectable for tests.
    """

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        self._now = now or asyncio.get_running_loop().time
        self._scopes: list[asyncio.Timeout] = []
        self._holds = 0
        self._since = 0.0
        self._left: list[tuple[asyncio.Timeout, float]] = []
        self.held_seconds = 0.0  # in all, for a clock that counts from the call's start

    @property
    def holding(self) -> bool:
        return self._holds > 0

    def held_so_far(self) -> float:
        """Seconds held in all, the hold under way included: questions kept open one over another hold the
        deadlines without a break, and their time counts from the first (D-91)."""
        return self.held_seconds + (self._now() - self._since if self.holding else 0.0)

    def watch(self, scope: asyncio.Timeout | None) -> None:
        if scope is not None and scope not in self._scopes:
            self._scopes.append(scope)
            if self.holding:
                self._stop(scope, self._now())

    @contextmanager
    def held(self) -> Iterator[None]:
        """Stop every watched deadline for the block; each gets back the time it had left."""
        if self._holds == 0:
            self._since = self._now()
            for scope in self._scopes:
                self._stop(scope, self._since)
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                now = self._now()
                self.held_seconds += now - self._since
                for scope, left in self._left:
                    _reschedule(scope, now + left)
                self._left = []

    def _stop(self, scope: asyncio.Timeout, now: float) -> None:
        when = scope.when()
        if when is None or scope.expired():
            return
        if _reschedule(scope, None):
            self._left.append((scope, max(0.0, when - now)))


def _reschedule(scope: asyncio.Timeout, when: float | None) -> bool:
    # A scope the call has already left (cancelled while a person was asked) is nothing to move.
    if scope.expired():
        return False
    try:
        scope.reschedule(when)
    except RuntimeError:
        return False
    return True
