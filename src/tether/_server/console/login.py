"""Signing in and out of the console: with a server token, or through the identity provider (OpenID
Connect, ``_server/signin.py``), and out again for every process sharing the store.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tether._engine.approvals import shown_as
from tether._engine.approvals.doors import Door, admits
from tether._server.auth import LOCAL, principal_for_token
from tether._server.console.sessions import (
    PRESESSION_COOKIE,
    SESSION_COOKIE,
    SESSION_SECONDS,
    ConsoleSessions,
    _session_id,
)


class SignIn(ConsoleSessions):
    """``/console/login``, ``/console/logout`` and ``/console/oidc/*``."""

    async def login_form(self, request: Request) -> Response:
        after = _next_page(request.query_params.get("next"))
        if await self.session(request) is not None:
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
        session = await self.session(request)
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


def _next_page(value: Any) -> str | None:
    """Where to go after signing in: a console or approval page of this server, never elsewhere."""
    if isinstance(value, str) and value.startswith(("/console/", "/approve/")) and "//" not in value \
            and "\\" not in value and len(value) < 2048:
        return value
    return None
