"""Runs on a Postgres 5 ms away never wait for each other's store calls (D-27).

Between tether and Postgres sits tests/latency_proxy.py (5 ms each way, in
its own thread). Assertions are on what overlapped and in which order things
happened, never on durations; the speed-up is measured in
bench/store_latency_bench.py.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import psycopg
import pytest

from latency_proxy import LatencyProxy, target_of
from tether import Runtime
from tether._sources.python import tool
from tether._store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

WAIT = 120.0  # a bound for a hang on a loaded machine, never reached by a pass
RUNS = 50


class Gate:
    """The tool waits at the gate until a test opens it; made afresh on each test's event loop."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered = asyncio.Event()


gates: list[Gate] = []


@tool(namespace="shop", read_only=True)
async def price(sku: str) -> dict:
    """The price of one item (read-only)."""
    gate = gates[-1]
    gate.entered.set()
    await gate.open.wait()
    return {"sku": sku, "cents": 250}


PROGRAM = 'import tools\n(await tools.shop.price(sku="{sku}"))["cents"]'


@tool(namespace="shop", destructive=True)
async def buy(sku: str) -> dict:
    """Buy one item (a write: the default policy asks first)."""
    return {"sku": sku, "bought": True}


@pytest.fixture
def schema(pg_url):
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def proxy(pg_url):
    with LatencyProxy(target_of(pg_url), 0.005) as p:
        yield p


@pytest.fixture
async def rt(pg_url, schema, proxy):
    gates.append(Gate())
    store = PostgresStore(proxy.url(pg_url), schema=schema)
    runtime = Runtime(store=store, tools=[price], max_workers=4)
    async with runtime:
        yield runtime
    store.close()


async def test_fifty_concurrent_read_only_runs_finish_with_their_store_calls_overlapping(rt, proxy):
    gates[-1].open.set()
    results = await asyncio.wait_for(
        asyncio.gather(*[rt.execute(PROGRAM.format(sku=f"s{i}")) for i in range(RUNS)]), WAIT)
    assert [r.status for r in results] == ["completed"] * RUNS
    assert all(r.result == 250 for r in results)
    # Each run's read is journaled and its end recorded, through the proxy.
    for r in results[:5]:
        assert [c.state for c in rt.store.get_calls(r.run_id)] == ["done"]
        assert rt.store.get_run(r.run_id).status == "completed"
    # More than one run's request was on the wire at once: with the store
    # called on the event loop, one call at a time ever was.
    assert proxy.peak > 1


class RowLock:
    """Holds a run's row as an update would, on a connection of the test's own, until released."""

    def __init__(self, url: str, schema: str, run_id: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url)
        # The lock an UPDATE of the row takes: the run's end waits for it; journal inserts do not.
        self.conn.execute(f"SELECT 1 FROM {schema}.runs WHERE run_id = %s FOR NO KEY UPDATE", (run_id,))
        self.pid = self.conn.info.backend_pid
        self._released = threading.Lock()
        self.released = False

    def waiters(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as admin:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                 (self.pid,)).fetchone()[0]

    def wait_for_waiter(self) -> None:
        """Return once a store call waits on this lock (a state, polled), or the lock was let go."""
        pause = threading.Event()
        while self.waiters() == 0 and not self.released:
            pause.wait(0.01)

    def release(self) -> None:
        with self._released:
            if not self.released:
                self.released = True
                self.conn.commit()
                self.conn.close()


async def test_a_run_whose_store_call_is_stuck_does_not_hold_up_another_run(rt, pg_url, schema):
    slow = await rt.begin(PROGRAM.format(sku="slow"))
    gate = gates[-1]
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    lock = RowLock(pg_url, schema, slow.run_id)
    # Should the store call block the event loop, nothing in this test could run
    # again to let go of the lock: a thread does, late, and the asserts below fail.
    watchdog = threading.Timer(WAIT, lock.release)
    watchdog.start()
    try:
        gate.open.set()
        # The slow run's end (its row update) now waits on the lock.
        await asyncio.to_thread(lock.wait_for_waiter)
        other = await asyncio.wait_for(rt.execute(PROGRAM.format(sku="other")), WAIT)
        # The slow run's end still waits (its lease renewal may wait beside it on a slow machine).
        stuck = not lock.released and lock.waiters() >= 1 and not slow.done()
    finally:
        lock.release()
        watchdog.cancel()
    assert other.status == "completed" and other.result == 250
    assert stuck, "the other run finished only after the slow run's store call was let go"
    ended = await asyncio.wait_for(slow.result(), WAIT)
    assert ended.status == "completed" and ended.result == 250
    assert rt.store.get_run(slow.run_id).status == "completed"


class LoopWatchingStore(PostgresStore):
    """A Postgres store that notes each transaction begun on the event loop's own thread."""

    def __init__(self, *args, **kwargs) -> None:
        self.on_loop: list[str] = []
        self.loop_thread: threading.Thread | None = None
        super().__init__(*args, **kwargs)

    def _transaction(self, *args, **kwargs):
        if threading.current_thread() is self.loop_thread:
            import traceback

            self.on_loop.append(" <- ".join(f.name for f in reversed(traceback.extract_stack(limit=5)[:-1])))
        return super()._transaction(*args, **kwargs)


async def test_a_read_only_run_makes_no_store_call_on_the_event_loop(pg_url, schema):
    gates.append(Gate())
    gates[-1].open.set()
    store = LoopWatchingStore(pg_url, schema=schema)
    try:
        async with Runtime(store=store, tools=[price], max_workers=2) as runtime:
            store.loop_thread = threading.current_thread()
            results = await asyncio.gather(*[runtime.execute(PROGRAM.format(sku=f"s{i}")) for i in range(3)])
            store.loop_thread = None
        assert [r.status for r in results] == ["completed"] * 3
        # Created, journaled, ended and announced: all of it in the store's threads.
        assert store.on_loop == []
        assert [c.state for c in store.get_calls(results[0].run_id)] == ["done"]
    finally:
        store.close()


async def test_a_run_that_sleeps_waits_and_pauses_makes_no_store_call_on_the_event_loop(pg_url, schema):
    gates.append(Gate())
    gates[-1].open.set()
    store = LoopWatchingStore(pg_url, schema=schema)
    program = """
import asyncio
import tools
await asyncio.sleep(0.01)
await yield_control()
cents = (await tools.shop.price(sku="a"))["cents"]
await tools.shop.buy(sku="a")
cents
"""
    try:
        async with Runtime(store=store, tools=[price, buy], max_workers=2) as runtime:
            store.loop_thread = threading.current_thread()
            paused = await runtime.execute(program)
            store.loop_thread = None
        assert paused.status == "paused" and paused.pending["address"] == "shop.buy"
        # The sleep's wait, the yield's event, the journal, the snapshot, the approval wait, the park.
        assert store.on_loop == []
        assert [c.op for c in store.get_calls(paused.run_id)] == ["sleep", "yield_control", "tool", "tool"]
    finally:
        store.close()


GATHERED = """
import asyncio
import tools
cents = (await tools.shop.price(sku="a"))["cents"]
await asyncio.gather(tools.shop.buy(sku="a"), tools.shop.buy(sku="b"))
cents
"""


@pytest.mark.parametrize("decision", ["approve", "decline", "cancel"])
async def test_deciding_a_paused_write_makes_no_store_call_on_the_event_loop(pg_url, schema, decision):
    """A person's decision (D-43) reads, records and continues the run off the loop: on Postgres, an
    approver's click must not hold up every other run on the replica for its round trips."""
    gates.append(Gate())
    gates[-1].open.set()
    store = LoopWatchingStore(pg_url, schema=schema)
    try:
        async with Runtime(store=store, tools=[price, buy], max_workers=2) as runtime:
            paused = await runtime.execute(GATHERED)
            assert paused.status == "paused"
            first, second = sorted(w["seq"] for w in paused.pending["writes"])
            store.loop_thread = threading.current_thread()
            if decision == "cancel":
                ended = await runtime.resume(paused.run_id, decision, seq=first)
            else:
                # Half the pause first (the run stays paused), then the rest (the run goes on).
                half = await runtime.resume(paused.run_id, decision, seq=first)
                assert half.status == "paused"
                ended = await runtime.resume(paused.run_id, decision, seq=second)
            store.loop_thread = None
        expected = {"approve": "completed", "decline": "failed", "cancel": "cancelled"}[decision]
        assert ended.status == expected, ended
        assert store.on_loop == [], "\n".join(store.on_loop)
    finally:
        store.close()


@tool(namespace="shop", undo="shop.refund", undo_args=lambda args, result: {"charge_id": result["id"]})
async def charge(order: str) -> dict:
    """Charge an order (its undo is a refund)."""
    return {"id": f"ch_{order}"}


@tool(namespace="shop", idempotent_with_key=True)
async def refund(charge_id: str) -> dict:
    """Refund a charge."""
    return {"refunded": charge_id}


async def test_a_decline_and_undo_makes_no_store_call_on_the_event_loop(pg_url, schema):
    """P-46's decline-and-undo from the loop: the pause declined, the plan recorded and the charge refunded,
    all in the store's threads (D-43)."""
    from tether import Policy

    store = LoopWatchingStore(pg_url, schema=schema)
    program = 'import tools\nawait tools.shop.charge(order="a")\nawait tools.shop.buy(sku="a")'
    policy = Policy(writes="allow", rules=[{"match": "shop.buy", "action": "ask"}])
    try:
        async with Runtime(store=store, tools=[charge, refund, buy], policy=policy, max_workers=2) as runtime:
            paused = await runtime.execute(program)
            assert paused.status == "paused" and paused.pending["address"] == "shop.buy"
            store.loop_thread = threading.current_thread()
            ended = await runtime.resume(paused.run_id, "decline_and_undo", seq=paused.pending["seq"])
            store.loop_thread = None
        assert ended.status == "rolled_back", ended
        assert store.on_loop == [], "\n".join(store.on_loop)
    finally:
        store.close()
