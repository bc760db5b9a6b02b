"""The console's read-only pages: the runs a principal may see (``/console/``) and one run
(``/console/runs/{id}``): its program, calls, events, outcome and the writes waiting on someone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from tether._engine.approvals import may_see, sees_local, visible_owners
from tether._engine.inspect import run_timeline
from tether._server.approvals import describe_write, input_schema, pending_writes, refused_decisions
from tether._server.auth import LOCAL
from tether._server.console.sessions import ConsoleSessions
from tether._server.pagetext import flash_text, run_summary
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus
from tether._tools.shown import mask, mask_source, redacted, secret_values
from tether.errors import RunNotFound

if TYPE_CHECKING:
    from tether._store.base import RunRecord

RUN_LIST_LIMIT = 200
# The console's filter order: what needs someone first.
STATUSES = (RunStatus.PAUSED, RunStatus.WAITING, RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.COMPLETED,
            RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.ROLLED_BACK)


class RunPages(ConsoleSessions):
    """``GET /console/`` and ``GET /console/runs/{run_id}``."""

    async def _visible_runs(self, principal: str, status: str | None) -> list[Any]:
        # Filtered by the store, not after it: another principal's newest runs must not crowd these out.
        grant = self.grant(principal)
        owners = visible_owners(self.access, grant)
        if owners is not None and not owners:
            return []
        runs = await self.rt.store.aio.list_runs(status=status or None, limit=RUN_LIST_LIMIT,
                                                 principals=None if owners is None else sorted(owners),
                                                 local=sees_local(self.access, grant))
        return [r for r in runs if may_see(self.access, grant, r.principal)]

    async def home(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self._login_redirect()
        status = request.query_params.get("status") or None
        if status not in STATUSES:
            status = None
        runs = await self._visible_runs(session["p"], status)
        everything = runs if status is None else await self._visible_runs(session["p"], None)
        counts = [(s, n) for s in STATUSES if (n := sum(1 for r in everything if r.status == s))]
        # Principals this one may see runs of: its own, and local ones when [server] local_runs shares them.
        principals = sorted({r.principal or LOCAL for r in everything})
        who = request.query_params.get("principal") or None
        if who in principals:
            runs = [r for r in runs if (r.principal or LOCAL) == who]
        else:
            who = None
        # The writes paused runs wait on are read from the journal: in the store's thread (D-27).
        waits = await self.rt.store.aio.call(lambda: [pending_writes(self.rt, r) for r in runs])
        rows = [{"run_id": r.run_id, "status": r.status,
                 "principal": self._owner_name(r),
                 "updated_at": r.updated_at, "summary": run_summary(r.program),
                 "waits": ", ".join(w["address"] for w in writes) or None,
                 "error": (r.error or {}).get("code")} for r, writes in zip(runs, waits)]
        return self.render("runs.html", principal=session["p"], csrf=self.csrf_for(session["n"]), live="all",
                           runs=rows, status=status, statuses=STATUSES, counts=counts, principals=principals,
                           who=who)

    def _run_reads(self, run: RunRecord, flash: str | None, seqs: str | None) -> tuple[Any, ...]:
        """What the run's page reads from the store, read together in the store's thread (D-27)."""
        return (run_timeline(self.rt.store, run.run_id), self.rt.store.get_events(run.run_id, limit=500),
                pending_writes(self.rt, run), flash_text(self.rt, run, flash, seqs))

    def _run_context(self, run: RunRecord, timeline: dict[str, Any], stored: list[Any],
                     waiting: list[dict[str, Any]]) -> dict[str, Any]:
        outcome = run.result if isinstance(run.result, dict) else None
        logs = (outcome or {}).get("logs") or []
        events = [e for e in stored if e.type != "output"][-100:]
        calls, secrets = [], set()
        for c in timeline["calls"]:
            schema = input_schema(self.rt, c["address"])
            secrets |= secret_values(c["args"], schema) if isinstance(c["args"], dict) else set()
            calls.append({**c, "args": redacted(c["args"], schema)})
        # A secret a call was given is not shown where the program or its log spelled it out either.
        program = mask(mask_source(run.program), secrets)
        logs = [mask(str(line), secrets) for line in logs]
        return {"run": run, "program": program, "calls": calls, "events": events, "logs": logs,
                # Decisions the page answered "queued" for and that were refused when their turn came.
                "refused": refused_decisions(stored),
                "outcome": outcome if run.status in TERMINAL_RUN_STATUSES else None,
                "writes": [describe_write(self.rt, w, run) for w in waiting],
                "requester": self._requester(run)}

    async def run_page(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self._login_redirect()
        try:
            run = await self._run_for(request.path_params["run_id"], session["p"])
        except RunNotFound:
            return self.message("No such run", "There is no run with that id for you.", status=404,
                                principal=session["p"], csrf=self.csrf_for(session["n"]),
                                link={"href": "/console/", "text": "All runs"})
        flash = request.query_params.get("flash")
        timeline, events, waiting, text = await self.rt.store.aio.call(
            self._run_reads, run, flash, request.query_params.get("seqs"))
        if flash == "queued" and refused_decisions(events):
            text = None  # the refusal below says what became of it, not "it waits"
        return self.render("run.html", principal=session["p"], csrf=self.csrf_for(session["n"]),
                           live=run.run_id, flash=text,
                           flash_error=(flash or "").startswith("e_"),
                           owner_name=self._owner_name(run),
                           approve_note=self._approve_note(run, session["p"]),
                           **self._run_context(run, timeline, events, waiting))
