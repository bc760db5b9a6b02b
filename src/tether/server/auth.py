"""Who is calling: bearer tokens over HTTP, and the principal a run belongs to.

A run belongs to the principal that started it; every other principal gets
``run_not_found`` for it. The principal is a hash of the bearer token (so the
store never holds a token), or ``local`` where there is no token: standard
input/output, and ``--dev`` HTTP on a loopback address.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from typing import Any, Mapping, Sequence

LOCAL = "local"
_LOOPBACK_NAMES = ("localhost",)


def split_tokens(value: str | None) -> tuple[str, ...]:
    """The accepted tokens: ``TETHER_TOKEN`` / ``[server] token`` may list several, comma-separated."""
    if not value:
        return ()
    return tuple(t.strip() for t in value.split(",") if t.strip())


def principal_for_token(token: str) -> str:
    # 16 bytes of SHA-256: unique per token, and the store never learns one.
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def bearer(headers: Mapping[str, str] | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if there is one."""
    if not headers:
        return None
    value = headers.get("authorization") or headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def principal_from_headers(headers: Mapping[str, str] | None) -> str:
    """The principal of a request the auth middleware already let through."""
    token = bearer(headers)
    return principal_for_token(token) if token is not None else LOCAL


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """ASGI middleware: every HTTP request carries one of ``tokens``, or gets a 401 JSON error.

    With no tokens (``--dev`` on loopback) it lets everything through; the
    caller decides whether that is allowed.
    """

    def __init__(self, app: Any, tokens: Sequence[str]) -> None:
        self.app = app
        self.tokens = tuple(t.encode() for t in tokens)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.tokens:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        token = bearer(headers)
        if token is None:
            await _unauthorized(send, "missing_token", "the request has no Authorization: Bearer token")
            return
        presented = token.encode()
        # Compare with every token, always, so timing tells nothing about which one nearly matched.
        matched = False
        for known in self.tokens:
            matched |= hmac.compare_digest(presented, known)
        if not matched:
            await _unauthorized(send, "invalid_token", "the bearer token is not one this server accepts")
            return
        await self.app(scope, receive, send)


async def _unauthorized(send: Any, code: str, message: str) -> None:
    body = json.dumps({"error": {
        "code": code,
        "message": message,
        "next_action": "Send `Authorization: Bearer <token>` with the token the server was started with "
                       "(TETHER_TOKEN or [server] token).",
    }}).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="tether"'),
    ]})
    await send({"type": "http.response.body", "body": body})
