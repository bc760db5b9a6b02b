"""The sandbox worker goes back to the pool after the run's answer, not before it (bench/README.md,
"Issue 24, session 6"): one worker still serves executes back to back, and it is back by itself."""

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
