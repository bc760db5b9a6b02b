"""The store as awaitables, for code on the event loop (docs/decisions.md D-27).

A store's methods block until their transaction commits. On Postgres that is
a network round trip or three, and a blocked event loop stalls every other
run and the server with it; so for a store that says so (``capabilities.offloads``:
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

from tether._store.base import (
    CallRecord,
    Capabilities,
    EventRecord,
    OutboxRecord,
    RunRecord,
    SessionRecord,
    SnapshotRecord,
    Store,
    WaitRecord,
)
from tether._store.states import WaitStatus

T = TypeVar("T")


class Offloading(Protocol):
    """A store whose calls should leave the event loop: it lends the threads they run in."""

    capabilities: Capabilities  # whose offloads is true

    def executor(self) -> Executor: ...


class AsyncStore:
    """The store as event-loop code sees it: every method of the Store protocol, awaitable.

    One per store, made with it (``store.aio``): code inside ``async def`` calls the store only through
    it (tests/test_store_shape.py), so no transaction blocks the loop on a backend that offloads.
    Calls run in place unless the store's capabilities say it ``offloads`` (Postgres; a
    benchmark clears that to measure the loop-blocking path, as before D-27).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def inline(self) -> bool:
        return not self.store.capabilities.offloads

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

    async def store_size_bytes(self) -> int:
        return await self.call(self.store.store_size_bytes)

    # -- runs

    async def create_run(self, run: RunRecord) -> None:
        await self.call(self.store.create_run, run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.call(self.store.get_run, run_id)

    async def get_run_by_key(self, principal: str, run_key: str) -> RunRecord | None:
        return await self.call(self.store.get_run_by_key, principal, run_key)

    async def update_run(self, run_id: str, expect_status: Sequence[str] | None, **fields: Any) -> bool:
        return await self.call(self.store.update_run, run_id, expect_status, **fields)

    async def list_runs(self, status: str | None = None, limit: int = 100,
                        principals: Sequence[str] | None = None) -> list[RunRecord]:
        return await self.call(self.store.list_runs, status, limit, principals)

    async def claim_run(self, run_id: str, owner: str, lease_until: float, now: float,
                        gone_owner: str | None = None) -> bool:
        return await self.call(self.store.claim_run, run_id, owner, lease_until, now, gone_owner)

    async def claim_queued(self, owner: str, lease_until: float, now: float,
                           skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_queued, owner, lease_until, now, skip)

    async def claim_due(self, owner: str, lease_until: float, now: float,
                        skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_due, owner, lease_until, now, skip)

    async def claim_orphan(self, owner: str, lease_until: float, now: float,
                           skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_orphan, owner, lease_until, now, skip)

    async def release_orphan(self, run: RunRecord, owner: str) -> bool:
        return await self.call(self.store.release_orphan, run, owner)

    async def runs_with_expired_lease(self, now: float) -> list[RunRecord]:
        return await self.call(self.store.runs_with_expired_lease, now)

    async def paused_runs_past_expiry(self, now: float, limit: int = 100) -> list[RunRecord]:
        return await self.call(self.store.paused_runs_past_expiry, now, limit)

    async def count_runs(self, status: str | None = None) -> int:
        return await self.call(self.store.count_runs, status)

    async def delete_run(self, run_id: str) -> bool:
        return await self.call(self.store.delete_run, run_id)

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

    # -- snapshots

    async def put_snapshot(self, snapshot: SnapshotRecord) -> None:
        await self.call(self.store.put_snapshot, snapshot)

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        return await self.call(self.store.latest_snapshot, run_id)

    # -- waits

    async def create_wait(self, wait: WaitRecord) -> WaitRecord:
        return await self.call(self.store.create_wait, wait)

    async def get_wait(self, key: str) -> WaitRecord | None:
        return await self.call(self.store.get_wait, key)

    async def settle_wait(self, wait: WaitRecord) -> tuple[bool, WaitRecord]:
        return await self.call(self.store.settle_wait, wait)

    async def list_waits(self, run_id: str | None = None, status: str | None = WaitStatus.PENDING,
                         session: str | None = None) -> list[WaitRecord]:
        return await self.call(self.store.list_waits, run_id, status, session)

    async def runs_due(self, now: float, limit: int = 100) -> list[RunRecord]:
        return await self.call(self.store.runs_due, now, limit)

    async def runs_with_settled_wait(self, limit: int = 50) -> list[str]:
        return await self.call(self.store.runs_with_settled_wait, limit)

    # -- sessions

    async def put_session(self, session: SessionRecord) -> None:
        await self.call(self.store.put_session, session)

    async def get_session(self, name: str, principal: str) -> SessionRecord | None:
        return await self.call(self.store.get_session, name, principal)

    async def delete_session(self, name: str, principal: str) -> bool:
        return await self.call(self.store.delete_session, name, principal)

    # -- source listings

    async def get_listing(self, key: str) -> tuple[Any, float] | None:
        return await self.call(self.store.get_listing, key)

    async def put_listing(self, key: str, data: Any, now: float) -> None:
        await self.call(self.store.put_listing, key, data, now)

    # -- events

    async def add_event(self, run_id: str, type: str, data: dict[str, Any], now: float) -> int:
        return await self.call(self.store.add_event, run_id, type, data, now)

    async def notify(self, payload: str) -> None:
        await self.call(self.store.notify, payload)

    async def get_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        return await self.call(self.store.get_events, run_id, after, limit)

    # -- changes

    async def runs_updated_since(self, since: float, limit: int = 200) -> list[RunRecord]:
        return await self.call(self.store.runs_updated_since, since, limit)

    # -- outbox

    async def add_outbox(self, target: str, event_id: str, body: str, now: float, mac: str | None = None) -> bool:
        return await self.call(self.store.add_outbox, target, event_id, body, now, mac)

    async def claim_outbox(self, now: float, lease_seconds: float, limit: int = 20) -> list[OutboxRecord]:
        return await self.call(self.store.claim_outbox, now, lease_seconds, limit)

    async def settle_outbox(self, id: int, *, status: str, attempts: int, next_at: float,
                            last_error: str | None = None, delivered_at: float | None = None) -> None:
        await self.call(self.store.settle_outbox, id, status=status, attempts=attempts, next_at=next_at,
                        last_error=last_error, delivered_at=delivered_at)

    async def list_outbox(self, status: str | None = None, limit: int = 100) -> list[OutboxRecord]:
        return await self.call(self.store.list_outbox, status, limit)

    # -- console sign-outs

    async def sign_out(self, session: str, expires_at: float, now: float) -> None:
        await self.call(self.store.sign_out, session, expires_at, now)

    async def signed_out(self, session: str) -> bool:
        return await self.call(self.store.signed_out, session)


def _recancel(times: int) -> None:
    """Deliver cancellations absorbed while a call finished, at the caller's next await."""
    task = asyncio.current_task()
    for _ in range(times if task is not None else 0):
        task.cancel()  # type: ignore[union-attr]


__all__ = ["AsyncStore", "Offloading"]
