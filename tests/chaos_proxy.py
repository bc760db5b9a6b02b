"""A round-robin HTTP proxy on loopback for the chaos test (a helper, not a test).

Runs in a process of its own (:class:`ProxyProcess` starts it), as a balancer
would: in the test's process it would compete for one interpreter with the
clients it serves. Forwards each request to the next replica in rotation. A
replica leaves the rotation when ``/readyz`` fails three times in a row
(probed every 0.3 s, 5 s to answer: a replica busy under load is slow, not
gone) or at once when it refuses a connection (the request goes to the next:
nothing reached the dead one); it comes back when ``/readyz`` answers 200.
When no replica is in the rotation the proxy fails open, as balancers do, and
tries them all. Responses are streamed through, so SSE works. No stickiness
of any kind. ``GET /_proxy/stats`` says, per replica port, the requests served
and in flight, the answers of 400 and more, and (``x-chaos-tag`` header, port)
of each request a replica failed under (its answer cut off or lost).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx2
import uvicorn

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Proxy:
    def __init__(self, ports: list[int], port: int) -> None:
        self.ports = ports
        self.up = set(ports)
        self._turn = itertools.count()
        self._stop = threading.Event()
        self.served: Counter[int] = Counter()
        self.in_flight: Counter[int] = Counter()
        self.broken: set[tuple[str, int]] = set()
        self.errors: Counter[str] = Counter()  # answers >= 400: status, and who gave it
        self.client: httpx2.AsyncClient | None = None
        self.port = port

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

    def stats(self) -> dict:
        return {"served": self.served, "in_flight": self.in_flight, "up": sorted(self.up),
                "errors": self.errors, "broken": sorted(self.broken)}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/_proxy/stats":
            body = json.dumps(self.stats()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if self.client is None:
            # No cap on connections: 100 clients' open SSE answers would fill httpx's default pool of 100
            # and the next request would wait for a free connection until it timed out. Idle connections
            # are dropped after 2 s, before uvicorn closes them at 5 s: with both at 5 s, a request sent on
            # a connection uvicorn was closing failed as if the (living) replica had broken it.
            self.client = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300),
                                             limits=httpx2.Limits(max_connections=None, max_keepalive_connections=50,
                                                                  keepalive_expiry=2.0))
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

    def run(self) -> None:
        threading.Thread(target=self._probe, daemon=True).start()
        config = uvicorn.Config(self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        uvicorn.Server(config).run()  # until SIGTERM
        self._stop.set()


class ProxyProcess:
    """The proxy in its own process, in front of replicas on ``ports``."""

    def __init__(self, ports: list[int], log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, __file__, str(self.port), *map(str, ports)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                self.stats()
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the proxy did not start: {log.read_text()}")
            time.sleep(0.05)

    def stats(self) -> dict:
        data = httpx2.get(f"http://127.0.0.1:{self.port}/_proxy/stats", timeout=30).json()
        for k in ("served", "in_flight"):
            data[k] = {int(p): n for p, n in data[k].items()}
        data["broken"] = {(tag, port) for tag, port in data["broken"]}
        return data

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


async def _json(send, status: int, code: str, message: str) -> None:
    """An answer of the proxy's own (``Proxy.errors`` counts them)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _tag(scope) -> str:
    return next((v.decode() for k, v in scope["headers"] if k.decode().lower() == "x-chaos-tag"), "")


if __name__ == "__main__":
    Proxy([int(p) for p in sys.argv[2:]], int(sys.argv[1])).run()
