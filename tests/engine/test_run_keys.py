"""Run keys (P-36): (principal, key) names one run; a repeat gets that run, never a second one."""

from __future__ import annotations

import asyncio
import threading

import pytest

from helpers import Recorder
from tether import IdempotencyConflict
from tether._engine.rules.policy import Policy
from tether._engine.worker import Worker
from tether._runtime import Runtime
from tether._store import open_store

WRITE = """
import tools
c = await tools.helpdesk.close_ticket(id=7)
c["status"]
"""
SLOW_WRITE = """
import tools
await tools.helpdesk.close_ticket(id=7)
await tools.slowpoke.wait(seconds=SECONDS)
"done"
"""


def runtime(store_url: str, rec: Recorder, **kw) -> Runtime:
    kw.setdefault("type_check", False)
    kw.setdefault("policy", Policy(writes="allow"))
    return Runtime(store=open_store(store_url), tools=rec.tools(), **kw)


async def test_p36_a_repeated_execute_gets_the_first_result_and_sends_nothing(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        first = await rt.execute(WRITE, key="req-1")
        again = await rt.execute(WRITE, key="req-1")
        assert first.status == again.status == "completed" and again.result == "closed"
        assert again.run_id == first.run_id
        assert rec.deliveries == [("close_ticket", {"id": 7})]
        # Another key is another request.
        other = await rt.execute(WRITE, key="req-2")
        assert other.run_id != first.run_id and len(rec.deliveries) == 2
        assert rt.store.count_runs() == 2


async def test_p36_without_a_key_each_execute_is_a_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        a, b = await rt.execute(WRITE), await rt.execute(WRITE)
        assert a.run_id != b.run_id and len(rec.deliveries) == 2


async def test_p36_the_same_key_with_another_request_is_refused_naming_the_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        first = await rt.execute(WRITE, key="k")
        for change in ({"code": WRITE + "\n1"}, {"session": "s1"}, {"check": "off", "meta": {"x": 1}}):
            with pytest.raises(IdempotencyConflict) as caught:
                await rt.execute(change.pop("code", WRITE), key="k", **change)
            err = caught.value.to_dict()
            assert err["code"] == "idempotency_conflict" and err["details"]["run_id"] == first.run_id
            assert first.run_id in err["message"] and "nothing was started or sent" in err["message"]
        assert rec.deliveries == [("close_ticket", {"id": 7})] and rt.store.count_runs() == 1


async def test_p36_keys_belong_to_a_principal(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        mine = await rt.execute(WRITE, key="k", principal="alice")
        theirs = await rt.execute(WRITE, key="k", principal="bob")
        assert mine.run_id != theirs.run_id and len(rec.deliveries) == 2


async def test_p36_a_repeat_of_a_paused_run_gets_the_pause_and_resume_continues_it(store_url):
    rec = Recorder()
    async with runtime(store_url, rec, policy=Policy()) as rt:
        paused = await rt.execute(WRITE, key="p")
        again = await rt.execute(WRITE, key="p")
        assert paused.status == again.status == "paused" and again.run_id == paused.run_id
        assert again.pending["address"] == "helpdesk.close_ticket" and rec.deliveries == []
        done = await rt.resume(paused.run_id, "approve")
        assert done.status == "completed"
        after = await rt.execute(WRITE, key="p")
        assert after.status == "completed" and after.result == "closed" and len(rec.deliveries) == 1


async def test_p36_a_repeat_while_it_runs_here_awaits_the_same_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        handle = await rt.begin(SLOW_WRITE.replace("SECONDS", "0.5"), key="slow")
        again = await rt.begin(SLOW_WRITE.replace("SECONDS", "0.5"), key="slow")
        assert again.run_id == handle.run_id
        a, b = await asyncio.gather(handle.result(), again.result())
        assert a.status == b.status == "completed" and b.result == "done"
        assert rec.deliveries == [("close_ticket", {"id": 7})]


async def test_p36_past_the_wait_a_repeat_gets_a_running_envelope_naming_the_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        rt.engine.settings.rejoin_wait_seconds = 0.2
        handle = await rt.begin(SLOW_WRITE.replace("SECONDS", "3"), key="long")
        again = await rt.execute(SLOW_WRITE.replace("SECONDS", "3"), key="long")
        assert again.status == "running" and again.run_id == handle.run_id
        assert again.error["code"] == "still_running" and "same key" in again.error["next_action"]
        assert (await handle.result()).status == "completed" and len(rec.deliveries) == 1


async def test_p36_start_with_a_key_queues_one_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        run_id = rt.start(WRITE, key="bg")
        assert rt.start(WRITE, key="bg") == run_id and rt.store.count_runs() == 1
        with pytest.raises(IdempotencyConflict):
            rt.start(WRITE + "\n2", key="bg")
        # execute with the same key waits for the queued run, which a worker runs.
        waiting = asyncio.ensure_future(rt.execute(WRITE, key="bg"))
        (ran,) = await Worker(rt.engine).run_queued()
        out = await waiting
        assert ran.run_id == out.run_id == run_id and out.status == "completed"
        assert rec.deliveries == [("close_ticket", {"id": 7})]


async def test_p36_a_key_must_be_a_short_printable_string(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        for bad in ("", "x" * 201, "a\nb", 5):
            with pytest.raises(Exception) as caught:
                await rt.execute(WRITE, key=bad)
            assert getattr(caught.value, "code", None) == "invalid_arguments"
        assert rt.store.count_runs() == 0 and rec.deliveries == []


async def test_p36_a_repeat_on_another_runtime_while_the_first_still_runs_gets_its_outcome(store_url):
    """A retry that lands on another replica while the first is still running the program."""
    rec = Recorder()
    program = SLOW_WRITE.replace("SECONDS", "1.0")
    async with runtime(store_url, rec) as first, runtime(store_url, rec) as second:
        handle = await first.begin(program, key="retry")
        while not rec.deliveries:  # the write is done; the program is in its slow read
            await asyncio.sleep(0.01)
        again = await second.execute(program, key="retry")
        assert again.status == "completed" and again.result == "done" and again.run_id == handle.run_id
        assert (await handle.result()).run_id == handle.run_id
        assert rec.deliveries == [("close_ticket", {"id": 7})]
        assert first.store.count_runs() == 1


def race(url: str, n: int = 8) -> tuple[set[str], list[tuple[str, dict]]]:
    """``n`` runtimes, each on its own thread and store connection, execute with one key at once."""
    rec = Recorder()
    barrier = threading.Barrier(n)
    outcomes: list[object] = []

    def one() -> None:
        async def go() -> object:
            async with runtime(url, rec) as rt:
                await asyncio.to_thread(barrier.wait)
                return await rt.execute(WRITE, key="race")

        try:
            outcomes.append(asyncio.run(go()))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcomes.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    assert all(o.status == "completed" for o in outcomes), outcomes  # type: ignore[attr-defined]
    return {o.run_id for o in outcomes}, rec.deliveries  # type: ignore[attr-defined]


def test_p36_concurrent_requests_with_one_key_start_one_run_on_sqlite(store_url):
    run_ids, deliveries = race(store_url)
    assert len(run_ids) == 1 and deliveries == [("close_ticket", {"id": 7})]
    store = open_store(store_url)
    try:
        assert store.count_runs() == 1
    finally:
        store.close()


def test_p36_concurrent_requests_with_one_key_start_one_run_on_postgres(pg_url):
    store = open_store(pg_url)
    try:
        before = store.count_runs()
        run_ids, deliveries = race(pg_url)
        assert len(run_ids) == 1 and deliveries == [("close_ticket", {"id": 7})]
        assert store.count_runs() == before + 1
    finally:
        store.close()
