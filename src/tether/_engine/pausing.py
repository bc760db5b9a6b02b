"""Pausing and parking: how an attempt stops at a host call (P-4, P-18, P-27).

A write that asks pauses the run; a durable wait, a signal or a long sleep
parks it. Both take one path (:meth:`Pauses.stop_at`): calls in flight finish
and are journaled, the state is handed to the pause sink (which dumps and
stores it), and the program is unwound. Calls issued while the attempt stops
are held, not journaled; a write that would ask joins a forming write pause.

:class:`Pauses` is owned by the :class:`~tether._engine.boundary.EffectBoundary`
of one attempt and reaches it only through :class:`PauseHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Literal, Protocol

from tether._engine import journal
from tether._engine import policy as policy_mod
from tether._engine.guest_errors import err_json, guest_error
from tether._engine.inputs import wait_name_problem
from tether._engine.pending import AskedWrite, ParkedWait, Stop, WritePause
from tether._engine.waits import SIGNAL_PREFIX, SLEEP_PREFIX, key_for
from tether._sandbox.monty import GuestRaise, Stopped
from tether._store.aio import AsyncStore
from tether._store.base import CallRecord, Store, WaitRecord
from tether._store.states import CallState, WaitStatus
from tether.errors import InvalidArguments, UnknownTool

if TYPE_CHECKING:
    from tether._engine.attempt_state import AttemptState
    from tether._engine.boundary import Approver
    from tether._engine.integrity import Keyring
    from tether._engine.limits import Limits
    from tether._sandbox.monty import Execution
    from tether._tools.catalog import Catalog
    from tether._tools.model import Tool


class Paused(Stopped):
    """The attempt stopped because a write waits for a decision."""

    def __init__(self, pending: AskedWrite) -> None:
        super().__init__("paused")
        self.pending = pending


class Parked(Stopped):
    """The attempt stopped because the run waits on a wait, a signal or a timer."""

    def __init__(self, pending: ParkedWait) -> None:
        super().__init__("parked")
        self.pending = pending


# What a call held by a stopping run answers: the program unwinds (a bare
# BaseException is not caught by `except Exception`), and nothing it does after
# is sent or recorded.
_UNWIND = GuestRaise("BaseException", "the run stopped here")


class PauseHost(Protocol):
    """What the pausing unit needs from the boundary that owns it."""

    run_id: str
    store: Store
    catalog: Catalog
    policy: policy_mod.Policy
    limits: "Limits"
    journaled_bytes: int
    on_approval: Approver | None
    state: "AttemptState"
    execution: "Execution | None"
    clock: Callable[[], float]
    secret: bytes  # signs wait keys
    keyring: Keyring  # older secrets in it: keys handed out before a rotation stay the waits' keys
    session: str | None
    inline_sleep_seconds: float  # sleeps up to this long are waited out, not parked

    @property
    def journal(self) -> dict[int, CallRecord]:
        """The run's journal entries this attempt knows, by seq."""

    @property
    def last_recorded_seq(self) -> int:
        """The highest seq earlier attempts recorded: a live call past it is new."""

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""

    def woke_idle(self) -> None:
        """Wake ``wait_idle`` after ``state.inflight`` was lowered to 0 outside a call's own end."""

    async def send_approved(self, seq: int, tool: "Tool", args: dict[str, Any], t: float) -> Any:
        """Send a write already in state approved; its outcome for the program."""

    async def move_call(self, seq: int, expect: list[str], **fields: Any) -> bool:
        """Move a journaled call on from one of `expect` (signed, compare-and-set)."""

    async def record_intent(self, seq: int, op: str, address: str, args: dict[str, Any], key: str, kind: str,
                            state: CallState, existing: CallRecord | None) -> None:
        """Journal a call before it is sent (write-ahead)."""

    def journal_room(self, size: int, what: str, part: str) -> GuestRaise | None:
        """Count a value against the journal's limits; the error to raise if it does not fit."""

    def remember(self, err: GuestRaise, seq: int, address: str) -> None:
        """Note an error raised into the program as this call's."""

    async def record_rejected(self, seq: int, op: str, address: str, args: dict[str, Any], kind: str,
                              err: GuestRaise, *, key: str | None = None,
                              existing: CallRecord | None = None) -> None:
        """Journal a call refused before it was sent, as failed with `err`."""

    async def record_new(self, record: CallRecord) -> None:
        """Sign and store a new journal entry, after the reads still buffered."""

    def stat(self, seq: int, op: str, address: str, kind: str, state: str, t: float) -> None:
        """Count a finished call in the attempt's stats and progress."""


class Pauses:
    """Stops one attempt at a host call: pauses, parks, and the calls held meanwhile."""

    def __init__(self, host: PauseHost, pause_sink: Callable[[Any, Stop], Awaitable[None]], *,
                 batch_window_seconds: float = 0.05) -> None:
        self.host = host
        self.pause_sink = pause_sink  # called with (host, pending): saves the state before the program unwinds
        # A write pause is stored once the program has issued no call for this
        # long, so writes issued together (asyncio.gather) pause as one batch (P-27).
        self.batch_window_seconds = batch_window_seconds
        self._release = asyncio.Event()

    async def hold(self, seq: int, op: str, address: str, args: dict[str, Any]) -> Any:
        """Park a call issued while the attempt is stopping; it is not journaled.

        Once the stop is recorded the call is answered with a BaseException,
        which unwinds the program (its state is already saved, or no longer wanted)
        so its worker can be reused instead of killed.
        """
        self.host.state.held.append({"seq": seq, "op": op, "address": address, "args": args})
        await self._release.wait()
        raise _UNWIND

    def release_held(self) -> None:
        self._release.set()

    @contextlib.asynccontextmanager
    async def _in_flight(self, delta: int = 1) -> AsyncIterator[None]:
        """Count this call in (or, with -1, out of) the calls in flight a stop waits for, while inside."""
        self._count(delta)
        try:
            yield
        finally:
            self._count(-delta)

    def _count(self, delta: int) -> None:
        st = self.host.state
        st.inflight += delta
        if st.inflight == 0:
            self.host.woke_idle()

    def reset(self) -> None:
        """Hold calls again (the attempt starts over from call 1)."""
        self._release = asyncio.Event()

    async def park(self, pending: ParkedWait) -> Any:
        """Stop the program until the wait is settled; like a pause, but for the world to answer."""
        return await self.stop_at(pending, Parked(pending))

    async def wait(self, seq: int, op: str, args: dict[str, Any], key: str, decision: Any) -> Any:
        """wait_for / wait_for_signal / sleep: settle now, or park the run (P-18)."""
        host = self.host
        pos, kw = list(args.get("args", ())), dict(args.get("kwargs", {}))
        t = time.perf_counter()
        name: str
        timeout: float | None
        try:
            if op == "sleep":
                seconds = float(pos[0] if pos else kw.get("seconds", 0))
                name, timeout = f"{SLEEP_PREFIX}{seq}", max(seconds, 0.0)
                if timeout > host.limits.max_sleep_seconds and decision.entry is None:
                    err = guest_error("sleep_too_long",
                                      f"a sleep of {seconds:g} s is longer than limits.max_sleep_seconds "
                                      f"({host.limits.max_sleep_seconds:g} s); the run was not parked", "ValueError")
                    await host.record_rejected(seq, op, op, args, "wait", err, key=key)
                    raise err
            else:
                given = pos[0] if pos else kw.get("name")
                given_timeout = pos[1] if len(pos) > 1 else kw.get("timeout")
                if not isinstance(given, str) or not given:
                    raise TypeError("needs a non-empty name")
                name = given
                problem = wait_name_problem(name)
                if problem:
                    raise ValueError(problem)
                timeout = float(given_timeout) if given_timeout is not None else None
                if op == "wait_for_signal":
                    name = SIGNAL_PREFIX + name
        except (TypeError, ValueError, IndexError) as exc:
            err = guest_error("invalid_arguments", f"{op}: {exc}", "TypeError")
            await host.record_rejected(seq, op, op, args, "wait", err, key=key, existing=decision.entry)
            raise err from None
        entry = decision.entry
        now = host.clock()
        if entry is None:
            entry = CallRecord(host.run_id, seq, op, name, args, key, "wait", CallState.WAITING, started_at=now)
            await host.record_new(entry)
        # The deadline counts from when the program first reached the wait, so
        # a restart continues with only the remaining time.
        deadline = None if timeout is None else (entry.started_at or now) + timeout
        astore = AsyncStore(host.store)  # off the event loop on Postgres (D-27)
        wkey = await astore.call(key_for, host.store, host.secret, host.run_id, name, host.keyring.previous)
        row = await astore.call(host.store.create_wait, WaitRecord(
            wkey, host.run_id, name, WaitStatus.PENDING, now, seq=seq, deadline=deadline, session=host.session))
        if row.status == WaitStatus.PENDING and deadline is not None and now >= deadline:
            status = WaitStatus.RESOLVED if op == "sleep" else WaitStatus.TIMEOUT
            _, row = await astore.call(host.store.settle_wait, WaitRecord(wkey, host.run_id, name, status, now,
                                                                          seq=seq, resolved_at=now))
        # (A sleep always has a deadline.)
        if (row.status == WaitStatus.PENDING and op == "sleep" and deadline is not None
                and deadline - now <= host.inline_sleep_seconds):
            # A short sleep is cheaper to wait out than to park.
            await asyncio.sleep(max(0.0, deadline - now))
            _, row = await astore.call(host.store.settle_wait, WaitRecord(
                wkey, host.run_id, name, WaitStatus.RESOLVED, host.clock(), seq=seq, resolved_at=host.clock()))
        if row.status == WaitStatus.PENDING:
            kind: Literal["wait", "signal", "sleep"] = (
                "sleep" if op == "sleep" else "signal" if op == "wait_for_signal" else "wait")
            return await self.park(ParkedWait(kind, seq, op, args, name, wkey, deadline))
        # Settled: journal the outcome, then answer the program.
        if row.status == WaitStatus.RESOLVED:
            refused = host.journal_room(journal.value_size(row.value), name, "result")
            if refused is not None:
                await host.move_call(seq, [CallState.WAITING], state=CallState.FAILED, error=err_json(refused),
                                      finished_at=host.clock())
                if host.state.failure is not None:
                    return await self.hold(seq, op, op, args)
                host.remember(refused, seq, name)
                raise refused
            await host.move_call(seq, [CallState.WAITING], state=CallState.DONE, outcome=row.value,
                                  finished_at=host.clock())
            host.stat(seq, op, name, "wait", CallState.DONE, t)
            return row.value
        if row.status == WaitStatus.TIMEOUT:
            err = guest_error("wait_timeout", f"{name} was not resolved within {timeout:g} s", "TimeoutError")
        elif row.status == WaitStatus.FAILED:
            err = guest_error("wait_failed", f"{name}: {(row.error or {}).get('message', 'failed')}", "RuntimeError")
        elif row.status == WaitStatus.CANCELLED:
            err = guest_error("wait_cancelled", f"{name} was cancelled", "RuntimeError")
        else:
            err = guest_error("wait_revoked", f"{name} was revoked", "RuntimeError")
        await host.move_call(seq, [CallState.WAITING], state=CallState.FAILED, error=err_json(err),
                              finished_at=host.clock())
        host.stat(seq, op, name, "wait", CallState.FAILED, t)
        host.remember(err, seq, name)
        raise err

    async def ask(self, seq: int, tool: Tool, args: dict[str, Any], valid: dict[str, Any], t: float,
                  entry: CallRecord | None = None) -> Any:
        host = self.host
        pending = AskedWrite.of(seq, tool, args)
        # A rule that requires a signed-in approver keeps the write from an inline
        # approver (an MCP client's form): the run pauses for the console, a
        # signed-in link page or the operator, unless the approver is the operator's own prompt.
        inline = host.on_approval is not None and (
            policy_mod.rule_approver(host.policy, tool.address) != "signed_in"
            or getattr(host.on_approval, "signed_in", False))
        if host.on_approval is not None and inline:
            from tether._engine.approvals.model import approval_verdict

            answer = host.on_approval(pending.for_approver())
            verdict, reason = approval_verdict(await answer if inspect.isawaitable(answer) else answer)
            await self._record_inline_decision(seq, tool.address, "approve" if verdict == "approve" else "decline",
                                               reason)
            if verdict == "approve":
                await host.move_call(seq, [CallState.ASKED], state=CallState.APPROVED)
                return await host.send_approved(seq, tool, valid, t)
            err = guest_error(
                "write_declined",
                f"the write {tool.address} was declined{': ' + reason if reason else ''}; it was not sent",
                "PermissionError",
            )
            await host.move_call(seq, [CallState.ASKED], state=CallState.DECLINED, error=err_json(err),
                                 finished_at=host.clock())
            host.remember(err, seq, tool.address)
            raise err
        # Pause: the first write to ask pauses the run; writes issued with it
        # that ask too join its batch (P-27); other calls are held (P-4).
        return await self.stop_at(pending, Paused(pending))

    async def _record_inline_decision(self, seq: int, address: str, decision: str, reason: str | None) -> None:
        """Who decided a write asked inline, and through what (P-29): the approver may say, else `prompt`."""
        from tether._engine.approvals.model import Decision

        host = self.host
        taken = Decision(seq, decision, reason, actor=getattr(host.on_approval, "actor", None),
                         via=getattr(host.on_approval, "via", "prompt"), at=host.clock())
        await AsyncStore(host.store).add_event(host.run_id, "decided", taken.event(address), host.clock())

    async def join_batch(self, seq: int, address: str, args: dict[str, Any]) -> Any:
        """A call issued while a write pause forms: a write that would ask joins the pause (P-27).

        Everything else — reads, writes that policy allows or denies, a write
        past the budget counting the batch, invalid calls — is held and issued
        again when the run continues, exactly as before batches existed.
        """
        host = self.host
        st = host.state
        batch = st.batch
        joined = False
        try:
            tool = host.catalog.get(address)
        except UnknownTool:
            tool = None
        if tool is not None and tool.is_write and seq <= host.limits.host_calls and batch is not None:
            try:
                host.catalog.validate_args(address, args)
                key, size = journal.call_key_and_size("tool", address, args)
            except (InvalidArguments, TypeError, ValueError):
                key, size = None, 0
            if key is not None:
                decision = journal.decide(host.journal.get(seq), key, seq, host.last_recorded_seq)
                # Arguments the journal cannot take are refused when the call is issued again (P-22).
                fits = (size <= host.limits.journal_value_bytes
                        and host.journaled_bytes + size <= host.limits.journal_bytes)
                if decision.action == journal.ASK:
                    joined = True  # asked before this attempt and still undecided
                elif decision.action == journal.LIVE and decision.entry is None and fits:
                    # The first write of the pause and the batch are not spent yet
                    # but may all be approved: count them against the budget.
                    prospective = st.writes_spent + 1 + len(batch)
                    if policy_mod.decide_call(host.policy, address, True, prospective) == policy_mod.ASK:
                        host.journal_room(size, address, "arguments")
                        # Counted in flight while its intent is stored (an await, off the loop on
                        # Postgres): the pause waits for it to join before the state is saved.
                        async with self._in_flight():
                            await host.record_intent(seq, "tool", address, args, key, "write", CallState.ASKED, None)
                        joined = True
        if joined and tool is not None and batch is not None and st.batch is batch:
            batch.append(AskedWrite.of(seq, tool, args))
        return await self.hold(seq, "tool", address, args)

    async def stop_at(self, pending: AskedWrite | ParkedWait, stop: Stopped) -> Any:
        """Pause or park at this call (P-4, P-18): the first call to stop wins; later ones are held."""
        host = self.host
        st = host.state
        if st.pausing:
            # A call issued before the stop began that reached it after (its intent was being
            # stored): a write that asks joins a forming batch (P-27), as join_batch takes one
            # issued later; either way it is held, and no longer in flight.
            if isinstance(pending, AskedWrite) and st.batch is not None:
                st.batch.append(pending)
            call = pending.call()
            async with self._in_flight(-1):
                return await self.hold(call["seq"], call["op"], call["address"], call["args"])
        st.pausing = True
        is_write_pause = isinstance(stop, Paused)
        if is_write_pause:
            st.batch = []
        # Calls in flight finish and are journaled before the snapshot is stored.
        st.inflight -= 1  # this call waits, it is not dispatching
        try:
            while True:
                await host.wait_idle()
                for _ in range(3):
                    await asyncio.sleep(0)
                # Gathered calls reach the host one sandbox round trip apart:
                # a write pause waits until the program has gone quiet.
                quiet = time.monotonic() - st.last_arrival
                if not is_write_pause or (quiet >= self.batch_window_seconds and st.inflight == 0):
                    break
                await asyncio.sleep(self.batch_window_seconds - quiet)
        finally:
            st.inflight += 1
        stopped: Stop
        if isinstance(pending, AskedWrite):
            batch, st.batch = st.batch or [], None
            stopped = WritePause(pending, tuple(sorted([pending, *batch], key=lambda w: w.seq)))
        else:
            stopped = pending
        await self.pause_sink(host, stopped)
        # The state is saved: end the execution and unwind the program; what it
        # does while unwinding is never sent nor recorded.
        if host.execution is not None:  # set for as long as a program runs, which is when a call stops
            host.execution.stop(stop)
        self.release_held()
        raise _UNWIND
