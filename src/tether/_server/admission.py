"""Admission control: how many runs execute at once, and who waits.

A slot is held only while ``execute`` or ``resume`` is actually running a
program, never while a run sits paused for a decision. Requests beyond the
slots wait in a line of bounded depth; beyond that line, or after waiting
``queue_timeout`` seconds, they fail with ``Overloaded`` and a
``retry_after_ms`` estimated from how long recent runs held their slots. A
request cancelled while it waits leaves the line and never starts.

The line is shared between principals (D-74): each principal's waiters keep
their own order, and a freed slot goes to the waiting principal holding the
fewest slots, the one served longest ago among equals — round-robin when
every principal runs alike. A full line takes a newcomer whose principal has
at least two fewer waiting than another: that principal's latest waiter gives
up its place. So no principal can fill the line or hold every slot against
another's one request. Requests without a principal (standard input/output,
local runs) are one principal, ``local``.

Pure asyncio and free of MCP, so it is tested on its own
(tests/server/test_admission.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Mapping

from tether import _metrics as metrics
from tether._store.base import LOCAL_PRINCIPAL
from tether.errors import Overloaded

# Enough recent runs for a median that follows a change of workload within
# a few dozen runs, without one slow outlier moving it.
HISTORY = 32
# Before any run has finished there is nothing to measure; one second is the
# order of a program making a few tool calls.
DEFAULT_RUN_SECONDS = 1.0
# Below this a retry would only meet the same full line again.
MIN_RETRY_AFTER_MS = 100
# A newcomer takes a place in a full line from a principal with at least this
# many more waiting (D-74): with one more only, the two would take the place
# from each other on every retry and neither would keep it.
PUSH_OUT_MARGIN = 2

# What a waiter's future is set to: None is a slot, an Overloaded is a place
# given up to another principal's program (D-74).
_Waiter = asyncio.Future["Overloaded | None"]


@dataclass
class _Share:
    """One principal's part: slots it holds, its waiters in arrival order, when it was last given a slot."""

    running: int = 0
    waiters: collections.deque[_Waiter] = field(default_factory=collections.deque)
    served: int = -1  # the turn of its last slot; -1: none since it last held or waited for nothing

    @property
    def waiting(self) -> int:
        return sum(1 for w in self.waiters if not w.done())


# -- the decisions (pure, over counts) -------------------------------------------------------


def next_turn(waiting: Mapping[str, tuple[int, int, int]]) -> str | None:
    """Whose waiter gets a freed slot: ``waiting`` maps principal -> (waiting, running, served).

    The principal with someone waiting that holds the fewest slots; among
    equals the one served longest ago (never served first, then in order of
    arrival: the mapping's order). None when nobody waits (D-74).
    """
    best: str | None = None
    best_key: tuple[int, int] | None = None
    for principal, (count, running, served) in waiting.items():
        if count <= 0:
            continue
        key = (running, served)
        if best_key is None or key < best_key:
            best, best_key = principal, key
    return best


def push_out(waiting: Mapping[str, tuple[int, int, int]], newcomer: str) -> str | None:
    """Whose latest waiter gives its place in a full line to ``newcomer``'s request; None: nobody's (D-74).

    The principal with the most waiting (on a tie, the one holding more
    slots), when that is at least ``PUSH_OUT_MARGIN`` more than the newcomer's
    principal has waiting.
    """
    mine = waiting[newcomer][0] if newcomer in waiting else 0
    best: str | None = None
    best_key: tuple[int, int] | None = None
    for principal, (count, running, _served) in waiting.items():
        if principal == newcomer or count < mine + PUSH_OUT_MARGIN:
            continue
        if best_key is None or (count, running) > best_key:
            best, best_key = principal, (count, running)
    return best


def places_ahead(waiting: Mapping[str, tuple[int, int, int]], principal: str) -> int:
    """How many waiters a new request of ``principal`` would wait behind, taking turns (D-74).

    Its own principal's, all of them, and of every other principal at most
    one more than that: by then the turns have come round to it.
    """
    mine = waiting[principal][0] if principal in waiting else 0
    others = sum(min(count, mine + 1) for p, (count, _r, _s) in waiting.items() if p != principal)
    return mine + others


# -- the slots ------------------------------------------------------------------------------


class Slot:
    """The right to run one program. ``release()`` is idempotent."""

    __slots__ = ("_admission", "_principal", "_started", "_released")

    def __init__(self, admission: "Admission", principal: str, started: float) -> None:
        self._admission = admission
        self._principal = principal
        self._started = started
        self._released = False

    @property
    def principal(self) -> str:
        return self._principal

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._admission._release(self._principal, self._admission.clock() - self._started)


class Admission:
    """At most ``max_running`` slots out at once; ``queue_depth`` callers may wait for one, shared by principal."""

    def __init__(
        self,
        max_running: int,
        queue_depth: int,
        queue_timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        if queue_depth < 0:
            raise ValueError("queue_depth must not be negative")
        self.max_running = max_running
        self.queue_depth = queue_depth
        self.queue_timeout = queue_timeout
        self.clock = clock
        self._running = 0
        # Only principals holding or waiting for a slot: an entry goes when both are none,
        # so the table is bounded by max_running + queue_depth whoever calls.
        self._shares: dict[str, _Share] = {}
        # When principals that left the table were last served, the latest max_running + queue_depth of them:
        # one that asks again only once its slot is back (holding and waiting for nothing in between) is not
        # "never served" on return, which would put it before everyone waiting at every hand-over (D-74).
        self._left: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._turns = 0
        self._durations: collections.deque[float] = collections.deque(maxlen=HISTORY)

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return sum(share.waiting for share in self._shares.values())

    @property
    def principals(self) -> int:
        """How many principals hold or wait for a slot."""
        return len(self._shares)

    def running_for(self, principal: str | None) -> int:
        share = self._shares.get(_key(principal))
        return share.running if share is not None else 0

    def queued_for(self, principal: str | None) -> int:
        share = self._shares.get(_key(principal))
        return share.waiting if share is not None else 0

    async def acquire(self, principal: str | None = None) -> Slot:
        """A slot now, or after waiting in line; raises ``Overloaded`` when there is no room or no time."""
        key = _key(principal)
        if self._running < self.max_running and not self.queued:
            self._grant(key)
            return Slot(self, key, self.clock())
        if self.queued >= self.queue_depth:
            self._make_room(key)
        share = self._share(key)
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        share.waiters.append(waiter)
        try:
            async with asyncio.timeout(self.queue_timeout):
                given_up = await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                given_up = waiter.result()
                if given_up is None:
                    # The slot was handed over as the timeout fired: use it.
                    return Slot(self, key, self.clock())
                raise given_up from None
            self._forget(key, waiter)
            raise self._overloaded(
                key,
                f"waited {self.queue_timeout:g} s for one of {self.max_running} run slots"
                f"{self._yours(key)}; this program was not started",
            ) from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result() is None:
                # Granted and cancelled in the same turn: pass the slot on.
                self._release(key, None)
            else:
                self._forget(key, waiter)
            raise
        if given_up is not None:
            raise given_up
        return Slot(self, key, self.clock())

    @contextlib.asynccontextmanager
    async def slot(self, principal: str | None = None) -> AsyncIterator[Slot]:
        held = await self.acquire(principal)
        try:
            yield held
        finally:
            held.release()

    def retry_after_ms(self, principal: str | None = None) -> int:
        """When a slot is likely free for a newcomer of ``principal``: the turns ahead of it, at the recent pace."""
        typical = statistics.median(self._durations) if self._durations else DEFAULT_RUN_SECONDS
        rounds = (places_ahead(self._counts(), _key(principal)) + 1) / self.max_running
        return max(MIN_RETRY_AFTER_MS, math.ceil(typical * rounds * 1000))

    # -- internals -----------------------------------------------------------------

    def _counts(self) -> dict[str, tuple[int, int, int]]:
        return {p: (s.waiting, s.running, s.served) for p, s in self._shares.items()}

    def _yours(self, key: str) -> str:
        running, waiting = self.running_for(key), self.queued_for(key)
        return f" (you have {running} running and {waiting} more waiting)"

    def _make_room(self, key: str) -> None:
        """A place in the full line for ``key``'s request, taken from a principal with more waiting; else Overloaded."""
        victim = push_out(self._counts(), key)
        if victim is None:
            if not self.queue_depth:
                why = (f"all {self.max_running} run slots are taken, {self.running_for(key)} of them by you, "
                       "and no request may wait (queue depth 0)")
            elif self.queued_for(key) == self.queued:
                why = (f"the line for a run slot is full (queue depth {self.queue_depth}) with your own programs: "
                       f"you have {_programs(self.running_for(key))} running and {self.queued_for(key)} waiting")
            else:
                why = (f"the line for a run slot is full (queue depth {self.queue_depth}) and shared evenly: "
                       f"you have {_programs(self.running_for(key))} running and {self.queued_for(key)} waiting, "
                       f"and no other principal has {PUSH_OUT_MARGIN} more waiting than you")
            raise self._overloaded(key, f"{why}; this program was not started")
        share = self._shares[victim]
        had = share.waiting
        latest = next(w for w in reversed(share.waiters) if not w.done())
        share.waiters.remove(latest)
        latest.set_result(self._overloaded(
            victim,
            f"you had {_programs(had)} waiting for a run slot, more than another principal that needed a place "
            f"in the full line (queue depth {self.queue_depth}); your latest, this one, gave up its place"
            f"{self._yours(victim)} and was not started",
        ))

    def _overloaded(self, key: str, message: str) -> Overloaded:
        metrics.OVERLOADED.inc()
        return Overloaded(
            message,
            details={"retry_after_ms": self.retry_after_ms(key), "running": self._running, "queued": self.queued,
                     "max_running": self.max_running, "queue_depth": self.queue_depth,
                     "your_running": self.running_for(key), "your_queued": self.queued_for(key)},
        )

    def _share(self, key: str) -> _Share:
        share = self._shares.get(key)
        if share is None:
            share = self._shares[key] = _Share(served=self._left.pop(key, -1))
        return share

    def _grant(self, key: str) -> None:
        share = self._share(key)
        share.running += 1
        self._running += 1
        self._turns += 1
        share.served = self._turns

    def _release(self, key: str, held_seconds: float | None) -> None:
        if held_seconds is not None:
            self._durations.append(max(0.0, held_seconds))
        share = self._shares[key]
        share.running -= 1
        self._running -= 1
        # Hand the slot straight to the next waiter by turn, so a newcomer
        # arriving now cannot overtake the line.
        while self._running < self.max_running:
            turn = next_turn(self._counts())
            if turn is None:
                break
            waiters = self._shares[turn].waiters
            while waiters[0].done():  # cancelled or timed out, its task not yet resumed to forget it
                waiters.popleft()
            self._grant(turn)
            waiters.popleft().set_result(None)
        self._tidy(key)

    def _forget(self, key: str, waiter: _Waiter) -> None:
        share = self._shares.get(key)
        if share is None:
            return
        with contextlib.suppress(ValueError):
            share.waiters.remove(waiter)
        self._tidy(key)

    def _tidy(self, key: str) -> None:
        share = self._shares.get(key)
        if share is None:
            return
        if share.running == 0 and not share.waiting:
            # What is left are waiters already cancelled, whose own tasks will find nothing to forget.
            del self._shares[key]
            if share.served >= 0:
                self._left[key] = share.served
                self._left.move_to_end(key)
                while len(self._left) > self.max_running + self.queue_depth:
                    self._left.popitem(last=False)


def _programs(n: int) -> str:
    return f"{n} program" if n == 1 else f"{n} programs"


def _key(principal: str | None) -> str:
    return LOCAL_PRINCIPAL if principal is None else principal
