"""Who a request comes from and whether its form may be read: session cookies, CSRF tokens, forms.

Every check of who sent a request and what it sent (a signed session, not signed out, through the
console's door; a form's type and size; its CSRF token) is here, once, for every route.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tether._engine.approvals import Grant
from tether._engine.approvals.capabilities import CONSOLE_SESSION
from tether._engine.approvals.doors import Door, admits
from tether._server.console.base import _SESSION_GRANT, ConsoleBase

SESSION_COOKIE = "tether_session"
PRESESSION_COOKIE = "tether_csrf"
# A working day: long enough not to sign people out mid-task, short enough
# that a forgotten browser does not hold decisions open for long.
SESSION_SECONDS = 12 * 3600

# The console's forms are a token, a CSRF token, a decision, seqs and a reason
# (MAX_REASON_CHARS, up to 3 bytes a character escaped as 9): 32 KB holds any
# genuine one and bounds what an unauthenticated POST can make the server read.
MAX_FORM_BYTES = 32 * 1024
FORM_TYPE = "application/x-www-form-urlencoded"


class ConsoleSessions(ConsoleBase):
    """Session cookies, CSRF tokens and form bodies, for every console route."""

    def make_session(self, principal: str, person: Grant | None = None) -> str:
        data: dict[str, Any] = {"p": principal, "n": secrets.token_urlsafe(16), "e": int(time.time() + SESSION_SECONDS)}
        if person is not None:
            data["u"] = {"n": person.name, "r": sorted(person.rights), "a": sorted(person.approves_for)}
        return CONSOLE_SESSION.mint(self._keyring, data)

    async def session(self, request: Request) -> dict[str, Any] | None:
        """``{"p": principal, "n": nonce}`` of a valid session cookie, else None."""
        _SESSION_GRANT.set(None)  # whatever this request carries decides, and nothing before it
        value = request.cookies.get(SESSION_COOKIE, "")
        data = CONSOLE_SESSION.open(self._keyring, value)
        # A session outlives neither its time, nor its signing out, nor the token it was opened with.
        if not isinstance(data, dict) or data.get("e", 0) < time.time():
            return None
        if not isinstance(data.get("n"), str) or await self.rt.store.aio.signed_out(_session_id(data["n"])):
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


def _session_id(nonce: str) -> str:
    # What the store keeps of a signed-out session: a digest, which cannot be turned back into a cookie.
    return hashlib.sha256(f"tether/console-session/{nonce}".encode()).hexdigest()


def _too_large() -> Response:
    return Response(f"a form is at most {MAX_FORM_BYTES} bytes; nothing was read further or decided",
                    status_code=413, media_type="text/plain")
