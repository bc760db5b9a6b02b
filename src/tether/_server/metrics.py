"""``GET /metrics``: the Prometheus text exposition of :mod:`tether._metrics`.

On the main listener it sits behind the bearer token like everything but the
health probes (a scrape job sends ``Authorization: Bearer ...``): a static
token or an identity provider's access token whose rights include metrics (or
operate), and never open while any authentication is configured (P-44);
``[metrics] listen`` adds a separate listener without a token, for a network
only the scraper reaches (docs/deploy.md "Metrics").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Sequence

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from tether._engine.approvals.doors import Door
from tether._metrics import render
from tether._server.auth import BearerAuth
from tether._store.retention import live_counts

if TYPE_CHECKING:
    from tether._runtime import Runtime

METRICS_PATH = "/metrics"


class MetricsApp:
    """Answers ``GET /metrics`` and nothing else (404)."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope.get("path") != METRICS_PATH:
            await _send(send, 404, b"not found\n", b"text/plain; charset=utf-8")
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _send(send, 405, b"method not allowed\n", b"text/plain; charset=utf-8", [(b"allow", b"GET, HEAD")])
            return
        # The live part reads the store: off the event loop, as every store call should be.
        body = await asyncio.to_thread(render, self.rt, live_counts)
        await _send(send, 200, body if scope.get("method") == "GET" else b"", CONTENT_TYPE_LATEST.encode())


class MetricsRoute:
    """``/metrics`` behind the bearer token (static or OAuth, with the metrics right); every other path goes on."""

    def __init__(self, app: ASGIApp, rt: "Runtime", tokens: Sequence[str], resource: Any = None,
                 access: Any = None) -> None:
        self.app = app
        self.metrics = BearerAuth(MetricsApp(rt), tokens, resource, access=access, door=Door.METRICS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == METRICS_PATH:
            await self.metrics(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _send(send: Send, status: int, body: bytes, content_type: bytes,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
