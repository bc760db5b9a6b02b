"""A run handle: a run started in this process, named before it ends.

``handle = await rt.begin(code)`` returns as soon as the run is recorded and its
attempt started; ``await handle.result()`` is the envelope ``execute`` returns,
``await handle.cancel()`` stops it, ``handle.events()`` streams what it stores
(outputs, yields, questions, its end). Every start path (execute, begin, cells,
the worker, resume, recover, wake) goes through one: ``tether._engine.launcher.launch``.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from tether._engine.attempt.result import RunResult
from tether._engine.events import ANY_EVENT, EventBus


class RunHandle:
    """One attempt of a run, running in this process."""

    def __init__(self, run_id: str, task: "asyncio.Task[RunResult]", *, bus: EventBus,
                 cancel: Callable[[str, str], Awaitable[RunResult]], detached: bool = False) -> None:
        self.run_id = run_id
        self._task = task
        # Nobody awaits it (a cell, a begin() left running): it stops when the runtime closes.
        self.detached = detached
        self._bus = bus
        self._cancel = cancel

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id} {'done' if self._task.done() else 'running'}>"

    @property
    def task(self) -> "asyncio.Task[RunResult]":
        """The attempt's task, to wait on alongside other things; ``result()`` is the usual way."""
        return self._task

    async def result(self) -> RunResult:
        """The run's envelope once this attempt ends: completed, failed, paused, waiting or cancelled.

        Cancelling the awaiting task cancels the attempt, as cancelling ``execute`` always did.
        """
        return await self._task

    def done(self) -> bool:
        return self._task.done()

    def add_done_callback(self, fn: Callable[["RunHandle"], Any]) -> None:
        """Call ``fn(handle)`` when the attempt ends (at once if it has)."""
        self._task.add_done_callback(lambda _t: fn(self))

    async def cancel(self, reason: str = "cancelled by the client") -> RunResult:
        """Stop the run: nothing further is sent; a write already on the wire finishes and is journaled."""
        return await self._cancel(self.run_id, reason)

    async def events(self, after: int = 0, *, poll_ms: int = 30_000) -> AsyncIterator[Any]:
        """The run's stored events after the cursor ``after``, as they come, until the attempt ends.

        Each is a ``RunEvent`` (``event_id``, ``type``, ``data``): ``output`` for each
        ``emit(value)``, ``yielded``, ``question``, ``decided``, ``progress`` (cells), ``paused``,
        ``waiting``, and ``completed`` / ``failed`` / ``terminated`` at the end.
        """
        cursor = after
        while True:
            if self._task.done():
                # Its last events were stored before it ended: one read has them all.
                for event in await self._bus.store.aio.get_events(self.run_id, after=cursor):
                    yield event
                return
            batch = await self._bus.wait(self.run_id, cursor, poll_ms, stop_on=ANY_EVENT, task=self._task)
            for event in batch:
                cursor = event.event_id
                yield event
