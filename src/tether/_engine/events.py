"""The event bus: a run's stored events (P-20) and the listeners told when a run pauses, parks or ends.

Events are rows in the store, so any process sharing it can read them; this
process's observers are woken at once through a signal per run, and on a store
that can say so (Postgres LISTEN/NOTIFY) other processes' events wake them too.
Polling the store underneath finds everything whatever happens to the wake-ups.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from tether._engine.attempt.result import to_json_value
from tether._engine.notices import ENDED, EVENT, Notices
from tether._store.base import Store
from tether._store.states import TERMINAL_RUN_STATUSES
from tether.errors import RunNotFound

# Events after which an observer has something to act on.
STOPPING_EVENTS = frozenset({"yielded", "paused", "waiting", "completed", "failed", "terminated"})
# A long-poll returns as soon as anything new is there: outputs stream.
ANY_EVENT = frozenset({"output"}) | STOPPING_EVENTS

# Told when a run pauses, parks, or ends: (run_id, kind, data).
Listener = Callable[[str, str, dict[str, Any]], None]


class EventBus:
    """Stores run events, wakes this process's observers, tells listeners; takes no runtime."""

    def __init__(self, *, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        # A listener must be quick and never raises into a run (notifications use them).
        self.listeners: list[Listener] = []
        self._signals: dict[str, asyncio.Event] = {}
        # Other processes' notices (events, cancels, ends); the listener is started on first need.
        self.notices = Notices(store)
        self.notices.handlers.append(self._heard)

    def emit(self, run_id: str, type: str, data: dict[str, Any]) -> int:
        """Store an event of ``run_id``; observers here wake at once. Returns its id."""
        event_id = self.store.add_event(run_id, type, to_json_value(data)[0], self.clock())
        self._wake(run_id)
        return event_id

    async def emit_awaited(self, run_id: str, type: str, data: dict[str, Any]) -> int:
        """``emit`` with the store write awaited: off the event loop on Postgres (D-27)."""
        event_id = await self.store.aio.add_event(run_id, type, to_json_value(data)[0], self.clock())
        self._wake(run_id)
        return event_id

    def stored(self, run_id: str) -> None:
        """An event of ``run_id`` was stored with another write (a pause's, store.park_run): observers here wake."""
        self._wake(run_id)

    def _wake(self, run_id: str) -> None:
        signal = self._signals.get(run_id)
        if signal is not None:
            signal.set()

    def observed(self, run_id: str) -> bool:
        """Whether an observer in this process follows ``run_id`` (its end is then worth an event)."""
        return run_id in self._signals

    def forget(self, run_id: str) -> None:
        """The run ended here: observers still waiting were woken by its last event; later ones poll."""
        self._signals.pop(run_id, None)

    def announce(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        """Tell the listeners a run paused, parked or ended; nothing a listener does reaches the run."""
        for listener in list(self.listeners):
            try:
                listener(run_id, kind, data)
            except Exception:  # a notification that cannot be queued must not change the run
                pass

    def listen(self) -> None:
        """Hear other processes' notices (a store that can say so: Postgres; tether._engine.notices).

        Started by the first observer, waiter or attempt; without it (SQLite, or the listener down) they poll.
        """
        self.notices.start()

    def _heard(self, kind: str, run_id: str) -> None:
        if kind == EVENT:
            signal = self._signals.get(run_id)
            if signal is not None:
                signal.set()
            # A run's events include its pausing and parking: a waiter for its outcome looks too.
            self.notices.deliver(f"{ENDED}:{run_id}")

    def close(self) -> None:
        self.notices.stop()

    async def wait(self, run_id: str, after: int, timeout_ms: int, stop_on: frozenset[str] = STOPPING_EVENTS,
                   task: asyncio.Future[Any] | None = None) -> list[Any]:
        """Events after ``after``: returns at the first stopping event, or when the time is up with what came.

        ``task``: the run's attempt in this process, if any; its end wakes the wait too.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        collected: list[Any] = []
        cursor = after
        delay = 0.005
        signal = self._signals.setdefault(run_id, asyncio.Event())
        self.listen()  # on Postgres, other processes' events at once too
        while True:
            signal.clear()
            new = await self.store.aio.get_events(run_id, after=cursor)
            for i, e in enumerate(new):
                if e.type in STOPPING_EVENTS:
                    # One stop per observation: the observer sees every yield.
                    return collected + new[: i + 1]
            if new and any(e.type in stop_on for e in new):
                return collected + new
            if new:
                collected += new
                cursor = new[-1].event_id
                delay = 0.005
            run = await self.store.aio.get_run(run_id)
            if run is None:
                raise RunNotFound(f"no cell {run_id!r}")
            if run.status in TERMINAL_RUN_STATUSES and not new:
                return collected
            if task is not None and task.done() and not new:
                # The attempt ended here (paused, parked, or stopped without a stopping event): what it stored
                # is all there is, and a pause is not terminal, so waiting on would last the whole timeout.
                return collected
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return collected
            waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(signal.wait())}
            if task is not None and not task.done():
                waiters.add(task)
            await asyncio.wait(waiters, timeout=min(delay, remaining), return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                if w is not task and not w.done():
                    w.cancel()
            delay = min(delay * 2, 0.05)
