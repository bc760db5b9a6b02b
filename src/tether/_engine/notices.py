"""Notices: what other processes sharing the store tell this one, at once (Postgres LISTEN/NOTIFY).

A notice names a run and what happened to it:

- ``event``: the run has a new event (a cell's observers look now, P-20);
- ``cancel``: a cancel was requested for a run executing somewhere; the
  process executing it stops it now instead of at its next lease renewal;
- ``ended``: the run stopped running (ended, paused or parked); whoever waits
  for its outcome in another process looks now;
- ``settled``: a wait of a parked run was settled and the process that settled
  it did not continue the run (it lacked the sources, or was told not to); a
  runner that can continue it does (P-18).

A notice is a hint to look at the store now, never the data: every waiter
re-reads the store, and polls it anyway, so a lost notice, a broken listener
or a store that cannot notify (SQLite) only makes things slower.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from tether._store.base import Store

EVENT, CANCEL, ENDED, SETTLED = "event", "cancel", "ended", "settled"


def encode(kind: str, run_id: str) -> str:
    # An event's notice is the bare run id, as before the other kinds existed.
    return run_id if kind == EVENT else f"{kind}:{run_id}"


def decode(payload: str) -> tuple[str, str]:
    kind, sep, run_id = payload.partition(":")
    return (kind, run_id) if sep else (EVENT, payload)


class Notices:
    """One listener per runtime, and the waiters it wakes, by (kind, run id)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._stop: Callable[[], None] | None = None
        # Called on the loop with the payload's kind and run id, for every notice (the runtime's hooks).
        self.handlers: list[Callable[[str, str], None]] = []

    @property
    def listening(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        """Listen (once) on a store that can say when another process changed something; else nothing."""
        if self._stop is not None or not self.store.capabilities.notifies:
            return
        loop = asyncio.get_running_loop()

        def heard(payload: str) -> None:  # on the listener's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(self.deliver, payload)

        self._stop = self.store.listen(heard)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def deliver(self, payload: str) -> None:
        """Wake whoever waits for this notice (on the loop)."""
        kind, run_id = decode(payload)
        for event in self._waiters.get((kind, run_id), ()):
            event.set()
        for handler in list(self.handlers):
            with contextlib.suppress(Exception):  # a hint that cannot be acted on is polled for later
                handler(kind, run_id)

    @contextlib.contextmanager
    def watch(self, kind: str, run_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever a ``kind`` notice for ``run_id`` arrives, while the block runs."""
        event = asyncio.Event()
        key = (kind, run_id)
        self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def publish(self, kind: str, run_id: str) -> None:
        """Tell the other processes on this store (and this one's listener); never fails the caller."""
        if not self.store.capabilities.notifies:
            return  # nobody would hear it: other processes poll
        with contextlib.suppress(Exception):  # polling covers a notice that could not be sent
            self.store.notify(encode(kind, run_id))


async def wait_a_little(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` up to ``seconds``; True if it was set. Clears it for the next round."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        event.clear()
