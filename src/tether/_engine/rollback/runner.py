"""Beginning and carrying out a rollback (P-46, D-67, D-68).

``begin`` makes the plan (plan.py) where a person asked for it, records it on
the run as its signed ``pending`` while moving the run to ``running`` here
(paused, or ended, -> running: ``Lifecycle.begin_rollback``), and only then
declines the pause's writes. ``run_to_end`` carries it out: each compensation
is a journaled write of its own, written by the ledger ahead of its send
(``approved``, then ``sending``, then its outcome, P-7), its idempotency key
derived from the original call's; what to do next is ``plan.next_move`` read off
the journal, so a process that takes the run over after a crash (the worker's
takeover launches it like any attempt) finishes it without sending anything
twice. The run ends ``rolled_back`` with what was and was not undone.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Sequence

from tether._engine import integrity
from tether._engine.approvals import rights
from tether._engine.attempt.guest_errors import err_json, guest_error, tool_error
from tether._engine.attempt.result import RunResult
from tether._engine.calls import resend
from tether._engine.calls.call import call_key
from tether._engine.calls.ledger import Ledger, value_text
from tether._engine.rollback.plan import (
    UNDO_OP,
    UNSENT,
    Step,
    make_plan,
    next_move,
    report,
    summary,
    undo_tools,
)
from tether._engine.rules.policy import Policy
from tether._store.base import CallRecord, Conflict, RunRecord
from tether._store.states import TERMINAL_RUN_STATUSES, CallState, RunStatus
from tether._tools import context as call_context
from tether._tools.undo import Undo
from tether.errors import InvalidArguments, RunTampered, UnknownTool, WrongSecret

if TYPE_CHECKING:
    from tether._engine.engine import Engine
    from tether._tools.model import Tool

ROLLBACK = "rollback"


def plan_of(run: RunRecord) -> dict[str, Any] | None:
    """The rollback a running run carries out, if it is one (its signed ``pending``)."""
    pending = run.pending
    if run.status != RunStatus.RUNNING or not isinstance(pending, dict):
        return None
    plan = pending.get(ROLLBACK)
    return plan if isinstance(plan, dict) else None


def rolled_back_error(lines: list[dict[str, Any]], declined: str | None) -> dict[str, Any]:
    """The error of a rolled-back run's envelope, naming what was undone and what was not."""
    # A run that wrote nothing has nothing rolled back: say so rather than claim writes were (P-46).
    rolled = "the run's writes were rolled back" if lines else "the run made no writes to roll back"
    head = f"the write {declined} was declined and {rolled}" if declined else rolled
    left = [x for x in lines if not x.get("undone")]
    return {"code": "rolled_back", "message": f"{head}; {summary(lines)}",
            "next_action": ("Check each write listed as not undone with the tool's owner (tether runs show RUN_ID)."
                            if left else "Start a new run if the work is still needed."),
            "details": {"rollback": lines}}


def _undo_of(engine: Engine) -> Any:
    def undo_of(address: str) -> Undo | None:
        tool = engine.catalog.find(address)
        return tool.undo if tool is not None else None
    return undo_of


async def begin(engine: Engine, run: RunRecord, *, declined: Sequence[dict[str, Any]] = (),
                decision: dict[str, Any] | None = None) -> RunRecord | None:
    """Record the rollback of ``run`` (paused: ``declined`` are its pause's writes; or ended) and own it here;
    the run as now stored, or None if its status changed meanwhile. Nothing is sent yet."""
    if run.status in TERMINAL_RUN_STATUSES:
        await _require_sources_ended(engine, run)
    else:
        await engine.require_sources(run)  # P-30: the undo declarations come with the run's own sources
    entries = await engine.astore.get_calls(run.run_id)
    integrity.verify_calls(engine.keyring, run.run_id, entries)
    steps = make_plan(entries, _undo_of(engine), Policy.from_dict(run.policy))
    plan = {"steps": [s.to_dict() for s in steps], "declined": [w["seq"] for w in declined],
            "declined_address": declined[0]["address"] if declined else None, "by": decision}
    # Off the event loop (D-43): the plan's compare-and-set is a person's click, as a decision is.
    return await engine.astore.call(
        engine.lifecycle.begin_rollback, run, {ROLLBACK: plan}, decision,
        lambda r: integrity.sign_run(engine.keyring, r, engine.settings.run_signature))


async def needs_signed_in(engine: Engine, run: RunRecord) -> bool:
    """Whether a rollback of ``run`` would send an undo whose rule keeps it for a signed-in approver: then
    only such a person asks for it, never a channel that cannot say who it is (D-68)."""
    rules = (run.policy or {}).get("rules") or []
    entries = await engine.astore.get_calls(run.run_id)
    return any(rights.needs_signed_in(rules, address) for address in undo_tools(entries, _undo_of(engine)))


async def _require_sources_ended(engine: Engine, run: RunRecord) -> None:
    """``engine.require_sources`` for an ended run: every signed field verifies but ``pending``, which ending
    a run clears without signing again (it decides nothing once the run has ended, D-67)."""
    try:
        integrity.verify_run(engine.keyring, run)
    except RunTampered as exc:
        if exc.details.get("fields") != ["pending"] or run.pending is not None:
            raise
    recorded = (run.meta or {}).get("sources")
    if engine.sources is not None and recorded is not None:
        await engine.sources.require(recorded, live=(), run_id=run.run_id, status=run.status)


def _planned_text(steps: list[Step]) -> str:
    undone = [f"call {s.seq} {s.address} by {s.undo}" for s in steps if s.undo]
    left = [f"call {s.seq} {s.address} ({s.why})" for s in steps if not s.undo]
    text = "undoing, newest first: " + (", ".join(undone) if undone else "nothing")
    return text + ("; not undone: " + "; ".join(left) if left else "")


async def run_to_end(engine: Engine, run: RunRecord, t0: float | None = None) -> RunResult:
    """Carry out the rollback ``run`` holds (owned here) and end it ``rolled_back`` (P-46).

    A record or journal that fails its check ends the run refused (P-35), and a failure of tether's own ends
    it ``internal_error``, as an attempt does: never left running for one takeover after another."""
    t0 = time.perf_counter() if t0 is None else t0
    try:
        return await _verified_run_to_end(engine, run, t0)
    except (RunTampered, WrongSecret) as exc:
        return engine.finisher.refused(run, exc, t0=t0)
    except Exception as exc:  # noqa: BLE001 - ended and logged with a correlation id, as an attempt's
        return engine.finisher.internal_error(run, exc)


async def _verified_run_to_end(engine: Engine, run: RunRecord, t0: float) -> RunResult:
    integrity.verify_run(engine.keyring, run)  # P-35: the plan it carries out is signed
    plan = plan_of(run) or {}
    steps = [Step.from_dict(s) for s in plan.get("steps") or []]
    entries = await engine.astore.get_calls(run.run_id)
    integrity.verify_calls(engine.keyring, run.run_id, entries)
    ledger = Ledger(run_id=run.run_id, store=engine.store, keyring=engine.keyring, clock=engine.clock,
                    entries=entries)
    await _decline(engine, ledger, plan, steps)
    beat = asyncio.ensure_future(_heartbeat(engine, run.run_id))
    try:
        return await _carry_out(engine, run, plan, steps, ledger, t0)
    finally:
        beat.cancel()


async def _heartbeat(engine: Engine, run_id: str) -> None:
    """Keep the lease while an undo is on the wire (a send may take longer than a lease): as an attempt does."""
    interval = max(engine.lifecycle.lease_seconds / 3, 0.05)
    while True:
        await asyncio.sleep(interval)
        if not await engine.astore.call(engine.lifecycle.renew, run_id):
            return  # no longer ours: the next move finds that out and leaves the run to its owner


async def _carry_out(engine: Engine, run: RunRecord, plan: dict[str, Any], steps: list[Step], ledger: Ledger,
                     t0: float) -> RunResult:
    limits = engine.limits
    # Each move settles a step or moves its entry on; one that changed nothing (another process's
    # compare-and-set won) reads the entry again. Bounded all the same: a journal that will not move (edited
    # under the rollback) ends it with what it holds, reported.
    for _ in range(len(steps) * (limits.key_sends + 4) + 1):
        move = next_move(steps, ledger.entries, _dedupes(engine), limits.key_sends)
        if move.step is None:
            break
        if not await engine.astore.call(engine.lifecycle.renew, run.run_id, touch=True):
            return await engine.wait_for_run(run.run_id)  # another process holds it now and finishes it
        step = move.step
        assert step.undo_seq is not None and step.undo is not None
        if not await _take(engine, ledger, move.kind, step):
            fresh = await engine.astore.get_call(run.run_id, step.undo_seq)
            if fresh is not None:
                # What another writer left is read as any journal entry is: checked before it is trusted (P-35).
                integrity.verify_calls(engine.keyring, run.run_id, [fresh])
                ledger.entries[step.undo_seq] = fresh
    lines = report(steps, ledger.entries)
    await engine.events.emit_awaited(run.run_id, "rolled_back", {"rollback": lines})
    return await engine.finisher.finish_awaited(run, RunStatus.ROLLED_BACK, rollback=lines,
                                                error=rolled_back_error(lines, plan.get("declined_address")))


async def _take(engine: Engine, ledger: Ledger, kind: str, step: Step) -> bool:
    """One move of the rollback (plan.next_move); False when the journal did not take it."""
    assert step.undo_seq is not None
    if kind == "record":
        return await _record(engine, ledger, step)
    if kind in ("send", "resend"):
        entry = ledger.entries[step.undo_seq]
        return await _send(engine, ledger, step, send=1 if kind == "send" else max(entry.sends, 1) + 1)
    # lost: left sending by a process that stopped, to a tool that does not dedupe by key (P-11)
    return await ledger.move(step.undo_seq, [CallState.SENDING], state=CallState.UNKNOWN, finished_at=engine.clock(),
                             error={"type": "TimeoutError", "message": f"[write_outcome_unknown] {step.undo} was "
                                    "being sent when the process stopped; it may or may not have happened and was "
                                    "not sent again"})


def _dedupes(engine: Engine) -> Any:
    def dedupes(address: str) -> bool:
        tool = engine.catalog.find(address)
        return tool is not None and tool.dedupes_by_key
    return dedupes


async def _decline(engine: Engine, ledger: Ledger, plan: dict[str, Any], steps: list[Step]) -> None:
    """The pause's writes, declined: the program's view of them names what is undone (P-46)."""
    for seq in plan.get("declined") or []:
        entry = ledger.entries.get(seq)
        if entry is None or entry.state not in UNSENT:
            continue
        err = guest_error("write_rolled_back", f"the write {entry.address} was declined and the run's writes "
                          f"rolled back ({_planned_text(steps)}); it was not sent", "PermissionError")
        await ledger.move(seq, [entry.state], state=CallState.DECLINED, error=err_json(err),
                          finished_at=engine.clock())


async def _record(engine: Engine, ledger: Ledger, step: Step) -> bool:
    """The compensation's intent, ahead of its send (P-7); refused here, it is recorded failed, never sent."""
    assert step.undo is not None and step.undo_seq is not None
    now = engine.clock()
    record = CallRecord(ledger.run_id, step.undo_seq, UNDO_OP, step.undo, step.args,
                        call_key(UNDO_OP, step.undo, step.args), "write", CallState.APPROVED, started_at=now,
                        idempotency_key=step.key)
    try:
        tool = engine.catalog.get(step.undo)
        engine.catalog.validate_args(step.undo, step.args)
        if not tool.is_write:
            raise InvalidArguments(f"{step.undo} is a read; an undo is a write")
    except (UnknownTool, InvalidArguments) as exc:
        record.state, record.finished_at = CallState.FAILED, now
        record.error = {"type": "LookupError", "message": f"[{exc.code}] {exc.message}; it was not sent"}
    try:
        await ledger.record_new(record)
    except Conflict:  # another process recorded it first
        return False
    return True


async def _send(engine: Engine, ledger: Ledger, step: Step, *, send: int) -> bool:
    """Send the compensation: ``sending`` (with its count) is committed before it leaves (P-7, P-31)."""
    assert step.undo is not None and step.undo_seq is not None
    seq = step.undo_seq
    tool = engine.catalog.get(step.undo)
    frm = CallState.APPROVED if send == 1 else CallState.SENDING
    if not await ledger.move(seq, [frm], state=CallState.SENDING, sends=send, started_at=engine.clock()):
        return False  # another process moved it
    key = step.key or ""

    async def invoke(n: int) -> Any:
        token = call_context.enter(call_context.CallContext(ledger.run_id, seq, step.undo or "", key, n, "write"))
        try:
            async with asyncio.timeout(tool.timeout_seconds or engine.limits.call_timeout_seconds):
                return await tool.handler(dict(step.args))
        finally:
            call_context.leave(token)

    try:
        value = await resend.deliver(tool, send, engine.limits, invoke,
                                     lambda n: ledger.move(seq, [CallState.SENDING], state=CallState.SENDING, sends=n))
    except Exception as exc:  # noqa: BLE001 - the compensation's outcome, journaled
        await _settle_failure(engine, ledger, tool, seq, exc)
        return True
    from tether._engine.attempt.result import to_json_value

    value = to_json_value(value)[0]
    text, size = value_text(value)
    await ledger.record_outcome(seq, CallState.SENDING, CallState.SENT, outcome=value, size=size, text=text)
    return True


async def _settle_failure(engine: Engine, ledger: Ledger, tool: Tool, seq: int, exc: BaseException) -> None:
    lost = isinstance(exc, TimeoutError) or (resend.outcome_unknown(exc) if tool.dedupes_by_key
                                              else resend.sent_unanswered(exc))
    err = tool_error(tool.address, exc)
    state = CallState.UNKNOWN if lost else CallState.FAILED
    await ledger.record_outcome(seq, CallState.SENDING, state, error=err_json(err))
