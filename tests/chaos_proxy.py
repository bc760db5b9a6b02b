"""A round-robin HTTP proxy on loopback for the chaos test (a helper, not a test).

Forwards each request to the next replica in rotation. A replica leaves the
rotation when ``/readyz`` fails three times in a row (probed every 0.3 s, 5 s
to answer: a replica busy under load is slow, not gone) or at once when it
refuses a connection (the request goes to the next: nothing reached the dead
one); it comes back when ``/readyz`` answers 200. When no replica is in the
rotation the proxy fails open, as balancers do, and tries them all. Responses are streamed
through, so SSE works. No stickiness of any kind. ``served`` and ``in_flight``
count requests per replica port; ``broken`` records (``x-chaos-tag`` header,
port) of each request a replica failed under (its answer cut off or lost).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import Counter

import httpx2
import uvicorn

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Proxy:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.up = set(ports)
        self._turn = itertools.count()
        self._stop = threading.Event()
        self.served: Counter[int] = Counter()
        self.in_flight: Counter[int] = Counter()
        self.broken: set[tuple[str, int]] = set()
        self.errors: Counter[str] = Counter()  # answers >= 400: status, and who gave it
        self.client: httpx2.AsyncClient | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    # -- readiness

    def _probe(self) -> None:
        with httpx2.Client(timeout=5.0) as http:
            failed: Counter[int] = Counter()
            while not self._stop.is_set():
                for port in self.ports:
                    refused = False
                    try:
                        ok = http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                    except httpx2.ConnectError:
                        ok, refused = False, True  # nothing listens there any more
                    except httpx2.HTTPError:
                        ok = False
                    failed[port] = 0 if ok else failed[port] + 1
                    if ok:
                        self.up.add(port)
                    elif refused or failed[port] >= 3:
                        self.up.discard(port)
                self._stop.wait(0.3)

    def _next(self, tried: set[int]) -> int | None:
        pool = self.up or set(self.ports)  # none ready: fail open
        ready = [p for p in self.ports if p in pool and p not in tried]
        return ready[next(self._turn) % len(ready)] if ready else None

    # -- ASGI

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            # No cap on connections: 100 clients' open SSE answers would fill httpx's default pool of 100
            # and the next request would wait for a free connection until it timed out.
            self.client = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300),
                                             limits=httpx2.Limits(max_connections=None, max_keepalive_connections=50))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.decode().lower() not in _HOP]
        query = scope.get("query_string") or b""
        tried: set[int] = set()
        while (port := self._next(tried)) is not None:
            tried.add(port)
            url = f"http://127.0.0.1:{port}{scope['path']}" + (f"?{query.decode()}" if query else "")
            self.in_flight[port] += 1
            try:
                await self._forward(port, url, scope, headers, body, send)
                return
            except httpx2.ConnectError:
                self.up.discard(port)  # refused: the request never reached it
                continue
            except httpx2.HTTPError as exc:
                self.broken.add((_tag(scope), port))
                self.errors[f"502 replica_lost ({type(exc).__name__})"] += 1
                await _json(send, 502, "replica_lost", "the replica failed while taking the request")
                return
            finally:
                self.in_flight[port] -= 1
        self.errors["503 no_replica_ready"] += 1
        await _json(send, 503, "no_replica_ready", "no replica answered /readyz")

    async def _forward(self, port: int, url: str, scope, headers, body: bytes, send) -> None:
        assert self.client is not None
        response = await self.client.send(
            self.client.build_request(scope["method"], url, headers=headers, content=body), stream=True)
        self.served[port] += 1
        if response.status_code >= 400:
            self.errors[f"{response.status_code} from replica {port}"] += 1
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.multi_items()
                                    if k.lower() not in _HOP]})
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx2.HTTPError as exc:
                self.broken.add((_tag(scope), port))  # the replica died mid-response: the stream ends here
                self.errors[f"cut mid-answer ({type(exc).__name__})"] += 1
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    # -- life

    def start(self) -> None:
        threading.Thread(target=self._probe, daemon=True).start()
        config = uvicorn.Config(self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def _serve(self) -> None:
        self.native_id = threading.get_native_id()  # for its CPU time in /proc
        self._server.run()

    def stop(self) -> None:
        self._stop.set()
        self._server.should_exit = True
        self._thread.join(timeout=10)


async def _json(send, status: int, code: str, message: str) -> None:
    """An answer of the proxy's own (``Proxy.errors`` counts them)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _tag(scope) -> str:
    return next((v.decode() for k, v in scope["headers"] if k.decode().lower() == "x-chaos-tag"), "")
