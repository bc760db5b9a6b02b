"""The console's live feed: one poller of the store's run changes, and ``/console/events`` streaming them.

Its own module because it is the console's only long-lived work: a task polling the store and
streams held open, each bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tether._engine.approvals import may_see
from tether._server.console.sessions import ConsoleSessions
from tether._store.states import RunStatus

if TYPE_CHECKING:
    from tether._store.base import Store

# The change feed polls the store (runs may be decided or continued by any
# process sharing it); a fifth of a second keeps a pause on screen well
# within a second without a noticeable load.
FEED_POLL_SECONDS = 0.2
# An event stream ends after this long and the browser reconnects: a server
# shutting down never waits on a forgotten tab for more than this.
STREAM_SECONDS = 300.0
KEEPALIVE_SECONDS = 15.0


class RunFeed:
    """One poller of the store's run changes, fanned out to every open event stream."""

    def __init__(self, store: Store, poll_seconds: float = FEED_POLL_SECONDS) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self._queues: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None
        self._since = time.time()
        self._seen: dict[str, tuple[float, str]] = {}

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=256)
        self._queues.add(queue)
        if self._task is None or self._task.done():
            self._since = time.time() - 1.0
            self._task = asyncio.ensure_future(self._poll())
        try:
            yield queue
        finally:
            self._queues.discard(queue)
            if not self._queues and self._task is not None:
                self._task.cancel()
                self._task = None

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a store hiccup must not end the feed
                await self._tick()
            await asyncio.sleep(self.poll_seconds)

    async def _tick(self) -> None:
        # Clocks of processes sharing a store differ a little: look back two
        # seconds and drop what was already announced.
        for run in await self.store.aio.runs_updated_since(self._since - 2.0, limit=500):
            mark = (run.updated_at, run.status)
            if self._seen.get(run.run_id) == mark:
                continue
            self._seen[run.run_id] = mark
            self._since = max(self._since, run.updated_at)
            change = {"run_id": run.run_id, "status": run.status, "run": run,
                      "waits_on": (run.pending or {}).get("address") if run.status == RunStatus.PAUSED else None}
            for queue in list(self._queues):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(change)
        horizon = self._since - 10.0
        if len(self._seen) > 5000:
            self._seen = {k: v for k, v in self._seen.items() if v[0] >= horizon}

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class EventFeed(ConsoleSessions):
    """``GET /console/events``: the runs a signed-in principal may see, as they change."""

    feed: RunFeed

    async def events(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return Response("sign in first", status_code=401, media_type="text/plain")
        principal = session["p"]

        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 1000\n\n"
            deadline = time.monotonic() + STREAM_SECONDS
            async with self.feed.subscribe() as queue:
                while time.monotonic() < deadline:
                    try:
                        change = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                    except asyncio.TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    if not may_see(self.access, self.grant(principal), change["run"].principal):
                        continue
                    data = {k: change[k] for k in ("run_id", "status", "waits_on")}
                    yield f"event: run\ndata: {json.dumps(data)}\n\n".encode()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})
