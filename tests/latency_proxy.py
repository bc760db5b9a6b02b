"""A loopback TCP proxy that delays every byte by a fixed latency (a helper, not a test).

It stands between tether and Postgres: each chunk read from one side is
written to the other ``delay`` seconds after it arrived, in order, both ways,
so a request/answer round trip costs at least twice the delay while many
connections stay in flight at once (latency, not a bandwidth cap). It runs its
own event loop in a thread, so a caller that blocks its loop on a store call
cannot stall the proxy.

``in_flight`` counts the connections that sent bytes not yet answered;
``peak`` is its highest value so far: two store calls overlapped on the wire
when ``peak > 1``. ``round_trips`` counts the times a connection sent a
request while none of its earlier ones was unanswered: the waits a client
paid, as the wire saw them (what the store's own counts are checked against).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg.conninfo


def target_of(url: str) -> tuple[str, int] | str:
    """Where a proxy for ``url`` forwards: the server's unix socket, or its host and port."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    host = (query.get("host") or [parsed.hostname or "localhost"])[0]
    port = int((query.get("port") or [parsed.port or 5432])[0])
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


class LatencyProxy:
    def __init__(self, target: tuple[str, int] | str, delay: float) -> None:
        """``target``: (host, port), or the path of a unix socket."""
        self.target = target
        self.delay = delay
        self.port = 0
        self.in_flight = 0
        self.peak = 0
        self.round_trips = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="latency-proxy", daemon=True)

    def start(self) -> "LatencyProxy":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the latency proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def __enter__(self) -> "LatencyProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, behind: str) -> str:
        """``behind`` (the server's URL) reached through this proxy."""
        params = psycopg.conninfo.conninfo_to_dict(behind)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**params)

    # -- the proxy's own loop

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if isinstance(self.target, str):
                server_r, server_w = await asyncio.open_unix_connection(self.target)
            else:
                server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        with self._lock:
            self.connections += 1
        waiting = [False]  # this connection sent bytes not yet answered
        await asyncio.gather(
            self._pipe(client_r, server_w, waiting, request=True),
            self._pipe(server_r, client_w, waiting, request=False),
            return_exceptions=True,
        )

    def _mark(self, waiting: list[bool], value: bool) -> None:
        with self._lock:
            if waiting[0] != value:
                waiting[0] = value
                self.in_flight += 1 if value else -1
                self.peak = max(self.peak, self.in_flight)
                self.round_trips += 1 if value else 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, waiting: list[bool], *,
                    request: bool) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                pause = due - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                writer.write(data)
                await writer.drain()
                if not request:
                    self._mark(waiting, False)

        sender: Any = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if request and data:
                    self._mark(waiting, True)
                await queue.put((time.monotonic() + self.delay, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()
            self._mark(waiting, False)
            writer.close()
