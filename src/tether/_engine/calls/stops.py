"""Stops: how an attempt pauses or parks at a host call (P-4, P-18, P-27).

A write that asks pauses the run; a durable wait, a signal or a long sleep
parks it. Both take one path (:meth:`Stops.stop_at`): calls in flight finish
and are journaled, the state is handed to the pause sink (which dumps and
stores it), and the program is unwound. Calls issued while the attempt stops
are held, not journaled; a write that would ask joins a forming write pause.

:class:`Stops` is owned by the :class:`~tether._engine.calls.boundary.EffectBoundary`
of one attempt and reaches it only through :class:`StopHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Literal, Protocol

from tether._engine.attempt.guest_errors import err_json, guest_error
from tether._engine.attempt.inputs import wait_name_problem
from tether._engine.attempt.pending import AskedWrite, ParkedWait, Stop, WritePause, reasons_of
from tether._engine.calls import replay
from tether._engine.calls.call import Call
from tether._engine.calls.ledger import Ledger, value_size
from tether._engine.rules import policy as policy_mod
from tether._engine.waits import SIGNAL_PREFIX, SLEEP_PREFIX, reserved_name_problem
from tether._sandbox.monty import GuestRaise, Stopped
from tether._store.base import CallRecord, Store
from tether._store.states import CallState, WaitStatus
from tether.errors import InvalidArguments, UnknownTool

if TYPE_CHECKING:
    from tether._engine.approvals.model import Approver
    from tether._engine.attempt.state import AttemptState
    from tether._engine.rules.limits import Limits
    from tether._engine.waits import Waits
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


class StopHost(Protocol):
    """What the stops unit needs from the boundary that owns it."""

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
    waits: "Waits"  # the one place wait rows are written (their keys signed, rotations kept)
    session: str | None
    inline_sleep_seconds: float  # sleeps up to this long are waited out, not parked
    held_records: dict[int, dict[str, Any]]  # calls a snapshot lists as held, by seq, as its signed record has them

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""

    def woke_idle(self) -> None:
        """Wake ``wait_idle`` after ``state.inflight`` was lowered to 0 outside a call's own end."""

    async def send_approved(self, call: Call, tool: "Tool", args: dict[str, Any], t: float) -> Any:
        """Send a write already in state approved; its outcome for the program."""

    async def judge_write(self, call: Call, tool: "Tool", valid: dict[str, Any]) -> dict[str, Any]:
        """A write under writes = "guard": its verdict and reasons (P-45)."""

    def journal_room(self, size: int, what: str, part: str) -> GuestRaise | None:
        """Count a value against the journal's limits; the error to raise if it does not fit."""

    def remember(self, err: GuestRaise, seq: int, address: str) -> None:
        """Note an error raised into the program as this call's."""

    async def record_rejected(self, call: Call, kind: str, err: GuestRaise, *,
                              existing: CallRecord | None = None) -> None:
        """Journal a call refused before it was sent, as failed with `err`."""

    def stat(self, seq: int, op: str, address: str, kind: str, state: str, t: float) -> None:
        """Count a finished call in the attempt's stats and progress."""


class Stops:
    """Stops one attempt at a host call: pauses, parks, and the calls held meanwhile.

    It owns what stopping knows (whether a stop is under way, the write batch
    forming, the calls held) and journals through the attempt's ledger; the
    boundary that owns it reads ``pausing`` and ``batch`` to route a call here.
    """

    def __init__(self, host: StopHost, ledger: Ledger, pause_sink: Callable[[Any, Stop], Awaitable[bool]], *,
                 batch_window_seconds: float = 0.05) -> None:
        self.host = host
        self.ledger = ledger
        self.pause_sink = pause_sink  # called with (host, pending): saves the state before the program unwinds
        # A write pause is stored once the program has issued no call for this
        # long, so writes issued together (asyncio.gather) pause as one batch (P-27).
        self.batch_window_seconds = batch_window_seconds
        self.reset()

    def reset(self) -> None:
        """Nothing stopped, nothing held (an attempt, or a replay starting over from call 1)."""
        self._release = asyncio.Event()
        self.pausing = False  # a pause or a park is under way: later calls are held
        self.held: list[dict[str, Any]] = []  # calls issued while stopping, listed in the dump (P-9)
        # While a write pause forms: the other writes that ask, issued with it (P-27).
        self.batch: list[AskedWrite] | None = None
        self.last_arrival = 0.0  # time.monotonic() of the latest call the program issued
        # While a restored program's waiting calls are answered (EffectBoundary.answer_restored): those
        # calls. A stop then is not one call's: its dump waits on them all, and no call is held.
        self.answering: list[dict[str, Any]] | None = None

    def waits_on(self, stop: Stop) -> list[dict[str, Any]]:
        """The calls a stop's dump waits on, by seq: the restored ones being answered, else the call that
        stopped and those held meanwhile (P-9)."""
        calls = list(self.answering) if self.answering is not None else [stop.call(), *self.held]
        return sorted(calls, key=lambda c: c["seq"])

    def arrived(self) -> None:
        """The program issued a call: a forming write pause waits until it goes quiet."""
        self.last_arrival = time.monotonic()

    async def hold(self, call: Call) -> Any:
        """Park a call issued while the attempt is stopping; it is not journaled.

        Once the stop is recorded the call is answered with a BaseException,
        which unwinds the program (its state is already saved, or no longer wanted)
        so its worker can be reused instead of killed.
        """
        self.held.append({**call.held(), "at": self.host.clock()})
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

    async def park(self, pending: ParkedWait) -> Any:
        """Stop the program until the wait is settled; like a pause, but for the world to answer."""
        return await self.stop_at(pending, Parked(pending))

    async def wait(self, call: Call, decision: Any) -> Any:
        """wait_for / wait_for_signal / sleep: settle now, or park the run (P-18)."""
        host = self.host
        seq, op, args, key = call.seq, call.op, call.args, call.key
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
                    await host.record_rejected(call, "wait", err)
                    raise err
            else:
                given = pos[0] if pos else kw.get("name")
                given_timeout = pos[1] if len(pos) > 1 else kw.get("timeout")
                if not isinstance(given, str) or not given:
                    raise TypeError("needs a non-empty name")
                name = given
                problem = wait_name_problem(name) or (reserved_name_problem(name) if op == "wait_for" else None)
                if problem:
                    raise ValueError(problem)
                timeout = float(given_timeout) if given_timeout is not None else None
                if op == "wait_for_signal":
                    name = SIGNAL_PREFIX + name
        except (TypeError, ValueError, IndexError) as exc:
            err = guest_error("invalid_arguments", f"{op}: {exc}", "TypeError")
            await host.record_rejected(call, "wait", err, existing=decision.entry)
            raise err from None
        entry = decision.entry
        now = host.clock()
        if entry is None:
            entry = CallRecord(host.run_id, seq, op, name, args, key, "wait", CallState.WAITING,
                               started_at=self._first_reached(call, now))
            await self.ledger.record_new(entry)
        # The deadline counts from when the program first reached the wait, so
        # a restart continues with only the remaining time.
        deadline = None if timeout is None else (entry.started_at or now) + timeout
        # Wait rows are the waits service's (waits.py); off the event loop on Postgres (D-27).
        astore = host.store.aio
        wkey, row = await astore.call(host.waits.reach, host.run_id, name, seq=seq, deadline=deadline,
                                      session=host.session)
        if row.status == WaitStatus.PENDING and deadline is not None and now >= deadline:
            status = WaitStatus.RESOLVED if op == "sleep" else WaitStatus.TIMEOUT
            row = await astore.call(host.waits.end, wkey, host.run_id, name, seq=seq, status=status)
        # (A sleep always has a deadline.)
        if (row.status == WaitStatus.PENDING and op == "sleep" and deadline is not None
                and deadline - now <= host.inline_sleep_seconds):
            # A short sleep is cheaper to wait out than to park.
            await asyncio.sleep(max(0.0, deadline - now))
            row = await astore.call(host.waits.end, wkey, host.run_id, name, seq=seq, status=WaitStatus.RESOLVED)
        if row.status == WaitStatus.PENDING:
            kind: Literal["wait", "signal", "sleep"] = (
                "sleep" if op == "sleep" else "signal" if op == "wait_for_signal" else "wait")
            return await self.park(ParkedWait(kind, seq, op, args, name, wkey, deadline))
        # Settled: journal the outcome, then answer the program.
        if row.status == WaitStatus.RESOLVED:
            refused = host.journal_room(value_size(row.value), name, "result")
            if refused is not None:
                await self.ledger.move(seq, [CallState.WAITING], state=CallState.FAILED, error=err_json(refused),
                                      finished_at=host.clock())
                if host.state.failure is not None:
                    return await self.hold(call)
                host.remember(refused, seq, name)
                raise refused
            await self.ledger.move(seq, [CallState.WAITING], state=CallState.DONE, outcome=row.value,
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
        await self.ledger.move(seq, [CallState.WAITING], state=CallState.FAILED, error=err_json(err),
                              finished_at=host.clock())
        host.stat(seq, op, name, "wait", CallState.FAILED, t)
        host.remember(err, seq, name)
        raise err

    def _first_reached(self, call: Call, now: float) -> float:
        """When the program first reached this wait: a wait held while the run stopped at another one (two
        tasks each waiting or sleeping) was reached then, and its deadline counts from then (P-18)."""
        held = self.host.held_records.get(call.seq)
        if held is None or held.get("address") != call.address or held.get("args") != call.args:
            return now
        at = held.get("at")
        # Signed with the snapshot's record (P-35); never later than now, so it can only shorten the wait.
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
            return now
        return min(float(at), now)

    async def ask(self, call: Call, tool: Tool, valid: dict[str, Any], t: float) -> Any:
        """A write that asks: decided at once by an inline approver, or the run pauses (P-4, P-27)."""
        host = self.host
        seq = call.seq
        pending = AskedWrite.of(seq, tool, call.args, reasons_of(self.ledger.get(seq)))
        # A rule that requires a signed-in approver keeps the write from an inline
        # approver (an MCP client's form): the run pauses for the console, a
        # signed-in link page or the operator, unless the approver is the operator's own prompt.
        inline = host.on_approval is not None and (
            policy_mod.rule_approver(host.policy, tool.address) != "signed_in"
            or getattr(host.on_approval, "signed_in", False))
        if host.on_approval is not None and inline:
            from tether._engine.approvals.model import approval_verdict

            answer = host.on_approval(pending.for_approver())
            if inspect.isawaitable(answer):
                # A person may take their time: the end of a program that left this write behind does not
                # wait for them (P-50).
                host.state.approving += 1
                try:
                    answer = await answer
                finally:
                    host.state.approving -= 1
            verdict, reason = approval_verdict(answer)
            await self._record_inline_decision(seq, tool.address, "approve" if verdict == "approve" else "decline",
                                               reason)
            if verdict == "approve":
                if not await self.ledger.move(seq, [CallState.ASKED], state=CallState.APPROVED):
                    # Settled meanwhile: its program ended before the approver answered (D-82). Not sent.
                    raise _UNWIND
                return await host.send_approved(call, tool, valid, t)
            err = guest_error(
                "write_declined",
                f"the write {tool.address} was declined{': ' + reason if reason else ''}; it was not sent",
                "PermissionError",
            )
            await self.ledger.move(seq, [CallState.ASKED], state=CallState.DECLINED, error=err_json(err),
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
        await host.store.aio.add_event(host.run_id, "decided", taken.event(address), host.clock())

    async def join_batch(self, call: Call) -> Any:
        """A call issued while a write pause forms: a write that would ask joins the pause (P-27).

        Everything else — reads, writes that policy allows or denies, a write
        past the budget counting the batch, invalid calls — is held and issued
        again when the run continues, exactly as before batches existed.
        """
        host = self.host
        st = host.state
        seq, address, args = call.seq, call.address, call.args
        batch = self.batch
        joined = False
        try:
            tool = host.catalog.get(address)
        except UnknownTool:
            tool = None
        if tool is not None and tool.is_write and seq <= host.limits.host_calls and batch is not None:
            try:
                host.catalog.validate_args(address, args)
                valid = True
            except InvalidArguments:
                valid = False
            if valid:
                decision = replay.decide(self.ledger.get(seq), call.key, seq, self.ledger.last_recorded_seq)
                # Arguments the journal cannot take are refused when the call is issued again (P-22).
                size = call.size
                fits = (size <= host.limits.journal_value_bytes
                        and host.journaled_bytes + size <= host.limits.journal_bytes)
                if decision.action == replay.ASK:
                    joined = True  # asked before this attempt and still undecided
                elif decision.action == replay.LIVE and decision.entry is None and fits:
                    # The first write of the pause and the batch are not spent yet
                    # but may all be approved: count them against the budget.
                    prospective = st.writes_spent + 1 + len(batch)
                    verdict = policy_mod.decide_call(host.policy, address, True, prospective)
                    lineage = None
                    if verdict == policy_mod.GUARD:
                        async with self._in_flight():
                            lineage = await host.judge_write(call, tool, args)
                        verdict = policy_mod.ASK if lineage["ask"] else policy_mod.ALLOW
                    if verdict == policy_mod.ASK:
                        host.journal_room(size, address, "arguments")
                        # Counted in flight while its intent is stored (an await, off the loop on
                        # Postgres): the pause waits for it to join before the state is saved.
                        async with self._in_flight():
                            await self.ledger.record_intent(call, "write", CallState.ASKED, None, lineage)
                        joined = True
        if joined and tool is not None and batch is not None and self.batch is batch:
            batch.append(AskedWrite.of(seq, tool, args, reasons_of(self.ledger.get(seq))))
        return await self.hold(call)

    async def stop_at(self, pending: AskedWrite | ParkedWait, stop: Stopped) -> Any:
        """Pause or park at this call (P-4, P-18): the first call to stop wins; later ones are held."""
        host = self.host
        st = host.state
        if self.pausing:
            # A call issued before the stop began that reached it after (its intent was being
            # stored): a write that asks joins a forming batch (P-27), as join_batch takes one
            # issued later; either way it is held, and no longer in flight.
            if isinstance(pending, AskedWrite) and self.batch is not None:
                self.batch.append(pending)
            async with self._in_flight(-1):
                return await self.hold(Call(**pending.call()))
        self.pausing = True
        is_write_pause = isinstance(stop, Paused)
        if is_write_pause:
            self.batch = []
        # Calls in flight finish and are journaled before the snapshot is stored.
        st.inflight -= 1  # this call waits, it is not dispatching
        try:
            while True:
                await host.wait_idle()
                for _ in range(3):
                    await asyncio.sleep(0)
                # Gathered calls reach the host one sandbox round trip apart:
                # a write pause waits until the program has gone quiet.
                quiet = time.monotonic() - self.last_arrival
                if not is_write_pause or (quiet >= self.batch_window_seconds and st.inflight == 0):
                    break
                await asyncio.sleep(self.batch_window_seconds - quiet)
        finally:
            st.inflight += 1
        if self.ledger.program_ended:
            # The program ended while the stop formed (a write it never awaited): there is nothing to pause;
            # the run's end settles the write (D-82).
            self.release_held()
            raise _UNWIND
        stopped: Stop
        if isinstance(pending, AskedWrite):
            batch, self.batch = self.batch or [], None
            stopped = WritePause(pending, tuple(sorted([pending, *batch], key=lambda w: w.seq)))
        else:
            stopped = pending
        if not await self.pause_sink(host, stopped):
            # The program ended while its state was being saved: nothing was stored, the run's end settles
            # what the stop was for (P-50, P-52).
            self.release_held()
            raise _UNWIND
        # The state is saved: end the execution and unwind the program; what it
        # does while unwinding is never sent nor recorded.
        if host.execution is not None:  # set for as long as a program runs, which is when a call stops
            host.execution.stop(stop)
        self.release_held()
        raise _UNWIND
