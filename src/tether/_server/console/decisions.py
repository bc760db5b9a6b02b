"""The console's decision form (``POST /console/runs/{id}/decide``): approve, decline, decline and
undo, or undo an ended run's writes, each behind its door (P-44) and the run's rules (``may_decide``).
``_read_decision`` reads the form for approval links too (links.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tether._engine.approvals import Channel, may_decide
from tether._engine.approvals.model import MAX_REASON_CHARS
from tether._engine.approvals.surface import signed_in_required
from tether._server.console.base import _REFUSALS, _origin
from tether._server.console.sessions import ConsoleSessions
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus
from tether.errors import RunNotFound, TetherError

if TYPE_CHECKING:
    from tether._store.base import RunRecord


class Decisions(ConsoleSessions):
    """``POST /console/runs/{run_id}/decide``."""

    async def decide(self, request: Request) -> Response:
        session = await self.session(request)
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
            run = await self._run_for(run_id, session["p"])  # a run it may not see does not exist for it
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
                                detail=f"({outcome.code})" if outcome.code else None, principal=session["p"], csrf=csrf,
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
