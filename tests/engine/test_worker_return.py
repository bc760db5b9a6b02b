"""The sandbox worker goes back to the pool after the run's answer, not before it (0.92x a 10-call execute,
paired): one worker still serves executes back to back, and it is back by itself."""

from __future__ import annotations

import asyncio
import time

from helpers import Recorder
from tether import Runtime


async def test_one_worker_serves_executes_back_to_back_and_concurrently():
    rec = Recorder()
    async with Runtime(tools=rec.tools(), max_workers=1) as rt:
        code = "import tools\n(await tools.helpdesk.get_ticket(id=4))['title']"
        for _ in range(5):
            result = await rt.execute(code)
            assert (result.status, result.result) == ("completed", "ticket 4")
        together = await asyncio.gather(*(rt.execute(code) for _ in range(4)))
        assert [r.status for r in together] == ["completed"] * 4
        # Given back without anything else happening: the pool counts no worker busy once it is.
        pool, deadline = rt.engine.pool, time.monotonic() + 20
        while pool.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert pool.busy == 0



def _monty_children() -> int:
    """Live descendants of this process running a Monty worker (bench/common.py reads /proc)."""
    from bench.common import child_processes, live

    return live(child_processes("monty"))

async def test_executes_one_after_another_do_not_start_a_second_worker():
    # The answer comes before the worker is back; the next execute waits for it (~0.1 ms) instead of having
    # the pool start another process (durable_bench: "monty workers held by paused runs" went 0 -> 1).
    rec = Recorder()
    async with Runtime(tools=rec.tools(), max_workers=2) as rt:
        await rt.execute("1")
        first = _monty_children()
        for _ in range(10):  # a pause: its dump is taken, then the worker goes back while the answer returns
            paused = await rt.execute("import tools\nawait tools.helpdesk.add_comment(id=1, body='x')")
            assert paused.status == "paused"
        assert first >= 1 and _monty_children() == first


async def test_a_checkout_started_and_not_used_gives_its_worker_back():
    # An attempt starts its worker's checkout before it builds the rest (0.94-0.97x a short execute, paired);
    # if it ends before its program runs, the worker goes back: with one worker, the next execute still runs.
    import datetime as _dt

    from tether._sandbox.monty import SandboxLimits, SandboxSpec

    spec = SandboxSpec(namespaces={}, builtins=(), sync_builtins=(), clock=_dt.datetime(2026, 1, 1),
                       limits=SandboxLimits(memory_bytes=64 * 1024 * 1024, run_seconds=10.0, host_calls=10),
                       seed=1, type_check=False)
    async with Runtime(max_workers=1) as rt:
        pool = rt.engine.pool
        for _ in range(3):
            (await pool.reserve(spec)).release()
        result = await asyncio.wait_for(rt.execute("1 + 1"), timeout=30)
        assert (result.status, result.result) == ("completed", 2)
        await pool.returned()
        assert pool.busy == 0
