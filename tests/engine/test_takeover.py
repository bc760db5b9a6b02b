"""Takeover of a dead owner's runs: after the lease, or at once when the owner was on this host (P-11).

A real runtime process is SIGKILLed while a write is being sent (tests/crash).
Its lease is long (600 s). An owner on another host is waited for until its
lease lapses (the clock is injected, nothing sleeps); an owner on this host
whose process is gone is taken over at once. Either way the write that was
being sent becomes ``unknown`` and nothing is sent twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import anyio
import pytest

from helpers import Clock
from replicas import ReplicaSet, connect
from test_crash import child, deliveries, server  # noqa: F401 - the delivery server fixture
from tether._engine import ownership
from tether._runtime import Runtime
from tether._store import open_store

pytestmark = pytest.mark.slow

LONG_LEASE = {"CRASH_LEASE_SECONDS": "600"}


def crashed_mid_write(tmp_path, server_url: str) -> tuple[str, str]:  # noqa: F811
    store_url = f"sqlite:///{tmp_path / 'crashed.db'}"
    code, _, err = child(store_url, server_url, "start", "sending:1", env=LONG_LEASE)
    assert code == -signal.SIGKILL, err
    store = open_store(store_url)
    try:
        (run,) = store.list_runs()
    finally:
        store.close()
    assert run.status == "running" and run.lease_until > time.time() + 500
    return store_url, run.run_id


async def recover_with(store_url: str, server_url: str, clock=None):
    from crash.child import shop_tools
    from tether._engine.rules.policy import Policy

    rt = Runtime(store=open_store(store_url), tools=shop_tools(server_url), type_check=False,
                 policy=Policy(writes="allow"), **({"clock": clock} if clock else {}))
    async with rt:
        return await rt.recover(), rt.store.get_calls


def assert_unknown_not_resent(results, ledger, before):
    (result,) = results
    assert result.status == "failed" and result.error["code"] == "write_outcome_unknown", result.error
    new = deliveries(ledger, "order-") - before
    assert all(v == 1 for v in new.values()), f"delivered twice: {new}"


async def test_an_owner_on_this_host_whose_process_is_gone_is_taken_over_at_once(tmp_path, server):  # noqa: F811
    server_url, ledger = server
    before = deliveries(ledger, "order-")
    store_url, run_id = crashed_mid_write(tmp_path, server_url)
    # The lease has ~600 s left; the owner's process is gone, so recover does not wait for it.
    results, _ = await recover_with(store_url, server_url)
    assert [r.run_id for r in results] == [run_id]
    assert_unknown_not_resent(results, ledger, before)


async def test_an_owner_on_another_host_is_waited_for_until_its_lease_lapses(tmp_path, server):  # noqa: F811
    server_url, ledger = server
    before = deliveries(ledger, "order-")
    store_url, run_id = crashed_mid_write(tmp_path, server_url)
    store = open_store(store_url)
    try:
        # The same crash, as seen from another machine: owner and lease are not signed (P-35), so
        # changing the owner's host is what a process elsewhere would have written.
        run = store.get_run(run_id)
        other = "elsewhere:4242:abcdef;h=0000000000000000;t=1"
        assert store.claim_run(run_id, other, run.lease_until, time.time()) is False  # held: no claim
        with store._transaction(write=True) as tx:
            tx.run("UPDATE runs SET owner = ? WHERE run_id = ?", (other, run_id))
        lease_until = store.get_run(run_id).lease_until
    finally:
        store.close()
    clock = Clock(lease_until - 1)
    results, _ = await recover_with(store_url, server_url, clock)
    assert results == []  # still within its lease: another host's process may be alive
    clock.now = lease_until + 0.001
    results, _ = await recover_with(store_url, server_url, clock)
    assert [r.run_id for r in results] == [run_id]
    assert_unknown_not_resent(results, ledger, before)


def test_owner_gone_is_true_only_for_an_ended_process_on_this_host():
    me = ownership.new_owner()
    assert not ownership.owner_gone(me)  # this process
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = ownership.start_time(proc.pid)
        assert started is not None and started > 0
        theirs = f"host:{proc.pid}:aaaaaa;h={ownership.host_key()};t={started}"
        assert not ownership.owner_gone(theirs)
        # The same pid with another start time is a reused pid: the owner is gone.
        assert ownership.owner_gone(theirs.replace(f"t={started}", f"t={started - 1}"))
        # Another host's owner is never judged from here.
        assert not ownership.owner_gone(theirs.replace(ownership.host_key(), "0" * 16))
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while ownership.start_time(proc.pid) != -1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the kernel ends it soon after the signal
        assert ownership.owner_gone(theirs)  # killed, not yet reaped by its parent
        proc.wait(timeout=10)
        assert ownership.owner_gone(theirs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Owners named before host keys (or on systems without /proc) only ever wait for the lease.
    assert not ownership.owner_gone(f"host:{proc.pid}:aaaaaa")
    assert not ownership.owner_gone(None)


SLOW_THEN_WRITE = """
import tools
await tools.ledger.wait(seconds=2)
await tools.ledger.write(tag="after-takeover")
"""


async def test_a_sigkilled_replica_s_run_is_continued_by_a_replica_on_the_same_host_without_the_lease(
        tmp_path, pg_url):
    # A 600 s lease: the run can only finish within the test if the survivor does not wait for it.
    rs = ReplicaSet(tmp_path / "rs", pg_url, 2, lease_seconds=600)
    a, b = rs.replicas
    try:
        async with connect(a.url, "auto") as on_a:
            cell_id = (await on_a.call_tool("cell_start", {"code": SLOW_THEN_WRITE, "yield_after_ms": 100}
                                            )).structured_content["cell_id"]
        store = open_store(pg_url)
        try:
            with anyio.fail_after(30):
                while store.get_run(cell_id).status != "running":
                    await anyio.sleep(0.05)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(timeout=10)
            with anyio.fail_after(120):
                while (run := store.get_run(cell_id)).status == "running":
                    await anyio.sleep(0.1)
            assert run.status == "completed", run.error
        finally:
            store.close()
        async with connect(b.url, "auto") as on_b:
            obs = (await on_b.call_tool("cell_wait", {"cell_id": cell_id, "timeout_ms": 5000})).structured_content
        assert "after-takeover" in str(obs["events"])
        assert rs.tags().count("after-takeover") == 1
    finally:
        rs.stop()
