"""The store as awaitables, for code on the event loop (docs/decisions.md D-27).

A store's methods block until their transaction commits. On Postgres that is
a network round trip or three, and a blocked event loop stalls every other
run and the server with it; so for a store that says so (``offload = True``:
Postgres) ``AsyncStore`` runs each call in the store's own threads, each on a
connection of its own. SQLite answers faster inline than a thread hand-off
costs, so its calls run in place.

A call is never cut short by cancellation: the transaction finishes (or
fails) in its thread as it would have inline, the caller gets its outcome, and
the cancellation is delivered at the caller's next await. So a write-ahead
record the caller awaited is either committed and seen, or not made, never
committed behind the back of a caller that was told otherwise.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from typing import Any, Callable, Protocol, Sequence, TypeVar

from tether._store.base import CallRecord, EventRecord, RunRecord, SnapshotRecord, Store

T = TypeVar("T")


class Offloading(Protocol):
    """A store whose calls should leave the event loop: it lends the threads they run in."""

    offload: bool

    def executor(self) -> Executor: ...


class AsyncStore:
    """Awaitable versions of the store calls made on the event loop's hot path.

    Calls run in place unless the store's ``offload`` flag is set (Postgres; a
    benchmark clears it to measure the loop-blocking path, as before D-27).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def inline(self) -> bool:
        return not getattr(self.store, "offload", False)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, a function of the store's (or one that calls it), off the loop if offloading."""
        if self.inline:
            return fn(*args, **kwargs)
        store: Offloading = self.store  # type: ignore[assignment]
        done = asyncio.get_running_loop().run_in_executor(store.executor(), functools.partial(fn, *args, **kwargs))
        absorbed = 0
        while not done.done():
            try:
                await asyncio.wait((done,))
            except asyncio.CancelledError:
                # Counted back now and requested again once the call is over: asyncio.timeout()
                # tells its own cancellation apart by the task's count of them.
                task = asyncio.current_task()
                if task is None:
                    raise
                task.uncancel()
                absorbed += 1
        try:
            return done.result()
        finally:
            _recancel(absorbed)

    # -- runs

    async def create_run(self, run: RunRecord) -> None:
        await self.call(self.store.create_run, run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.call(self.store.get_run, run_id)

    async def update_run(self, run_id: str, expect_status: Sequence[str] | None, **fields: Any) -> bool:
        return await self.call(self.store.update_run, run_id, expect_status, **fields)

    # -- journal

    async def record_call(self, call: CallRecord) -> None:
        await self.call(self.store.record_call, call)

    async def record_calls(self, calls: Sequence[CallRecord]) -> None:
        await self.call(self.store.record_calls, calls)

    async def update_call(self, run_id: str, seq: int, expect_state: Sequence[str], **fields: Any) -> bool:
        return await self.call(self.store.update_call, run_id, seq, expect_state, **fields)

    async def get_call(self, run_id: str, seq: int) -> CallRecord | None:
        return await self.call(self.store.get_call, run_id, seq)

    async def get_calls(self, run_id: str, after: int | None = None,
                        states: Sequence[str] | None = None) -> list[CallRecord]:
        return await self.call(self.store.get_calls, run_id, after, states)

    async def count_calls(self, run_id: str, kind: str | None = None, states: Sequence[str] | None = None) -> int:
        return await self.call(self.store.count_calls, run_id, kind, states)

    async def journal_bytes(self, run_id: str) -> int:
        return await self.call(self.store.journal_bytes, run_id)

    # -- snapshots and events

    async def put_snapshot(self, snapshot: SnapshotRecord) -> None:
        await self.call(self.store.put_snapshot, snapshot)

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        return await self.call(self.store.latest_snapshot, run_id)

    async def add_event(self, run_id: str, type: str, data: dict[str, Any], now: float) -> int:
        return await self.call(self.store.add_event, run_id, type, data, now)

    async def get_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        return await self.call(self.store.get_events, run_id, after, limit)


def _recancel(times: int) -> None:
    """Deliver cancellations absorbed while a call finished, at the caller's next await."""
    task = asyncio.current_task()
    for _ in range(times if task is not None else 0):
        task.cancel()  # type: ignore[union-attr]


__all__ = ["AsyncStore", "Offloading"]
