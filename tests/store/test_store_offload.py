"""The store off the event loop (D-27): Postgres calls run in the store's threads, each on its own connection.

A call made slow here is one that waits for a row lock the test holds, so
"slow" lasts exactly until the test lets go: every assertion is on order,
never on time.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest

from contract import make_run
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore

pytestmark = pytest.mark.postgres

WAIT = 60.0  # generous: the machine may be loaded; a pass never waits this long


@pytest.fixture
def schema(pg_url):
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def store(pg_url, schema):
    s = PostgresStore(pg_url, schema=schema)
    yield s
    s.close()


class RowLock:
    """Holds run ``run_id``'s row lock on a connection of the test's own until ``release()``."""

    def __init__(self, url: str, schema: str, run_id: str) -> None:
        self.conn = psycopg.connect(url)
        self.conn.execute(f"SELECT 1 FROM {schema}.runs WHERE run_id = %s FOR UPDATE", (run_id,))
        self.pid = self.conn.info.backend_pid
        self.url = url

    def waiters(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as admin:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                 (self.pid,)).fetchone()[0]

    def wait_for_waiter(self) -> None:
        """Return once a store call waits on this lock (polls a state; WAIT bounds a hang, never a pass)."""
        pause = threading.Event()
        deadline = time.monotonic() + WAIT
        while self.waiters() == 0:
            assert time.monotonic() < deadline, "no store call came to wait on the lock"
            pause.wait(0.01)

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.commit()
            self.conn.close()


def test_threads_run_transactions_at_once_each_on_its_own_connection(pg_url, schema, store):
    store.create_run(make_run("held"))
    store.create_run(make_run("free"))
    lock = RowLock(pg_url, schema, "held")
    try:
        blocked = threading.Thread(target=store.update_run, args=("held", ["paused"]), kwargs={"status": "running"})
        blocked.start()
        lock.wait_for_waiter()
        # One connection behind a lock (before D-27) queued this behind the blocked update.
        free = threading.Thread(target=store.update_run, args=("free", ["paused"]), kwargs={"status": "running"})
        free.start()
        free.join(WAIT)
        assert not free.is_alive(), "the other run's update waited for the held one"
        assert store.get_run("free").status == "running"
        assert blocked.is_alive(), "the held run's update still waits for the lock"
    finally:
        lock.release()
    blocked.join(WAIT)
    assert store.get_run("held").status == "running"


def test_one_caller_at_a_time_keeps_to_one_connection(store):
    pids = set()
    for i in range(5):
        store.create_run(make_run(f"r{i}"))
        pids.add(store._connection().info.backend_pid)
    assert len(pids) == 1


async def test_a_blocked_call_leaves_the_loop_to_other_calls(pg_url, schema, store):
    astore = store.aio
    assert not astore.inline
    store.create_run(make_run("held"))
    store.create_run(make_run("free"))
    lock = RowLock(pg_url, schema, "held")
    order: list[str] = []

    async def slow() -> None:
        assert await astore.update_run("held", ["paused"], status="running")
        order.append("held updated")

    task = asyncio.ensure_future(slow())
    try:
        await asyncio.to_thread(lock.wait_for_waiter)
        assert await astore.update_run("free", ["paused"], status="running")
        assert (await astore.get_run("free")).status == "running"
        order.append("free updated")
    finally:
        lock.release()
    await asyncio.wait_for(task, WAIT)
    assert order == ["free updated", "held updated"]


async def test_a_cancelled_caller_sees_its_call_through_before_the_cancellation(pg_url, schema, store):
    # The transaction is not abandoned half-way: it commits, and the caller is
    # cancelled at its next await, as if the call had run inline.
    astore = store.aio
    store.create_run(make_run("held"))
    lock = RowLock(pg_url, schema, "held")
    after: list[str] = []

    async def caller() -> None:
        await astore.update_run("held", ["paused"], status="running")
        after.append("returned")
        await asyncio.sleep(0)
        after.append("ran past its next await")

    task = asyncio.ensure_future(caller())
    try:
        await asyncio.to_thread(lock.wait_for_waiter)
        task.cancel()
        await asyncio.sleep(0)
        assert not task.done(), "the caller waits for its call, cancelled or not"
    finally:
        lock.release()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    assert after == ["returned"]
    assert store.get_run("held").status == "running"


async def test_a_timeout_around_a_call_still_reads_as_a_timeout(pg_url, schema, store):
    astore = store.aio
    store.create_run(make_run("held"))
    lock = RowLock(pg_url, schema, "held")

    async def caller() -> None:
        async with asyncio.timeout(0):  # expires at once: while the call waits for the lock
            await astore.update_run("held", ["paused"], status="running")
            await asyncio.sleep(0)

    task = asyncio.ensure_future(caller())
    try:
        await asyncio.to_thread(lock.wait_for_waiter)
    finally:
        lock.release()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, WAIT)
    assert store.get_run("held").status == "running"


async def test_a_failing_call_raises_in_the_caller(store):
    from tether._store import Conflict

    astore = store.aio
    await astore.create_run(make_run("r1"))
    with pytest.raises(Conflict):
        await astore.create_run(make_run("r1"))


async def test_sqlite_calls_run_in_place(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path}/t.db")
    try:
        astore = store.aio
        assert astore.inline
        seen = await astore.call(threading.current_thread)
        assert seen is threading.current_thread()
    finally:
        store.close()


async def test_a_closed_store_refuses_offloaded_calls(pg_url, schema):
    from tether.errors import StoreError

    store = PostgresStore(pg_url, schema=schema)
    astore = store.aio
    await astore.create_run(make_run("r1"))
    store.close()
    with pytest.raises(StoreError):
        await astore.get_run("r1")
