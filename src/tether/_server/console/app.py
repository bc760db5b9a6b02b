"""The console itself: ``Console`` joins its groups of routes (one class each, in this package) over
one Runtime and lists every route in one table, behind the host check and security headers (asgi.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tether._engine.approvals import Access
from tether._engine.approvals.capabilities import Keyring
from tether._server.approvals import Decider
from tether._server.auth import LOCAL, allowed_hosts, principal_for_token
from tether._server.console.asgi import SecurityHeaders
from tether._server.console.decisions import Decisions
from tether._server.console.feed import EventFeed, RunFeed
from tether._server.console.links import ApprovalLinks
from tether._server.console.login import SignIn
from tether._server.console.pages import RunPages
from tether._server.console.render import HERE, _environment

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._server.admission import Admission


class Console(SignIn, RunPages, Decisions, ApprovalLinks, EventFeed):
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


def _default_access(rt: Runtime, tokens: Sequence[str]) -> Access:
    """A console built with tokens alone: each may run and approve, its own runs only, with no self-approval."""
    from types import SimpleNamespace

    from tether._engine.approvals.grants import server_access

    server = SimpleNamespace(local_runs=rt.engine.settings.local_runs)
    return server_access(server, tuple(tokens), {}, principal_for_token, http=True)[0]
