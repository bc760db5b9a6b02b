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
import time
from typing import TYPE_CHECKING, Any

from ..errors import RunNotFound

if TYPE_CHECKING:
    from .runtime import Runtime

# Events after which an observer has something to act on.
STOPPING_EVENTS = frozenset({"yielded", "paused", "waiting", "completed", "failed", "terminated"})
STATUS_OF_EVENT = {"completed": "completed", "failed": "failed", "terminated": "terminated", "paused": "paused"}


def observation(rt: "Runtime", cell_id: str, events: list[Any], after: int) -> dict[str, Any]:
    run = rt.store.get_run(cell_id)
    if run is None:
        raise RunNotFound(f"no cell {cell_id!r}")
    by_run = {"completed": "completed", "failed": "failed", "cancelled": "terminated", "paused": "paused",
              "waiting": "paused"}.get(run.status, "running")
    cursor = events[-1].event_id if events else after
    # The status the observer has reached: a finished run whose last events
    # it has not read yet is still "running" for it.
    status = by_run
    if by_run != "running" and rt.store.get_events(cell_id, after=cursor, limit=1):
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


async def wait_events(rt: "Runtime", cell_id: str, after: int, timeout_ms: int,
                      stop_on: frozenset[str] = STOPPING_EVENTS, task: asyncio.Task | None = None) -> list[Any]:
    """Events after ``after``: returns at the first stopping event, or when the time is up with what came."""
    deadline = time.monotonic() + timeout_ms / 1000
    collected: list[Any] = []
    cursor = after
    delay = 0.005
    # Events stored by this process wake us at once; other processes' events
    # too on Postgres (LISTEN/NOTIFY), and polling the store (backing off to
    # 50 ms) finds them whatever happens to the notifications.
    signal = rt._event_signals.setdefault(cell_id, asyncio.Event())
    rt.listen_for_events()  # and, on Postgres, other processes' events at once too
    while True:
        signal.clear()
        new = rt.store.get_events(cell_id, after=cursor)
        for i, e in enumerate(new):
            if e.type in STOPPING_EVENTS:
                # One stop per observation: the observer sees every yield.
                return collected + new[: i + 1]
        if new and any(e.type in stop_on for e in new):
            return collected + new
        if new:
            collected += new
            cursor = new[-1].event_id
            delay = 0.005
        run = rt.store.get_run(cell_id)
        if run is None:
            raise RunNotFound(f"no cell {cell_id!r}")
        if run.status in ("completed", "failed", "cancelled") and not new:
            return collected
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return collected
        waiters = {asyncio.ensure_future(signal.wait())}
        if task is not None and not task.done():
            waiters.add(task)
        done, _ = await asyncio.wait(waiters, timeout=min(delay, remaining), return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            if w is not task and not w.done():
                w.cancel()
        delay = min(delay * 2, 0.05)


async def start_cell(rt: "Runtime", code: str, *, yield_after_ms: int = 1000, principal: str | None = None,
                     meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start ``code`` in this process and observe it for up to ``yield_after_ms``."""
    from ..store.base import RUN_RUNNING
    from .inputs import check_code_size

    # Created already running and owned by this process: a queued row would be
    # claimed by another replica's runner first now and then (the caller would
    # hold a cell id it cannot start).
    check_code_size(code, rt.limits.code_bytes)
    run = rt._new_run(code, principal=principal, meta={**(meta or {}), "cell": True},
                      check=rt._check_for(None, None), status=RUN_RUNNING)
    rt._sign(run)
    rt.store.create_run(run)
    run_id = run.run_id
    task = asyncio.ensure_future(rt._attempt(run, mode="fresh", on_approval=None, t0=time.perf_counter()))
    rt._cell_tasks[run_id] = task
    def done(t: asyncio.Task) -> None:
        rt._cell_tasks.pop(run_id, None)
        # Observers in this process were woken by the final event; later ones poll the store.
        rt._event_signals.pop(run_id, None)
        if not t.cancelled():
            t.exception()  # retrieved: the outcome is in the store

    task.add_done_callback(done)
    events = await wait_events(rt, run_id, 0, yield_after_ms, task=task)
    return observation(rt, run_id, events, 0)


# A long-poll returns as soon as anything new is there: outputs stream.
ANY_EVENT = frozenset({"output"}) | STOPPING_EVENTS


async def wait_cell(rt: "Runtime", cell_id: str, *, after: int = 0, timeout_ms: int = 30_000,
                    principal: str | None = None) -> dict[str, Any]:
    rt._get_run(cell_id, principal)
    events = await wait_events(rt, cell_id, after, timeout_ms, stop_on=ANY_EVENT, task=rt._cell_tasks.get(cell_id))
    return observation(rt, cell_id, events, after)


async def terminate_cell(rt: "Runtime", cell_id: str, *, principal: str | None = None) -> dict[str, Any]:
    await rt.cancel(cell_id, "terminated by the observer", principal=principal)
    task = rt._cell_tasks.get(cell_id)
    if task is not None:
        await asyncio.wait({task}, timeout=30)
    events = rt.store.get_events(cell_id)
    return observation(rt, cell_id, events, 0)
