"""MCP Tasks on tether's server: extension ``io.modelcontextprotocol/tasks`` (SEP-2663), modern protocol only.

    client ──tools/call execute (_meta declares the extension)──> the run starts
           <── the result, when the run ends within task_after_seconds
           <── {resultType: "task", taskId, status} when it pauses, parks or runs on  (P-47)
    client ──tasks/get {taskId}──>    working | input_required (+ the question) | completed (+ result) | cancelled
    client ──tasks/update {taskId, inputResponses}──> the answer, held to its channel's rule
    client ──tasks/cancel {taskId}──> the run is cancelled

``cell_start`` answers with its observation as before, unless the cell paused: its pause is the task, done
once the run is past it, with the cell's observation since as its result.

A task is a view of one run, nothing more: its state is the run's, read from the
store, so any process sharing the store answers for it after a restart (D-71). The
task id is the run id and an HMAC over the run id and the principal that started it,
keyed from the store's secret: another principal's task id, or an altered one, is
"not found", and no table of tasks is kept.

The question a paused write asks is the one the same client would be asked without
a task (docs/mcp.md, ``[server] approvals``): the approval form, or the URL-mode
approval link, or none at all for a write only a signed-in person may approve. An
answer through ``tasks/update`` is decided exactly as that channel decides (D-72):
an approve on the form goes through ``may_decide`` for the form channel, so a rule
with ``approver = "signed_in"`` refuses it; an accepted link decides nothing (the
page does). An answer that decided nothing is recorded in the run's timeline (once
per distinct answer, D-90), and the task then reports ``working`` until someone
decides, instead of asking the client's user the same question again.

The decisions are the small pure functions at the top; the extension below applies them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field, ValidationError

from tether._engine.approvals import Channel
from tether._engine.approvals.model import MAX_REASON_CHARS
from tether._engine.approvals.surface import signed_in_required
from tether._engine.attempt.result import RunResult
from tether._server import urlmode
from tether._server.channels import APPROVAL_KEY, APPROVAL_SCHEMA, ApprovalForm, ApprovalHost
from tether._store.retention import DAY
from tether._store.states import RunStatus
from tether.errors import ApprovalElsewhere, InvalidArguments, RunNotFound, TetherError

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._store.base import RunRecord
    from tether._store.retention import RetentionRules

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# Which of tether's tools a client's call may turn into a task.
TASKABLE = frozenset({"execute", "cell_start"})
# How often a client is asked to poll: a paused run waits on a person, so once a second is plenty.
POLL_INTERVAL_MS = 1000
# The run's timeline event recording an answer that decided nothing (an opened link, a refused approve,
# a dismissed form): the task stops asking that write's question.
ANSWERED = "task_answered"
# How the run's timeline is read for that event: pages of PAGE, at most MAX_PAGES (a million events is
# more than a run's limits let it write).
PAGE, MAX_PAGES = 1000, 1000
# How many runs' read positions in their timelines a process keeps for that read (D-87).
SCANNED_RUNS = 4096
# The task id: <run id>.<MAC>; 32 hex digits (128 bits) of HMAC-SHA-256 under the store's key for tasks.
MAC_CHARS = 32
TASK_ID_PURPOSE = "mcp/task-id"
DECLINED_ON_FORM = "the user declined it"


# -- the decisions (pure) --------------------------------------------------------------------------


def task_id_for(run_id: str, principal: str, sign: Callable[[bytes], str], cursor: int | None = None) -> str:
    """The task id of ``run_id`` for ``principal``: the run id and a MAC binding the two (P-47).

    A cell's task (``cell_start``) also names the cursor of the observation it replaced: its result is the
    cell's observation after it.
    """
    name = run_id if cursor is None else f"{run_id}.c{cursor}"
    return f"{name}.{sign(_bound(name, principal))[:MAC_CHARS]}"


def run_of_task(task_id: Any, principal: str,
                verifies: Callable[[bytes, str, int], bool]) -> tuple[str, int | None] | None:
    """(run id, a cell task's cursor or None) a task id names for ``principal``; None for an altered id or
    another principal's."""
    if not isinstance(task_id, str) or "." not in task_id or len(task_id) > 200:
        return None
    name, _, mac = task_id.rpartition(".")
    if not name or len(mac) != MAC_CHARS or not verifies(_bound(name, principal), mac, MAC_CHARS):
        return None
    run_id, _, cell = name.partition(".")
    if not cell:
        return run_id, None
    if cell[:1] == "c" and cell[1:].isdigit() and len(cell) < 16:
        return run_id, int(cell[1:])
    return None


def _bound(run_id: str, principal: str) -> bytes:
    return b"\x00".join([b"task", run_id.encode(), principal.encode()])


def becomes_task(status: str | None) -> bool:
    """Whether a call's run, as it stands when the call must answer, is handed over as a task.

    None: still running after ``task_after_seconds``. A run that ended answers the call as it does without
    the extension; one that paused, parked or runs on becomes a task (P-47).
    """
    return status is None or not RunStatus(status).terminal


def task_status(run_status: str, *, asks: bool, cell: bool = False) -> str:
    """The task's status for its run's: ``asks`` — a question for the client's user is open.

    A cell's task stands for its pause only: once the run is past it, the task is complete and its result
    is the cell's observation since (the client goes on with cell_wait).
    """
    if run_status == RunStatus.CANCELLED:
        return "cancelled"
    if cell and run_status != RunStatus.PAUSED:
        return "completed"
    if RunStatus(run_status).terminal:
        # A failed program is a completed tool call with an error result, as without a task: the envelope
        # carries its code and next action.
        return "completed"
    if run_status == RunStatus.PAUSED and asks:
        return "input_required"
    return "working"


def question_kind(how: str | None, *, signed_in: bool) -> str | None:
    """What a paused write is put to the client's user as: "url", "form" or nothing (D-72).

    ``how`` is the channel ``[server] approvals`` picks for this client ("url", "form" or None). A write
    whose rule needs a signed-in approver is never put to a form, as without a task.
    """
    if how == "url":
        return "url"
    if how == "form" and not signed_in:
        return "form"
    return None


def answer_of(kind: str | None, action: str, content: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(decision, reason) an answer asks for; (None, None) when it decides nothing.

    Accepting a link means the user went to the page, where the decision is taken; declining to open it
    declines the write (as without a task); dismissing anything decides nothing. Any other accept is read
    as the approval form; an approve it carries is taken only if ``may_approve_by_form`` says so.
    """
    if action == "decline":
        return "decline", urlmode.DECLINED_TO_OPEN if kind == "url" else DECLINED_ON_FORM
    if action != "accept" or kind == "url":
        return None, None
    form = ApprovalForm.model_validate(dict(content or {}))
    # Stored in the journal and told to the program: held to the console's length (D-87).
    reason = form.reason.strip()[:MAX_REASON_CHARS] if form.reason and form.reason.strip() else None
    return form.decision, reason


def ttl_ms(status: str, created_at: float, updated_at: float, retention: RetentionRules | None) -> int | None:
    """The task's ``ttlMs``: how long from its creation it is kept, which is as long as its run's row (D-90).

    A run is never forgotten before it ends (``[retention]`` selects ended runs only), so a task whose run has not
    ended is kept without limit for now: null (the extension lets the value change over a task's life). An ended run
    is kept its status's ``[retention]`` days from its end (``updated_at``), or for ever (no days, no ``[retention]``,
    or ``keep_journals``, which keeps the row and its envelope, all a task shows).
    """
    if not RunStatus(status).terminal or retention is None or retention.keep_journals:
        return None
    days = retention.days.get(str(status))
    if days is None:
        return None
    return int(max(0.0, updated_at + days * DAY - created_at) * 1000)


def answer_mark(data: Mapping[str, Any]) -> tuple[int, str, str, str] | None:
    """What makes an answer that decided nothing distinct (D-90): its write, what the client did, the channel it was
    put on, and why an approve was refused. One ``task_answered`` event is recorded per mark."""
    seq = data.get("seq")
    if not isinstance(seq, int):
        return None
    return seq, str(data.get("action")), str(data.get("channel")), str(data.get("refused") or "")


def may_approve_by_form(kind: str | None) -> bool:
    """Whether an approve answered through ``tasks/update`` can be taken at all: only where the write was
    put to the client's user as the form. The form channel's own rule (``may_decide``) is checked next."""
    return kind == "form"


def input_key(seq: int) -> str:
    """The key of a write's question: an answer names the write it is for."""
    return f"{APPROVAL_KEY}:{seq}"


def seq_of_key(key: str) -> int | None:
    head, _, seq = key.partition(":")
    # One spelling a write (as input_key makes it): "approval:01" is no key, so it cannot answer twice (D-87).
    if head != APPROVAL_KEY or not seq.isdigit() or len(seq) >= 10 or seq != str(int(seq)):
        return None
    return int(seq)


# -- what the extension needs of the server ----------------------------------------------------------


class TaskHost(ApprovalHost, Protocol):
    """What the tasks extension uses of tether's MCP server (``_server/mcp.py``), which imports this."""

    task_after_seconds: float

    def principal_of(self, ctx: Any) -> str: ...

    def channel_of(self, ctx: Any) -> str | None:
        """"url", "form" or None: how a paused write is put to this client's user (``[server] approvals``)."""
        ...

    async def approval_refused(self, run_id: str, principal: str, channel: str, seqs: list[int],
                               ctx: Any) -> TetherError | None: ...

    def actor_of(self, ctx: Any, principal: str) -> str: ...

    def where(self, run_id: str) -> str:
        """Where a person approves the run's writes (the console page, a link, the CLI)."""
        ...

    async def observation(self, obs: dict[str, Any]) -> Any:
        """A cell's observation as the tool result cell_start and cell_wait return."""
        ...

    async def start_run(self, ctx: Any, arguments: Mapping[str, Any], principal: str,
                        started: Callable[[str], None]) -> Any:
        """Run execute's program as execute does, without asking anyone inline; ``started(run_id)`` once begun.

        Returns the run's RunResult, or a tool result when the call was refused before a run."""
        ...

    def keep(self, task: asyncio.Future[Any]) -> None:
        """Hold ``task`` until it ends (the run outlives the call that started it)."""
        ...

    async def continue_run(self, ctx: Any, principal: str, run_id: str,
                           decide: Callable[[Any], Any]) -> RunResult | None: ...


# -- wire shapes ----------------------------------------------------------------------------------------


class TaskParams(RequestParams):
    """Params of ``tasks/get`` and ``tasks/cancel``."""

    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId", max_length=200)


class UpdateParams(TaskParams):
    """Params of ``tasks/update``: the answers, keyed as the questions were."""

    input_responses: dict[str, Any] = Field(alias="inputResponses")


@dataclass(frozen=True)
class Question:
    key: str
    request: dict[str, Any]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _dump(value: Any) -> dict[str, Any]:
    return value.model_dump(by_alias=True, mode="json", exclude_none=True)


# -- the extension ---------------------------------------------------------------------------------------


class TasksExtension(Extension):
    """``tasks/get``, ``tasks/update``, ``tasks/cancel``, and ``execute`` turned into a task (P-47)."""

    identifier = TASKS_EXTENSION

    def __init__(self, host: TaskHost, context: Callable[[ServerRequestContext[Any, Any], Any], Any]) -> None:
        self.host = host
        # Builds the SDK's tool Context over a request (what the server's own methods read a caller from).
        self.context = context
        self.keys = host.rt.engine.keyring.derive(TASK_ID_PURPOSE)
        self.scans = Scans()
        config = host.rt.engine.config
        self.retention = config.retention.rules() if config is not None else None
        # Answers being recorded in this process, by (run id, mark): a second request with the same answer waits
        # for none of them and records nothing (D-90).
        self.recording: set[tuple[str, tuple[int, str, str, str]]] = set()

    def methods(self) -> Sequence[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [MethodBinding("tasks/get", TaskParams, self._get, modern),
                MethodBinding("tasks/update", UpdateParams, self._update, modern),
                MethodBinding("tasks/cancel", TaskParams, self._cancel, modern)]

    # -- tools/call ----------------------------------------------------------------------------------

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        # A client that did not declare the extension on this request, and a modern input-required
        # retry (its request state names a run already), see execute as before.
        if (params.name not in TASKABLE or not declared(ctx) or params.request_state is not None
                or params.input_responses is not None):
            return await call_next(ctx)
        context = self.context(ctx, params)
        principal = self.host.principal_of(context)
        if params.name == "cell_start":
            return await self._cell(ctx, context, principal, call_next)
        loop = asyncio.get_running_loop()
        begun: asyncio.Future[str] = loop.create_future()

        def started(run_id: str) -> None:
            if not begun.done():
                begun.set_result(run_id)

        run = asyncio.ensure_future(self.host.start_run(context, params.arguments or {}, principal, started))
        try:
            await asyncio.wait({run}, timeout=self.host.task_after_seconds)
            if not run.done():
                # Still running (or still queued for a slot): a task once it has a run id.
                await asyncio.wait({run, begun}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            run.cancel()  # the request went away before the call became a task: its run is cancelled
            raise
        if run.done():
            outcome = run.result()
            if not isinstance(outcome, RunResult):
                return outcome  # refused before a run: the error result, as without a task
            if not becomes_task(outcome.status):
                return await self.host.paused_result(outcome, diagnostics=bool((params.arguments or {}).get("diagnostics")))
            run_id = outcome.run_id
        else:
            self.host.keep(run)
            run_id = begun.result()
        record = await self._run(run_id, principal)
        shape = await self._shape(record, principal, context)
        return {"resultType": "task", **{k: v for k, v in shape.items() if k not in ("inputRequests", "result")}}

    async def _cell(self, ctx: ServerRequestContext[Any, Any], context: Any, principal: str,
                    call_next: CallNext) -> HandlerResult:
        """cell_start as before, unless its observation is a pause: then the pause is a task (P-47)."""
        out = await call_next(ctx)
        obs = getattr(out, "structured_content", None) or {}
        if obs.get("status") != RunStatus.PAUSED or not isinstance(obs.get("cell_id"), str):
            return out
        record = await self._run(obs["cell_id"], principal)
        shape = await self._shape(record, principal, context, int(obs.get("cursor") or 0))
        return {"resultType": "task", **{k: v for k, v in shape.items() if k not in ("inputRequests", "result")}}

    # -- tasks/* ----------------------------------------------------------------------------------------

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        context, principal, run, cursor = await self._open(ctx, params.task_id)
        return await self._shape(run, principal, context, cursor)

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        context, principal, run, _ = await self._open(ctx, params.task_id)
        write = await urlmode.waiting_write(self.host, run.run_id) if run.status == RunStatus.PAUSED else None
        for key, reply in params.input_responses.items():
            seq = seq_of_key(key) if isinstance(key, str) else None
            # An answer to a write the run no longer waits on (decided elsewhere meanwhile) decides nothing.
            if write is None or seq != int(write["seq"]):
                continue
            await self._answer(context, principal, run, seq, reply)
            break  # the run waits on one write, answered once a request (D-87)
        return {}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        context, principal, run, _ = await self._open(ctx, params.task_id)
        if not RunStatus(run.status).terminal:
            try:
                await self.host.rt.cancel(run.run_id, "the MCP client cancelled the task; nothing further was sent",
                                          principal=principal)
            except TetherError as exc:
                raise _wire_error(exc) from None
        return {}

    # -- helpers ----------------------------------------------------------------------------------------

    async def _run(self, run_id: str, principal: str) -> RunRecord:
        """``engine.get_run`` read off the event loop (D-27)."""
        return await self.host.rt.store.aio.call(self.host.rt.engine.get_run, run_id, principal)

    async def _open(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple[Any, str, RunRecord, int | None]:
        if not declared(ctx):
            raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                           message=f"tasks/* needs the {TASKS_EXTENSION} extension declared on the request",
                           data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})
        context = self.context(ctx, None)
        principal = self.host.principal_of(context)
        named = run_of_task(task_id, principal, self.keys.verifies)
        try:
            if named is None:
                raise RunNotFound("no task with this id is yours; nothing was read or changed",
                                  next_action="Use the taskId the tools/call result gave this token.")
            return context, principal, await self._run(named[0], principal), named[1]
        except RunNotFound as exc:
            raise _wire_error(exc, message="Task not found") from None

    async def _shape(self, run: RunRecord, principal: str, context: Any, cursor: int | None = None) -> dict[str, Any]:
        """The task as ``tasks/get`` returns it: the run's state, and its question or result."""
        status, question, message = await self._state(run, context, cell=cursor is not None)
        shape: dict[str, Any] = {
            "taskId": task_id_for(run.run_id, principal, self.keys.sign, cursor), "status": status,
            "createdAt": _iso(run.created_at), "lastUpdatedAt": _iso(run.updated_at),
            "ttlMs": ttl_ms(run.status, run.created_at, run.updated_at, self.retention),
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if message:
            shape["statusMessage"] = message
        if question is not None:
            shape["inputRequests"] = {question.key: question.request}
        if status in ("completed", "cancelled") and cursor is not None:
            obs = await self.host.rt.wait_cell(run.run_id, after=cursor, timeout_ms=0, principal=principal)
            shape["result"] = _dump(await self.host.observation(obs))
        elif status in ("completed", "cancelled"):
            shape["result"] = _dump(await self.host.paused_result(self.host.rt.engine.recorded(run), diagnostics=False))
        return shape

    async def _state(self, run: RunRecord, context: Any, *, cell: bool) -> tuple[str, Question | None, str | None]:
        if run.status != RunStatus.PAUSED:
            return task_status(run.status, asks=False, cell=cell), None, None
        write = await urlmode.waiting_write(self.host, run.run_id)
        if write is None:  # every write decided: the run is about to continue
            return "working", None, None
        seq = int(write["seq"])
        kind = question_kind(self.host.channel_of(context), signed_in=signed_in_required(run, [seq]))
        where = await self.host.paused_result(self.host.rt.engine.recorded(run), diagnostics=False)
        waiting = (where.structured_content or {}).get("instructions")
        if kind is None or await _answered(self.host.rt, run.run_id, seq, self.scans):
            return "working", None, waiting
        question = self._question(run.run_id, write, kind)
        return (task_status(run.status, asks=question is not None), question,
                None if question is not None else waiting)

    def _question(self, run_id: str, write: dict[str, Any], kind: str) -> Question | None:
        seq = int(write["seq"])
        if kind == "url":
            link = urlmode.link_to(self.host, run_id, write)
            if link is None:
                return None
            params: Any = ElicitRequestURLParams(message=urlmode.message(self.host, write), url=link,
                                                 elicitation_id=f"{run_id}:{seq}")
        else:
            params = ElicitRequestFormParams(message=self.host.approval_message_for(write),
                                             requested_schema=APPROVAL_SCHEMA)
        return Question(input_key(seq), _dump(ElicitRequest(params=params)))

    async def _answer(self, context: Any, principal: str, run: RunRecord, seq: int, reply: Any) -> None:
        kind = question_kind(self.host.channel_of(context), signed_in=signed_in_required(run, [seq]))
        try:
            answer = ElicitResult.model_validate(reply)
            decision, reason = answer_of(kind, answer.action, answer.content)
        except ValidationError:
            raise _wire_error(InvalidArguments(
                "the answer is not an elicitation result with a decision 'approve' or 'decline'; nothing was "
                "decided", next_action="Answer the task's question with the form it asked for.")) from None
        refused: TetherError | None = None
        if decision == "approve" and not may_approve_by_form(kind):
            refused = ApprovalElsewhere(
                f"write {seq} of run {run.run_id} was not put to this client's user as a form, so an approve "
                "through tasks/update decides nothing; nothing was sent",
                next_action=f"A person approves it: {self.host.where(run.run_id)}.")
        elif decision == "approve":
            refused = await self.host.approval_refused(run.run_id, principal, Channel.FORM, [seq], context)
        if decision is None or refused is not None:
            # Decided nothing: the timeline says so, and the task stops putting this question.
            data: dict[str, Any] = {"seq": seq, "action": answer.action, "channel": kind or "none"}
            if refused is not None:
                data["refused"] = refused.code
            await self._record_once(run.run_id, data)
            return
        actor = self.host.actor_of(context, principal)
        rt = self.host.rt

        def decide(progress: Any) -> Any:
            return rt.resume(run.run_id, decision, reason, seq=seq, principal=principal, actor=actor, via="mcp",
                             on_progress=progress)

        self.host.keep(asyncio.ensure_future(self.host.continue_run(context, principal, run.run_id, decide)))
        # Answered once the decision is recorded: the next tasks/get must not put the same question again.
        await urlmode.decided(rt, run.run_id, seq, timeout=10.0)


    async def _record_once(self, run_id: str, data: dict[str, Any]) -> None:
        """Record an answer that decided nothing in the run's timeline, once per distinct mark (D-90): a client
        repeating it (tasks/update in a loop) adds nothing a person reading the timeline did not see the first time.
        One per process at once; processes racing may each record it once."""
        mark = answer_mark(data)
        if mark is None or (run_id, mark) in self.recording:
            return
        key = (run_id, mark)
        self.recording.add(key)
        try:
            if not await _answered(self.host.rt, run_id, mark, self.scans):
                await self.host.rt.engine.events.emit_awaited(run_id, ANSWERED, data)
        finally:
            self.recording.discard(key)


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared the tasks extension for this request (modern protocol only)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(caps, "extensions", None) or {}
    return TASKS_EXTENSION in extensions


class Scans:
    """Where each run's timeline was last read up to, and the writes found answered there (D-87).

    A paused task is polled once a second for as long as a person takes, and the agent's program can fill
    the run's timeline first (``emit`` in a loop costs it nothing): reading it from the start on every poll
    made each tasks/get cost the whole timeline. Events are only appended, so each poll reads what came
    since. At most SCANNED_RUNS runs are remembered, the least recently polled forgotten first (and read
    from the start again if polled later).
    """

    def __init__(self, limit: int = SCANNED_RUNS) -> None:
        self.limit = limit
        # Per run: the last event read, and the answers found (each an answer_mark, D-90).
        self.runs: OrderedDict[str, tuple[int, frozenset[tuple[int, str, str, str]]]] = OrderedDict()

    def take(self, run_id: str) -> tuple[int, frozenset[tuple[int, str, str, str]]]:
        return self.runs.pop(run_id, (0, frozenset()))

    def put(self, run_id: str, after: int, answered: frozenset[tuple[int, str, str, str]]) -> None:
        self.runs[run_id] = (after, answered)
        while len(self.runs) > self.limit:
            self.runs.popitem(last=False)


def answered_in(events: Sequence[Any]) -> frozenset[tuple[int, str, str, str]]:
    """The answers through the task that decided nothing (each an answer_mark), in a page of a run's events."""
    marks = (answer_mark(e.data) for e in events if e.type == ANSWERED and isinstance(e.data, dict))
    return frozenset(m for m in marks if m is not None)


async def _answered(rt: Runtime, run_id: str, seq: int | tuple[int, str, str, str],
                    scans: Scans | None = None) -> bool:
    """Whether an answer through the task already decided nothing about write ``seq`` (recorded, any process);
    given a mark (``answer_mark``), whether that very answer was recorded.

    The run's events are read a page at a time (a program's outputs are events too), at most MAX_PAGES a
    call, from where ``scans`` last left this run.
    """
    scans = scans if scans is not None else Scans()
    after, found = scans.take(run_id)

    def seen() -> bool:
        return seq in found if isinstance(seq, tuple) else any(m[0] == seq for m in found)

    try:
        for _ in range(MAX_PAGES):
            if seen():
                break
            page = await rt.store.aio.get_events(run_id, after=after, limit=PAGE)
            found |= answered_in(page)
            if not page or page[-1].event_id <= after:
                break
            after = page[-1].event_id
            if len(page) < PAGE:
                break
    finally:
        scans.put(run_id, after, found)
    return seen()


def _wire_error(exc: TetherError, *, message: str | None = None) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message or exc.message, data=exc.to_dict())

