"""An attempt's heartbeat on a store without notices (SQLite): it starts at its first renewal (a timer
stands in before: 0.99x a 10-call execute, paired), and still keeps the lease and sees a cancel."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from helpers import Gate
from tether import Runtime
from tether._store import open_store

PROGRAM = "import tools\nawait tools.gate.hold()"


async def _until(check: Any, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.02)
    return bool(check())


async def test_a_run_longer_than_its_lease_keeps_it_on_sqlite(tmp_path):
    gate = Gate()
    url = f"sqlite:///{tmp_path}/tether.db"
    async with Runtime(tools=[gate.tool()], store=open_store(url), lease_seconds=0.3) as rt:
        handle = await rt.begin(PROGRAM)
        await asyncio.wait_for(gate.entered.wait(), 60)
        first = rt.engine.get_run(handle.run_id).lease_until
        assert first is not None
        # Renewed every lease / 3 while the run waits at the gate, never left to lapse.
        assert await _until(lambda: rt.engine.get_run(handle.run_id).lease_until > first + 0.2)
        async with Runtime(tools=[gate.tool()], store=open_store(url), lease_seconds=0.3) as other:
            assert await other.recover() == []  # nothing to take over: its owner holds it
        gate.open.set()
        assert (await handle.result()).status == "completed"


async def test_a_cancel_from_another_runtime_is_seen_at_the_next_renewal_on_sqlite(tmp_path):
    gate = Gate()
    url = f"sqlite:///{tmp_path}/tether.db"
    async with Runtime(tools=[gate.tool()], store=open_store(url), lease_seconds=0.3) as rt, \
            Runtime(tools=[gate.tool()], store=open_store(url), lease_seconds=0.3) as other:
        handle = await rt.begin(PROGRAM)
        await asyncio.wait_for(gate.entered.wait(), 60)
        cancelled = await other.cancel(handle.run_id, "not needed")
        assert cancelled.status == "cancelled"
        result = await handle.result()
        assert result.status == "cancelled" and "not needed" in result.error["message"]
