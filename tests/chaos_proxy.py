"""A round-robin HTTP proxy on loopback for the chaos test (a helper, not a test).

Forwards each request to the next replica whose ``/readyz`` answered 200 at
the last probe (every 0.3 s); a replica that refuses the connection is taken
out at once and the request goes to the next (nothing reached the dead one).
Responses are streamed through, so SSE works. No stickiness of any kind.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time

import httpx2
import uvicorn

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Proxy:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.up = set(ports)
        self._turn = itertools.count()
        self._stop = threading.Event()
        self.client: httpx2.AsyncClient | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    # -- readiness

    def _probe(self) -> None:
        with httpx2.Client(timeout=1.0) as http:
            while not self._stop.is_set():
                for port in self.ports:
                    try:
                        ok = http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                    except httpx2.HTTPError:
                        ok = False
                    (self.up.add if ok else self.up.discard)(port)
                self._stop.wait(0.3)

    def _next(self, tried: set[int]) -> int | None:
        ready = [p for p in self.ports if p in self.up and p not in tried]
        return ready[next(self._turn) % len(ready)] if ready else None

    # -- ASGI

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            self.client = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
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
            try:
                response = await self.client.send(
                    self.client.build_request(scope["method"], url, headers=headers, content=body), stream=True)
            except httpx2.ConnectError:
                self.up.discard(port)  # refused: the request never reached it
                continue
            except httpx2.HTTPError:
                await _json(send, 502, "replica_lost", "the replica failed while taking the request")
                return
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.multi_items()
                                    if k.lower() not in _HOP]})
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx2.HTTPError:
                pass  # the replica died mid-response: the stream ends here
            finally:
                await response.aclose()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _json(send, 503, "no_replica_ready", "no replica answered /readyz")

    # -- life

    def start(self) -> None:
        threading.Thread(target=self._probe, daemon=True).start()
        config = uvicorn.Config(self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._server.should_exit = True
        self._thread.join(timeout=10)


async def _json(send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
