"""tether as an MCP server: two tools, ``execute`` and ``resume``.

    client ──tools/call execute {code}──> admission ──> Runtime.begin ──> handle.result()
                                             │ (slot held only while a program runs)
           <── text + structuredContent ──────┘  completed | failed | cancelled | paused

A write that needs approval becomes, depending on what the client can do:

* a form put to the user inside the same tool call, when the client declares
  form elicitation: on 2025-11-25 (legacy) a server→client ``elicitation/create``
  sent from ``on_approval`` while the write waits; on 2026-07-28 (modern) an
  ``InputRequiredResult`` whose request state names the paused run, so whichever
  process receives the client's answer continues that run;
* otherwise a paused result telling the model what to ask the user and how to
  call ``resume``.

docs/mcp.md is the user-facing account of this surface and the reasons for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable, Literal, Mapping

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import (
    CallToolResult,
    ElicitResult,
    InputRequiredResult,
    ToolAnnotations,
)
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticUndefined

from tether._engine.approvals import Access, Channel, Grant, may_decide, shown_as
from tether._engine.approvals.rights import APPROVE, RUN
from tether._engine.approvals.surface import refusal, signed_in_required, where_to_approve
from tether._engine.attempt.handle import RunHandle
from tether._engine.attempt.result import RunResult
from tether._engine.rollback import runner as rollback
from tether._engine.rules.run_keys import MAX_RUN_KEY_CHARS
from tether._server import channels, keyed, urlmode
from tether._server.admission import Admission
from tether._server.auth import GRANT_KEY, IDENTITY_KEY, LOCAL, request_scope_value
from tether._server.channels import APPROVAL_KEY, ApprovalForm
from tether._server.results import (
    approval_message,
    error_result,
    observation_result,
    run_result,
)
from tether._server.tasks import TasksExtension
from tether._sources.mcp import _VERSION as TETHER_VERSION
from tether._store.states import RunStatus
from tether.errors import InvalidArguments, Overloaded, RunNotFound, TetherError

if TYPE_CHECKING:
    from tether._engine.rules.policy import Policy
    from tether._runtime import Runtime
    from tether._store.base import RunRecord

SERVER_NAME = "tether"
# The first protocol revision without server→client requests mid-call.
MODERN = "2026-07-28"
# Argument values quoted to the user are cut here: a form is read, not scrolled.

INLINE, INPUT_REQUIRED = "inline", "input_required"


# -- wire shapes -------------------------------------------------------------------


class RunEnvelope(BaseModel):
    """The output schema of ``execute`` and ``resume``: a run's result envelope."""

    status: str = Field(description="completed | failed | paused | cancelled")
    run_id: str | None = None
    result: Any = None
    logs: list[str] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    calls: int = 0
    diagnostics: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None
    expires_at: float | None = None
    instructions: str | None = None
    notes: list[str] | None = None


# What the model reads about a run key, in execute's and cell_start's input schema (P-36).
KEY_DESCRIPTION = (
    "Idempotency key for this request: a new unique value (e.g. a UUID) per program you mean to run once. "
    "If the reply is lost (timeout, disconnect, error before a result), call again with the same key and "
    "the same code: you get the run it started (its result, its pause, or its progress), never a second run. "
    "The same key with different code is refused (idempotency_conflict)."
)

# Each tool's arguments, as one model: its input schema (advertised, descriptions included) and what a
# call is checked against before it runs (a named invalid_arguments error instead of the SDK's dump).


class ExecuteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(description="The Python program. Its last expression is the result.")
    diagnostics: bool = Field(default=False, description="Include per-call timings in the result.")
    session: str | None = Field(default=None, min_length=1, max_length=128,
                                description="Keep globals across executes under this name.")
    key: str | None = Field(default=None, min_length=1, max_length=MAX_RUN_KEY_CHARS, description=KEY_DESCRIPTION)


class CellStartArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(description="The Python program.")
    yield_after_ms: int = Field(default=1000, ge=0, le=600_000,
                                description="Return an observation after this long at most.")
    key: str | None = Field(default=None, min_length=1, max_length=MAX_RUN_KEY_CHARS, description=KEY_DESCRIPTION)


class CellWaitArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cell_id: str = Field(description="The cell_id from cell_start.")
    after: int = Field(default=0, ge=0, description="The cursor of the last observation.")
    timeout_ms: int = Field(default=30_000, ge=0, le=600_000, description="Wait at most this long.")


class CellTerminateArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cell_id: str = Field(description="The cell_id from cell_start.")


class ResumeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(description="The run_id of the paused result.")
    decision: Literal["approve", "decline", "cancel", "decline_and_undo"] = Field(
        description="What to do with the write; decline_and_undo also undoes the run's applied writes (P-46).")
    reason: str | None = Field(default=None, description="Why; told to the program when declining.")
    seq: int | list[int] | None = Field(
        default=None, description="The seq of the write this decision is for (from pending.writes), or a list of "
                                  "them. Required once the run has asked about more than one write.")

CELL_START_DESCRIPTION = (
    "Start a long program as a cell and get an observation as soon as it yields (await yield_control()), "
    "ends, pauses, or yield_after_ms passes; the program keeps running. emit(value) in the program adds "
    "output events. Returns {status, cell_id, cursor, events, result?, error?}; follow it with cell_wait."
)
CELL_WAIT_DESCRIPTION = (
    "Wait for a cell's events after a cursor (from cell_start or a previous cell_wait). Returns as soon "
    "as there are any, stopping at a yield, pause or end, or after timeout_ms with what came."
)
CELL_TERMINATE_DESCRIPTION = "Stop a cell: nothing further is sent; a write already on the wire finishes."

RESUME_DESCRIPTION = (
    "Decide writes a paused run waits on, then continue the run. A pause lists its writes in "
    "pending.writes (several when the program issued them together); seq names the write, or a list of "
    "writes, this decision is for. decision: 'approve' sends it; 'decline' does not send it and the "
    "program gets a PermissionError (with your reason) and goes on; 'cancel' stops the run. Decide the "
    "writes of a pause in one call or several (e.g. approve some, decline others); the run continues once "
    "all are decided. Returns the run's next result, which may pause again."
)
INSTRUCTIONS = (
    "Call execute with one Python program that uses the tools listed in its description. "
    "A write may pause the run: its result says what to ask the user and how to call resume."
)


# -- the server ----------------------------------------------------------------------


class TetherServer:
    """The MCP surface over one Runtime. ``.mcp`` is the SDK server to run or connect to."""

    def __init__(
        self,
        rt: Runtime,
        *,
        admission: Admission | None = None,
        principal_of: Callable[[Context], str] | None = None,
        run_meta: Mapping[str, Any] | None = None,
        name: str = SERVER_NAME,
        approvals: str = "auto",
        public_url: str | None = None,
        url_wait_seconds: float | None = None,
        access: Access | None = None,
        console: bool = False,
        task_after_seconds: float = 5.0,
        form_wait_seconds: float = 600.0,
    ) -> None:
        self.rt = rt
        # [server] form_wait_seconds: how long an approval form asked inside the call may stay open (D-88).
        self.form_wait_seconds = form_wait_seconds
        # MCP Tasks (P-47): a call from a client declaring the extension whose run has not ended by then
        # is answered with a task.
        self.task_after_seconds = task_after_seconds
        # Whether people reach a console on this server (HTTP): where approvals are sent.
        self.console = console
        # Who may decide what (tether._engine.approvals): `tether serve` passes the
        # server's; without one, nobody is told apart (standard input/output).
        self.access = access or Access.open(local_runs=rt.engine.settings.local_runs)
        # [server] approvals: how a paused write is put to the client's user (see urlmode).
        self.approvals = approvals
        self.public_url = public_url
        self.url_wait_seconds = urlmode.URL_WAIT_SECONDS if url_wait_seconds is None else url_wait_seconds
        self.admission = admission or Admission(rt.engine.pool.max_workers, queue_depth=16, queue_timeout=10.0)
        self.principal_of = principal_of or (lambda ctx: LOCAL)
        self.run_meta = dict(run_meta or {})
        self._background: set[asyncio.Future[Any]] = set()
        self._tasked: set[asyncio.Future[Any]] = set()
        # One key for the SDK's sealing of request state and one for tether's
        # own signature inside it, both derived from the store's secret: every
        # process sharing the store can open and verify what another minted.
        # The current secret's keys seal and sign; a rotated keyring's older
        # ones still open and verify state minted before the rotation.
        self._state_macs = rt.engine.keyring.derive("mcp/request-state/mac")
        seal_keys = list(rt.engine.keyring.derive("mcp/request-state/seal").keys)
        security = RequestStateSecurity(
            keys=seal_keys,
            # A paused run waits this long for its decision; the answer to the
            # form is good for as long as the run is.
            ttl=float(rt.engine.settings.approval_ttl_seconds),
            # tether binds the principal into its own signature, and reports a
            # mismatch as run_not_found like every other foreign run.
            bind_principal=None,
            audience=name,
        )
        tasks = TasksExtension(self, lambda request, params: Context(request_context=request, mcp_server=self.mcp,
                                                                     input_params=params))
        # serverInfo.version: what a host shows of the server it talks to, and what a bug report names.
        self.mcp: MCPServer = MCPServer(name, version=TETHER_VERSION, instructions=INSTRUCTIONS, log_level="WARNING",
                                        request_state_security=security, extensions=[tasks])
        self.mcp.middleware.append(_check_arguments)
        for tool in TOOLS:
            self.mcp.add_tool(tool.function(self), name=tool.name, title=tool.title,
                              description=tool.description(rt), annotations=tool.annotations(rt.policy))

    async def close(self) -> None:
        """Wait for cancellations handed to the background to finish."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- tools ---------------------------------------------------------------------

    async def execute(self, ctx: Context, args: ExecuteArguments) -> CallToolResult | InputRequiredResult:
        code, diagnostics, session, key = args.code, args.diagnostics, args.session, args.key
        principal = self.principal_of(ctx)
        if ctx.request_state is not None:
            return await self._answer(ctx, principal, diagnostics)
        era, how = self._how(ctx)
        asks = era if how == "form" else None
        approver = self._approver(ctx) if asks == INLINE else None
        asker = self._asker(ctx) if _elicitation(ctx) == INLINE else None
        meta = self._meta_for(ctx)

        def begin(progress: Any) -> Any:
            return self.rt.begin(code, on_approval=approver, principal=principal, meta=meta,
                                 on_progress=progress, session=session, on_question=asker, key=key)

        try:
            try:
                result = await self.run_in_slot(begin, ctx, principal)
            except Overloaded as exc:
                # A retry of a request whose run has stopped running needs no slot to be answered;
                # any other is told whether a run was started for it, and which (P-36).
                if key is None or not await keyed.settled(self.rt, principal, key):
                    return await keyed.overloaded(self.rt, exc, principal, key)
                result = await (await begin(None)).result()
            if how == "url" and era == INLINE:
                result = await urlmode.legacy(self, ctx, result, principal)
        except TetherError as exc:
            return error_result(exc)
        return await self._respond(keyed.cancelled(result, key), era if how else None, principal, diagnostics, how=how)

    def _meta_for(self, ctx: Context) -> dict[str, Any]:
        meta = dict(self.run_meta)
        identity = request_scope_value(ctx, IDENTITY_KEY)
        if identity is not None:
            # Who the access token names, as the IdP put it: shown by runs show, the console and the timeline.
            meta["principal_name"] = identity.shown
        client = _client_of(ctx)
        if client is not None:
            # Which agent asked, as it named itself: shown to the people who approve its writes.
            meta["client"] = client
        return meta

    async def resume(self, ctx: Context, args: ResumeArguments) -> CallToolResult:
        run_id, decision, reason, seq = args.run_id, args.decision, args.reason, args.seq
        principal = self.principal_of(ctx)
        era, how = self._how(ctx)
        # A resumed run may pause at a later write: a legacy client gets that
        # one as a form or link too. (A modern one gets the paused result
        # from resume; input-required rounds belong to execute's own call.)
        approver = self._approver(ctx) if era == INLINE and how == "form" else None
        if decision in ("approve", "decline_and_undo"):
            # resume is the agent's own call: an approve through it is taken only
            # when the configuration lets a principal approve its own writes; so is
            # an undo, which sends writes of its own (P-46).
            try:
                # An undo's own tools count too: one kept for signed-in approvers is not sent on the agent's word.
                undo = (decision == "decline_and_undo"
                        and await rollback.needs_signed_in(self.rt.engine, await self._run_of(run_id, principal)))
                refused = await self._refused(run_id, principal, Channel.RESUME,
                                        seq if isinstance(seq, list) else None if seq is None else [seq], ctx=ctx,
                                        signed_in=undo)
            except TetherError as exc:
                return error_result(exc)
            if refused is not None:
                return error_result(refused, run_id=run_id)

        def decide(progress: Any) -> Any:
            if isinstance(seq, list):
                return self.rt.decide(run_id, {s: (decision, reason) for s in seq}, principal=principal,
                                      actor=_actor(ctx, principal), via="mcp", on_approval=approver, on_progress=progress)
            return self.rt.resume(run_id, decision, reason, seq=seq, principal=principal, actor=_actor(ctx, principal),
                                  via="mcp", on_approval=approver, on_progress=progress)

        try:
            result = await self.run_in_slot(decide, ctx, principal, run_id=run_id)
            if how == "url" and era == INLINE:
                result = await urlmode.legacy(self, ctx, result, principal)
        except TetherError as exc:
            return error_result(exc)
        return await self.paused_result(result, diagnostics=False)

    # -- cells -----------------------------------------------------------------------

    async def cell_start(self, ctx: Context, args: CellStartArguments) -> CallToolResult:
        code, yield_after_ms, key = args.code, args.yield_after_ms, args.key
        principal = self.principal_of(ctx)
        try:
            # A running cell holds a sandbox worker: it takes a run slot until it ends or parks.
            try:
                slot = await self.admission.acquire(principal)
            except Overloaded as exc:
                return await keyed.overloaded(self.rt, exc, principal, key)
            try:
                obs = await self.rt.start_cell(code, yield_after_ms=yield_after_ms, principal=principal,
                                               meta=dict(self.run_meta), key=key)
            except BaseException:
                slot.release()
                raise
            handle = self.rt.running(obs["cell_id"])
            if handle is None:
                slot.release()
            else:
                handle.add_done_callback(lambda _h: slot.release())
        except TetherError as exc:
            return error_result(exc)
        return await self.observation(obs)

    async def cell_wait(self, ctx: Context, args: CellWaitArguments) -> CallToolResult:
        try:
            obs = await self.rt.wait_cell(args.cell_id, after=args.after, timeout_ms=args.timeout_ms,
                                          principal=self.principal_of(ctx))
        except TetherError as exc:
            return error_result(exc)
        return await self.observation(obs)

    async def cell_terminate(self, ctx: Context, args: CellTerminateArguments) -> CallToolResult:
        try:
            obs = await self.rt.terminate_cell(args.cell_id, principal=self.principal_of(ctx))
        except TetherError as exc:
            return error_result(exc)
        return await self.observation(obs)

    # -- tasks (tasks.py, P-47) ----------------------------------------------------------

    async def start_run(self, ctx: Context, arguments: Mapping[str, Any], principal: str,
                        started: Callable[[str], None]) -> RunResult | CallToolResult:
        """execute's run for a client that declared MCP Tasks: nobody is asked inline; ``started(run_id)``."""
        args = ExecuteArguments.model_validate(arguments)
        meta = self._meta_for(ctx)

        async def begin(progress: Any) -> RunHandle:
            handle = await self.rt.begin(args.code, principal=principal, meta=meta, on_progress=progress,
                                         session=args.session, key=args.key)
            started(handle.run_id)
            return handle

        try:
            try:
                result = await self.run_in_slot(begin, ctx, principal)
            except Overloaded as exc:
                if args.key is None or not await keyed.settled(self.rt, principal, args.key):
                    return await keyed.overloaded(self.rt, exc, principal, args.key)
                result = await (await begin(None)).result()
        except TetherError as exc:
            return error_result(exc)
        return keyed.cancelled(result, args.key)

    async def continue_run(self, ctx: Context, principal: str, run_id: str,
                           decide: Callable[[Any], Any]) -> RunResult | None:
        """A decision taken through a task, continuing its run in the background; its outcome is the run's."""
        with contextlib.suppress(TetherError):
            return await self.run_in_slot(decide, ctx, principal, run_id=run_id)
        return None

    def keep(self, task: asyncio.Future[Any]) -> None:
        # Not awaited by close(): a run handed over as a task is stopped with the runtime, and its lease
        # lapses for another process to take it over (P-16), as for any run this process was running.
        self._tasked.add(task)
        task.add_done_callback(self._tasked.discard)

    def channel_of(self, ctx: Context) -> str | None:
        return self._how(ctx)[1]

    async def approval_refused(self, run_id: str, principal: str, channel: str, seqs: list[int],
                               ctx: Context) -> TetherError | None:
        return await self._refused(run_id, principal, channel, seqs, ctx=ctx)

    def actor_of(self, ctx: Context, principal: str) -> str:
        return _actor(ctx, principal)

    def where(self, run_id: str) -> str:
        return self._where(run_id)

    # -- running -------------------------------------------------------------------

    async def run_in_slot(self, start: Callable[[Any], Any], ctx: Context, principal: str, *,
                   run_id: str | None = None) -> RunResult:
        """Run ``start(on_progress)`` in a slot; a cancelled request cancels its run.

        ``start`` returns the run's handle (a new run: its id is known once it
        starts) or, continuing ``run_id``, its result.
        """
        # Slots are shared out by principal (D-74): one caller's load cannot keep another's run waiting.
        slot = await self.admission.acquire(principal)
        # Only for a client that asked: otherwise every host call would wake a task to send what the SDK drops.
        progress = _Progress(ctx) if _asked_progress(ctx) else None
        started = False
        current = run_id

        async def begin() -> RunResult:
            nonlocal started, current
            started = True
            out = await start(progress)
            if isinstance(out, RunHandle):
                current = out.run_id
                return await out.result()
            return out

        # The runtime call gets its own task so that a cancelled request does
        # not tear the run apart mid-step: the run is stopped through the
        # runtime, journaled as cancelled, and the slot is freed when it ends.
        task = asyncio.ensure_future(begin())
        task.add_done_callback(lambda _t: slot.release())
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if progress is not None:
                progress.stop()
            if not started or current is None:
                task.cancel()  # nothing started, or nothing left to stop
            else:
                self._spawn(self._cancel(current, principal, task))
            raise
        except BaseException:
            if progress is not None:
                progress.stop()
            raise
        if progress is not None:
            await progress.flush()
        return result

    async def _cancel(self, run_id: str, principal: str, task: asyncio.Future) -> None:
        with contextlib.suppress(Exception):
            await self.rt.cancel(run_id, "the MCP client cancelled the request; nothing further was sent",
                                 principal=principal)
        with contextlib.suppress(BaseException):
            await task

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _respond(self, result: RunResult, asks: str | None, principal: str, diagnostics: bool, *,
                       how: str | None = "form") -> Any:
        if result.status == RunStatus.PAUSED and asks == INPUT_REQUIRED and result.pending:
            if how == "url":
                return await urlmode.input_required(self, result, principal)
            if not await self._needs_sign_in(result, first_only=True):
                return self._input_required(result, principal)
        return await self.paused_result(result, diagnostics=diagnostics)

    def _grant(self, principal: str) -> Grant:
        # Behind BearerAuth every principal has a grant; a server built without
        # an Access (an embedding, a test) treats each caller as one that runs programs.
        return self.access.grant(principal) or Grant(principal, principal, frozenset({RUN, APPROVE}))

    async def _run_of(self, run_id: str, principal: str) -> RunRecord:
        """``engine.get_run`` read off the event loop (D-27): on Postgres a slow read holds up no other request."""
        return await self.rt.store.aio.call(self.rt.engine.get_run, run_id, principal)

    async def _refused(self, run_id: str, principal: str, channel: str, seqs: list[int] | None, *,
                       ctx: Context | None = None, signed_in: bool = False) -> TetherError | None:
        """Why ``principal`` may not approve writes ``seqs`` of the run through ``channel``; None when it may.

        ``signed_in``: what is asked for needs a signed-in approver whatever the writes' rules say (an undo
        whose tool's rule does, D-68)."""
        run = await self._run_of(run_id, principal)
        # An access token's rights are its own (they come with each request); a static token's are configured.
        grant = request_scope_value(ctx, GRANT_KEY) if ctx is not None else None
        verdict = may_decide(self.access, grant or self._grant(principal), run.principal, "approve", channel,
                             signed_in_required=signed_in or signed_in_required(run, seqs))
        return None if verdict.ok else refusal(verdict, run_id, self.public_url,
                                               paused=run.status == RunStatus.PAUSED, console=self.console)

    async def _needs_sign_in(self, result: RunResult, *, first_only: bool = False) -> bool:
        run = await self.rt.store.aio.get_run(result.run_id) if result.run_id else None
        if run is None:
            return False
        seqs = [_first_undecided(result.pending or {}).get("seq")] if first_only else None
        return signed_in_required(run, [s for s in seqs if isinstance(s, int)] if seqs is not None else None)

    async def observation(self, obs: dict[str, Any]) -> CallToolResult:
        """A cell's observation for the model: a paused one says how to decide it, with no key or link (D-32)."""
        if obs.get("status") != "paused":
            return observation_result(obs)
        here = await self._approves_here(obs["cell_id"])
        return observation_result(obs, approve_here=here, elsewhere=None if here else self._where(obs["cell_id"]))

    async def paused_result(self, result: RunResult, *, diagnostics: bool) -> CallToolResult:
        """A run's result for the model: a paused one says how to decide it, and carries no approval link (D-32)."""
        if result.status != RunStatus.PAUSED:
            return run_result(result, diagnostics=diagnostics)
        here = await self._approves_here(result.run_id)
        return run_result(result, diagnostics=diagnostics, approve_here=here,
                          elsewhere=None if here else self._where(result.run_id))

    async def _approves_here(self, run_id: str) -> bool:
        """Whether the run's own principal may approve its waiting writes through resume (what to tell the model)."""
        run = await self.rt.store.aio.get_run(run_id)
        if run is None:
            return False
        owner = run.principal or LOCAL
        return may_decide(self.access, self._grant(owner), owner, "approve", Channel.RESUME,
                          signed_in_required=signed_in_required(run)).ok

    def _where(self, run_id: str) -> str:
        return where_to_approve(self.public_url, run_id, console=self.console)

    def _how(self, ctx: Context) -> tuple[str | None, str | None]:
        """(era, "form" | "url" | None): how this client's user can be asked about a paused write."""
        caps = ctx.client_capabilities
        elicitation = caps.elicitation if caps is not None else None
        version = ctx.protocol_version
        era: str | None
        if version is not None and is_version_at_least(version, MODERN):
            era = INPUT_REQUIRED
        else:
            era = INLINE if getattr(ctx.session, "can_send_request", True) else None
        url = elicitation is not None and elicitation.url is not None and bool(self.public_url)
        if era is not None and url and self.approvals in ("url", "auto"):
            return era, "url"
        if self.approvals == "url":
            return era, None  # never a form: the paused result names the link
        return (era, "form") if _elicitation(ctx) is not None else (era, None)

    # -- approval: legacy (inline) ---------------------------------------------------

    def approval_message_for(self, pending: Mapping[str, Any]) -> str:
        description, schema = pending.get("description"), None
        if pending.get("address") in self.rt.catalog:
            tool = self.rt.catalog.get(pending["address"])
            description, schema = description if description is not None else tool.description, tool.input_schema
        return approval_message(pending, description, schema)

    def _approver(self, ctx: Context) -> Callable[[dict], Any]:
        return channels.inline_form(self, ctx, self.principal_of(ctx))

    def _asker(self, ctx: Context) -> Callable[[dict], Any]:
        """Put an upstream tool's question to this client's user, as the upstream's own form (2025 era)."""

        async def ask(question: dict) -> dict:
            if question.get("mode") != "form" or not question.get("schema"):
                return {"action": "decline"}
            message = f"{question['address']} asks: {question['message']}"
            reply = await ctx.request_context.session.elicit_form(message, question["schema"],
                                                                  related_request_id=ctx.request_id)
            return {"action": reply.action, "content": reply.content}

        return ask

    # -- approval: modern (input required) -----------------------------------------

    def _input_required(self, result: RunResult, principal: str) -> InputRequiredResult:
        return channels.input_required_form(self, result, principal)

    async def _answer(self, ctx: Context, principal: str, diagnostics: bool) -> Any:
        """The client's answer to a form: decide the named run's write and continue it."""
        try:
            run_id, seq = self._open_state(ctx.request_state or "", principal)
            reply = (ctx.input_responses or {}).get(APPROVAL_KEY)
            if json.loads(ctx.request_state or "{}").get("m") == "url" and reply is not None:
                result = await urlmode.answer(self, ctx, run_id, seq, reply, principal)
                if await urlmode.still_waits_on(self, result, seq):
                    # Nobody decided on the page within the wait (or the link was dismissed):
                    # the paused envelope (run id, where a person approves, how to resume), not the
                    # same link again, which would loop until the client's round limit and lose the
                    # run id. It carries no link: the model reads it (D-32).
                    return await self.paused_result(result, diagnostics=diagnostics)
                return await self._respond(result, INPUT_REQUIRED, principal, diagnostics, how="url")
            if reply is None:
                # A retry without an answer: ask again if the run still waits on it.
                run = await self._run_of(run_id, principal)
                paused = run.result if run.status == RunStatus.PAUSED else None
                if paused and _first_undecided(RunResult.from_dict(paused).pending or {}).get("seq") == seq:
                    return self._input_required(RunResult.from_dict(paused), principal)
                return await self.paused_result(self.rt.engine.recorded(run), diagnostics=diagnostics)
            decision, reason = _decision(reply)
            if decision == "approve":
                refused = await self._refused(run_id, principal, Channel.FORM, [seq], ctx=ctx)
                if refused is not None:
                    return error_result(refused, run_id=run_id)
            if decision is None:
                # Dismissed without a choice: nothing is decided and the run
                # stays paused; the model can ask in words and call resume.
                return await self.paused_result(self.rt.engine.recorded(await self._run_of(run_id, principal)),
                                                diagnostics=diagnostics)
            try:
                result = await self.run_in_slot(
                    lambda progress: self.rt.resume(run_id, decision, reason, seq=seq, principal=principal,
                                                    actor=_actor(ctx, principal), via="mcp", on_progress=progress),
                    ctx, principal, run_id=run_id)
            except Overloaded as exc:
                # The answer cannot be acted on now, and the model never saw
                # this run: name it, so the decision is not lost with the form.
                call = json.dumps({"run_id": run_id, "seq": seq, "decision": decision, "reason": reason})
                exc.next_action = (f"Nothing was decided and run {run_id} is still paused. After retry_after_ms, "
                                   f"call the resume tool with {call}.")
                return error_result(exc, run_id=run_id)
        except TetherError as exc:
            return error_result(exc)
        return await self._respond(result, INPUT_REQUIRED, principal, diagnostics)

    def sign_state(self, run_id: str, seq: int, principal: str, *, mode: str | None = None) -> str:
        body: dict[str, Any] = {"v": 1, "run_id": run_id, "seq": seq}
        if mode is not None:
            body["m"] = mode  # the request is sealed by the SDK: a client cannot change it
        return json.dumps({**body, "mac": self._state_macs.sign(self._signed_state(run_id, seq, principal))}, separators=(",", ":"))

    def _open_state(self, state: str, principal: str) -> tuple[str, int]:
        try:
            data = json.loads(state)
            run_id, seq, mac = data["run_id"], data["seq"], data["mac"]
            valid = (data.get("v") == 1 and isinstance(run_id, str) and type(seq) is int and isinstance(mac, str)
                     and self._state_macs.verifies(self._signed_state(run_id, seq, principal), mac))
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            # Forged, or minted for another principal: that run does not exist for this caller.
            raise RunNotFound("the request state names no run of yours; start the program again",
                              next_action="Call execute again; the answered form belonged to another run.")
        return run_id, seq

    @staticmethod
    def _signed_state(run_id: str, seq: int, principal: str) -> bytes:
        return b"\x00".join([run_id.encode(), str(seq).encode(), principal.encode()])


# -- helpers -------------------------------------------------------------------------


class _Progress:
    """Turns the runtime's synchronous ``on_progress`` into progress notifications.

    Only the latest count is sent: a burst of calls becomes one notification,
    and counts only ever go up, as the protocol asks.
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._latest: tuple[int, str] | None = None
        self._sent: tuple[int, str] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None

    def __call__(self, done: int, address: str) -> None:
        self._latest = (done, address)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._latest != self._sent:
                latest = self._latest
                assert latest is not None
                self._sent = latest
                with contextlib.suppress(Exception):
                    await self._ctx.report_progress(latest[0], None, f"{int(latest[0])} tool calls done; last: {latest[1]}")
            if self._closing:
                return

    async def flush(self) -> None:
        """Send what is left before the result goes out."""
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await self._task

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _asked_progress(ctx: Context) -> bool:
    """Whether the client may want progress notifications on this request.

    Over JSON-RPC (HTTP, stdio) only a ``progressToken`` in the request's ``_meta`` asks for them, and the SDK
    drops the rest. In process (the SDK's direct dispatch) a caller's callback travels beside the request, so
    there, and wherever the SDK's shape is not the one known here, the answer is yes.
    """
    request = ctx.request_context
    if (request.meta or {}).get("progress_token") is not None:
        return True
    outbound = getattr(request.session, "_request_outbound", None)
    return getattr(getattr(outbound, "transport", None), "kind", None) != "jsonrpc"


def _actor(ctx: Context, principal: str) -> str:
    """Who the timeline says decided: the person an access token names, else the principal."""
    identity = request_scope_value(ctx, IDENTITY_KEY)
    return shown_as(principal, identity.shown) if identity is not None else principal


_first_undecided = channels.first_undecided




def _client_of(ctx: Context) -> dict[str, str] | None:
    """The client's own name and version from its initialize request (``clientInfo``), when it sent one."""
    params = getattr(getattr(ctx, "session", None), "client_params", None)
    info = getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    if not isinstance(name, str) or not name.strip():
        return None
    version = getattr(info, "version", None)
    # A client names itself: bounded, so a long name cannot fill a page or the store.
    out = {"name": name.strip()[:80]}
    if isinstance(version, str) and version.strip():
        out["version"] = version.strip()[:40]
    return out


def _elicitation(ctx: Context) -> str | None:
    """How a paused write can be put to this client's user, if at all."""
    caps = ctx.client_capabilities
    form = caps.elicitation if caps is not None else None
    # A bare `elicitation: {}` predates modes and means forms; url-only does not.
    if form is None or (form.form is None and form.url is not None):
        return None
    version = ctx.protocol_version
    if version is not None and is_version_at_least(version, MODERN):
        return INPUT_REQUIRED
    return INLINE if getattr(ctx.session, "can_send_request", True) else None


def _decision(reply: Any) -> tuple[str | None, str | None]:
    """(decision, reason) from a form answer; (None, None) when the user made no choice."""
    if not isinstance(reply, ElicitResult):
        raise InvalidArguments("the answer to the approval form is not an elicitation result; nothing was decided")
    if reply.action == "decline":
        return "decline", "the user declined it"
    if reply.action == "cancel":
        return None, None
    try:
        form = ApprovalForm.model_validate(reply.content or {})
    except ValidationError:
        raise InvalidArguments("the approval form came back without a valid decision; nothing was decided",
                               next_action="Answer the form with decision 'approve' or 'decline'.") from None
    return form.decision, form.reason


def _writes_unasked(policy: Policy) -> bool:
    """Whether a write can go out without anyone approving it: only then is execute destructive."""
    # Under "guard" most writes go out unasked: only a write whose lineage is untrusted waits (P-45).
    return policy.writes in ("allow", "guard") or any(rule.action == "allow" for rule in policy.rules)


async def _check_arguments(ctx: Any, call_next: Any) -> Any:
    """Malformed arguments to one of tether's tools get a named error, not the SDK's validation dump."""
    params = ctx.params if ctx.method == "tools/call" else None
    name = params.get("name") if params else None
    tool = TOOLS_BY_NAME.get(name) if isinstance(name, str) else None
    if tool is not None and params:
        try:
            tool.arguments.model_validate(params.get("arguments") or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                                 for e in exc.errors())
            return error_result(InvalidArguments(
                f"{tool.name} got arguments it cannot use ({problems}); nothing was run", next_action=tool.usage))
    return await call_next(ctx)


# -- tether's own tools, as a table ------------------------------------------------------------
# A new tool is one entry here (and its handler on TetherServer): its name, its arguments model
# (input schema and check), how to call it (the next_action of a refused call), its handler, and what
# its result is (output schema).


@dataclass(frozen=True)
class ServerTool:
    """One of tether's own MCP tools."""

    name: str
    title: str
    arguments: type[BaseModel]  # the input schema, and what a call is checked against first
    usage: str  # how to call it: the next_action when its arguments are refused
    handler: Callable[[TetherServer, Context, Any], Awaitable[Any]]  # TetherServer.<method>(ctx, args)
    annotations: Callable[[Policy], ToolAnnotations]
    # Its description: a fixed text, or built from the runtime (execute's lists the catalog).
    describe: str | Callable[[Runtime], str]
    # What a call returns, as the SDK reads it: RunEnvelope is the structured output of a run's envelope.
    returns: Any = CallToolResult

    def description(self, rt: Runtime) -> str:
        return self.describe if isinstance(self.describe, str) else self.describe(rt)

    def function(self, server: TetherServer) -> Callable[..., Awaitable[Any]]:
        """The handler as the SDK registers it: keyword arguments named and described by the model."""
        model, handler = self.arguments, self.handler

        async def call(ctx: Context, **arguments: Any) -> Any:
            return await handler(server, ctx, model.model_validate(arguments))

        params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
        for name, field in model.model_fields.items():
            # The field as a parameter: its constraints and description in Annotated, its default apart.
            info = copy.copy(field)
            info.default = PydanticUndefined
            params.append(inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[field.annotation, info],
                default=inspect.Parameter.empty if field.is_required() else field.default))
        call.__signature__ = inspect.Signature(params, return_annotation=self.returns)  # type: ignore[attr-defined]
        call.__annotations__ = {p.name: p.annotation for p in params} | {"return": self.returns}
        call.__name__ = call.__qualname__ = self.name
        call.__doc__ = self.describe if isinstance(self.describe, str) else None
        return call


def _annotations(*, read_only: bool, destructive: bool | None, idempotent: bool,
                 open_world: bool) -> Callable[[Policy], ToolAnnotations]:
    """Fixed hints; ``destructive=None``: destructive only when a write can go out without anyone asking."""
    return lambda policy: ToolAnnotations(
        read_only_hint=read_only, destructive_hint=_writes_unasked(policy) if destructive is None else destructive,
        idempotent_hint=idempotent, open_world_hint=open_world)


TOOLS: tuple[ServerTool, ...] = (
    ServerTool(
        "execute", "Run a Python program against the tools", ExecuteArguments,
        'Call execute with {"code": "<a Python program>"} (and optionally "key": "<a unique id, reused '
        'on a retry>", "diagnostics": true).',
        TetherServer.execute, _annotations(read_only=False, destructive=None, idempotent=False, open_world=True),
        lambda rt: rt.engine.model_description(),
        returns=Annotated[CallToolResult, RunEnvelope] | InputRequiredResult),
    ServerTool(
        "resume", "Decide a paused write and continue the run", ResumeArguments,
        'Call resume with {"run_id": "run_...", "decision": "approve" | "decline" | "cancel", '
        '"seq": <a seq of pending.writes, or a list of them>, "reason": "..."} taken from the paused result.',
        TetherServer.resume, _annotations(read_only=False, destructive=True, idempotent=False, open_world=True),
        RESUME_DESCRIPTION, returns=Annotated[CallToolResult, RunEnvelope]),
    ServerTool(
        "cell_start", "Start a long program and observe it", CellStartArguments,
        'Call cell_start with {"code": "<a Python program>", "yield_after_ms": 1000}.',
        TetherServer.cell_start, _annotations(read_only=False, destructive=None, idempotent=False, open_world=True),
        CELL_START_DESCRIPTION),
    ServerTool(
        "cell_wait", "Wait for a cell's next events", CellWaitArguments,
        'Call cell_wait with {"cell_id": "run_...", "after": <cursor>, "timeout_ms": 30000}.',
        TetherServer.cell_wait, _annotations(read_only=True, destructive=False, idempotent=True, open_world=False),
        CELL_WAIT_DESCRIPTION),
    ServerTool(
        "cell_terminate", "Stop a cell", CellTerminateArguments,
        'Call cell_terminate with {"cell_id": "run_..."}.',
        TetherServer.cell_terminate,
        _annotations(read_only=False, destructive=True, idempotent=True, open_world=False),
        CELL_TERMINATE_DESCRIPTION),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
