"""How many of an upstream's progress notifications reach the run (D-89).

Every notification restarts the call's no-progress clock, which costs nothing.
Forwarding one does cost: a cell stores it as a `progress` event in the run's
timeline, and a watching client is sent it. An upstream sending thousands a
second (the reference server's long-running tool does, asked for 2,000 steps in
a second) would write thousands of rows, each after a read of the run. A
token bucket per call passes a burst and then a steady rate; the call's end is
reported by the engine whatever was dropped.
"""

from __future__ import annotations

from collections.abc import Callable

# More than a person or a cell's observer reads; a server stepping every 0.1 s or slower loses nothing.
RATE_PER_SECOND = 10.0
BURST = 10.0


class ProgressGate:
    """``allow()`` says whether this notification is forwarded. ``now``: the clock (seconds), injectable."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._tokens = BURST
        self._at = now()

    def allow(self) -> bool:
        now = self._now()
        self._tokens = min(BURST, self._tokens + (now - self._at) * RATE_PER_SECOND)
        self._at = now
        if self._tokens < 1.0 - 1e-9:  # 0.1 s steps add up to a hair under one token
            return False
        self._tokens -= 1.0
        return True
