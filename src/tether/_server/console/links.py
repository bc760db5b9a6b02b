"""Approval links (``/approve/<token>``): the page showing one write to whoever holds its link, and
deciding it — by a signed-in approver, or by the link alone when ``[server] links = "capability"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tether._engine.approvals import SIGNED_IN, Access, Channel, may_decide
from tether._engine.approvals.service import recorded_decision
from tether._engine.approvals.surface import signed_in_required
from tether._server.approvals import describe_write, open_token, pending_writes, refused_decisions
from tether._server.auth import LOCAL
from tether._server.console.base import _REFUSALS, _origin
from tether._server.console.decisions import _read_decision
from tether._server.console.render import _when
from tether._server.console.sessions import PRESESSION_COOKIE, ConsoleSessions
from tether._server.pagetext import flash_text
from tether._store.states import RunStatus


class ApprovalLinks(ConsoleSessions):
    """``GET`` and ``POST /approve/{token}``."""

    async def _link_state(self, token: str, deciding: bool = False) -> tuple[Any, Any, dict[str, Any] | None,
                                                                            Response | None]:
        """(claim, run, the write it names, None) for a link that may decide now, else (.., .., None, the page
        saying why not).

        ``deciding``: a decision was posted; whether it takes effect, repeats one taken or is refused is the
        approvals service's rule, the same at every door (P-51): only the link itself is checked here.

        The run and its journal are read in the store's thread (D-27): a slow read holds up no other request.
        """
        claim = open_token(self.rt.engine.keyring, token)
        if claim is None:
            return None, None, None, self.message(
                "This approval link is not valid", "The link is incomplete or was altered, so it decides nothing.",
                status=404, detail="Copy the whole link from the message it came in, or ask for a new one.")
        run = await self.rt.store.aio.get_run(claim.run_id)
        if run is None:
            return claim, None, None, self.message("This approval link is not valid",
                                             "The run it names no longer exists; nothing was decided.", status=404)
        decided = None if deciding else await self.rt.store.aio.call(recorded_decision, self.rt.engine,
                                                                      run.run_id, claim.seq)
        lost = None if deciding else await self._lost(run.run_id, claim.seq)
        if lost is not None and ((decided is None and run.status != RunStatus.PAUSED)
                                 or (decided is not None and (decided.at or 0.0) <= lost["at"])):
            # A decision posted here was answered "queued" and refused when its turn came (the run was cancelled
            # or decided elsewhere meanwhile): said first, as the page would have said it at once.
            return claim, run, None, self.message(
                "Your decision was not taken", f"The {lost['decision']} posted from this link ({_when(lost['at'])}) "
                f"waited for a free run slot and was refused when its turn came: [{lost['code']}] {lost['message']}",
                status=409, detail=f"The run is {run.status}.")
        if decided is not None:
            verb = {"approve": "approved", "decline": "declined", "cancel": "cancelled"}.get(decided.decision,
                                                                                           decided.decision)
            return claim, run, None, self.message(
                "Already decided", f"This write was already {verb} ({_when(decided.at)}). "
                "An approval link decides once; nothing more was decided.", status=409, tone="info",
                detail=f"The run is {run.status}.")
        expiry = min(claim.expires_at, run.expires_at or claim.expires_at)
        if self.rt.engine.clock() > expiry:
            return claim, run, None, self.message(
                "This approval link has expired", f"It was good until {_when(expiry)}; nothing was decided "
                "and nothing was sent.", status=410, detail="Approvals wait as long as the approval time to live.")
        if deciding:
            return claim, run, None, None
        write = next((w for w in await self.rt.store.aio.call(pending_writes, self.rt, run) if w["seq"] == claim.seq),
                     None)
        if write is not None and lost is not None:
            # Still waiting on it (the refusal left it so, e.g. its sources could not be loaded): decided again here.
            write = {**write, "lost": f"Your {lost['decision']} was not taken: [{lost['code']}] {lost['message']}"}
        if write is None:
            return claim, run, None, self.message(
                "Nothing to decide", f"The run is {run.status} and no longer waits on this write; "
                "nothing was decided.", status=409, tone="info")
        return claim, run, write, None

    async def _lost(self, run_id: str, seq: int) -> dict[str, Any] | None:
        """The last decision posted through a link on write ``seq`` that was queued and then refused, if any."""
        events = await self.rt.store.aio.get_events(run_id, limit=500)
        refused = refused_decisions(events, seq=seq, via="link")
        return refused[-1] if refused else None

    async def _link_session(self, request: Request) -> dict[str, Any] | None:
        """Who is deciding on a link page: a console session; under --dev nobody is told apart, so `local`."""
        session = await self.session(request)
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
        claim, run, write, refusal = await self._link_state(token)
        if refusal is not None:
            return refusal
        assert write is not None  # _link_state names the write whenever it refuses nothing
        session = await self._link_session(request)
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
        session = await self._link_session(request)
        # A signed-in approver's rights open this door or not (P-44), before the link is even read;
        # without a session the link itself is the capability (links = "capability") or nothing.
        if session is not None and (shut := self._shut(self.grant(session["p"]), form.get("decision"))):
            return shut
        claim, run, _, refusal = await self._link_state(token, deciding=True)
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
            return self.message("Nothing decided", outcome.message or "Nothing was decided.", status=409,
                                detail=f"({outcome.code})" if outcome.code else None)
        if outcome.status == "queued":
            return self.message("Queued", f"Your {decision} waits for a free run slot and is taken when its turn "
                                "comes, unless the run was cancelled or decided elsewhere meanwhile; nothing has been "
                                "sent yet.", status=202, tone="info",
                                detail="Open this link again later: it says whether your decision was taken.")
        verb = "Approved" if decision == "approve" else "Declined"
        now = await self.rt.store.aio.get_run(run.run_id) or run
        # What is true as the page is drawn: sent or not yet, and whether the run went on or paused again.
        text = await self.rt.store.aio.call(flash_text, self.rt, now, "approved" if decision == "approve" else "declined",
                                            str(claim.seq))
        return self.message(verb, text or verb, status=200, tone="ok",
                            detail="This link has been used and decides nothing more.")


# Who a capability-mode link decision is recorded as: nobody signed in, so no person can be named.
CAPABILITY_HOLDER = "whoever held the approval link (links = capability, not signed in)"
