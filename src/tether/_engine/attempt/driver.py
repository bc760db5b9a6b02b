"""One attempt of a run, as an object: prepare, restore or replay, run, pause or park, finish.

An :class:`Attempt` takes the :class:`~tether._engine.engine.Engine` (the
store, the keyring that signs, the clock, the catalog, the sandbox pool, the
event bus, the finisher, the waits and sessions services) and the caller's
:class:`~tether._engine.engine.Hooks`, never the runtime, so it reads on its
own and nothing here reaches into another module's state.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import functools
import json
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from tether._engine.approvals import service as approvals
from tether._engine.attempt import telemetry
from tether._engine.attempt.envelopes import (
    LogBuffer,
    diagnostics,
    failure_error,
    paused_envelope,
    waiting_envelope,
)
from tether._engine.attempt.pending import ParkedWait, Stop, as_stored
from tether._engine.attempt.restore import SnapshotMismatch
from tether._engine.attempt.result import RunResult, preview, to_json_value
from tether._engine.attempt.spec import prepare
from tether._engine.calls import ledger
from tether._engine.calls.boundary import SPENT_STATES, Cancelled, EffectBoundary
from tether._engine.calls.resend import resendable
from tether._engine.calls.stops import Parked, Paused
from tether._engine.engine import NO_HOOKS, Hooks
from tether._engine.events import EventBus
from tether._engine.integrity import (
    sign_run,
    sign_snapshot_record,
    verify_calls,
    verify_run,
    verify_snapshot_record,
)
from tether._engine.lifecycle import outcome_unknown
from tether._engine.notices import CANCEL, wait_a_little
from tether._engine.rules import policy as policy_mod
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._engine.rules.quarantine import takeovers, without_takeovers
from tether._hostwork import HostBudget, off_loop
from tether._sandbox.monty import MONTY_VERSION, DumpNotAtCall, ProgramFailed, Reserved, SandboxSpec, Stopped
from tether._store.base import CallRecord, ParkEvent, RunRecord, SnapshotRecord, WaitRecord
from tether._store.states import CallState, RunStatus
from tether.errors import (
    ExecutionDiverged,
    HostWorkTimeout,
    LimitExceeded,
    RunTampered,
    SandboxCrashed,
    SnapshotTampered,
    TetherError,
    TypeCheckError,
    WrongSecret,
)

if TYPE_CHECKING:
    from tether._engine.engine import Engine
    from tether._engine.lineage.guard import Guard

EMIT_BUDGET_BYTES = 4 * 1024 * 1024


class Attempt:
    """One stretch of running a run in this process: fresh, restore (a signed snapshot) or replay (the journal).

    ``mode`` is "fresh" or "continue" (restore when a usable snapshot exists, else replay).
    """

    def __init__(self, run: RunRecord, engine: Engine, *, mode: str, hooks: Hooks = NO_HOOKS,
                 t0: float | None = None) -> None:
        self.run = run
        self.deps = engine
        # The engine's knobs as they are now: one attempt sees one set.
        self.settings = engine.settings.copy()
        # The store as the attempt awaits it: on Postgres its calls leave the event loop (D-27).
        self.astore = engine.astore
        self.mode = mode
        self.hooks = hooks
        self.t0 = time.perf_counter() if t0 is None else t0
        self.span: Any = None
        self.limits = _LIMITS(run.limits)
        # Host work done for this program (built-ins, the check, stubs) counts against its time limit.
        self.host_budget = HostBudget(self.limits.run_seconds)
        self.policy = _POLICY(run.policy)
        self.logs = LogBuffer(self.limits.log_bytes)
        self.snapshot: SnapshotRecord | None = None
        # Seqs the latest genuine snapshot's signed record waits on: those the journal lacks were held while
        # its pause formed, never sent, and a replay issues them rather than reading a gap (D-80).
        self.listed: list[dict[str, Any]] = []
        self.entries: list[CallRecord] = []
        self.writes_spent: int | None = None
        # A continued run's (journal bytes, writes spent, output events), read with its journal (prepare).
        self.totals: tuple[int, int, int] = (0, 0, 0)
        self.kind = "fresh"  # fresh | restore | replay
        self.boundary: EffectBoundary | None = None
        self.setup_ms = 0.0
        self.t_exec = 0.0
        self.stopped_at: RunResult | None = None  # the paused / waiting envelope, once it stops at a call
        self.checkpoints_off: str | None = None  # why, once a checkpoint could not be taken
        self.extra_notes: list[str] = []
        self.verdict_key: str | None = None  # set by spec.prepare when the sandbox type-checks the program

    # -- the whole attempt ---------------------------------------------------------

    async def run_to_end(self) -> RunResult:
        """Run the attempt; its envelope. A bug in tether ends the run ``internal_error``, never ``running``."""
        try:
            with telemetry.run_span(self.run.run_id, self.mode) as span:
                self.span = span if span.is_recording() else None
                result = await self._run_refusing_forgeries()
                if self.span is not None:
                    span.set_attribute("tether.status", result.status)
                    if result.error:
                        span.set_attribute("tether.error", str(result.error.get("code")))
                return result
        except TetherError:
            # A named failure outside the program (the store, sources): the
            # caller is told; the run is handled by its own rules.
            raise
        except Exception as exc:  # a bug or a value tether could not handle: the run ends, the host goes on
            if self.boundary is not None:
                # Reads a returned program left for its end to write (P-7): written before it ends, if the
                # store lets them be.
                with contextlib.suppress(Exception):
                    await self.boundary.flush()
            return self.deps.finisher.internal_error(self.run, exc)
        finally:
            # The boundary calls back into this attempt (pause, checkpoint) and its Stops back into the boundary:
            # with the attempt over (its boundary closed and out of attempts.live), both cycles are cut so the
            # attempt's graph is freed at once by reference counting, not by the cyclic collector (core_bench.py).
            boundary, self.boundary = self.boundary, None
            if boundary is not None:
                boundary.stops.host = None  # type: ignore[assignment]

    async def _run_refusing_forgeries(self) -> RunResult:
        try:
            ended = await self.prepare()
            if ended is not None:
                return ended
            return await self.execute()
        except (RunTampered, SnapshotTampered, WrongSecret) as exc:
            # P-35: refused before anything was sent; the run ends here instead of staying running.
            return self.deps.finisher.refused(self.run, exc)

    # -- prepare: verify, settle what a dead attempt left, restore or replay ---------

    async def prepare(self) -> RunResult | None:
        """Verify the run and read what continuing it needs; an envelope if it ends here."""
        d, run = self.deps, self.run
        verify_run(d.keyring, run)
        if self.mode != "fresh":
            # Read once, checked below in the order they are acted on (D-49: the journal was read twice,
            # its totals three times over).
            snapshot = await self.astore.latest_snapshot(run.run_id)
            # Checked now, refused below (after what a dead attempt left is settled, as before): a forged
            # snapshot does not get to say which part of the journal is read.
            genuine: bool | WrongSecret
            try:
                genuine = snapshot is not None and verify_snapshot_record(d.keyring, snapshot)
            except WrongSecret as exc:
                genuine = exc  # raised where it was before
            low = self._restore_from(snapshot) if genuine is True else None
            # A restore never re-issues calls before its snapshot: read only the calls it waits on and those
            # after, and one more, the first one's MAC chains to it, so resuming does not slow down with the
            # length of the journal. Every write a dead attempt left `sending` is among them: one in flight
            # when the snapshot was taken is one it waits on, and any later is after it.
            self.entries = await self.astore.get_calls(run.run_id, after=low - 2 if low is not None else None)
            self.totals = await self.astore.journal_totals(run.run_id, SPENT_STATES)
            ended = await self._settle_stuck_writes([e for e in self.entries if e.state == CallState.SENDING])
            if ended is not None:
                return ended
            self._restore_or_replay(snapshot, genuine)
        return None

    @staticmethod
    def _restore_from(snapshot: SnapshotRecord | None) -> int | None:
        """The lowest seq a restore from ``snapshot`` needs; None when it will not be restored from."""
        if snapshot is None or snapshot.monty_version != MONTY_VERSION:
            return None
        return int(min([p["seq"] for p in snapshot.pending] + [snapshot.seq + 1]))

    async def _settle_stuck_writes(self, stuck: list[CallRecord]) -> RunResult | None:
        """P-11: a write left `sending` by a dead attempt is never re-sent, unless its tool dedupes by
        idempotency key and has sends left (P-31): then it is re-sent with its recorded key when reached."""
        d, run = self.deps, self.run
        verify_calls(d.keyring, run.run_id, stuck)
        for e in stuck:
            if e.state == CallState.SENDING and resendable(d.catalog, e, self.limits) is None:
                lost, err = outcome_unknown(e)
                await ledger.move_async(self.astore, d.keyring, e, [CallState.SENDING], finished_at=d.clock(), **lost)
                return await d.finisher.end_attempt(run, RunStatus.FAILED, error=err.to_dict(), calls=e.seq)
        return None

    def _restore_or_replay(self, snapshot: SnapshotRecord | None, genuine: bool | WrongSecret) -> None:
        d, run = self.deps, self.run
        if snapshot is not None:
            if isinstance(genuine, WrongSecret):
                raise genuine
            if not genuine:
                # Refuse, do not replay past a forgery.
                raise SnapshotTampered(
                    f"the stored snapshot of run {snapshot.run_id} at call {snapshot.seq} failed its signature "
                    "check; nothing was resumed or sent", details={"seq": snapshot.seq})
            self.listed = list(snapshot.pending)
            if snapshot.monty_version != MONTY_VERSION:
                snapshot = None  # another build cannot load it: replay from the journal (P-12)
        if snapshot is not None:
            # Its entries from the calls it waits on (prepare); the writes spent before them, counted.
            self.writes_spent = self.totals[1]
            if isinstance(run.result, dict):
                # A restore continues the program where it stopped: keep what it
                # printed before. A replay prints it all again by itself.
                for line in run.result.get("logs", []):
                    self.logs("stdout", line + "\n")
        verify_calls(d.keyring, run.run_id, self.entries)
        self.snapshot = snapshot
        self.kind = "restore" if snapshot is not None else "replay"

    # -- run -----------------------------------------------------------------------

    async def execute(self) -> RunResult:
        d, run = self.deps, self.run
        t_setup = time.perf_counter()
        prepared = await prepare(d, run, self.limits, self.host_budget, continuing=self.mode != "fresh")
        spec, refused, self.verdict_key = prepared.spec, prepared.refused, prepared.verdict_key
        # The worker's checkout is started before the rest is built: measured 3-6 % of a short execute
        # (0.94-0.97x paired in one process). It serves no call and writes nothing: the run's row is
        # already written (P-7, P-11).
        # Released below if the program never gets to run in it.
        reserved = await d.pool.reserve(spec) if refused is None and spec is not None else None
        try:
            journaled = self.totals[0]
            boundary = self.boundary = self._boundary(journaled)
            if self.kind == "replay":
                boundary.list_held(self.listed)
            d.attempts.live[run.run_id] = boundary
            heartbeat = _Heartbeat(self, boundary)
            self.setup_ms = (time.perf_counter() - t_setup) * 1000
            self.t_exec = time.perf_counter()
            already_emitted = 0
            if self.mode != "fresh":
                already_emitted = self.totals[2]
            # One output budget per run: images and large values are cut, not dropped silently.
            emitter = Emitter(d.events, run.run_id, 0, EMIT_BUDGET_BYTES)
            session_base = self._session_base() if run.session else None
        except BaseException:
            if reserved is not None:
                reserved.release()
            raise
        try:
            try:
                if refused is not None or spec is None:
                    raise refused or AssertionError("no sandbox spec")
                value = await self._run_once(spec, emitter, already_emitted, session_base, reserved)
            except (SnapshotMismatch, DumpNotAtCall):
                # Nothing was sent: the mapping is checked before any dispatch, and a dump of an ended program
                # answers no call (P-52).
                assert spec is not None  # a mismatch comes from running it
                value = await self._replay(spec, emitter, already_emitted, session_base)
            except _CheckpointSkipped:
                assert spec is not None  # a checkpoint is taken while the program runs
                value = await self._replay(spec, emitter, max(already_emitted, emitter.count), session_base)
        except (Paused, Parked):
            assert self.stopped_at is not None
            return self.stopped_at
        except Cancelled as exc:
            unasked = await boundary.settle_unasked()
            return d.finisher.cancelled(run, exc.reason, logs=self.logs.lines(), calls=boundary.state.issued,
                                        diagnostics=self._diagnostics(), notes=_unasked_notes(unasked))
        except (TetherError, ProgramFailed, Stopped) as exc:
            failure = boundary.state.failure if isinstance(exc, Stopped) and boundary.state.failure else exc
            return await self._failed(failure)
        finally:
            heartbeat.cancel()
            if d.attempts.live.get(run.run_id) is boundary:
                del d.attempts.live[run.run_id]
            if reserved is not None:
                reserved.release()  # nothing if its execution took it
        return await self._completed(value)

    async def _replay(self, spec: SandboxSpec, emitter: "Emitter", already_emitted: int,
                      session_base: bytes | None) -> Any:
        assert self.boundary is not None
        self.kind = "replay"
        self.boundary.reset_for_replay(await self.astore.get_calls(self.run.run_id), listed=self.listed)
        self.logs = LogBuffer(self.limits.log_bytes)
        return await self._run_once(spec, emitter, already_emitted, session_base)

    async def _run_once(self, spec: SandboxSpec, emitter: "Emitter", already_emitted: int,
                        session_base: bytes | None, reserved: Reserved | None = None) -> Any:
        d, run, boundary = self.deps, self.run, self.boundary
        assert boundary is not None
        restore = self.kind == "restore"
        # A restore continues past earlier emits; a replay repeats them.
        emitter.count, emitter.skip = (already_emitted, 0) if restore else (0, already_emitted)
        async with d.pool.execution(spec, boundary.host, self.logs, emitter, reserved=reserved) as execution:
            boundary.execution = execution
            returned = False  # the program returned: its run's end writes the last reads (_completed)
            try:
                if restore:
                    assert self.snapshot is not None
                    boundary.state.issued = self.snapshot.seq
                    value = await execution.resume(self.snapshot.data,
                                                   functools.partial(boundary.answer_restored,
                                                                     list(self.snapshot.pending)))
                else:
                    try:
                        value = await execution.run(run.program, session_base)
                    except TypeCheckError:
                        self._remember_verdict(False)
                        raise
                    except (ProgramFailed, Stopped, LimitExceeded):
                        self._remember_verdict(True)  # it ran: the check passed
                        raise
                    self._remember_verdict(True)
                # From here a call the program issued and never awaited starts no journal entry (D-82).
                boundary.ledger.end_program()
                if run.session:
                    # The globals the next execute of this session starts from (P-21). The run is done and its
                    # writes are sent: state that cannot be saved is a note, never a failure to retry.
                    try:
                        state = await execution.dump()
                    except (LimitExceeded, SandboxCrashed) as exc:
                        self.extra_notes.append(f"the session state was not saved ({exc.message}); session "
                                                f"{run.session!r} keeps the globals of its previous execute")
                    else:
                        await self.astore.call(d.sessions.save, run.session,
                                               run.principal or self.settings.principal, state)
                returned = True
                return value
            finally:
                await boundary.close(hold=returned)
                # The execution holds the boundary's host function: the program has ended, so the pair is
                # let go now, not left a cycle for the collector (core_bench.py).
                boundary.execution = None

    def _remember_verdict(self, passed: bool) -> None:
        """What the type checker said of this program against its stubs: a resent one is not checked again."""
        if self.verdict_key is None:
            return  # the sandbox did not type-check it
        verdicts = self.deps.verdicts
        verdicts[self.verdict_key] = passed
        if len(verdicts) > 1024:
            verdicts.pop(next(iter(verdicts)))

    def _boundary(self, journaled_bytes: int) -> EffectBoundary:
        d, run = self.deps, self.run
        return EffectBoundary(
            run_id=run.run_id,
            store=d.store,
            catalog=d.catalog,
            policy=self.policy,
            limits=self.limits,
            journal_entries=self.entries,
            writes_spent=self.writes_spent,
            on_approval=self.hooks.on_approval,
            builtins_impl=builtins_for(d, run.run_id, self.host_budget),
            pause_sink=self.pause,
            checkpoint_sink=self.checkpoint,
            clock=d.clock,
            keyring=d.keyring,
            waits=d.waits,
            session=run.session,
            on_progress=self.hooks.on_progress,
            on_question=self.hooks.on_question,
            span=self.span,
            inline_sleep_seconds=self.settings.inline_sleep_seconds,
            batch_window_seconds=self.settings.batch_window_seconds,
            journaled_bytes=journaled_bytes,
            guard=self._guard(),
        )

    def _guard(self) -> "Guard | None":
        """What judges the run's writes under writes = "guard" (P-45); None, and nothing imported, otherwise."""
        if self.policy.writes != policy_mod.GUARD:
            return None
        from tether._engine.lineage.guard import Guard
        from tether._engine.lineage.trust import guard_labels

        d = self.deps
        loaded = d.sources.statuses() if d.sources is not None else []
        # The [[sources]] tables' labels and those tools added from Python carry (D-73).
        labels = guard_labels(((s.namespace, s.definition) for s in loaded), d.catalog)
        return Guard(run=self.run, policy=self.policy, labels=labels, astore=d.astore, keyring=d.keyring)

    def _session_base(self) -> bytes | None:
        """The session globals this run started from, recorded on the run so a replay starts there too."""
        run = self.run
        base = (run.meta or {}).get("session_base")
        if not base:
            return None
        data = base64.b64decode(base["data"])
        if base.get("monty_version") != MONTY_VERSION:
            return None
        # str(): the name the base was signed under; a base without a session fails the check, as before.
        self.deps.sessions.verify(str(run.session), run.principal or self.settings.principal, data, base["mac"])
        return data

    # -- pause / park, checkpoints ----------------------------------------------------

    async def pause(self, boundary: EffectBoundary, stop: Stop) -> bool:
        """Stop at a host call: store the signed dump, mark the run paused or waiting (P-10, P-18).

        False, with nothing stored, when the program ended before its state was saved (P-52)."""
        d, run = self.deps, self.run
        await boundary.flush()
        st = boundary.state
        assert boundary.execution is not None
        try:
            data = await boundary.execution.dump()
        except (LimitExceeded, SandboxCrashed) as exc:
            # Before anything of this stop is stored or sent: the run fails here, the write that asked unsent.
            call = stop.call()
            # The run ends here: a wait it was parking on is cancelled with it (as a cancel does), not left open.
            await self.astore.call(d.waits.cancel, run.run_id)
            raise type(exc)(f"the run could not be {'parked' if isinstance(stop, ParkedWait) else 'paused'} at call "
                            f"{call['seq']} ({call['address']}): {exc.message}; nothing of that call was sent (the "
                            "calls before it are in the journal)", next_action=exc.next_action,
                            details={"call": call}) from None
        if boundary.ledger.program_ended or boundary.execution.finished:
            # A task the program never awaited reached this stop, and the program returned meanwhile: the dump
            # may be of the ended program, which cannot continue at a call. The run ends instead; its end
            # settles the wait or the write (P-50, P-52). A program still running at this check was running
            # when its state was dumped, so a stop stored past it continues where it was.
            return False
        waits_on = boundary.stops.waits_on(stop)
        snapshot = self._snapshot_record(st.issued, data, waits_on, "pause")
        now = d.clock()
        asked: list[WaitRecord] = []
        if isinstance(stop, ParkedWait):  # parked on a wait, a signal or a timer (P-18)
            public = stop.stored()
            envelope = waiting_envelope(run.run_id, public, self.logs, boundary, self.t0)
            status, expires = RunStatus.WAITING, stop.deadline
        else:
            expires = now + self.settings.approval_ttl_seconds
            # A paused write is also a durable wait (P-18): its key resolves it
            # like resume() does, from anywhere that holds the key.
            asked = await self.astore.call(approvals.ask, d.waits, run, [w.seq for w in stop.writes], expires)
            writes = [w.stored(a.key) for w, a in zip(stop.writes, asked)]
            # The first write at the top level, as before batches; every write
            # of the pause, that one included, under "writes" (P-27).
            public = {**next(w for w in writes if w["seq"] == stop.first.seq), "writes": writes}
            envelope = paused_envelope(run.run_id, public, expires, self.logs, boundary, self.t0)
            status = RunStatus.PAUSED
        # The store keeps no wait key (a capability: an approval's decides a write, a parked wait's
        # feeds the program): only this attempt's caller gets it; whoever may see the run later gets it
        # recomputed (D-33).
        kept = as_stored(public)
        stored = envelope if kept is public else dataclasses.replace(envelope, pending=kept)
        # The run's MAC covers what it waits on (P-35).
        signed = sign_run(d.keyring, dataclasses.replace(run, pending=kept, expires_at=expires),
                          self.settings.run_signature)
        # An attempt that parks ended normally: the takeovers before it no longer count (P-39).
        fresh = await self.astore.get_run(run.run_id) if takeovers(run) else None
        # The snapshot, the approval waits, paused (or waiting) and its event: one transaction (D-50).
        event = ParkEvent("paused" if status == RunStatus.PAUSED else "waiting", to_json_value({"pending": kept})[0],
                          d.clock())
        park: dict[str, Any] = dict(pending=kept, expires_at=expires, envelope=stored.to_dict(), mac=signed,
                                    meta=without_takeovers(fresh.meta if fresh is not None else None),
                                    snapshot=snapshot, event=event)
        if status == RunStatus.PAUSED:
            await self.astore.call(approvals.pause, d.lifecycle, run.run_id, asked, **park)
        else:
            await self.astore.call(d.lifecycle.park, run.run_id, status, **park)
        d.events.stored(run.run_id)
        d.events.announce(run.run_id, status, {"pending": kept, "expires_at": expires})
        self.stopped_at = envelope
        return True

    def checkpoint(self, boundary: EffectBoundary, entry: CallRecord) -> Awaitable[None] | None:
        """A signed dump every so many calls or seconds, so a crash replays little: the dump to await when
        one is due, else None (asked after every call: no coroutine is made for the calls that take none)."""
        st = boundary.state
        now = self.deps.clock()
        if (st.issued - st.checkpoint_at_seq < self.settings.checkpoint_every_calls
                and now - (st.checkpoint_at_time or self.run.created_at) < self.settings.checkpoint_every_seconds):
            return None
        if self.checkpoints_off:
            return None
        return self._checkpoint(boundary, entry, now)

    async def _checkpoint(self, boundary: EffectBoundary, entry: CallRecord, now: float) -> None:
        d, run, st = self.deps, self.run, boundary.state
        await boundary.flush()
        assert boundary.execution is not None
        try:
            data = await boundary.execution.dump()
        except (LimitExceeded, SandboxCrashed) as exc:
            # A checkpoint is an optimisation: never a reason to fail the run. The failed dump may have cost
            # the worker, so the attempt goes on by replaying the journal (nothing is sent twice, P-13)
            # without checkpoints.
            self.checkpoints_off = (f"checkpoints were skipped from call {entry.seq} on ({exc.message}); the run "
                                    "went on by replaying its journal in a fresh worker, nothing was sent twice")
            boundary.execution.stop(_CheckpointSkipped())
            return
        st.checkpoint_at_seq, st.checkpoint_at_time = st.issued, now
        await self.astore.put_snapshot(self._snapshot_record(
            st.issued, data,
            [{"seq": entry.seq, "op": entry.op, "address": entry.address, "args": entry.args}], "checkpoint"))
        await self.astore.call(d.lifecycle.renew, run.run_id, touch=True)

    def _snapshot_record(self, seq: int, data: bytes, pending: list[dict[str, Any]], kind: str) -> SnapshotRecord:
        d, run_id = self.deps, self.run.run_id
        mac = sign_snapshot_record(d.keyring, run_id, seq, MONTY_VERSION, data, pending, kind)
        return SnapshotRecord(run_id, seq, MONTY_VERSION, data, mac, pending, d.clock(), kind)

    async def _heartbeat(self, boundary: EffectBoundary, renewed: float | None = None) -> None:
        """Keep this process's lease on the run while the attempt lives; see cancel requests.

        A cancel requested from another process is seen at once when its notice
        arrives (Postgres), else at the next renewal. ``renewed``: when the lease
        was last taken (monotonic), if not now.
        """
        d, run_id = self.deps, self.run.run_id
        interval = heartbeat_interval(d)
        with d.events.notices.watch(CANCEL, run_id) as cancel:
            d.events.listen()
            renewed = time.monotonic() if renewed is None else renewed
            while True:
                await wait_a_little(cancel, max(0.0, renewed + interval - time.monotonic()))
                if time.monotonic() - renewed >= interval:
                    await self.astore.call(d.lifecycle.renew, run_id)
                    renewed = time.monotonic()
                run = await self.astore.get_run(run_id)
                reason = (run.meta or {}).get("cancel_requested") if run else None
                if reason and boundary.execution is not None:
                    boundary.execution.stop(Cancelled(reason))
                    boundary.release_held()

    # -- finish --------------------------------------------------------------------

    async def _completed(self, value: Any) -> RunResult:
        d, run, boundary = self.deps, self.run, self.boundary
        assert boundary is not None
        if self.stopped_at is not None:
            # A task the program never awaited parked the run (a wait, a sleep) just before the program ended:
            # the park is stored, with a snapshot taken while the program ran, so the run waits, and when it
            # continues the restored program reaches its end again (P-52).
            return self.stopped_at
        if boundary.state.failure is not None:
            return await self._failed(boundary.state.failure)
        # P-13: a write the journal holds beyond what the program issued means
        # the replay took another path; report it, send nothing more.
        extra = [e for s, e in boundary.journal.items() if s > boundary.state.issued and e.kind == "write"
                 and e.state in (CallState.APPROVED, CallState.SENDING, CallState.SENT)]
        if extra:
            return await self._failed(ExecutionDiverged(
                f"the replay finished without repeating the recorded write {extra[0].address} (call {extra[0].seq})",
                details={"seq": extra[0].seq}))
        unasked = await boundary.settle_unasked()
        result, notes = to_json_value(value)
        notes.extend(_unasked_notes(unasked))
        result, cut = preview(result, self.limits.result_bytes)
        if cut:
            notes.append(
                f"result truncated: {cut['kept_bytes']} of {cut['original_bytes']} bytes kept; the "
                f"{boundary.state.issued} calls this run made were made and are journaled "
                f"(tether runs show {run.run_id})"
            )
        if self.checkpoints_off:
            notes.append(self.checkpoints_off)
        notes.extend(self.extra_notes)
        for address, changes in boundary.state.conversions.items():
            notes.append(f"results of {address} were converted to JSON: {'; '.join(changes[:5])}")
        if boundary.state.unknown_writes:
            notes.append("writes with unknown outcome (not re-sent): "
                         + ", ".join(f"{w['address']} (call {w['seq']})" for w in boundary.state.unknown_writes))
        diag = self._diagnostics()
        if cut:
            diag["result_truncated"] = cut
        return await d.finisher.end_attempt(run, RunStatus.COMPLETED, result=result, logs=self.logs.lines(),
                                            calls=boundary.state.issued, diagnostics=diag, notes=notes,
                                            journal=boundary.ledger)

    async def _failed(self, exc: BaseException) -> RunResult:
        d, boundary = self.deps, self.boundary
        assert boundary is not None
        if self.stopped_at is not None:
            return self.stopped_at  # parked just before the program failed: as in _completed (P-52)
        suggest = getattr(d.catalog, "suggest", None)
        try:
            # A misspelled tool gets suggestions: comparing it with a large catalog's addresses is
            # a tenth of a second or more, off the loop, and given up for none after a few seconds.
            error = await off_loop(failure_error, exc, boundary, d.source_failures,
                                   suggest or (lambda _address: []), seconds=5.0, what="suggesting tools")
        except HostWorkTimeout:
            error = failure_error(exc, boundary, d.source_failures, lambda _address: [])
        unasked = await boundary.settle_unasked()
        return await d.finisher.end_attempt(self.run, RunStatus.FAILED, error=error, logs=self.logs.lines(),
                                            calls=boundary.state.issued, diagnostics=self._diagnostics(),
                                            notes=_unasked_notes(unasked), journal=boundary.ledger)

    def _diagnostics(self) -> dict[str, Any]:
        assert self.boundary is not None
        return diagnostics(self.boundary, self.setup_ms, self.t_exec, self.t0, self.kind)


def _unasked_notes(unasked: list[dict[str, Any]]) -> list[str]:
    """The note on a run that ended with writes it never awaited, which were not sent (D-82)."""
    if not unasked:
        return []
    return ["writes that asked were not sent: the program ended before the run could pause for a decision on "
            + ", ".join(f"{w['address']} (call {w['seq']})" for w in unasked)
            + "; a write the program does not await (a task or a coroutine left behind) cannot pause its run: "
            "await each write, or gather them"]


# -- what the program reaches besides tools ----------------------------------------


def builtins_for(d: Engine, run_id: str, budget: HostBudget) -> dict[str, Any]:
    """search / describe / sources / yield_control, as host calls through the boundary.

    The first three leave the event loop and spend the attempt's host budget
    (_hostwork.py): a catalog large or odd enough to make one slow fails that
    call with ``host_work_timeout`` while every other run goes on.
    """

    async def search(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        query = args[0] if args else kwargs.pop("query", "")
        return await budget.run(d.search, query, what="search()", **kwargs)

    async def describe(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target = args[0] if args else kwargs.get("address", kwargs.get("addresses", []))
        detail = args[1] if len(args) > 1 else kwargs.get("detail", "default")
        offset = args[2] if len(args) > 2 else kwargs.get("offset", 0)
        return await budget.run(d.describe, target, detail=detail, offset=offset, what="describe()")

    async def sources(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await budget.run(d.list_sources, what="sources()")

    async def yield_control(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Journaled like any call, so a replay does not yield twice.
        await d.events.emit_awaited(run_id, "yielded", {})
        return None

    return {"search": _guarded(search), "describe": _guarded(describe), "sources": _guarded(sources),
            "yield_control": _guarded(yield_control)}


def heartbeat_interval(d: Engine) -> float:
    return max(d.lifecycle.lease_seconds / 3, 0.05)


class _Heartbeat:
    """An attempt's heartbeat (``Attempt._heartbeat``), started when it first has something to do.

    On a store that can say when another process asks for a cancel (Postgres), it watches for that
    notice from the start. On one that cannot (SQLite), it has nothing to do before its first renewal
    one interval in: a timer stands in for it until then, so an attempt shorter than that (most
    executes: the interval is seconds) costs a timer, not two tasks, an event and a ``wait_for``
    (0.99x a 10-call execute, paired in one process). The lease and the cancel checks happen when they did.
    """

    def __init__(self, attempt: Attempt, boundary: EffectBoundary) -> None:
        d = attempt.deps
        self.task: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        if d.store.capabilities.notifies:
            self.task = asyncio.ensure_future(attempt._heartbeat(boundary))
        else:
            started = time.monotonic()
            self.timer = asyncio.get_running_loop().call_later(
                heartbeat_interval(d), self._start, attempt, boundary, started)

    def _start(self, attempt: Attempt, boundary: EffectBoundary, started: float) -> None:
        self.timer = None
        self.task = asyncio.ensure_future(attempt._heartbeat(boundary, renewed=started))

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


class _Parsed:
    """A run's recorded limits or policy, parsed once per dict a fresh run records.

    Every run this process creates records the engine's own ``limits_dict`` and ``policy_dict``
    (the same objects), and every attempt parsed them again: ~25 µs of an execute, the
    dataclasses checking themselves field by field. The value parsed from one of those dicts is
    kept while the dict still equals what was parsed (compared in full, so a dict changed in place
    is parsed again); a record read from the store is a new dict, parsed as before. The values
    are frozen dataclasses, so attempts share them.
    """

    def __init__(self, parse: Callable[[dict[str, Any]], Any], size: int = 8) -> None:
        self.parse, self.size = parse, size
        self.kept: dict[int, tuple[dict[str, Any], dict[str, Any], Any]] = {}

    def __call__(self, data: dict[str, Any]) -> Any:
        hit = self.kept.get(id(data))
        # The dict itself is held, so its id is not reused while it is kept.
        if hit is not None and hit[0] is data and hit[1] == data:
            return hit[2]
        value = self.parse(data)
        if len(self.kept) >= self.size:
            self.kept.pop(next(iter(self.kept)))
        self.kept[id(data)] = (data, copy.deepcopy(data), value)
        return value


_LIMITS: Callable[[dict[str, Any]], Limits] = _Parsed(Limits.from_dict)
_POLICY: Callable[[dict[str, Any]], Policy] = _Parsed(Policy.from_dict)


class _CheckpointSkipped(Exception):
    """A checkpoint's dump failed and may have cost the worker: the attempt replays without checkpoints."""


class Emitter:
    """emit(value): an output event, stored at once so any process can stream it (P-20).

    A replay re-runs the program from its first line; the outputs it already
    stored are not stored again.
    """

    def __init__(self, bus: EventBus, run_id: str, skip: int, budget: int) -> None:
        self.bus, self.run_id, self.skip, self.budget = bus, run_id, skip, budget
        self.count = 0

    def __call__(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from tether._sandbox.monty import GuestRaise

        if name != "emit":
            raise GuestRaise("NameError", f"name {name!r} is not defined")
        if len(args) + len(kwargs) != 1:
            raise GuestRaise("TypeError", "[invalid_arguments] emit takes one value: emit(value)")
        value = args[0] if args else next(iter(kwargs.values()))
        self.count += 1
        if self.count <= self.skip:
            return None
        value, notes = to_json_value(value)
        size = len(json.dumps(value, ensure_ascii=False).encode())
        if size > self.budget:
            value = {"type": "text", "text": f"[output of {size} bytes dropped: over the {self.budget}-byte budget]"}
        else:
            self.budget -= size
        self.bus.emit(self.run_id, "output", {"value": value, "n": self.count})
        return None


def _guarded(fn: Any) -> Any:
    from tether._sandbox.monty import GuestRaise

    async def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return await fn(args, dict(kwargs))
        except HostWorkTimeout as exc:
            raise GuestRaise("TimeoutError", f"[{exc.code}] {exc.message}") from None
        except TypeError as exc:
            raise GuestRaise("TypeError", f"[invalid_arguments] {exc}") from None
        except TetherError as exc:
            raise GuestRaise("ValueError", f"[{exc.code}] {exc.message}") from None

    return call
