"""The web console (``/console/``) and approval links (``/approve/<token>``) of ``tether serve --http``.

Server-rendered pages (Starlette + Jinja2): they work without JavaScript; one
static script swaps in fresh content when the server-sent event feed says a
run changed. Security, in the order a request meets it:

* a request whose ``Host`` is not a name of this server (loopback names on a
  loopback bind, ``public_url``'s host) is refused with 421 before anything
  else, ``--dev`` included: a DNS-rebinding page cannot reach the console;
* form bodies are read only when they say they are a form and only up to
  ``MAX_FORM_BYTES``: an unauthenticated POST cannot make the server buffer
  more than that;
* responses carry a CSP without inline scripts, ``frame-ancestors 'none'``,
  ``Referrer-Policy: no-referrer`` (an approval link is a capability and must
  not leak through a Referer) and ``Cache-Control: no-store``;
* the console needs a session: signing in with one of the server's bearer
  tokens sets an HttpOnly, SameSite=Strict cookie (Secure over TLS) naming the
  token's principal, signed with a key derived from the store's secret;
  signing out records the session as ended in the store, so the cookie opens
  nothing afterwards, in any process sharing the store;
* every form carries a CSRF token bound to the session (or, before there is
  one, to a SameSite=Strict cookie set with the form);
* a principal sees the runs it may act on and decides only the writes its
  rights allow: ``tether._engine.approvals`` answers both, as for every surface. The
  principal that ran a program does not approve its writes unless
  ``self_approval`` says so;
* an approval link shows its write to whoever holds it; deciding on it needs
  a signed-in approver unless ``[server] links = "capability"``;
* every decision is recorded with who made it (the token's name) and through what.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import hmac
import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether._engine.approvals import (
    SIGNED_IN,
    Access,
    Channel,
    Grant,
    kind_of,
    may_decide,
    may_see,
    sees_local,
    shown_as,
    visible_owners,
)
from tether._engine.approvals.capabilities import CONSOLE_SESSION, Keyring
from tether._engine.approvals.doors import Door, admits, door_of_decision
from tether._engine.approvals.service import recorded_decision
from tether._engine.approvals.surface import signed_in_required
from tether._engine.inspect import run_timeline
from tether._server.approvals import Decider, describe_write, input_schema, open_token, pending_writes
from tether._server.auth import LOCAL, allowed_hosts, host_allowed, principal_for_token
from tether._server.pagetext import flash_text, run_summary
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus
from tether._tools.shown import escape as escape_controls
from tether._tools.shown import mask, mask_source, redacted, secret_values
from tether.errors import RunNotFound, TetherError

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._server.admission import Admission
    from tether._store.base import RunRecord, Store

HERE = Path(__file__).parent
# The rights of the person whose signed session cookie this request carries (IdP sign-in): per
# request, so two sessions of one person signed in with different rights never borrow each other's.
_SESSION_GRANT: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("tether_session_grant", default=None)
SESSION_COOKIE = "tether_session"
PRESESSION_COOKIE = "tether_csrf"
# A working day: long enough not to sign people out mid-task, short enough
# that a forgotten browser does not hold decisions open for long.
SESSION_SECONDS = 12 * 3600
# The change feed polls the store (runs may be decided or continued by any
# process sharing it); a fifth of a second keeps a pause on screen well
# within a second without a noticeable load.
FEED_POLL_SECONDS = 0.2
# An event stream ends after this long and the browser reconnects: a server
# shutting down never waits on a forgotten tab for more than this.
STREAM_SECONDS = 300.0
KEEPALIVE_SECONDS = 15.0
MAX_REASON_CHARS = 2000
# The console's forms are a token, a CSRF token, a decision, seqs and a reason
# (MAX_REASON_CHARS, up to 3 bytes a character escaped as 9): 32 KB holds any
# genuine one and bounds what an unauthenticated POST can make the server read.
MAX_FORM_BYTES = 32 * 1024
FORM_TYPE = "application/x-www-form-urlencoded"
RUN_LIST_LIMIT = 200
# The console's filter order: what needs someone first.
STATUSES = (RunStatus.PAUSED, RunStatus.WAITING, RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.COMPLETED,
            RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.ROLLED_BACK)

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


# -- template helpers ------------------------------------------------------------------


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _short(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= 20 else text[:18] + "…"


def _short_name(text: str | None) -> str:
    # A principal's kind and name (D-62): room for both.
    text = text or ""
    return text if len(text) <= 44 else text[:42] + "…"


def _compact(value: Any) -> str:
    # Every call's arguments are shown with their secrets replaced (_tools/shown.py's one rule).
    text = json.dumps(redacted(value), ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:300] + "…"


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def _shown(value: Any) -> Any:
    # Every text a page shows (arguments, logs, results, reasons, errors): control and
    # format characters as escapes, so a bidi override cannot make it read as something else.
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value, keep_lines=True)
    return value


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=select_autoescape(default=True),
                      trim_blocks=False, lstrip_blocks=False, finalize=_shown)
    env.filters.update(when=_when, short=_short, compact=_compact, pretty=_pretty, short_name=_short_name)
    return env


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


# -- the change feed ----------------------------------------------------------------------


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
                self._tick()
            await asyncio.sleep(self.poll_seconds)

    def _tick(self) -> None:
        # Clocks of processes sharing a store differ a little: look back two
        # seconds and drop what was already announced.
        for run in self.store.runs_updated_since(self._since - 2.0, limit=500):
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


# -- the app --------------------------------------------------------------------------


class Console:
    """Builds the Starlette app serving ``/console`` and ``/approve`` over one Runtime."""

    def __init__(self, rt: Runtime, *, tokens: Sequence[str], admission: Admission | None = None,
                 public_url: str | None = None, decider: Decider | None = None,
                 access: Access | None = None, host: str = "127.0.0.1", sign_in: Any = None,
                 dev: bool | None = None) -> None:
        self.rt = rt
        # OpenID Connect sign-in against [auth]'s issuer (_server/signin.py), beside token sign-in.
        self.sign_in = sign_in
        self.tokens = tuple(tokens)
        # Nobody is told apart only without tokens *and* without an identity provider (--dev).
        self.dev = not self.tokens if dev is None else dev
        self.access = access or _default_access(rt, self.tokens)
        self.public_url = public_url
        self.decider = decider or Decider(rt, admission)
        # Sessions, CSRF tokens and the sign-in flow verify under the current secret
        # only: a rotation signs people out, as it always has.
        self._keyring = Keyring(rt.engine.keyring.current)
        self._csrf_keys = self._keyring.derive("console/csrf")
        self._principals = set(self.access.grants) if self.tokens else {LOCAL}
        # People signed in through the IdP: their rights travel in their signed session cookie
        # (any replica reads them, per request); this remembers their names for pages that list them.
        self._people: dict[str, str] = {}
        if sign_in is not None:
            sign_in.bind(self._keyring)
        self.templates = _environment()
        # Who is signed in, by the name their token has in the configuration.
        self.templates.filters["named"] = self._name
        self.feed = RunFeed(rt.store)
        routes = [
            Route("/console", self.home, methods=["GET"]),
            Route("/console/", self.home, methods=["GET"]),
            Route("/console/login", self.login_form, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self.logout, methods=["POST"]),
            Route("/console/oidc/start", self.oidc_start, methods=["GET"]),
            Route("/console/oidc/callback", self.oidc_callback, methods=["GET"]),
            Route("/console/events", self.events, methods=["GET"]),
            Route("/console/runs/{run_id}", self.run_page, methods=["GET"]),
            Route("/console/runs/{run_id}/decide", self.decide, methods=["POST"]),
            Route("/approve/{token}", self.link_page, methods=["GET"]),
            Route("/approve/{token}", self.link_decide, methods=["POST"]),
            Mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]
        # ``host`` is the address the server binds: which Host names reach it (_server/auth.py).
        self.app = SecurityHeaders(Starlette(routes=routes), allowed_hosts(host, public_url))

    async def close(self) -> None:
        self.feed.close()
        await self.decider.close()

    # -- sessions and CSRF ------------------------------------------------------------

    def make_session(self, principal: str, person: Grant | None = None) -> str:
        data: dict[str, Any] = {"p": principal, "n": secrets.token_urlsafe(16), "e": int(time.time() + SESSION_SECONDS)}
        if person is not None:
            data["u"] = {"n": person.name, "r": sorted(person.rights), "a": sorted(person.approves_for)}
        return CONSOLE_SESSION.mint(self._keyring, data)

    def session(self, request: Request) -> dict[str, Any] | None:
        """``{"p": principal, "n": nonce}`` of a valid session cookie, else None."""
        _SESSION_GRANT.set(None)  # whatever this request carries decides, and nothing before it
        value = request.cookies.get(SESSION_COOKIE, "")
        data = CONSOLE_SESSION.open(self._keyring, value)
        # A session outlives neither its time, nor its signing out, nor the token it was opened with.
        if not isinstance(data, dict) or data.get("e", 0) < time.time():
            return None
        if not isinstance(data.get("n"), str) or self.rt.store.signed_out(_session_id(data["n"])):
            return None
        person = data.get("u")
        if isinstance(person, dict) and self.sign_in is not None and isinstance(data.get("p"), str):
            grant = Grant(data["p"], str(person.get("n")), frozenset(person.get("r") or ()),
                          frozenset(person.get("a") or ()))
            _SESSION_GRANT.set(grant)
            self._people[grant.principal] = grant.name
            # The console's door, like every other (P-44): a session whose rights do not open it opens nothing.
            return data if admits(grant, Door.CONSOLE).ok else None
        if data.get("p") not in self._principals:
            return None
        return data if admits(self.grant(data["p"]), Door.CONSOLE).ok else None

    async def form(self, request: Request) -> Any:
        """The request's form, or the Response refusing it: read only if it is a form and small.

        Checked before a byte of the body is read: the declared type, then the
        declared length; the body is then read up to ``MAX_FORM_BYTES`` and no
        further, whatever the length header said.
        """
        from urllib.parse import parse_qsl

        from starlette.datastructures import FormData

        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != FORM_TYPE:
            return Response(f"a form is sent as {FORM_TYPE}; nothing was read or decided", status_code=415,
                            media_type="text/plain")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
            return _too_large()
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return _too_large()
        try:
            fields: list[tuple[str, Any]] = parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                                                      max_num_fields=64)
            return FormData(fields)
        except (UnicodeDecodeError, ValueError):
            return Response("the form could not be read; nothing was decided", status_code=400,
                            media_type="text/plain")

    def csrf_for(self, nonce: str) -> str:
        return self._csrf_keys.sign(nonce.encode())[:40]

    def _presession(self, request: Request) -> tuple[str, bool]:
        """The pre-session CSRF nonce of this browser, and whether it must be set now."""
        nonce = request.cookies.get(PRESESSION_COOKIE)
        if nonce and 16 <= len(nonce) <= 64:
            return nonce, False
        return secrets.token_urlsafe(24), True

    def _csrf_ok(self, nonce: str | None, presented: Any) -> bool:
        if not nonce:
            return False
        return isinstance(presented, str) and hmac.compare_digest(self.csrf_for(nonce), presented)

    def _secure(self, request: Request) -> bool:
        return request.url.scheme == "https" or (self.public_url or "").startswith("https://")

    def _set_cookie(self, response: Response, request: Request, name: str, value: str, *, path: str,
                    max_age: int | None) -> None:
        response.set_cookie(name, value, max_age=max_age, path=path, httponly=True, samesite="strict",
                            secure=self._secure(request))

    # -- rendering ---------------------------------------------------------------------

    def render(self, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(**context)
        return HTMLResponse(html, status_code=code)

    def message(self, heading: str, message: str, *, status: int, tone: str = "bad", detail: str | None = None,
                link: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
        return self.render("message.html", status, heading=heading, message=message, tone=tone, detail=detail,
                           link=link, **context)

    def _login_redirect(self) -> RedirectResponse:
        return RedirectResponse("/console/login", status_code=303)

    # -- sign in and out ---------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        after = _next_page(request.query_params.get("next"))
        if self.session(request) is not None:
            return RedirectResponse(after or "/console/", status_code=303)
        return self._login_page(request, after=after)

    def _login_page(self, request: Request, error: str | None = None, status: int = 200, *,
                    after: str | None = None) -> Response:
        nonce, fresh = self._presession(request)
        response = self.render("login.html", status, csrf=self.csrf_for(nonce), dev=self.dev, error=error,
                               next=after, oidc=self.sign_in is not None, tokens=bool(self.tokens))
        if fresh:
            self._set_cookie(response, request, PRESESSION_COOKIE, nonce, path="/", max_age=None)
        return response

    async def login(self, request: Request) -> Response:
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        after = _next_page(form.get("next"))
        if not self._csrf_ok(request.cookies.get(PRESESSION_COOKIE), form.get("csrf")):
            return self._login_page(request, "The form had expired; sign in again.", status=403, after=after)
        token = form.get("token")
        principal = None
        if self.dev:
            principal = LOCAL
        elif isinstance(token, str) and token:
            presented = token.strip().encode()
            matched = False
            for known in self.tokens:  # compare with every token, always
                if hmac.compare_digest(presented, known.encode()):
                    matched, principal = True, principal_for_token(known)
            if not matched:
                principal = None
        if principal is None or (not self.dev and self.access.grant(principal) is None):
            return self._login_page(request, "That is not a token this server accepts.", status=401, after=after)
        if not admits(self.grant(principal), Door.CONSOLE).ok:
            return self._login_page(request, "That token's rights do not open the console.", status=403,
                                    after=after)
        response = RedirectResponse(after or "/console/", status_code=303)
        self._set_cookie(response, request, SESSION_COOKIE, self.make_session(principal), path="/",
                         max_age=SESSION_SECONDS)
        return response

    async def oidc_start(self, request: Request) -> Response:
        """Off to the identity provider's own sign-in page (authorization code + PKCE)."""
        if self.sign_in is None:
            return self._login_redirect()
        from tether._server.signin import FLOW_COOKIE

        url, flow = await self.sign_in.start(_next_page(request.query_params.get("next")))
        response = RedirectResponse(url, status_code=303)
        # Lax, not Strict: the browser must send it on the IdP's redirect back here.
        response.set_cookie(FLOW_COOKIE, flow, max_age=600, path="/console/oidc/", httponly=True, samesite="lax",
                            secure=self._secure(request))
        return response

    async def oidc_callback(self, request: Request) -> Response:
        if self.sign_in is None:
            return self._login_redirect()
        from tether._server.signin import FLOW_COOKIE, SignInFailed

        flow = self.sign_in.open_flow(request.cookies.get(FLOW_COOKIE))
        try:
            person = await self.sign_in.finish(dict(request.query_params), flow)
        except SignInFailed as exc:
            return self.message("Not signed in", f"Signing in did not complete: {exc}.", status=401,
                                link={"href": "/console/login", "text": "Sign in again"})
        grant = person.grant()
        self._people[grant.principal] = grant.name
        # A 200 page that moves on, not a redirect: the session cookie is SameSite=Strict and this
        # request came from the IdP's site, so the browser must make the next request from here.
        after = (flow.after if flow is not None else None) or "/console/"
        response = self.render("signed_in.html", 200, after=after, who=shown_as(grant.principal, grant.name))
        self._set_cookie(response, request, SESSION_COOKIE, self.make_session(grant.principal, grant), path="/",
                         max_age=SESSION_SECONDS)
        response.delete_cookie(FLOW_COOKIE, path="/console/oidc/")
        return response

    async def logout(self, request: Request) -> Response:
        session = self.session(request)
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        if session is None or not self._csrf_ok(session["n"], form.get("csrf")):
            return self._login_redirect()
        # Deleting the cookie only asks the browser; the store's record ends the session for everyone.
        await self.rt.store.aio.sign_out(_session_id(session["n"]), float(session.get("e", 0)), time.time())
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                               secure=self._secure(request))
        return response

    # -- pages -------------------------------------------------------------------------

    def _visible_runs(self, principal: str, status: str | None) -> list[Any]:
        # Filtered by the store, not after it: another principal's newest runs must not crowd these out.
        grant = self.grant(principal)
        owners = visible_owners(self.access, grant)
        if owners is not None and not owners:
            return []
        runs = self.rt.store.list_runs(status=status or None, limit=RUN_LIST_LIMIT,
                                       principals=None if owners is None else sorted(owners),
                                       local=sees_local(self.access, grant))
        return [r for r in runs if may_see(self.access, grant, r.principal)]

    def grant(self, principal: str) -> Grant | None:
        """The rights of a signed-in principal (None: it has none here, so it sees nothing)."""
        signed_in = _SESSION_GRANT.get()
        if signed_in is not None and signed_in.principal == principal:
            return signed_in
        return self.access.grant(principal)

    def _run_for(self, run_id: str, principal: str) -> RunRecord:
        """A run this principal may see (its own, or one it approves for); RunNotFound otherwise."""
        run = self.rt.store.get_run(run_id) if isinstance(run_id, str) else None
        if run is None or not may_see(self.access, self.grant(principal), run.principal):
            raise RunNotFound(f"no run {run_id!r}")
        return run

    def _shut(self, grant: Grant | None, decision: Any, **context: Any) -> Response | None:
        """The 403 page for a decision whose door ``grant``'s rights do not open (P-44); None when they do."""
        door = admits(grant, door_of_decision(decision)) if isinstance(decision, str) and decision else None
        if door is None or door.ok:
            return None
        return self.message("Nothing decided", f"{_REFUSALS['insufficient_rights']} Nothing was decided and nothing "
                            "was sent.", status=403, detail=door.message, **context)

    def _approve_note(self, run: RunRecord, principal: str) -> str | None:
        """Why this principal cannot approve the run's writes here (the page offers decline only), or None."""
        verdict = may_decide(self.access, self.grant(principal), run.principal, "approve", Channel.CONSOLE)
        return None if verdict.ok else _REFUSALS.get(verdict.code or "", verdict.message)

    def _name(self, principal: str | None) -> str:
        """A principal as people read it: its kind and its name (D-62), so no name reads as another kind's."""
        if principal is None:
            return "anyone"
        grant = self.grant(principal)
        return shown_as(principal, grant.name if grant is not None else self._people.get(principal))

    def _owner_name(self, run: RunRecord) -> str:
        """Who started a run, as a person deciding its writes is shown it (D-42).

        A token the server knows is named by the configuration; ``meta.principal_name`` (the IdP's name for an
        access token, recorded with the run) is not signed, so it names only principals the configuration
        does not.
        """
        owner = run.principal or LOCAL
        grant = self.access.grant(owner)
        if grant is not None:
            return shown_as(owner, grant.name)
        name = (run.meta or {}).get("principal_name")
        # The kind comes from the run's principal, never from the recorded name (D-62).
        return shown_as(owner, str(name)) if name else self._name(owner)

    async def home(self, request: Request) -> Response:
        session = self.session(request)
        if session is None:
            return self._login_redirect()
        status = request.query_params.get("status") or None
        if status not in STATUSES:
            status = None
        runs = self._visible_runs(session["p"], status)
        everything = runs if status is None else self._visible_runs(session["p"], None)
        counts = [(s, n) for s in STATUSES if (n := sum(1 for r in everything if r.status == s))]
        # Principals this one may see runs of: its own, and local ones when [server] local_runs shares them.
        principals = sorted({r.principal or LOCAL for r in everything})
        who = request.query_params.get("principal") or None
        if who in principals:
            runs = [r for r in runs if (r.principal or LOCAL) == who]
        else:
            who = None
        rows = [{"run_id": r.run_id, "status": r.status,
                 "principal": self._owner_name(r),
                 "updated_at": r.updated_at, "summary": run_summary(r.program),
                 "waits": ", ".join(w["address"] for w in pending_writes(self.rt, r)) or None,
                 "error": (r.error or {}).get("code")} for r in runs]
        return self.render("runs.html", principal=session["p"], csrf=self.csrf_for(session["n"]), live="all",
                           runs=rows, status=status, statuses=STATUSES, counts=counts, principals=principals,
                           who=who)

    def _run_context(self, run: RunRecord) -> dict[str, Any]:
        timeline = run_timeline(self.rt.store, run.run_id)
        outcome = run.result if isinstance(run.result, dict) else None
        logs = (outcome or {}).get("logs") or []
        events = [e for e in self.rt.store.get_events(run.run_id, limit=500) if e.type != "output"][-100:]
        calls, secrets = [], set()
        for c in timeline["calls"]:
            schema = input_schema(self.rt, c["address"])
            secrets |= secret_values(c["args"], schema) if isinstance(c["args"], dict) else set()
            calls.append({**c, "args": redacted(c["args"], schema)})
        # A secret a call was given is not shown where the program or its log spelled it out either.
        program = mask(mask_source(run.program), secrets)
        logs = [mask(str(line), secrets) for line in logs]
        return {"run": run, "program": program, "calls": calls, "events": events, "logs": logs,
                "outcome": outcome if run.status in TERMINAL_RUN_STATUSES else None,
                "writes": [describe_write(self.rt, w, run) for w in pending_writes(self.rt, run)],
                "requester": self._requester(run)}

    def _requester(self, run: RunRecord) -> dict[str, Any]:
        """Who asked for a run's writes: the principal's name, the client it came through, what it says it does."""
        meta = run.meta or {}
        client = meta.get("client") if isinstance(meta.get("client"), dict) else None
        return {"name": self._owner_name(run), "kind": kind_of(run.principal),
                "client": " ".join(str(client[k]) for k in ("name", "version") if client.get(k)) if client else None,
                "summary": run_summary(run.program)}

    async def run_page(self, request: Request) -> Response:
        session = self.session(request)
        if session is None:
            return self._login_redirect()
        try:
            run = self._run_for(request.path_params["run_id"], session["p"])
        except RunNotFound:
            return self.message("No such run", "There is no run with that id for you.", status=404,
                                principal=session["p"], csrf=self.csrf_for(session["n"]),
                                link={"href": "/console/", "text": "All runs"})
        flash = request.query_params.get("flash")
        return self.render("run.html", principal=session["p"], csrf=self.csrf_for(session["n"]),
                           live=run.run_id, flash=flash_text(self.rt, run, flash, request.query_params.get("seqs")),
                           flash_error=(flash or "").startswith("e_"),
                           owner_name=self._owner_name(run),
                           approve_note=self._approve_note(run, session["p"]), **self._run_context(run))

    async def decide(self, request: Request) -> Response:
        session = self.session(request)
        if session is None:
            return self._login_redirect()
        run_id = request.path_params["run_id"]
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        csrf = self.csrf_for(session["n"])
        if not self._csrf_ok(session["n"], form.get("csrf")):
            return self.message("Refused", "This form's security token is not valid, so nothing was decided.",
                                status=403, detail="Reload the run's page and decide again.",
                                principal=session["p"], csrf=csrf,
                                link={"href": f"/console/runs/{run_id}", "text": "Back to the run"})
        decision, reason, seqs = _read_decision(form)
        grant = self.grant(session["p"])
        # The door first (P-44): rights that do not open it learn nothing, not even whether the run exists.
        if (shut := self._shut(grant, decision, principal=session["p"], csrf=csrf)) is not None:
            return shut
        try:
            run = self._run_for(run_id, session["p"])  # a run it may not see does not exist for it
        except RunNotFound:
            return self.message("No such run", "There is no run with that id for you; nothing was decided.",
                                status=404, principal=session["p"], csrf=csrf)
        if decision == "undo":
            return await self._undo(request, session, run, reason, csrf)
        if decision is None or seqs is None:
            return self.message("Nothing decided", "The form named no decision or no write.", status=400,
                                principal=session["p"], csrf=csrf,
                                link={"href": f"/console/runs/{run_id}", "text": "Back to the run"})
        verdict = may_decide(self.access, grant, run.principal, decision, Channel.CONSOLE,
                             signed_in_required=signed_in_required(run, seqs))
        if not verdict.ok:
            return self.message("Nothing decided", f"{_REFUSALS.get(verdict.code or '', verdict.message)} "
                                "Nothing was decided and nothing was sent.", status=403,
                                principal=session["p"], csrf=csrf,
                                link={"href": f"/console/runs/{run_id}", "text": "Back to the run"})
        # Authorised above: the decision acts on the run as its owner's, recorded as this person's.
        outcome = await self.decider.decide(run_id, seqs, decision, reason, principal=run.principal,
                                            who=self._name(session["p"]), via="console", origin=_origin(request))
        if not outcome.ok:
            return self.message("Nothing decided", outcome.message or "Nothing was decided.", status=409,
                                principal=session["p"], csrf=csrf,
                                link={"href": f"/console/runs/{run_id}", "text": "Back to the run"})
        flash = ("queued" if outcome.status == "queued" else "approved" if decision == "approve" else
                 "rolling_back" if decision == "decline_and_undo" else "declined")
        shown = ",".join(str(s) for s in seqs)
        return RedirectResponse(f"/console/runs/{run_id}?flash={flash}&seqs={shown}", status_code=303)

    async def _undo(self, request: Request, session: dict[str, Any], run: RunRecord, reason: str | None,
                    csrf: str) -> Response:
        """Undo an ended run's writes (P-46): who may is who may approve (an undo sends writes, D-68)."""
        verdict = may_decide(self.access, self.grant(session["p"]), run.principal, "decline_and_undo",
                             Channel.CONSOLE)
        back = {"href": f"/console/runs/{run.run_id}", "text": "Back to the run"}
        if not verdict.ok or run.status not in TERMINAL_RUN_STATUSES or run.status == RunStatus.ROLLED_BACK:
            why = (_REFUSALS.get(verdict.code or "", verdict.message) if not verdict.ok
                   else f"The run is {run.status}; only an ended run's writes are undone here.")
            return self.message("Nothing undone", f"{why} Nothing was undone and nothing was sent.",
                                status=403 if not verdict.ok else 409, principal=session["p"], csrf=csrf, link=back)
        task = asyncio.ensure_future(self.rt.resume(run.run_id, "undo", reason, principal=run.principal,
                                                    actor=self._name(session["p"]), via="console",
                                                    origin=_origin(request)))
        self.decider.keep(task)
        # The page is drawn once the rollback is recorded (the run running again) or over, never before.
        deadline = asyncio.get_running_loop().time() + self.decider.settle_seconds
        while not task.done() and asyncio.get_running_loop().time() < deadline:
            now = await self.rt.store.aio.get_run(run.run_id)
            if now is None or now.status != run.status:
                break
            await asyncio.wait({task}, timeout=0.02)
        if task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            text = exc.message if isinstance(exc, TetherError) else "The undo could not start."
            return self.message("Nothing undone", f"{text} Nothing was undone.", status=409,
                                principal=session["p"], csrf=csrf, link=back)
        return RedirectResponse(f"/console/runs/{run.run_id}?flash=rolling_back", status_code=303)

    # -- the live feed ----------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        session = self.session(request)
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

    # -- approval links --------------------------------------------------------------------

    def _link_state(self, token: str) -> tuple[Any, Any, Response | None]:
        """(claim, run, None) for a link that may decide now, else (.., .., the page saying why not)."""
        claim = open_token(self.rt.engine.keyring, token)
        if claim is None:
            return None, None, self.message(
                "This approval link is not valid", "The link is incomplete or was altered, so it decides nothing.",
                status=404, detail="Copy the whole link from the message it came in, or ask for a new one.")
        run = self.rt.store.get_run(claim.run_id)
        if run is None:
            return claim, None, self.message("This approval link is not valid",
                                             "The run it names no longer exists; nothing was decided.", status=404)
        decided = recorded_decision(self.rt.engine, run.run_id, claim.seq)
        if decided is not None:
            verb = {"approve": "approved", "decline": "declined", "cancel": "cancelled"}.get(decided.decision,
                                                                                           decided.decision)
            return claim, run, self.message(
                "Already decided", f"This write was already {verb} ({_when(decided.at)}). "
                "An approval link decides once; nothing more was decided.", status=409, tone="info",
                detail=f"The run is {run.status}.")
        expiry = min(claim.expires_at, run.expires_at or claim.expires_at)
        if self.rt.engine.clock() > expiry:
            return claim, run, self.message(
                "This approval link has expired", f"It was good until {_when(expiry)}; nothing was decided "
                "and nothing was sent.", status=410, detail="Approvals wait as long as the approval time to live.")
        if claim.seq not in {w["seq"] for w in pending_writes(self.rt, run)}:
            return claim, run, self.message(
                "Nothing to decide", f"The run is {run.status} and no longer waits on this write; "
                "nothing was decided.", status=409, tone="info")
        return claim, run, None

    def _link_session(self, request: Request) -> dict[str, Any] | None:
        """Who is deciding on a link page: a console session; under --dev nobody is told apart, so `local`."""
        session = self.session(request)
        if session is None and self.dev:
            nonce, _ = self._presession(request)
            return {"p": LOCAL, "n": nonce, "dev": True}
        return session

    def _links(self, claim: Any) -> Access:
        """The rights a link decides under: a link sent through the agent's own client (URL-mode elicitation)
        is never a capability, whatever ``[server] links`` says (D-57)."""
        if claim.in_band and self.access.links != SIGNED_IN:
            return dataclasses.replace(self.access, links=SIGNED_IN)
        return self.access

    def _csrf_nonce(self, request: Request, session: dict[str, Any] | None) -> str | None:
        if session is not None and not session.get("dev"):
            return str(session["n"])
        return request.cookies.get(PRESESSION_COOKIE)

    async def link_page(self, request: Request) -> Response:
        token = request.path_params["token"]
        claim, run, refusal = self._link_state(token)
        if refusal is not None:
            return refusal
        write = next(w for w in pending_writes(self.rt, run) if w["seq"] == claim.seq)
        session = self._link_session(request)
        nonce, fresh = self._presession(request)
        signed = session is not None and not session.get("dev")
        # The page shows the write to whoever holds the link; deciding needs a
        # signed-in approver unless links are capabilities (docs/security.md).
        sign_in = session is None and self._links(claim).links != "capability"
        note = self._approve_note(run, session["p"]) if session is not None else None
        response = self.render("approve.html", run=run, token=token,
                               csrf=self.csrf_for(session["n"] if signed and session else nonce),
                               w=describe_write(self.rt, write, run), sign_in=sign_in, approve_note=note,
                               requester=self._requester(run),
                               principal=session["p"] if signed and session else None,
                               expires_at=min(claim.expires_at, run.expires_at or claim.expires_at))
        if fresh:
            self._set_cookie(response, request, PRESESSION_COOKIE, nonce, path="/", max_age=None)
        return response

    async def link_decide(self, request: Request) -> Response:
        token = request.path_params["token"]
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        session = self._link_session(request)
        # A signed-in approver's rights open this door or not (P-44), before the link is even read;
        # without a session the link itself is the capability (links = "capability") or nothing.
        if session is not None and (shut := self._shut(self.grant(session["p"]), form.get("decision"))):
            return shut
        claim, run, refusal = self._link_state(token)
        if refusal is not None:
            return refusal
        if not self._csrf_ok(self._csrf_nonce(request, session), form.get("csrf")):
            return self.message("Refused", "This form's security token is not valid, so nothing was decided.",
                                status=403, detail="Open the approval link again and decide from that page.")
        decision, reason, seqs = _read_decision(form)
        if decision is None or seqs != [claim.seq]:
            return self.message("Nothing decided", "The form named no decision, or another write than its "
                                "link; nothing was decided.", status=400)
        needs = signed_in_required(run, seqs)
        if session is not None:
            channel, grant, who = Channel.LINK, self.grant(session["p"]), self._name(session["p"])
        else:
            channel, grant, who = Channel.LINK_CAPABILITY, None, CAPABILITY_HOLDER
        verdict = may_decide(self._links(claim), grant, run.principal, decision, channel, signed_in_required=needs)
        if not verdict.ok:
            return self.message("Nothing decided", f"{_REFUSALS.get(verdict.code or '', verdict.message)} "
                                "Nothing was decided and nothing was sent.",
                                status=401 if verdict.code == "sign_in_required" else 403,
                                link={"href": f"/console/login?next=/approve/{token}", "text": "Sign in"}
                                if verdict.code == "sign_in_required" else None)
        # Authorised above: the decision acts on the run as its owner's, recorded as whoever took it.
        outcome = await self.decider.decide(run.run_id, seqs, decision, reason, principal=run.principal,
                                            who=who, via="link", origin=_origin(request))
        if not outcome.ok:
            return self.message("Nothing decided", outcome.message or "Nothing was decided.", status=409)
        verb = "Approved" if decision == "approve" else "Declined"
        now = await self.rt.store.aio.get_run(run.run_id) or run
        # What is true as the page is drawn: sent or not yet, and whether the run went on or paused again.
        text = flash_text(self.rt, now, "approved" if decision == "approve" else "declined", str(claim.seq))
        return self.message(verb, text or verb, status=200, tone="ok",
                            detail="This link has been used and decides nothing more.")


# Who a capability-mode link decision is recorded as: nobody signed in, so no person can be named.
CAPABILITY_HOLDER = "whoever held the approval link (links = capability, not signed in)"
_REFUSALS = {
    "insufficient_rights": "Your rights do not include deciding this (approving needs the approve right).",
    "self_approval": "You started this run: the principal that ran a program does not approve its own writes "
                     "here ([server] self_approval is off). A person with a token that may approve decides it; "
                     "you may decline it.",
    "not_an_approver": "Your token may run programs but not approve writes; you may decline it.",
    "sign_in_required": "Deciding on an approval link needs a signed-in approver: sign in, then decide.",
    "approval_elsewhere": "This tool's policy rule requires a signed-in approver.",
}


def _next_page(value: Any) -> str | None:
    """Where to go after signing in: a console or approval page of this server, never elsewhere."""
    if isinstance(value, str) and value.startswith(("/console/", "/approve/")) and "//" not in value \
            and "\\" not in value and len(value) < 2048:
        return value
    return None


def _default_access(rt: Runtime, tokens: Sequence[str]) -> Access:
    """A console built with tokens alone: each may run and approve, its own runs only, with no self-approval."""
    from types import SimpleNamespace

    from tether._engine.approvals.grants import server_access

    server = SimpleNamespace(local_runs=rt.engine.settings.local_runs)
    return server_access(server, tuple(tokens), {}, principal_for_token, http=True)[0]


def _session_id(nonce: str) -> str:
    # What the store keeps of a signed-out session: a digest, which cannot be turned back into a cookie.
    return hashlib.sha256(f"tether/console-session/{nonce}".encode()).hexdigest()


def _too_large() -> Response:
    return Response(f"a form is at most {MAX_FORM_BYTES} bytes; nothing was read further or decided",
                    status_code=413, media_type="text/plain")


def _read_decision(form: Any) -> tuple[str | None, str | None, list[int] | None]:
    decision = form.get("decision")
    if decision not in ("approve", "decline", "decline_and_undo", "undo"):
        return None, None, None
    reason = form.get("reason")
    reason = reason.strip()[:MAX_REASON_CHARS] if isinstance(reason, str) and reason.strip() else None
    if decision == "undo":  # an ended run's writes, not one write (P-46)
        return decision, reason, []
    raw = form.get("seq")
    if raw == "all":
        # "All" is the writes the page showed, never whatever waits when the
        # form arrives: the run may have moved on to writes nobody here saw (P-28).
        try:
            shown = [int(s) for s in str(form.get("shown") or "").split(",") if s.strip()]
        except ValueError:
            return None, None, None
        return decision, reason, shown or None
    try:
        return decision, reason, [int(str(raw))]
    except ValueError:
        return None, None, None


def _origin(request: Request) -> str | None:
    client = request.client
    return client.host if client is not None else None


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
