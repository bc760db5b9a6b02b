"""The store counts what it asks of its database, and on Postgres the count is what the wire sees.

The benchmarks report statements and round trips per run from ``store.traffic``
(bench/roundtrip_bench.py, store_latency_bench.py); these tests hold that count to the truth: on Postgres, the
waits tests/latency_proxy.py saw on the wire between tether and the server.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from latency_proxy import LatencyProxy, target_of
from tether import Runtime
from tether._engine.rules.quotas import Quota, Quotas
from tether._sources.python import tool
from tether._store import Conflict
from tether._store.base import RunRecord
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore

WAIT = 60.0  # a bound for a hang on a loaded machine, never reached by a pass


@tool(namespace="shop", read_only=True)
async def price(sku: int) -> dict:
    """The price of one item (read-only)."""
    return {"sku": sku, "cents": 250}


@tool(namespace="shop", destructive=True)
async def buy(sku: int) -> dict:
    """Buy one item (a write: the default policy asks first)."""
    return {"sku": sku, "bought": True}


READS = "import tools\ntotal = 0\nfor i in range(10):\n    total += (await tools.shop.price(sku=i))['cents']\ntotal\n"
WRITE = "import tools\n(await tools.shop.buy(sku=1))['bought']\n"


def settle(proxy: LatencyProxy) -> int:
    """The wire's count once no request is in flight (the proxy forwards in its own thread)."""
    deadline = time.monotonic() + WAIT
    while proxy.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    return proxy.round_trips


@pytest.mark.postgres
async def test_postgres_round_trips_counted_are_the_ones_on_the_wire(pg_url):
    schema = f"t_{uuid.uuid4().hex[:16]}"
    try:
        with LatencyProxy(target_of(pg_url), 0.0) as proxy:
            store = PostgresStore(proxy.url(pg_url), schema=schema)
            try:
                async with Runtime(store=store, tools=[price, buy]) as rt:
                    # Warm: connections and the listener open, and psycopg has prepared each statement on its
                    # fifth use on a connection (one uncounted wait, once; the pool hands out the last used first).
                    for _ in range(6):
                        paused = await rt.execute(WRITE)
                        await rt.execute(READS)
                        await rt.resume(paused.run_id, "approve")
                    for label, step in [
                        ("10 reads", lambda: rt.execute(READS)),
                        ("a write that pauses", lambda: rt.execute(WRITE)),
                    ]:
                        wire, counted = settle(proxy), store.traffic.snapshot()
                        result = await step()
                        assert result.status in ("completed", "paused"), result.error
                        after = store.traffic.snapshot()
                        assert after["connections"] == counted["connections"], label
                        assert after["round_trips"] - counted["round_trips"] == settle(proxy) - wire, label
                        assert after["statements"] > counted["statements"]
                        if label == "10 reads":
                            # Created; its reads, its end and the notice of it in one statement: one wait
                            # each, as each runs without BEGIN and COMMIT (D-40).
                            assert after["round_trips"] - counted["round_trips"] <= 2, after
                    wire, counted = settle(proxy), store.traffic.snapshot()
                    resumed = await rt.resume(result.run_id, "approve")
                    assert resumed.status == "completed" and resumed.result is True, resumed.error
                    assert store.traffic.snapshot()["round_trips"] - counted["round_trips"] == settle(proxy) - wire
            finally:
                store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.postgres
async def test_postgres_a_start_counted_against_the_default_quotas_is_counted_as_the_wire_sees_it(pg_url):
    # `tether serve` checks [quotas] at every start (D-54: the count, the run and its bucket in one
    # transaction, under the principal's lock). BEGIN, the lock and the statement go in one flight and COMMIT in
    # the next, so a 10-call read-only run waits 3 times: two for the start, one for the end with its journal
    # (before D-54 also 3: the count, the insert, the end; 5 with D-54's transaction unpipelined).
    schema = f"t_{uuid.uuid4().hex[:16]}"
    quotas = Quotas(default=Quota(concurrent_runs=256, runs_per_period=10_000))
    try:
        with LatencyProxy(target_of(pg_url), 0.0) as proxy:
            store = PostgresStore(proxy.url(pg_url), schema=schema)
            try:
                async with Runtime(store=store, tools=[price, buy], quotas=quotas) as rt:
                    for _ in range(6):  # warm, as above
                        await rt.execute(READS)
                    wire, counted = settle(proxy), store.traffic.snapshot()
                    result = await rt.execute(READS)
                    assert result.status == "completed", result.error
                    after = store.traffic.snapshot()
                    assert after["round_trips"] - counted["round_trips"] == settle(proxy) - wire
                    assert after["round_trips"] - counted["round_trips"] <= 3, after
            finally:
                store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_sqlite_counts_statements_and_transactions_and_no_round_trips(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path}/t.db")
    async with Runtime(store=store, tools=[price]) as rt:
        before = store.traffic.snapshot()
        result = await rt.execute(READS)
        assert result.status == "completed" and result.result == 2500
        after = store.traffic.snapshot()
    assert after["transactions"] > before["transactions"]
    assert after["statements"] >= after["transactions"] - before["transactions"] + before["statements"]
    assert after["round_trips"] == 0  # in-process: nothing waits on a wire


@pytest.mark.postgres
def test_postgres_statement_failing_without_begin_leaves_the_connection_for_the_next_transaction(pg_url):
    schema = f"t_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(pg_url, schema=schema, pool_size=1)
    try:
        run = RunRecord(run_id="r1", status="running", program="1", environment={}, policy={}, limits={},
                        created_at=0.0, updated_at=0.0)
        store.create_run(run)
        with pytest.raises(Conflict):
            store.create_run(run)  # one statement, run without BEGIN: it fails alone
        conn = store._connection()
        assert conn.autocommit is False and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        before = store.traffic.snapshot()
        # A transaction of several statements is still one: BEGIN, the statements, COMMIT.
        store.add_event("r1", "output", {"i": 1}, 1.0)
        after = store.traffic.snapshot()
        assert after["round_trips"] - before["round_trips"] == after["statements"] - before["statements"] + 2
        assert [e.data for e in store.get_events("r1")] == [{"i": 1}]
        assert store.update_run("r1", ["running"], status="completed", updated_at=2.0)
        assert store.get_run("r1").status == "completed"
    finally:
        store.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_slow_run_journals_its_ten_reads_in_as_few_transactions_as_a_quick_one(backend, store_url, request):
    """D-6: on a loaded machine (CI) the 10-call run cost 9 round trips instead of 4, because held reads
    were written every 0.25 s. A batch now closes on how many reads it holds, never on how long they took
    (P-7): here each read takes ten seconds by the run's clock and the count is exactly a quick run's."""
    from helpers import Clock

    clock = Clock()

    @tool(namespace="shop", read_only=True)
    async def slow_price(sku: int) -> dict:
        """The price of one item, on a machine so loaded that each lookup takes ten seconds (read-only)."""
        clock.now += 10.0
        return {"sku": sku, "cents": 250}

    schema = f"t_{uuid.uuid4().hex[:16]}"
    pg_url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    store = PostgresStore(pg_url, schema=schema) if pg_url else SQLiteStore(store_url)
    slow = READS.replace("shop.price", "shop.slow_price")
    try:
        # Checkpoints (every 30 s) and the lease (30 s) go by the run's clock on purpose; this is about the reads.
        async with Runtime(store=store, tools=[price, slow_price], clock=clock, checkpoint_every_seconds=1e9,
                           lease_seconds=1e9) as rt:
            counts = {}
            for label, program in [("warm", READS)] * 6 + [("quick", READS), ("slow", slow)]:
                before = store.traffic.snapshot()
                result = await rt.execute(program)
                assert result.status == "completed" and result.result == 2500, result.error
                after = store.traffic.snapshot()
                counts[label] = {k: after[k] - before[k] for k in ("transactions", "statements", "round_trips")}
        assert counts["slow"] == counts["quick"]
        # Created; then its ten reads, its end (and on Postgres the notice of it) in one transaction.
        assert counts["slow"]["transactions"] == 2, counts
        if pg_url:
            assert counts["slow"]["round_trips"] == 2, counts
    finally:
        store.close()
        if pg_url:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
