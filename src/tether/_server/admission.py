"""Admission control: how many runs execute at once, and who waits.

A slot is held only while ``execute`` or ``resume`` is actually running a
program, never while a run sits paused for a decision. Requests beyond the
slots wait in one FIFO queue of bounded depth; beyond that queue, or after
waiting ``queue_timeout`` seconds, they fail at once with ``Overloaded`` and a
``retry_after_ms`` estimated from how long recent runs held their slots. A
request cancelled while it waits leaves the queue and never starts.

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
from typing import AsyncIterator, Callable

from tether import _metrics as metrics
from tether.errors import Overloaded

# Enough recent runs for a median that follows a change of workload within
# a few dozen runs, without one slow outlier moving it.
HISTORY = 32
# Before any run has finished there is nothing to measure; one second is the
# order of a program making a few tool calls.
DEFAULT_RUN_SECONDS = 1.0
# Below this a retry would only meet the same full queue again.
MIN_RETRY_AFTER_MS = 100


class Slot:
    """The right to run one program. ``release()`` is idempotent."""

    __slots__ = ("_admission", "_started", "_released")

    def __init__(self, admission: "Admission", started: float) -> None:
        self._admission = admission
        self._started = started
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._admission._release(self._admission.clock() - self._started)


class Admission:
    """At most ``max_running`` slots out at once; ``queue_depth`` callers may wait for one."""

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
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._durations: collections.deque[float] = collections.deque(maxlen=HISTORY)

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> Slot:
        """A slot now, or after waiting in line; raises ``Overloaded`` when there is no room or no time."""
        if self._running < self.max_running and not self.queued:
            self._running += 1
            return Slot(self, self.clock())
        if self.queued >= self.queue_depth:
            raise self._overloaded(
                f"tether is running {self._running} programs and {self.queued} more are waiting "
                f"(queue depth {self.queue_depth}); this one was not started"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.queue_timeout):
                await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over as the timeout fired: use it.
                return Slot(self, self.clock())
            self._forget(waiter)
            raise self._overloaded(
                f"waited {self.queue_timeout:g} s for one of {self.max_running} run slots; "
                "this program was not started"
            ) from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Granted and cancelled in the same turn: pass the slot on.
                self._release(None)
            else:
                self._forget(waiter)
            raise
        return Slot(self, self.clock())

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        held = await self.acquire()
        try:
            yield held
        finally:
            held.release()

    def retry_after_ms(self) -> int:
        """When a slot is likely free for a newcomer: the line ahead of it, run at the recent pace."""
        typical = statistics.median(self._durations) if self._durations else DEFAULT_RUN_SECONDS
        rounds = (self.queued + 1) / self.max_running
        return max(MIN_RETRY_AFTER_MS, math.ceil(typical * rounds * 1000))

    # -- internals -----------------------------------------------------------------

    def _overloaded(self, message: str) -> Overloaded:
        metrics.OVERLOADED.inc()
        return Overloaded(
            message,
            details={"retry_after_ms": self.retry_after_ms(), "running": self._running, "queued": self.queued,
                     "max_running": self.max_running, "queue_depth": self.queue_depth},
        )

    def _release(self, held_seconds: float | None) -> None:
        if held_seconds is not None:
            self._durations.append(max(0.0, held_seconds))
        # Hand the slot straight to the first live waiter, so a newcomer
        # arriving now cannot overtake the line.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
