"""REPL sessions: globals kept across executes, in any process (P-21)."""

from __future__ import annotations

import pytest

from helpers import Clock, Recorder
from tether._runtime import Runtime
from tether._store import open_store
from tether.errors import SnapshotTampered


def runtime(store_url, **kw) -> Runtime:
    return Runtime(store=open_store(store_url), tools=Recorder().tools(), **kw)


async def test_p21_globals_survive_between_executes_and_processes(store_url):
    async with runtime(store_url) as rt:
        r = await rt.execute("import tools\nseen = [await tools.helpdesk.get_ticket(id=1)]\n"
                             "def count() -> int:\n    return len(seen)\n", session="s1")
        assert r.status == "completed", r.error
    async with runtime(store_url) as rt2:  # another runtime, as another process would be
        r = await rt2.execute("seen.append({'id': 2})\ncount()", session="s1")
        assert r.status == "completed", r.error
        assert r.result == 2
        # Another session does not see them.
        other = await rt2.execute("count()", session="s2", type_check=False)
        assert other.status == "failed" and "count" in other.error["message"]


async def test_p21_a_failed_execute_keeps_the_previous_state(store_url):
    async with runtime(store_url) as rt:
        await rt.execute("x = 1", session="s")
        bad = await rt.execute("x = 2\n1/0", session="s")
        assert bad.status == "failed"
        r = await rt.execute("x", session="s")
        assert r.result == 1


async def test_p21_reset_and_expiry(store_url):
    clock = Clock()
    async with runtime(store_url, clock=clock, type_check=False) as rt:
        await rt.execute("x = 1", session="s")
        assert rt.reset_session("s")
        r = await rt.execute("x", session="s")
        assert r.status == "failed"
        await rt.execute("y = 5", session="t")
        clock.now += rt.engine.sessions.ttl_seconds + 1
        r = await rt.execute("y", session="t")
        assert r.status == "failed" and any("expired" in n for n in r.notes)


async def test_p21_session_state_is_signed(store_url):
    async with runtime(store_url) as rt:
        await rt.execute("x = 1", session="s")
        rec = rt.store.get_session("s", "local")
        rec.data = rec.data[:-1] + bytes([rec.data[-1] ^ 1])
        rt.store.put_session(rec)
        with pytest.raises(SnapshotTampered):
            await rt.execute("x", session="s")


async def test_p21_a_paused_session_run_saves_its_globals_when_it_completes(store_url):
    async with runtime(store_url) as rt:
        p = await rt.execute("import tools\nr = await tools.helpdesk.close_ticket(id=3)\nstatus = r['status']",
                             session="s")
        assert p.status == "paused"
        done = await rt.resume(p.run_id, "approve")
        assert done.status == "completed"
        r = await rt.execute("status", session="s")
        assert r.result == "closed"
