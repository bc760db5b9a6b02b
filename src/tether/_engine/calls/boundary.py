"""The effect boundary: the one function every host call passes through.

Data path, top to bottom (P-1), each step taking one :class:`~tether._engine.calls.call.Call`:

    program ──> sandbox ──> EffectBoundary.call(seq, op, address, args) -> Call
                               │ replay.decide(): replay or live?   (replay.py, pure)
                               │ resolve the tool, validate args    (the catalog)
                               │ decide_call(): may this run?       (policy.py, pure)
                               │ record intent (write-ahead)        (ledger.py)
                               │ dispatch to the tool's source      (with per-call timeout; resend.py)
                               │ record outcome                     (ledger.py)
    program <── sandbox <──────┘ value, or an exception raised in the program

One :class:`EffectBoundary` serves one *attempt*: a fresh run, a restore from
a snapshot, or a replay from the journal. Nothing else dispatches tools.
Stopping at a call (a write that asks, a wait, a long sleep) is stops.py's
job; the boundary owns its :class:`~tether._engine.calls.stops.Stops`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from tether import _metrics as metrics
from tether._engine.attempt import telemetry
from tether._engine.attempt.guest_errors import ToolAborted, err_json, exit_detail, guest_error, tool_error
from tether._engine.attempt.restore import plan_restore
from tether._engine.attempt.result import to_json_value
from tether._engine.attempt.state import AttemptState, RaisedError
from tether._engine.calls import replay, resend
from tether._engine.calls.call import Call, call_key, call_key_and_size
from tether._engine.calls.ledger import Ledger, refuse_value, value_size, value_text
from tether._engine.calls.plain import as_json
from tether._engine.calls.stops import Stops
from tether._engine.lifecycle import outcome_unknown
from tether._engine.rules import policy as policy_mod
from tether._hostwork import off_loop
from tether._sandbox.monty import GuestRaise, Stopped
from tether._store.base import CallRecord, Store
from tether._store.states import CallState
from tether._tools import binding, clocks
from tether._tools import context as call_context
from tether.errors import (
    CallLimit,
    ExecutionDiverged,
    HostWorkTimeout,
    InvalidArguments,
    JournalLimit,
    TetherError,
    UnknownTool,
)

if TYPE_CHECKING:
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.approvals.model import Approver
    from tether._engine.attempt.pending import Stop
    from tether._engine.lineage.guard import Guard
    from tether._engine.rules.limits import Limits
    from tether._engine.waits import Waits
    from tether._sandbox.monty import Execution
    from tether._tools.catalog import Catalog
    from tether._tools.model import Tool

BUILTIN_OPS = ("search", "describe", "sources")
WAIT_OPS = ("wait_for", "wait_for_signal", "sleep")
# A write in one of these states has spent the run's write budget. An
# approved write spends it when it is sent (`_send` counts it), so counting
# `approved` here too would charge a resumed write twice.
SPENT_STATES = (CallState.SENDING, CallState.SENT, CallState.UNKNOWN, CallState.FAILED)
# How long closing waits for reads it cancelled to unwind (a tool that ignores the cancel is not waited for).
READ_CUT_SECONDS = 1.0


class Cancelled(Stopped):
    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason



_CONTAINERS = (tuple, dict, list)


def _holds_tuple(value: Any) -> bool:
    """Whether a tuple is anywhere in ``value``."""
    t = type(value)
    if t is tuple:
        return True
    if t is dict:
        return any(_holds_tuple(v) for v in value.values())
    if t is list:
        return any(_holds_tuple(v) for v in value)
    return False


class EffectBoundary:
    """Serves host calls for one attempt of one run."""

    def __init__(
        self,
        *,
        run_id: str,
        store: Store,
        catalog: Catalog,
        policy: policy_mod.Policy,
        limits: "Limits",
        journal_entries: list[CallRecord],
        on_approval: Approver | None,
        builtins_impl: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], Awaitable[Any]]],
        pause_sink: Callable[["EffectBoundary", Stop], Awaitable[bool]],
        # Asked after each call settles: the checkpoint to await if one is due, else None.
        checkpoint_sink: Callable[["EffectBoundary", CallRecord], Awaitable[None] | None] | None,
        clock: Callable[[], float],
        keyring: Keyring,
        writes_spent: int | None = None,
        waits: "Waits",
        session: str | None = None,
        on_progress: Callable[[int, str], None] | None = None,
        on_question: Any = None,
        span: Any = None,
        inline_sleep_seconds: float = 1.0,
        batch_window_seconds: float = 0.05,
        journaled_bytes: int = 0,
        guard: "Guard | None" = None,
    ) -> None:
        self.run_id = run_id
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.limits = limits
        self.on_approval = on_approval
        self.builtins_impl = builtins_impl
        self._checkpoint_sink = checkpoint_sink
        self.clock = clock
        # The journal as this attempt reads and writes it (calls/ledger.py).
        self.ledger = Ledger(run_id=run_id, store=store, keyring=keyring, clock=clock,
                                    entries=journal_entries)
        self._idempotency_key = self.ledger.idempotency_key  # what a tool's call context reads its key from
        self.state = AttemptState()
        self.state.writes_spent = (writes_spent if writes_spent is not None
                                   else sum(1 for e in journal_entries if e.kind == "write" and e.state in SPENT_STATES))
        self.execution: "Execution | None" = None
        self.on_progress = on_progress
        # Puts an upstream tool's mid-call question to the run's user (Runtime.elicitation_handler).
        self.on_question = on_question
        self.span = span  # the run's OpenTelemetry span, when one is recording
        # Tools with a call on the wire now: an upstream's question is tied to its run by these.
        self.inflight_addresses: dict[str, int] = {}
        self.waits = waits  # creates and settles the waits the program reaches (P-18)
        self.session = session
        # Sleeps up to this long are waited out in the worker instead of parking.
        self.inline_sleep_seconds = inline_sleep_seconds
        # Bytes of arguments and outcomes this run has journaled (P-22), earlier attempts included.
        self.journaled_bytes = journaled_bytes
        self.keyring = keyring  # signs each journal entry (P-35)
        # Under writes = "guard" only: untrusted reads journal their marks, writes are judged (P-45).
        self.guard = guard
        self._idle = asyncio.Event()
        self._idle.set()
        self._dispatches: set[asyncio.Task[Any]] = set()
        self._sends: dict[int, int] = {}  # seq -> the send on the wire now, for writes
        self._read_verdicts: dict[str, str] = {}  # address -> the policy's verdict on reading it
        self._held_listed: set[int] = set()  # seqs a restored snapshot lists as held, not journaled (P-9)
        self._taken: set[int] = set()  # the journal's seqs the calls of this attempt (or replay) were matched to
        # The same calls as the signed record lists them, each with when the program first issued it (P-18).
        self.held_records: dict[int, dict[str, Any]] = {}
        self._reads_out: set[asyncio.Task[Any]] = set()  # tasks awaiting a read on the wire, cut short at close
        # Pausing, parking and the calls held while the attempt stops (stops.py).
        self.stops = Stops(self, self.ledger, pause_sink, batch_window_seconds=batch_window_seconds)

    # -- the sandbox's entry point ---------------------------------------------

    def _parse(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[str, str, dict[str, Any], GuestRaise | None]:
        """(op, address, call args, error) for a sandbox call."""
        if name.startswith("tools."):
            address = name[len("tools."):]
            if args:
                # Positional arguments are bound to names here, so the journal,
                # policy and validation all see one keyword dict (tools.binding).
                try:
                    found = self.catalog.find(address)
                    if found is not None:  # an unknown one is refused as unknown_tool by the call itself
                        return "tool", address, binding.bind(found, args, kwargs), None
                except InvalidArguments as exc:
                    err = guest_error("invalid_arguments", exc.message, "TypeError")
                    return "tool", address, {"_positional": list(args), **kwargs}, err
                return "tool", address, {"_positional": list(args), **kwargs}, None
            return "tool", address, dict(kwargs), None
        return name, name, {"args": list(args), "kwargs": dict(kwargs)}, None

    def host(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]:
        """Host function for the sandbox: map the name to (op, address, args) and call.

        A plain function handing back :meth:`call`'s coroutine, which the sandbox awaits at once: an
        ``async def`` here would add a coroutine frame to every host call for nothing (core_bench).
        """
        op, address, call_args, err = self._parse(name, args, kwargs)
        self.state.issued += 1
        seq = self.state.issued
        if err is not None:
            return self._refuse(Call(seq, op, address, call_args), "read", err, CallState.FAILED, None)
        return self.call(seq, op, address, call_args)

    def _same_call_elsewhere(self, call: Call) -> int | None:
        """The seq of the same call (its key, or a held call's op, address and arguments) in the journal or the
        snapshot's held list that no call of this attempt has been matched to yet."""
        for seq in sorted(self.journal):
            if self.journal[seq].key == call.key and seq not in self._taken:
                return seq
        for seq, held in sorted(self.held_records.items()):
            if (seq not in self._taken and held.get("op") == call.op and held.get("address") == call.address
                    and held.get("args") == call.args):
                return seq
        return None

    def list_held(self, listed: Sequence[dict[str, Any]]) -> None:
        """The calls a genuine snapshot lists that the journal lacks: held when its pause formed, never sent, so
        a restore or a replay issues them rather than reading their gap as divergence (D-80)."""
        self.held_records = {int(c["seq"]): c for c in listed if self.journal.get(int(c["seq"])) is None}
        self._held_listed = set(self.held_records)

    async def answer_restored(self, pending: list[dict[str, Any]], call_ids: list[int],
                              announced: list[Any]) -> dict[int, Any]:
        """Settle the calls a restored snapshot waits on (P-9); ``pending`` is what the snapshot recorded.

        The calls are mapped to the snapshot's record first (restore.py), so a
        mismatch can still fall back to replay; then each is answered through
        the boundary like any call.
        """
        def next_seq() -> int:
            self.state.issued += 1
            return self.state.issued

        plan = plan_restore(pending, call_ids, announced, self._parse, next_seq)
        # Calls the signed record lists that the journal lacks were held while the pause formed: never sent.
        planned = {p.seq for p in plan}
        self.list_held([c for c in pending if c["seq"] in planned])
        wanted = set(call_ids)
        # If answering pauses again, the new dump waits on every call of the plan.
        self.stops.answering = [{"seq": p.seq, "op": p.op, "address": p.address, "args": p.args}
                                for p in plan if p.call_id in wanted]

        async def one(seq: int, op: str, address: str, call_args: dict[str, Any], err: GuestRaise | None) -> Any:
            try:
                if err is not None:
                    await self._record_rejected(Call(seq, op, address, call_args), "read", err,
                                                existing=self.journal.get(seq))
                    raise err
                return await self.call(seq, op, address, call_args)
            except GuestRaise as exc:
                return exc

        results = await asyncio.gather(*(one(*p[1:]) for p in plan))
        self.stops.answering = None
        return {p.call_id: r for p, r in zip(plan, results) if p.call_id in wanted}

    # -- the boundary ----------------------------------------------------------

    async def call(self, seq: int, op: str, address: str, args: dict[str, Any]) -> Any:
        """Serve one host call: replay → resolve and validate → policy → intent → dispatch → outcome."""
        st = self.state
        self.stops.arrived()
        for v in args.values():  # most arguments are scalars: a loop, not a recursion, says there is no tuple
            if type(v) in _CONTAINERS:
                if _holds_tuple(args):
                    # A tuple is a JSON array to every tool (`(lat, lon)`, `tuple(ids)`): sent,
                    # validated and journaled as the list it becomes, as a resumed write is (P-26).
                    args = to_json_value(args)[0]
                break
        try:
            key, size = call_key_and_size(op, address, args)
        except (TypeError, ValueError):
            # Not JSON as given (a set, bytes, NaN, an int past 4,300 digits):
            # the call goes on with its JSON form, so what is journaled, shown
            # for approval and sent are one value (P-26).
            args = to_json_value(args)[0]
            key, size = call_key_and_size(op, address, args)
        call = Call(seq, op, address, args, key, size)
        if self.stops.pausing or (self.execution is not None and self.execution.stopping):
            if self.stops.batch is not None and op == "tool" and not (self.execution is not None and self.execution.stopping):
                return await self.stops.join_batch(call)
            return await self.stops.hold(call)
        if seq > self.limits.host_calls:
            self._fail(
                CallLimit(
                    f"the program made more than {self.limits.host_calls} host calls; call {seq} was not sent",
                    next_action="Make fewer calls per run: batch, page, or reduce upstream; or raise limits.host_calls.",
                )
            )
            return await self.stops.hold(call)
        self.ledger.note_key(seq, key)
        decision = replay.decide(self.journal.get(seq), key, seq, self.last_recorded_seq)
        if decision.action == replay.DIVERGED and decision.entry is not None:
            elsewhere = self._same_call_elsewhere(call)
            if elsewhere is not None:
                # Tasks issue their next calls as their answers come back, so a replay answering from the
                # journal at once may issue them in another order: a call is the entry with its key (or the
                # held call the signed snapshot lists) that no call of this attempt has taken yet (P-5, P-52);
                # its seq and idempotency key are the journal's.
                seq = elsewhere
                call = call._replace(seq=seq)
                self.ledger.note_key(seq, key)
                decision = replay.decide(self.journal.get(seq), key, seq, self.last_recorded_seq,
                                         unrecorded_ok=seq in self._held_listed)
        self._taken.add(seq)
        if decision.action == replay.DIVERGED and decision.entry is None:
            decision = replay.decide(None, key, seq, self.last_recorded_seq,
                                     unrecorded_ok=seq in self._held_listed or self._reads(op, address))
        if decision.action == replay.DIVERGED:
            self._fail(ExecutionDiverged(f"replay diverged from the journal: {decision.reason}; nothing was sent",
                                         details={"seq": seq, "address": address}))
            return await self.stops.hold(call)
        if decision.action == replay.REPLAY:
            return self._replay(replay.entry_of(decision))
        if decision.action == replay.UNKNOWN and self._resendable(replay.entry_of(decision)) is None:
            await self._mark_unknown(replay.entry_of(decision))
            return await self.stops.hold(call)
        if decision.action == replay.WAIT and op not in WAIT_OPS:
            self._fail(ExecutionDiverged(f"call {seq} was journaled as a wait", details={"seq": seq}))
            return await self.stops.hold(call)
        if decision.entry is None:
            # P-22: arguments too large to journal are refused before anything is sent.
            refused = self._journal_room(size, address, "arguments")
            if refused is not None:
                if self.state.failure is not None:
                    return await self.stops.hold(call)
                await self._record_rejected(Call(seq, op, address, {"_omitted_bytes": size}, key), "read", refused)
                raise refused

        st.inflight += 1
        self._idle.clear()
        if st.inflight_since is None:
            st.inflight_since = time.perf_counter()
        error: GuestRaise | None = None
        try:
            if op == "tool":
                value = await self._tool_call(call, decision)
            elif op in WAIT_OPS:
                value = await self.stops.wait(call, decision)
            else:
                value = await self._builtin_call(call, decision)
        except GuestRaise as exc:
            error = exc
        finally:
            st.inflight -= 1
            if st.inflight == 0:
                if st.inflight_since is not None:
                    st.host_seconds += time.perf_counter() - st.inflight_since
                st.inflight_since = None
                self._idle.set()
        if self.stops.pausing and self.stops.answering is None:
            # A pause began while this call was out: its outcome is journaled,
            # but handing it back now would let the program run on while the
            # pause is being dumped. It is answered from the journal on resume.
            return await self.stops.hold(call)
        if error is not None:
            raise error
        return value

    def _reads(self, op: str, address: str) -> bool:
        """Whether a call is a read: a built-in's lookup, or a tool that does not write."""
        if op in BUILTIN_OPS:
            return True
        tool = self.catalog.find(address) if op == "tool" else None
        return tool is not None and not tool.is_write

    async def _builtin_call(self, call: Call, decision: replay.JournalAnswer) -> Any:
        seq, op, address, args = call.seq, call.op, call.address, call.args
        impl = self.builtins_impl.get(op)
        t = time.perf_counter()
        if decision.entry is not None:
            await self.ledger.record_intent(call, "read", CallState.PENDING, decision.entry)
        else:
            self.ledger.buffer_intent(call)
        try:
            if impl is None:
                raise GuestRaise("NameError", f"name {op!r} is not defined")
            value = await impl(tuple(args.get("args", ())), dict(args.get("kwargs", {})))
        except GuestRaise as exc:
            await self.ledger.record_outcome(seq, CallState.PENDING, CallState.FAILED,
                                       error={"type": exc.exc_type, "message": exc.message})
            self._stat(seq, op, address, "read", CallState.FAILED, t)
            if exc.message.startswith(f"[{HostWorkTimeout.code}]"):
                # Uncaught, the run ends with this call's code, not program_error (P-14).
                self._remember(exc, seq, op)
            raise
        value = as_json(value)[0]
        size = value_size(value)
        refused = self._journal_room(size, op, "result")
        if refused is not None:
            await self.ledger.record_outcome(seq, CallState.PENDING, CallState.FAILED, error=err_json(refused))
            self._stat(seq, op, address, "read", CallState.FAILED, t)
            if self.state.failure is not None:
                return await self.stops.hold(call)
            self._remember(refused, seq, address)
            raise refused
        await self.ledger.record_outcome(seq, CallState.PENDING, CallState.DONE, outcome=value, size=size)
        self._stat(seq, op, address, "read", CallState.DONE, t)
        return value

    def _tool_call(self, call: Call, decision: replay.JournalAnswer) -> Awaitable[Any]:
        """Resolve, validate and decide a tool call: the coroutine that sends it, or refuses it.

        Decided without awaiting anything, so a live read's dispatch is handed back as it is: one coroutine
        frame fewer on every read (core_bench). What has to be awaited first (a refusal's entry, a write's
        intent) is in the coroutine handed back, which the caller awaits at once.
        """
        address, args = call.address, call.args
        t = time.perf_counter()
        tool = self.catalog.find(address)
        if tool is None:
            return self._unknown_tool(call, decision)
        # The journal says what a call was when it was issued: a write asked, approved or on the wire stays a
        # write if its tool is listed as a read now (its source's annotations changed between pause and resume).
        kind = "write" if tool.is_write or (decision.entry is not None and decision.entry.kind == "write") else "read"
        try:
            valid = args if (kind == "read" and tool.validates_args) else self.catalog.validate_args(address, args)
        except InvalidArguments as exc:
            return self._refuse(call, kind, guest_error("invalid_arguments", exc.message, "TypeError"),
                                CallState.FAILED, decision.entry)
        if kind == "write":
            return self._write(call, tool, valid, t, decision)
        verdict = self._read_verdicts.get(address)
        if verdict is None:  # a read's verdict depends on its address alone: matched once per attempt
            verdict = self._read_verdicts[address] = policy_mod.decide_call(self.policy, address, False, 0)
        if verdict == policy_mod.DENY:
            return self._refuse(call, kind, guest_error("call_denied", f"policy denies {address}; it was not called",
                                                        "PermissionError"), CallState.DENIED, decision.entry)
        if self.guard is not None and tool.annotations.open_world:
            # A read that reaches out (a page, a URL) sends its arguments where they point (P-45): judged as a
            # write is; one that asks is journaled, asked and sent as a write.
            if decision.entry is None:
                return self._guarded_read(call, tool, valid, t)
            if decision.entry.kind == "write":
                return self._write(call, tool, valid, t, decision)
        if decision.entry is not None:
            return self._reissue(call, tool, valid, t, decision.entry)
        self.ledger.buffer_intent(call)
        return self._dispatch(call, tool, valid, CallState.PENDING, CallState.DONE, t)

    async def _guarded_read(self, call: Call, tool: "Tool", valid: dict[str, Any], t: float) -> Any:
        lineage = await self.judge_write(call, tool, valid)
        if not lineage["ask"]:
            self.ledger.buffer_intent(call)
            return await self._dispatch(call, tool, valid, CallState.PENDING, CallState.DONE, t)
        await self.ledger.record_intent(call, "write", CallState.ASKED, None, lineage)
        return await self.stops.ask(call, tool, valid, t)

    async def _unknown_tool(self, call: Call, decision: replay.JournalAnswer) -> Any:
        err = guest_error("unknown_tool", (await self._no_such_tool(call.address)).message, "LookupError")
        await self._record_rejected(call, "read", err, existing=decision.entry)
        raise err

    async def _refuse(self, call: Call, kind: str, err: GuestRaise, state: CallState,
                      existing: CallRecord | None) -> Any:
        """Journal a call refused before it was sent (unless a dead attempt did), and raise why in the program."""
        await self._record_rejected(call, kind, err, state=state, existing=existing)
        raise err

    async def _reissue(self, call: Call, tool: "Tool", args: dict[str, Any], t: float, entry: CallRecord) -> Any:
        """A read a dead attempt left pending: re-issued under its seq."""
        await self.ledger.record_intent(call, "read", CallState.PENDING, entry)
        return await self._dispatch(call, tool, args, CallState.PENDING, CallState.DONE, t)

    async def _write(self, call: Call, tool: "Tool", valid: dict[str, Any], t: float,
                     decision: replay.JournalAnswer) -> Any:
        address, kind = call.address, "write"
        # SEND: approved earlier (by resume), never marked sending.
        if decision.action == replay.SEND:
            return await self._send(call, tool, valid, t)
        if decision.action == replay.UNKNOWN:
            # Left sending by a dead attempt, to a tool that dedupes by key (P-31).
            return await self._resend(call, tool, valid, t, replay.entry_of(decision))
        if decision.action == replay.ASK:
            return await self.stops.ask(call, tool, valid, t)

        verdict = policy_mod.decide_call(self.policy, address, True, self.state.writes_spent)
        if verdict == policy_mod.DENY:
            err = guest_error("write_denied", f"policy denies the write {address}; it was not sent", "PermissionError")
            await self._record_rejected(call, kind, err, state=CallState.DENIED, existing=decision.entry)
            raise err
        if verdict == policy_mod.OVER_BUDGET:
            err = guest_error(
                "budget_exceeded",
                f"the run's write budget of {self.policy.write_budget} is spent; {address} was not sent",
                "PermissionError",
            )
            await self._record_rejected(call, kind, err, state=CallState.DENIED, existing=decision.entry)
            raise err
        lineage = None
        if verdict == policy_mod.GUARD:
            # The rules left the write at the mode's default: its lineage decides (P-45).
            lineage = await self.judge_write(call, tool, valid)
            verdict = policy_mod.ASK if lineage["ask"] else policy_mod.ALLOW
        if verdict == policy_mod.ALLOW:
            # Spent before the intent is stored (an await): writes issued with this one are
            # checked against the budget meanwhile, and must count it.
            self.state.writes_spent += 1
            await self.ledger.record_intent(call, kind, CallState.APPROVED, decision.entry, lineage)
            return await self._send(call, tool, valid, t, spent=True)
        # ask
        await self.ledger.record_intent(call, kind, CallState.ASKED, decision.entry, lineage)
        return await self.stops.ask(call, tool, valid, t)

    async def judge_write(self, call: Call, tool: "Tool", valid: dict[str, Any]) -> dict[str, Any]:
        """A guarded write's verdict and reasons, as its journal entry keeps them (P-45)."""
        assert self.guard is not None  # decide_call says guard only when the attempt has one
        verdict = await self.guard.verdict(call.seq, tool, valid, self.journal)
        return verdict.to_dict()

    async def _send(self, call: Call, tool: "Tool", args: dict[str, Any], t: float, spent: bool = False) -> Any:
        """Send an approved write (``args`` validated): ``sending`` is journaled first (P-7)."""
        seq = call.seq
        if not spent:
            self.state.writes_spent += 1  # before the await below, for the same reason as in _write
        # P-7: `sending` is committed before the request leaves.
        if not await self.ledger.move(seq, [CallState.APPROVED], state=CallState.SENDING, started_at=self.clock(), sends=1):
            raise self._fail(ExecutionDiverged(f"call {seq} was not in state approved; nothing was sent"))
        return await self._dispatch(call, tool, args, CallState.SENDING, CallState.SENT, t)

    def _resendable(self, entry: CallRecord) -> "Tool | None":
        return resend.resendable(self.catalog, entry, self.limits)

    async def _resend(self, call: Call, tool: "Tool", args: dict[str, Any], t: float, entry: CallRecord) -> Any:
        # The write was already counted against the budget when first sent.
        seq = call.seq
        send = max(entry.sends, 1) + 1
        if not await self.ledger.move(seq, [CallState.SENDING], state=CallState.SENDING, sends=send):
            raise self._fail(ExecutionDiverged(f"call {seq} was not in state sending; nothing was sent"))
        return await self._dispatch(call, tool, args, CallState.SENDING, CallState.SENT, t, send=send)

    async def _dispatch(self, call: Call, tool: "Tool", args: dict[str, Any], from_state: CallState,
                        ok_state: CallState, t: float, send: int = 1) -> Any:
        """Call the tool with its validated ``args`` and journal the outcome; a write in its own task (P-8)."""
        seq = call.seq
        is_write = from_state == CallState.SENDING
        task = None
        try:
            if is_write:
                # A write runs in its own task so that stopping the program
                # (cancel, pause, limit) never interrupts it on the wire: it
                # finishes and its outcome is journaled (P-8).
                task = asyncio.ensure_future(self._deliver(tool, args, seq, send))
                self._dispatches.add(task)
                task.add_done_callback(self._dispatches.discard)
                value = await asyncio.shield(task)
            else:
                # A read cut short is re-issued later (P-5): await it in place,
                # which saves a task and two event-loop turns per call.
                reader = asyncio.current_task()
                if reader is not None:
                    self._reads_out.add(reader)
                try:
                    value = await self._invoke(tool, args, seq)
                finally:
                    self._reads_out.discard(reader)
        except asyncio.TimeoutError as exc:
            # A source that times calls itself says why (e.g. no progress for N s).
            why = str(exc) or f"did not answer within {tool.timeout_seconds or self.limits.call_timeout_seconds:g} s"
            if is_write:
                err = await self._unknown(seq, tool, t, why)
            else:
                err = guest_error(
                    "call_timeout",
                    f"{tool.address}: {why}",
                    "TimeoutError",
                )
                await self.ledger.record_outcome(seq, from_state, CallState.FAILED, error=err_json(err))
                self._stat(seq, "tool", tool.address, "read", CallState.FAILED, t)
            self._remember(err, seq, tool.address)
            raise err from None
        except asyncio.CancelledError:
            # Our caller was cancelled; a shielded write goes on and is
            # journaled by _finish_late. A read stays pending.
            if task is not None:
                task.add_done_callback(
                    lambda tk: asyncio.ensure_future(self._finish_late(tk, seq, from_state, ok_state)))
            raise
        except GuestRaise:
            raise
        except Exception as exc:  # the tool failed
            if is_write and (resend.outcome_unknown(exc) if tool.dedupes_by_key else resend.sent_unanswered(exc)):
                # Its sends ran out with the outcome still unknown (P-31), or a
                # source says the request left and no answer came back (P-8).
                err = await self._unknown(seq, tool, t, tool_error(tool.address, exc).message
                                          .removeprefix(f"[tool_error] {tool.address}: "))
                self._remember(err, seq, tool.address)
                raise err from None
            if isinstance(exc, InvalidArguments):
                err = guest_error("invalid_arguments", exc.message, "TypeError")
            else:
                err = tool_error(tool.address, exc)
            await self.ledger.record_outcome(seq, from_state, CallState.FAILED, error=err_json(err))
            self._stat(seq, "tool", tool.address, "write" if is_write else "read", CallState.FAILED, t)
            self._remember(err, seq, tool.address)
            raise err from None
        value, notes = as_json(value)
        if notes:
            seen = self.state.conversions.setdefault(tool.address, [])
            seen.extend(n for n in notes if n not in seen)
        text, size = value_text(value)
        refused = self._journal_room(size, tool.address, "result", sent=is_write)
        if refused is not None:
            # P-22: neither the store nor the sandbox gets the value. A write
            # happened all the same: its entry says so, and it is never re-sent.
            settled = ok_state if is_write else CallState.FAILED
            await self.ledger.record_outcome(seq, from_state, settled, error=err_json(refused))
            self._stat(seq, "tool", tool.address, "write" if is_write else "read", settled, t)
            if self.state.failure is not None:
                return await self.stops.hold(Call(seq, "tool", tool.address, args))
            self._remember(refused, seq, tool.address)
            raise refused
        lineage = None
        if self.guard is not None:
            # Every result an untrusted tool returns is labelled, a write's too (a read that marks mail read is
            # a write): a write keeps its verdict beside its result's marks.
            lineage = self.guard.read_lineage(tool.address, value)
            if is_write and lineage is not None:
                lineage = {**(self.journal[seq].lineage or {}), **lineage}
        written = self.ledger.settle(seq, from_state, ok_state, outcome=value, size=size, text=text, lineage=lineage)
        if written is not None:
            await written
        self._stat(seq, "tool", tool.address, "write" if is_write else "read", ok_state, t)
        if self._checkpoint_sink is not None and self.state.inflight == 1 and not self.stops.pausing:
            due = self._checkpoint_sink(self, self.journal[seq])
            if due is not None:
                await due
        return value

    async def _unknown(self, seq: int, tool: "Tool", t: float, why: str) -> GuestRaise:
        """Record a write whose outcome is unknown (P-8, P-31); the error for the program."""
        self.state.unknown_writes.append({"seq": seq, "address": tool.address})
        message = resend.unknown_message(tool.address, why, self._sends.get(seq, 1), self.ledger.idempotency_key(seq))
        err = guest_error("write_outcome_unknown", message, "TimeoutError")
        await self.ledger.record_outcome(seq, CallState.SENDING, CallState.UNKNOWN, error=err_json(err))
        self._stat(seq, "tool", tool.address, "write", CallState.UNKNOWN, t)
        return err

    async def _deliver(self, tool: "Tool", args: dict[str, Any], seq: int, send: int) -> Any:
        """Send a write; to a tool that dedupes by key, again while its outcome is unknown (P-31).

        Each re-send is journaled (its number, in state `sending`) before it
        leaves, so a crash mid-way never loses count of the bound.
        """
        async def invoke(n: int) -> Any:
            self._sends[seq] = n
            return await self._invoke(tool, args, seq, n)

        return await resend.deliver(tool, send, self.limits, invoke,
                                    lambda n: self.ledger.move(seq, [CallState.SENDING], state=CallState.SENDING, sends=n))

    async def _invoke(self, tool: "Tool", args: dict[str, Any], seq: int, send: int = 1) -> Any:
        address = tool.address
        self.inflight_addresses[address] = self.inflight_addresses.get(address, 0) + 1
        # The tool (and the source building its request) reads the call's
        # idempotency key from here (P-25).
        token = call_context.enter_call(self.run_id, seq, address, self._idempotency_key, send,
                                        "write" if tool.is_write else "read")
        try:
            async with asyncio.timeout(tool.timeout_seconds or self.limits.call_timeout_seconds) as scope:
                # A person answering the tool's question mid-call stops this clock (D-89).
                deadline = clocks.enter_deadline(scope)
                try:
                    return await tool.handler(args)
                finally:
                    clocks.leave_deadline(deadline)
        except (SystemExit, KeyboardInterrupt) as exc:
            # A tool's sys.exit() or KeyboardInterrupt is the tool failing, not
            # a request to end the host: the run (and the CLI) carry on and report it.
            raise ToolAborted(f"the tool raised {type(exc).__name__}{exit_detail(exc)}; tether does not exit "
                              "for a tool") from None
        finally:
            call_context.leave(token)
            self.inflight_addresses[address] -= 1

    async def _finish_late(self, task: asyncio.Task[Any], seq: int, from_state: CallState, ok_state: CallState) -> None:
        try:
            value = task.result()
        except BaseException as exc:  # noqa: BLE001 - recorded, not raised
            lost = from_state == CallState.SENDING and isinstance(exc, (asyncio.TimeoutError, asyncio.CancelledError))
            state = CallState.UNKNOWN if lost else CallState.FAILED
            await self.ledger.record_outcome(seq, from_state, state, error={"type": type(exc).__name__, "message": str(exc)})
            return
        value = to_json_value(value)[0]
        refused = self._journal_room(value_size(value), f"call {seq}", "result", sent=True)
        if refused is not None:
            await self.ledger.record_outcome(seq, from_state, ok_state, error=err_json(refused))
            return
        await self.ledger.record_outcome(seq, from_state, ok_state, outcome=value)

    async def drain(self) -> None:
        """Wait for requests already on the wire to finish and be journaled."""
        while self._dispatches:
            await asyncio.gather(*list(self._dispatches), return_exceptions=True)
            await asyncio.sleep(0)

    # -- replay, hold, fail ------------------------------------------------------

    def _replay(self, entry: CallRecord) -> Any:
        err = replay.raised(entry)
        if err is not None:
            self._remember(err, entry.seq, entry.address)
            raise err
        return entry.outcome

    def release_held(self) -> None:
        self.stops.release_held()

    async def close(self, *, hold: bool = False) -> None:
        """The program ended (returned, raised or stopped): let held calls go, wait for requests already on
        the wire to finish and be journaled, and write the settled reads still in memory (P-7) — unless
        ``hold``: the run's end writes them with it (Finisher.end_attempt)."""
        self.ledger.end_program()
        self.release_held()
        await self._cut_reads()
        await self._calls_arrived()
        await self.drain()
        await self.ledger.close(hold=hold)

    async def _calls_arrived(self) -> None:
        """Wait for the calls still on their way to the journal when the program ended (an intent being stored,
        a write being handed to its dispatch): each reaches the state the run's end reads (P-50, D-82). Not for
        a call waiting on an inline approver's person, nor past the per-call timeout: what such a call does
        later is refused by the journal's compare-and-set."""
        st = self.state
        if st.inflight <= st.approving:
            return
        deadline = time.monotonic() + self.limits.call_timeout_seconds + 1.0
        # Polled: inflight reaches the approvers' count without passing zero, which is all _idle says. Only a
        # program that ends with calls out gets here, and what it waits for is a store write or a send.
        while st.inflight > st.approving and time.monotonic() < deadline:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.02):
                    await self._idle.wait()

    async def settle_unasked(self) -> list[dict[str, Any]]:
        """Writes still asking once the program has ended without a pause: settled `declined`, never sent (D-82).

        A write the program issued and never awaited (a task or a coroutine left behind, reaching the host
        because gathered calls stream, D-80) asks as any write does, but the program ends before its pause
        forms: nobody can decide it now, so it is declined with `write_not_decided`, and the run says so.
        """
        settled = []
        waits_left = False
        for seq in sorted(self.ledger.entries):
            entry = self.ledger.entries[seq]
            if seq <= self.state.issued and entry.kind == "wait" and entry.state == CallState.WAITING:
                # A wait a task reached but the program ended before the run could park on it: the run ends,
                # so does the wait (P-52); nobody is handed its key, and a resolution finds it cancelled.
                err = guest_error("wait_cancelled", f"{entry.address} was cancelled: the program ended before "
                                  "the run could park on it", "RuntimeError")
                await self.ledger.move(seq, [CallState.WAITING], state=CallState.FAILED, error=err_json(err),
                                       finished_at=self.clock())
                waits_left = True
                continue
            if seq > self.state.issued or entry.kind != "write" or entry.state != CallState.ASKED:
                continue
            err = guest_error("write_not_decided",
                              f"the program ended before the run could pause for a decision on the write "
                              f"{entry.address}; it was not sent", "PermissionError")
            if await self.ledger.move(seq, [CallState.ASKED], state=CallState.DECLINED, error=err_json(err),
                                      finished_at=self.clock()):
                settled.append({"seq": seq, "address": entry.address})
        if waits_left:
            await self.store.aio.call(self.waits.cancel, self.run_id)
        return settled

    async def _cut_reads(self) -> None:
        """Cancel the reads still on the wire: the program that would await them has ended (D-80).

        A read the program never awaited (a gather cut short by a raise, a limit or a cancel) would otherwise
        run on after the run's result, holding a connection to its source. It is not journaled: it has no
        outcome, and whatever runs the program again issues it again, as any read cut short (P-5). Bounded:
        a tool that ignores the cancel is left to its own timeout.
        """
        here = asyncio.current_task()
        out = [t for t in self._reads_out if t is not here and not t.done()]
        for task in out:
            task.cancel()
        if out:
            await asyncio.wait(out, timeout=READ_CUT_SECONDS)

    def reset_for_replay(self, entries: list[CallRecord], listed: Sequence[dict[str, Any]] = ()) -> None:
        """Start over from call 1 after a restore that could not be used; replay needs the whole journal.

        ``listed``: the calls the snapshot's signed record waits on; those the journal lacks were held while
        its pause formed (P-9), never sent, so the replay issues them (D-80).
        """
        self.ledger.reset(entries)
        self._taken = set()
        self.state = AttemptState(writes_spent=self.state.writes_spent, t0=self.state.t0)
        self.list_held(listed)
        self.stops.reset()
        self._idle.set()

    def _journal_room(self, size: int, what: str, part: str, *, sent: bool = False) -> GuestRaise | None:
        """Count a value against the journal's limits (P-22); the error to raise if it does not fit."""
        limits = self.limits
        if (size <= limits.journal_value_bytes and size <= limits.memory_bytes
                and self.journaled_bytes + size <= limits.journal_bytes):
            # Fits every cap refuse_value applies (twice a host call: no message is made for a value that fits).
            self.journaled_bytes += size
            return None
        refused = refuse_value(limits, self.journaled_bytes, size, what, part, sent)
        if refused is None:
            self.journaled_bytes += size
            return None
        code, message = refused
        if code == "journal_limit":
            self._fail(JournalLimit(message))
        return guest_error(code, message, "ValueError")

    def _fail(self, error: TetherError) -> TetherError:
        if self.state.failure is None:
            self.state.failure = error
        if self.execution is not None:
            self.execution.stop(error)
            self.release_held()
        return error

    async def _mark_unknown(self, entry: CallRecord) -> None:
        lost, err = outcome_unknown(entry)
        await self.ledger.move(entry.seq, [CallState.SENDING], finished_at=self.clock(), **lost)
        self._fail(err)

    # -- what the stops unit calls (stops.StopHost) -------------------------------

    async def wait_idle(self) -> None:
        while self.state.inflight > 0:
            self._idle.clear()
            await self._idle.wait()

    def woke_idle(self) -> None:
        self._idle.set()

    async def send_approved(self, call: Call, tool: "Tool", args: dict[str, Any], t: float) -> Any:
        return await self._send(call, tool, args, t)

    def journal_room(self, size: int, what: str, part: str) -> GuestRaise | None:
        return self._journal_room(size, what, part)

    def remember(self, err: GuestRaise, seq: int, address: str) -> None:
        self._remember(err, seq, address)

    async def record_rejected(self, call: Call, kind: str, err: GuestRaise, *,
                              existing: CallRecord | None = None) -> None:
        await self._record_rejected(call, kind, err, existing=existing)

    def stat(self, seq: int, op: str, address: str, kind: str, state: str, t: float) -> None:
        self._stat(seq, op, address, kind, state, t)

    # -- the journal (calls/ledger.py) -------------------------------------------

    @property
    def journal(self) -> dict[int, CallRecord]:
        """The run's journal entries this attempt knows, by seq."""
        return self.ledger.entries

    @property
    def last_recorded_seq(self) -> int:
        return self.ledger.last_recorded_seq

    async def flush(self) -> None:
        """Write the settled reads still held in memory, in one transaction (P-7)."""
        await self.ledger.flush()

    async def _record_rejected(self, call: Call, kind: str, err: GuestRaise, *, state: CallState = CallState.FAILED,
                               existing: CallRecord | None = None) -> None:
        """Journal a call refused before it was sent, as ``state`` with ``err`` (unless a dead attempt did)."""
        if existing is None:
            args = to_json_value(call.args)[0]  # a call refused as it was parsed has not been made JSON yet
            call = Call(call.seq, call.op, call.address, args, call.key or call_key(call.op, call.address, args))
            await self.ledger.record_rejected(call, kind, err_json(err), state)
        self._remember(err, call.seq, call.address)

    async def _no_such_tool(self, address: str) -> UnknownTool:
        """The unknown_tool error with suggestions, found off the event loop: comparing an address with
        every address of a large catalog takes a tenth of a second or more (without them if it takes 2 s)."""
        try:
            await off_loop(self.catalog.get, address, seconds=2.0, what="suggesting tools")
        except UnknownTool as exc:
            return exc
        except HostWorkTimeout:
            pass
        return UnknownTool(f"no tool {address!r}", details={"address": address, "suggestions": []})

    def _remember(self, err: GuestRaise, seq: int, address: str) -> None:
        """Record what the host raised into the program, so an uncaught one is reported as this call's (P-14)."""
        message = err.message
        if message.startswith("[") and "]" in message:
            self.state.raised[message] = RaisedError(message[1:message.index("]")], err.exc_type, seq, address)

    def _stat(self, seq: int, op: str, address: str, kind: str, state: str, t: float) -> None:
        now = time.perf_counter()
        self.state.stats.append((seq, op, address, kind, state, t, now))
        metrics.call_settled(op, kind, state)
        if self.span is not None:
            telemetry.record_call(self.span, seq, op, address, kind, state, now - t)
        if self.on_progress is not None:
            self.on_progress(len(self.state.stats), address)

