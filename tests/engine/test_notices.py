"""Notices across processes on Postgres (LISTEN/NOTIFY): cancellations and wait resolutions arrive at once.

Two runtimes with stores of their own on one Postgres stand for two replicas.
The executing one's lease is ten minutes, so its renewals (the polling
fallback) cannot be what ends a wait here: only the notice can, within the
tests' generous timeouts. Each test first checks the listener hears (a probe
notice), so no test depends on how fast a connection opens.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from helpers import Recorder
from tether._engine.notices import wait_a_little
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store
from tether._tools.model import Annotations, Tool

LONG_LEASE = 600.0


async def hears(listener: Runtime, sender: Runtime) -> None:
    """Return once ``listener`` hears ``sender``'s notices."""
    with listener.engine.events.notices.watch("probe", "run_probe") as heard:
        listener.engine.events.listen()
        with anyio.fail_after(60):
            while True:
                sender.engine.events.notices.publish("probe", "run_probe")
                if await wait_a_little(heard, 0.2):
                    return


def blocking(started: asyncio.Event) -> Tool:
    """``slow.block()``: a read that says it started, then answers only after ten minutes."""
    async def block(args: dict) -> str:
        started.set()
        await asyncio.sleep(600)
        return "late"

    return Tool("slow", "block", "Answers after ten minutes.", {"type": "object", "properties": {}}, block,
                annotations=Annotations(read_only=True), timeout_seconds=900)


def runtimes(pg_url: str, rec: Recorder, *extra: Tool, **a_kwargs) -> tuple[Runtime, Runtime]:
    a = Runtime(store=open_store(pg_url), tools=[*rec.tools(), *extra], type_check=False,
                lease_seconds=LONG_LEASE, **a_kwargs)
    b = Runtime(store=open_store(pg_url), tools=rec.tools(), type_check=False)
    return a, b


async def until_status(rt: Runtime, run_id: str, status: str) -> None:
    with anyio.fail_after(60):
        while (run := rt.store.get_run(run_id)) is None or run.status != status:
            await asyncio.sleep(0.01)


CANCELLED_MID_CALL = """
import tools
await tools.slow.block()
await tools.helpdesk.close_ticket(id=7)
"""


async def test_a_cancel_from_another_replica_stops_the_executing_run_without_waiting_for_its_lease(pg_url):
    rec, started = Recorder(), asyncio.Event()
    a, b = runtimes(pg_url, rec, blocking(started), policy=Policy(writes="allow"))
    async with a, b:
        handle = await a.begin(CANCELLED_MID_CALL)
        run_id = handle.run_id
        await hears(a, b)
        with anyio.fail_after(60):
            await started.wait()  # the cancel lands mid-call
        with anyio.fail_after(120):
            out = await b.cancel(run_id, "operator stop")
            executed = await handle.result()
    assert out.status == "cancelled", out
    assert executed.status == "cancelled" and "operator stop" in executed.error["message"]
    assert rec.deliveries == []  # the write after the cancelled call was never sent
    assert b.store.get_run(run_id).status == "cancelled"


PARKED = """
import tools
await tools.helpdesk.close_ticket(id=1)
v = await wait_for("go")
await tools.helpdesk.add_comment(id=1, body=v)
v
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_wait_settled_where_the_run_cannot_continue_is_continued_by_one_runner(backend, request, tmp_path):
    """Settled without continuing the run (continue_run=False here; a resolver lacking the run's sources
    likewise): one of two runners continues it, told by a notice on Postgres, by its scan on SQLite."""
    from tether._engine.worker import Worker

    url = request.getfixturevalue("pg_url") if backend == "postgres" else f"sqlite:///{tmp_path}/t.db"
    rec = Recorder()

    def runtime(**kw) -> Runtime:
        return Runtime(store=open_store(url), tools=rec.tools(), type_check=False,
                       policy=Policy(writes="allow"), **kw)

    stop = asyncio.Event()
    async with runtime(lease_seconds=LONG_LEASE) as a1, runtime(lease_seconds=LONG_LEASE) as a2, runtime() as b:
        runners = [asyncio.ensure_future(Worker(rt.engine).work(stop=stop)) for rt in (a1, a2)]
        try:
            run_id = b.start(PARKED)
            await until_status(b, run_id, "waiting")
            if backend == "postgres":
                await hears(a1, b)
                await hears(a2, b)
            key = b.engine.waits.key(run_id, "go")  # the run's record keeps only its digest (D-33)
            out = await b.resolve_wait(key, "go on", continue_run=False)
            assert out["status"] == "accepted" and "run" not in out, out
            await until_status(b, run_id, "completed")
        finally:
            stop.set()
            await asyncio.gather(*runners)
    run = b.store.get_run(run_id)
    assert run.result["result"] == "go on"
    assert rec.deliveries == [("close_ticket", {"id": 1}), ("add_comment", {"id": 1, "body": "go on"})]


async def test_a_run_parked_on_a_revoked_wait_is_woken_with_wait_revoked(tmp_path):
    """Revoking a parked run's wait (a session reset does) no longer leaves the run parked for ever."""
    from tether._engine.worker import Worker

    url = f"sqlite:///{tmp_path}/t.db"
    stop = asyncio.Event()
    async with Runtime(store=open_store(url), type_check=False) as runner, \
            Runtime(store=open_store(url), type_check=False) as b:
        task = asyncio.ensure_future(Worker(runner.engine).work(stop=stop))
        try:
            run_id = b.start('try:\n    await wait_for("go")\nexcept RuntimeError as e:\n    out = str(e)\nout')
            await until_status(b, run_id, "waiting")
            assert b.engine.waits.revoke(run_id=run_id) == 1
            await until_status(b, run_id, "completed")
        finally:
            stop.set()
            await task
        assert "wait_revoked" in b.store.get_run(run_id).result["result"]
