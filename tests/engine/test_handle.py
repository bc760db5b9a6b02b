"""The run handle: begin() names a run before it ends; result(), cancel() and events() act on it."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import Gate, Recorder
from tether import Runtime
from tether._engine.rules.policy import Policy

PROGRAM = "import tools\nemit('before')\nv = await tools.gate.hold()\nemit('after')\nv"


async def test_begin_returns_the_run_id_while_the_run_is_still_running():
    gate = Gate()
    async with Runtime(tools=[gate.tool()]) as rt:
        handle = await rt.begin(PROGRAM)
        await asyncio.wait_for(gate.entered.wait(), 60)
        assert not handle.done()
        run = rt.engine.get_run(handle.run_id)
        assert run.status == "running" and run.owner == rt.engine.owner
        assert rt.running(handle.run_id) is handle
        gate.open.set()
        result = await handle.result()
        assert result.status == "completed" and result.result == "through" and result.run_id == handle.run_id
        assert rt.running(handle.run_id) is None
        # The stored envelope is what the handle returned.
        assert rt.engine.get_run(handle.run_id).result["result"] == "through"


async def test_events_stream_while_the_run_runs_and_end_with_it():
    gate = Gate()
    async with Runtime(tools=[gate.tool()]) as rt:
        handle = await rt.begin(PROGRAM)
        seen: list[tuple[str, Any]] = []
        async for event in handle.events():
            seen.append((event.type, event.data.get("value")))
            if event.type == "output" and event.data["value"] == "before":
                gate.open.set()  # the first output arrived while the run waits at the gate
        assert seen == [("output", "before"), ("output", "after"), ("completed", None)]
        assert (await handle.result()).result == "through"


async def test_events_end_when_the_attempt_pauses_at_a_write():
    """A pause is not an end of the run, but it ends the attempt: the stream stops there, as it does at an
    end, instead of lasting its whole poll (a termination test: the poll here is ten minutes)."""

    async def collect(handle: Any) -> list[str]:
        return [event.type async for event in handle.events(poll_ms=600_000)]

    rec = Recorder()
    async with Runtime(tools=rec.tools()) as rt:
        handle = await rt.begin("import tools\nemit('asking')\nawait tools.helpdesk.close_ticket(id=1)")
        seen = await asyncio.wait_for(collect(handle), 60)
        assert seen == ["output", "paused"]
        assert (await handle.result()).status == "paused" and rec.deliveries == []


async def test_cancel_through_the_handle_stops_the_run_and_sends_nothing_further():
    gate = Gate()
    rec = Recorder()
    async with Runtime(tools=[gate.tool(), *rec.tools()], policy=Policy(writes="allow")) as rt:
        handle = await rt.begin("import tools\nawait tools.gate.hold()\nawait tools.helpdesk.close_ticket(id=1)")
        await asyncio.wait_for(gate.entered.wait(), 60)
        cancelled = await handle.cancel("not needed")
        assert cancelled.status == "cancelled" and "not needed" in cancelled.error["message"]
        assert (await handle.result()).status == "cancelled"
        assert rec.deliveries == []
        assert rt.engine.get_run(handle.run_id).status == "cancelled"


async def test_execute_is_begin_then_result():
    rec = Recorder()
    async with Runtime(tools=rec.tools()) as rt:
        code = "import tools\n(await tools.helpdesk.get_ticket(id=4))['title']"
        via_execute = await rt.execute(code)
        handle = await rt.begin(code)
        via_handle = await handle.result()
        assert via_execute.status == via_handle.status == "completed"
        assert via_execute.result == via_handle.result == "ticket 4"


async def test_a_begun_run_left_running_stops_when_the_runtime_closes():
    gate = Gate()
    async with Runtime(tools=[gate.tool()]) as rt:
        handle = await rt.begin(PROGRAM)
        await asyncio.wait_for(gate.entered.wait(), 60)
    assert handle.done()
