"""Who is calling: bearer tokens over HTTP, and the principal a run belongs to.

A run belongs to the principal that started it; every other principal gets
``run_not_found`` for it. The principal is a hash of the bearer token (so the
store never holds a token), or ``local`` where there is no token: standard
input/output, the CLI, the Python API, and ``--dev`` HTTP on a loopback address.

One request, one identity (P-23): the middleware reads the request's raw
headers, refuses a request with more than one ``Authorization`` header or one
it cannot parse, checks the single token, and records the principal derived
from *that* token in the ASGI scope. Nothing downstream reads the headers
again, so no other header can name the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether._engine.approvals.doors import Door, admits, needed
from tether._engine.approvals.grants import ENV_RIGHTS
from tether._engine.approvals.rights import Access, Grant
from tether._server.credentials import CredentialProblem

if TYPE_CHECKING:
    from tether._server.oauth import ResourceServer

LOCAL = "local"
# Where the middleware leaves the verified principal for the MCP tools.
SCOPE_KEY = "tether.principal"
# An access token's rights and who it names (OAuth): per request, since two
# tokens of one user may carry different scopes.
GRANT_KEY, IDENTITY_KEY = "tether.grant", "tether.identity"
# A shorter token can be guessed or typed from memory; 16 characters of a
# random alphabet are ~96 bits (`openssl rand -hex 16` gives 32).
MIN_TOKEN_CHARS = 16
_LOOPBACK_NAMES = ("localhost",)
# RFC 7235 token68: what a bearer credential may be made of.
_TOKEN68 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")

HEALTH_PATH, READY_PATH = "/healthz", "/readyz"
# How a refusal names the door it was refused at.
_DOOR_TEXT = {Door.MCP: "calling tether's MCP tools", Door.METRICS: "scraping /metrics"}
SESSION_HEADER = b"mcp-session-id"
# Sessions remembered per process; past this the oldest is forgotten and its
# client must initialize again (idle legacy sessions are long gone by then).
MAX_BOUND_SESSIONS = 100_000
# The MCP SDK closes a stateful session idle this long (its default): a binding idle longer is no session.
SESSION_IDLE_SECONDS = 1800.0


def split_tokens(value: str | None) -> tuple[str, ...]:
    """The accepted tokens: ``TETHER_TOKEN`` / ``[server] token`` may list several, comma-separated."""
    if not value:
        return ()
    return tuple(t.strip() for t in value.split(",") if t.strip())


def short_tokens(tokens: Iterable[str]) -> list[int]:
    """The lengths of the tokens shorter than MIN_TOKEN_CHARS (never the tokens themselves)."""
    return [len(t) for t in tokens if len(t) < MIN_TOKEN_CHARS]


def well_formed(token: str) -> bool:
    """Whether ``token`` can be sent as one bearer credential (RFC 7235 token68)."""
    return bool(token) and set(token) <= _TOKEN68


def principal_for_token(token: str) -> str:
    # 16 bytes of SHA-256: unique per token, and the store never learns one.
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def bearer_token(raw_headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The one bearer token of a request, from its raw ASGI header list; else CredentialProblem.

    Every ``Authorization`` header counts, whatever its case: two of them are
    refused rather than choosing one, since a proxy, a framework and this
    check could each choose differently.
    """
    values = [v for k, v in raw_headers if k.lower() == b"authorization"]
    if not values:
        raise CredentialProblem(401, "missing_token", "the request has no Authorization: Bearer token")
    if len(values) > 1:
        raise CredentialProblem(400, "ambiguous_credentials",
                                f"the request has {len(values)} Authorization headers; send exactly one")
    try:
        value = values[0].decode("ascii")
    except UnicodeDecodeError:
        raise CredentialProblem(400, "malformed_credentials",
                                "the Authorization header is not ASCII") from None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise CredentialProblem(401, "missing_token",
                                "the request has no Authorization: Bearer token (another scheme was sent)")
    token = token.strip(" ")
    # A comma is how proxies join repeated headers; anything outside token68
    # (spaces, a second scheme) means this is not one bearer credential.
    if not well_formed(token):
        raise CredentialProblem(400, "malformed_credentials",
                                "the Authorization header is not `Bearer <token>` with one token")
    return token


def principal_of_request(ctx: Any) -> str:
    """The principal the middleware verified for this MCP request (it never re-reads headers)."""
    request = getattr(getattr(ctx, "request_context", None), "request", None)
    principal = (getattr(request, "scope", None) or {}).get(SCOPE_KEY)
    if not isinstance(principal, str):
        # Unreachable behind BearerAuth; failing closed keeps it that way if it ever is.
        from tether.errors import Unauthenticated
        raise Unauthenticated("the request carries no verified principal; nothing was run",
                              next_action="Send `Authorization: Bearer <token>`.")
    return principal


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:8000`` -> ``::1``, ``Example.com:443`` -> ``example.com``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts(bind_host: str, public_url: str | None) -> frozenset[str] | None:
    """The ``Host`` names a browser may use to reach this server, or None for any.

    A DNS-rebinding page reaches a loopback server under the attacker's own
    name, so a loopback bind answers only loopback names (the MCP SDK's rule
    for ``/mcp``), a specific address only itself, and ``public_url``'s host
    always. Only a wildcard bind (``0.0.0.0``, ``::``) without ``public_url``
    cannot know its names and accepts any.
    """
    names: set[str] = set()
    if is_loopback(bind_host):
        names |= {"localhost", "127.0.0.1", "::1"}
    else:
        try:
            wildcard = ipaddress.ip_address(bind_host.strip("[]")).is_unspecified
        except ValueError:
            wildcard = False
        if not wildcard:
            names.add(_host_name(bind_host if ":" not in bind_host.strip("[]") else f"[{bind_host.strip('[]')}]"))
        elif not public_url:
            return None
        else:
            names |= {"localhost", "127.0.0.1", "::1"}
    if public_url:
        from urllib.parse import urlsplit

        public = urlsplit(public_url).hostname
        if public:
            names.add(public.lower())
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    return bool(header) and _host_name(header or "") in allowed


class BearerAuth:
    """ASGI middleware: every HTTP request carries exactly one of ``tokens``, or gets a JSON error.

    With no tokens (``--dev`` on loopback) it lets everything through as
    ``local``; the caller decides whether that is allowed. With a
    ``resource`` server ([auth]), a token that is none of ``tokens`` is checked
    as an access token from the identity provider, and refusals carry the
    challenge that sends an MCP client to tether's Protected Resource Metadata.

    Whoever the token names, static or OAuth, must then hold a right that opens
    ``door`` (P-44, ``tether._engine.approvals.doors``): a static token's rights
    come from ``access`` (``[[server.tokens]]``), an access token's from its
    scopes and claims.
    """

    def __init__(self, app: ASGIApp, tokens: Sequence[str], resource: ResourceServer | None = None, *,
                 access: Access | None = None, door: str = Door.MCP,
                 session_quota: Callable[[str], int | None] | None = None,
                 idle_seconds: float = SESSION_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.tokens = tuple(t.encode() for t in tokens)
        self.resource = resource
        self.access, self.door = access, door
        # Legacy (2025-11-25) MCP sessions live in this process's memory, so
        # their binding to a principal can too: a session id is usable only
        # with the token that opened it (the SDK does not bind them).
        self._sessions: OrderedDict[bytes, str] = OrderedDict()
        # Per principal, its sessions by last use: what its mcp_sessions quota counts, and the only
        # sessions a flood of its own can push out (never another principal's).
        self._owned: dict[str, OrderedDict[bytes, float]] = {}
        self.session_quota = session_quota
        self.idle_seconds, self.clock = idle_seconds, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and (self.tokens or self.resource):
            # Nothing tether serves speaks WebSocket: refuse rather than pass one through unchecked.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.tokens and self.resource is None:
            scope[SCOPE_KEY] = LOCAL
            await self.app(scope, receive, send)
            return
        try:
            token = bearer_token(scope.get("headers", []))
        except CredentialProblem as problem:
            await self._refuse(send, problem)
            return
        presented = token.encode()
        # Compare with every token, always, so timing tells nothing about which one nearly matched.
        matched = False
        for known in self.tokens:
            matched |= hmac.compare_digest(presented, known)
        identity = None
        if matched:
            # The principal comes from the token just verified, and from nothing else.
            principal = principal_for_token(token)
            grant = self.static_grant(principal)
        elif self.resource is not None:
            try:
                identity = await self.resource.identify(token)
            except CredentialProblem as problem:
                await self._refuse(send, problem)
                return
            grant = identity.grant()
            principal = identity.principal
        else:
            await self._refuse(send, CredentialProblem(401, "invalid_token",
                                                       "the bearer token is not one this server accepts"))
            return
        verdict = admits(grant, self.door)
        if not verdict.ok:
            # RFC 6750 §3.1: the token is good, its rights are not enough; for an access token the
            # challenge names the scope so a client can step up.
            right = needed(self.door)
            await self._refuse(send, CredentialProblem(
                403, "insufficient_scope", f"the {'access ' if identity is not None else ''}token lacks the right "
                f"{right} (scope tether:{right}), which {_DOOR_TEXT.get(self.door, self.door)} needs"),
                scope=f"tether:{right}")
            return
        if identity is not None:
            scope[GRANT_KEY], scope[IDENTITY_KEY] = grant, identity
        scope[SCOPE_KEY] = principal
        session_ids = [v for k, v in scope.get("headers", []) if k.lower() == SESSION_HEADER]
        if len(session_ids) > 1:
            # The token was good: the advice is about the session header, and no Bearer challenge goes with it.
            await _json(send, 400, {"error": {
                "code": "ambiguous_credentials",
                "message": f"the request has {len(session_ids)} Mcp-Session-Id headers; nothing was run",
                "next_action": "Send at most one Mcp-Session-Id header: the id this server gave your session "
                               "(none on the request that starts one)."}})
            return
        if session_ids and self._sessions.get(session_ids[0]) != principal:
            # Another principal's session does not exist for this caller, as
            # the SDK answers an unknown one. Every session this process holds
            # was opened through here, so an id it never bound is no session.
            await _json(send, 404, {"error": {"code": "session_not_found",
                                              "message": "no MCP session with that id for this token",
                                              "next_action": "Start a new session (initialize) with your token."}})
            return
        if session_ids:
            self._owned.setdefault(principal, OrderedDict())[session_ids[0]] = self.clock()
            self._owned[principal].move_to_end(session_ids[0])
        elif scope.get("method") == "POST" and (refused := self._over_quota(principal)) is not None:
            await _json(send, 429, {"error": refused})
            return
        ending = session_ids[0] if session_ids and scope.get("method") == "DELETE" else None
        await self.app(scope, receive, self._binding_sessions(send, principal, ending))

    def static_grant(self, principal: str) -> Grant | None:
        """The rights of a static token: from ``access``; without one, what a TETHER_TOKEN may do."""
        if self.access is not None:
            return self.access.grant(principal)
        return Grant(principal, "TETHER_TOKEN", ENV_RIGHTS)

    def open_sessions(self, principal: str) -> int:
        """MCP sessions ``principal`` used within the SDK's idle time (older ones the SDK has closed)."""
        owned = self._owned.get(principal)
        if not owned:
            return 0
        cutoff = self.clock() - self.idle_seconds
        while owned and next(iter(owned.values())) < cutoff:
            self._unbind(principal, next(iter(owned)))
        return len(owned)

    def _over_quota(self, principal: str) -> dict[str, Any] | None:
        """The quota_exceeded error a new session (a POST without a session id) gets, if any."""
        limit = self.session_quota(principal) if self.session_quota is not None else None
        if limit is None:
            return None
        used = self.open_sessions(principal)
        if used < limit:
            return None
        return {"code": "quota_exceeded",
                "message": f"this token has {used} open MCP sessions; its mcp_sessions quota is {limit}; no "
                           "session was opened",
                "next_action": "Reuse an open session, end ones you no longer need (HTTP DELETE /mcp with its "
                               f"Mcp-Session-Id), or wait: sessions idle {self.idle_seconds:g} s are closed.",
                "details": {"quota": "mcp_sessions", "limit": limit, "used": used}}

    def _unbind(self, principal: str, session: bytes) -> None:
        self._sessions.pop(session, None)
        owned = self._owned.get(principal)
        if owned is not None:
            owned.pop(session, None)
            if not owned:
                del self._owned[principal]

    def _binding_sessions(self, send: Send, principal: str, ending: bytes | None) -> Send:
        async def bind(message: Message) -> None:
            if message.get("type") == "http.response.start":
                if ending is not None and 200 <= int(message.get("status", 500)) < 300:
                    self._unbind(principal, ending)  # the client ended it
                for k, v in message.get("headers", []):
                    if k.lower() == SESSION_HEADER and ending is None:
                        self._sessions.setdefault(v, principal)
                        self._sessions.move_to_end(v)
                        owned = self._owned.setdefault(principal, OrderedDict())
                        owned[v] = self.clock()
                        owned.move_to_end(v)
                        while len(self._sessions) > MAX_BOUND_SESSIONS and len(owned) > 1:
                            # Past the process's bound, the oldest session of the principal adding one
                            # goes: one token's flood never pushes out another's sessions.
                            self._unbind(principal, next(iter(owned)))
            await send(message)

        return bind

    async def _refuse(self, send: Send, problem: CredentialProblem, *, scope: str | None = None) -> None:
        if self.resource is None:
            if problem.code == "insufficient_scope":
                await _json(send, problem.status, {"error": {
                    "code": problem.code, "message": problem.message + "; nothing was run or read",
                    "next_action": "Use a token whose [[server.tokens]] rights include it (docs/security.md, "
                                   "\"Doors and rights\")."}},
                    [(b"www-authenticate", f'Bearer realm="tether", error="insufficient_scope", scope="{scope}"'
                      .encode())])
                return
            await _refuse(send, problem)
            return
        next_action = (f"Get an access token with the scope {scope} from the identity provider named in "
                       f"{self.resource.metadata_url}, or use a token whose rights include it."
                       if problem.code == "insufficient_scope" else
                       "Send exactly one `Authorization: Bearer <token>` header: one of the server's tokens, or an "
                       f"access token for {self.resource.audience} from the identity provider named in "
                       f"{self.resource.metadata_url}.")
        await _json(send, problem.status, {"error": {"code": problem.code, "message": problem.message,
                                                     "next_action": next_action}},
                    [(b"www-authenticate", self.resource.challenge(problem, scope=scope))])


class HealthRoutes:
    """``GET /healthz`` and ``GET /readyz``, answered before authentication.

    ``/healthz`` says only that the process serves HTTP. ``/readyz`` also
    asks the store one cheap question; either way the body holds a status
    and nothing about the deployment (no version, store URL or error text).
    """

    def __init__(self, app: ASGIApp, ready: Callable[[], Awaitable[bool]], *, timeout: float = 2.0) -> None:
        self.app, self.ready, self.timeout = app, ready, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path not in (HEALTH_PATH, READY_PATH):
            await self.app(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _json(send, 405, {"status": "method_not_allowed"}, [(b"allow", b"GET, HEAD")])
            return
        if path == HEALTH_PATH:
            await _json(send, 200, {"status": "ok"})
            return
        try:
            ok = await asyncio.wait_for(self.ready(), self.timeout)
        except Exception:  # the store is down, slow or refusing: not ready, and why stays in the server's log
            ok = False
        await _json(send, 200 if ok else 503, {"status": "ready" if ok else "unavailable"})


async def _json(send: Send, status: int, data: dict, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, problem: CredentialProblem) -> None:
    await _json(send, problem.status, {"error": {
        "code": problem.code,
        "message": problem.message,
        "next_action": "Send exactly one `Authorization: Bearer <token>` header with the token the server was "
                       "started with (TETHER_TOKEN or [server] token).",
    }}, [(b"www-authenticate", b'Bearer realm="tether"')])


def request_scope_value(ctx: Any, key: str) -> Any:
    """What the middleware recorded under ``key`` for this MCP request (an access token's grant or identity)."""
    request = getattr(getattr(ctx, "request_context", None), "request", None)
    return (getattr(request, "scope", None) or {}).get(key)
