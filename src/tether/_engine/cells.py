"""Cells: a run observed while it runs (P-20).

``start_cell`` starts a program and returns an *observation* as soon as the
program yields, ends, pauses, or ``yield_after_ms`` passes; the program keeps
running. ``wait_cell`` long-polls the run's stored events after a cursor and
returns as soon as there are any (outputs stream), stopping at the first yield,
pause or end, so any process sharing the store can observe a cell. ``terminate_cell`` cancels it.
A cell's id is its run id.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tether._engine import control, launcher
from tether._engine.events import ANY_EVENT, STOPPING_EVENTS
from tether._store.states import RunStatus
from tether.errors import RunNotFound

if TYPE_CHECKING:
    from tether._engine.engine import Engine


STATUS_OF_EVENT = {"completed": "completed", "failed": "failed", "terminated": "terminated", "paused": "paused"}
# What an observer is told for the run's status: a cancelled cell was terminated; a parked one is paused for it.
_CELL_STATUS = {RunStatus.COMPLETED: "completed", RunStatus.FAILED: "failed", RunStatus.CANCELLED: "terminated",
                RunStatus.PAUSED: "paused", RunStatus.WAITING: "paused"}


def observation(engine: Engine, cell_id: str, events: list[Any], after: int) -> dict[str, Any]:
    run = engine.store.get_run(cell_id)
    if run is None:
        raise RunNotFound(f"no cell {cell_id!r}")
    by_run = _CELL_STATUS.get(run.status, "running")
    cursor = events[-1].event_id if events else after
    # The status the observer has reached: a finished run whose last events
    # it has not read yet is still "running" for it.
    status = by_run
    if by_run != "running" and engine.store.get_events(cell_id, after=cursor, limit=1):
        status = "running"
    out: dict[str, Any] = {
        "status": status,
        "cell_id": cell_id,
        "cursor": cursor,
        "events": [{"id": e.event_id, "type": e.type, **e.data} for e in events],
    }
    envelope = run.result or {}
    if status == "completed":
        out["result"] = envelope.get("result")
    if status in ("failed", "terminated"):
        out["error"] = envelope.get("error") or run.error
    if status == "paused":
        out["pending"] = run.pending
        out["instructions"] = envelope.get("instructions")
    return out


async def wait_events(engine: Engine, cell_id: str, after: int, timeout_ms: int,
                      stop_on: frozenset[str] = STOPPING_EVENTS, task: asyncio.Future[Any] | None = None) -> list[Any]:
    """Events after ``after``: returns at the first stopping event, or when the time is up with what came."""
    return await engine.events.wait(cell_id, after, timeout_ms, stop_on=stop_on, task=task)


async def start_cell(engine: Engine, code: str, *, yield_after_ms: int = 1000, principal: str | None = None,
                     meta: dict[str, Any] | None = None, key: str | None = None) -> dict[str, Any]:
    """Start ``code`` in this process (a run begun like any other) and observe it for up to ``yield_after_ms``.

    With a ``key`` that already names a cell (P-36), that cell is observed from its first event.
    """
    handle = await launcher.begin(engine, code, check=engine.settings.check, principal=principal,
                                  meta={**(meta or {}), "cell": True}, detached=True, key=key)
    events = await wait_events(engine, handle.run_id, 0, yield_after_ms, task=handle.task)
    return await engine.astore.call(observation, engine, handle.run_id, events, 0)


async def wait_cell(engine: Engine, cell_id: str, *, after: int = 0, timeout_ms: int = 30_000,
                    principal: str | None = None) -> dict[str, Any]:
    await engine.astore.call(engine.get_run, cell_id, principal)
    handle = engine.attempts.handle(cell_id)
    events = await wait_events(engine, cell_id, after, timeout_ms, stop_on=ANY_EVENT,
                               task=handle.task if handle is not None else None)
    return await engine.astore.call(observation, engine, cell_id, events, after)


async def terminate_cell(engine: Engine, cell_id: str, *, principal: str | None = None) -> dict[str, Any]:
    await control.cancel(engine, cell_id, "terminated by the observer", principal=principal)
    handle = engine.attempts.handle(cell_id)
    if handle is not None:
        await asyncio.wait({handle.task}, timeout=30)
    events = await engine.store.aio.get_events(cell_id)
    return await engine.astore.call(observation, engine, cell_id, events, 0)
