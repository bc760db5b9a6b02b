"""What every console handler shares: the state ``Console`` is built with (app.py), the rights and
names of whoever is asking, and drawing a page or a refusal.

Each group of routes (login.py, pages.py, decisions.py, links.py, feed.py) is a class over this one;
``Console`` joins them. The rights checks all go through ``tether._engine.approvals`` (doors.py,
rights.py), so no handler carries its own copy of a rule.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tether._engine.approvals import Access, Channel, Grant, kind_of, may_decide, may_see, shown_as
from tether._engine.approvals.capabilities import Keyring
from tether._engine.approvals.doors import admits, door_of_decision
from tether._server.auth import LOCAL
from tether._server.pagetext import run_summary
from tether.errors import RunNotFound

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._server.approvals import Decider
    from tether._store.base import RunRecord

# The rights of the person whose signed session cookie this request carries (IdP sign-in): per
# request, so two sessions of one person signed in with different rights never borrow each other's.
_SESSION_GRANT: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("tether_session_grant", default=None)


class ConsoleBase:
    """The console's state (set by ``Console.__init__``) and the helpers every page handler uses."""

    rt: Runtime
    sign_in: Any
    tokens: tuple[str, ...]
    dev: bool
    access: Access
    public_url: str | None
    decider: Decider
    templates: Environment
    _keyring: Keyring
    _csrf_keys: Keyring
    _principals: set[str]
    _people: dict[str, str]

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

    # -- who is asking, and what they may do ------------------------------------------

    def grant(self, principal: str) -> Grant | None:
        """The rights of a signed-in principal (None: it has none here, so it sees nothing)."""
        signed_in = _SESSION_GRANT.get()
        if signed_in is not None and signed_in.principal == principal:
            return signed_in
        return self.access.grant(principal)

    async def _run_for(self, run_id: str, principal: str) -> RunRecord:
        """A run this principal may see (its own, or one it approves for); RunNotFound otherwise."""
        run = await self.rt.store.aio.get_run(run_id) if isinstance(run_id, str) else None
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

    def _requester(self, run: RunRecord) -> dict[str, Any]:
        """Who asked for a run's writes: the principal's name, the client it came through, what it says it does."""
        meta = run.meta or {}
        client = meta.get("client") if isinstance(meta.get("client"), dict) else None
        return {"name": self._owner_name(run), "kind": kind_of(run.principal),
                "client": " ".join(str(client[k]) for k in ("name", "version") if client.get(k)) if client else None,
                "summary": run_summary(run.program)}


_REFUSALS = {
    "insufficient_rights": "Your rights do not include deciding this (approving needs the approve right).",
    "self_approval": "You started this run: the principal that ran a program does not approve its own writes "
                     "here ([server] self_approval is off). A person with a token that may approve decides it; "
                     "you may decline it.",
    "not_an_approver": "Your token may run programs but not approve writes; you may decline it.",
    "sign_in_required": "Deciding on an approval link needs a signed-in approver: sign in, then decide.",
    "approval_elsewhere": "This tool's policy rule requires a signed-in approver.",
}


def _origin(request: Request) -> str | None:
    client = request.client
    return client.host if client is not None else None
