"""The console's ASGI layer: what every request meets before a page handler (the host check and the
security headers), and the router that puts the console and MCP on one HTTP app.

Kept apart from the pages: these wrap any app and know nothing of sessions or runs.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether._server.auth import host_allowed

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeaders:
    """ASGI middleware: a request for another host is refused (421); the console's headers on every response."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None = None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), None)
        if not host_allowed(host, self.hosts):
            # The body is never read: the same answer /mcp gives a rebound name.
            await Response("Invalid Host header", status_code=421, media_type="text/plain",
                           headers=dict((k.decode(), v.decode()) for k, v in SECURITY_HEADERS))(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)

# -- one HTTP app for MCP and the console -----------------------------------------------------------


class Router:
    """ASGI: ``/console`` and ``/approve`` go to the console (its own auth); everything else to ``other``."""

    PREFIXES = ("/console/", "/approve/")

    def __init__(self, console_app: ASGIApp, other: ASGIApp) -> None:
        self.console_app = console_app
        self.other = other

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path == "/console" or path.startswith(self.PREFIXES):
                await self.console_app(scope, receive, send)
                return
        await self.other(scope, receive, send)
