"""The approvals service: the one place approval waits are created and settled (D-46).

A pause lists every write that waits (one, or a batch issued together). Each
write is decided on its own, by its seq: the journal entry's compare-and-set
``asked -> approved | declined`` is the decision, so of two deciders exactly
one wins and a repeat changes nothing (P-28). The run continues once every
write of the pause is decided; a ``cancel`` of any of them ends the run.

    ask(...), pause(...)  a pause's approval waits, created with the pause in one transaction (driver;
                      the rows written by _engine/waits.py, the one writer of wait rows)
    pending(engine, run)  -> [PendingWrite, ...]                   (Runtime.pending)
    decide(engine, run_id, {3: "approve", 4: ("decline", "why")}, actor=..., via=...)
                      every surface's decision: Python, CLI, MCP resume and forms, the console,
                      approval links (_server/approvals.py's Decider), wait keys (_engine/waits.py);
                      a run whose whole pause is now decided comes back as Resumed, and its
                      caller continues it (tether._engine.control.decide launches it)
    refusal(...)      why a decision would take nothing, asked before queueing one (Decider)
    expire(engine)    paused runs past their approval time to live end run_expired

Who may decide is asked before, of ``tether._engine.approvals.may_decide``; the
capabilities that name a write (wait keys, links) are made in capabilities.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tether import _metrics as metrics
from tether._engine import waits as waits_mod
from tether._engine.approvals.model import (
    APPROVAL_PREFIX,
    CHANNELS,
    CONFLICT,
    CUT_CANCEL,
    CUT_IDLE,
    DECISIONS,
    ENDED,
    ENDS_PAUSE,
    EXPIRED_WRITE,
    REPEAT,
    TAKE,
    Decision,
    PendingWrite,
    approval_wait_name,
    batch_of,
    cut_end,
    ended_with,
    judge,
    kept_reason,
    pause_of,
    taken,
)
from tether._engine.attempt.result import RunResult
from tether._engine.calls import ledger
from tether._engine.lifecycle import cancelled_error
from tether._store.base import CallRecord, RunRecord, WaitRecord
from tether._store.states import CallState, RunStatus, WaitStatus
from tether.errors import (
    AlreadyDecided,
    InvalidArguments,
    NotPaused,
    RunExpired,
    RunNotFound,
    SeqRequired,
    TetherError,
    WriteNotPending,
)

if TYPE_CHECKING:
    from tether._engine.engine import Engine
    from tether._engine.lifecycle import Lifecycle
    from tether._engine.waits import Waits


@dataclass(frozen=True)
class Resumed:
    """What ``decide`` returns when it moved the run ``paused -> running``: the run, to continue here."""

    run: RunRecord


@dataclass(frozen=True)
class Rejoin:
    """What ``decide`` returns for a repeat of a decision on a run running since (a decline-and-undo's rollback
    under way, P-53; a pause decided and continued, D-90): the run, whose outcome the caller waits for, carrying it
    on itself if its owner stopped (launcher.rejoin)."""

    run: RunRecord


def ask(waits: Waits, run: RunRecord, seqs: Sequence[int], deadline: float) -> list[WaitRecord]:
    """The waits the paused writes ``seqs`` are (each named approval:<seq>), keys made, nothing written:
    ``pause`` creates them with the pause."""
    return [WaitRecord(waits.key(run.run_id, approval_wait_name(seq)), run.run_id, approval_wait_name(seq),
                       WaitStatus.PENDING, waits.clock(), seq=seq, deadline=deadline, session=run.session)
            for seq in seqs]


def pause(life: Lifecycle, run_id: str, asked: Sequence[WaitRecord], **park: Any) -> bool:
    """Pause the run with its approval waits (``ask``): created in the transaction that stores the pause
    (``Lifecycle.park``, whose wait rows _engine/waits.py writes), so a pause is never stored without them."""
    return life.park(run_id, RunStatus.PAUSED, waits=asked, **park)


def recorded_decision(engine: Engine, run_id: str, seq: int, entry: CallRecord | None = None) -> Decision | None:
    """The decision taken on write ``seq`` of a run, with who took it, or None if none was."""
    entry = entry if entry is not None else engine.store.get_call(run_id, seq)
    which = taken(entry)
    if which is None:
        return None
    row = engine.store.get_wait(engine.waits.key(run_id, approval_wait_name(seq)))
    if row is None:
        return Decision(seq, which)
    if isinstance(row.value, dict) and row.value.get("decision") not in (None, which):
        # Approved, then the pause was cancelled or rolled back by someone else: the wait holds the approval,
        # the run the decision that ended it; whoever approved did not cancel (P-51).
        run = engine.store.get_run(run_id)
        ended = run.decision if run is not None and isinstance(run.decision, dict) else {}
        if ended.get("decision") == which:
            return Decision(seq, which, ended.get("reason"), ended.get("actor"), ended.get("via"),
                            ended.get("origin"), ended.get("at"))
        return Decision(seq, which)
    return Decision.from_wait(seq, which, row.value, row.resolved_at)


def pending(engine: Engine, run: RunRecord) -> list[PendingWrite]:
    """The writes of a run's pause, each with its key and any decision taken (empty when not paused)."""
    out = []
    for w in batch_of(run):
        entry = engine.store.get_call(run.run_id, w["seq"])
        description = None
        if w["address"] in engine.catalog:
            description = engine.catalog.get(w["address"]).description
        # The store holds no approval key (it is a capability): recomputed for whoever may see this run.
        key = w.get("key") or engine.waits.key(run.run_id, approval_wait_name(w["seq"]))
        out.append(PendingWrite(run.run_id, w["seq"], w["address"], w.get("args") or {}, w.get("annotations") or {},
                                description, key, run.expires_at,
                                recorded_decision(engine, run.run_id, w["seq"], entry),
                                tuple(r for r in w.get("reasons") or () if isinstance(r, dict))))
    return out


def _pending_text(writes: list[PendingWrite]) -> str:
    if not writes:
        return "it waits on no write"
    return "it waits on " + ", ".join(
        f"call {w.seq} {w.address}" + (f" ({w.decision.decision}d)" if w.decision else "") for w in writes)


def _pending_details(writes: list[PendingWrite]) -> list[dict[str, Any]]:
    return [{"seq": w.seq, "address": w.address, "args": w.args,
             "decision": w.decision.decision if w.decision else None} for w in writes]


def _parse(decisions: Mapping[Any, Any]) -> dict[int, tuple[str, str | None]]:
    if not isinstance(decisions, Mapping) or not decisions:
        raise InvalidArguments("decisions must map each write's seq to a decision, e.g. {3: 'approve'}")
    out: dict[int, tuple[str, str | None]] = {}
    for seq, value in decisions.items():
        if isinstance(seq, bool) or not isinstance(seq, (int, str)) or not str(seq).isdigit():
            raise InvalidArguments(f"a decision is keyed by the write's seq (an integer), not {seq!r}")
        decision, reason = (value, None) if isinstance(value, str) else (tuple(value) + (None,))[:2]
        if decision not in DECISIONS:
            raise InvalidArguments(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        if reason is not None and not isinstance(reason, str):
            raise InvalidArguments("a decision's reason must be text")
        out[int(seq)] = (decision, kept_reason(reason))
    return out


def unnamed_target(engine: Engine, run: RunRecord, decision: str) -> int:
    """The write a decision without seq is for, when it can only be one (P-28).

    That is the case when the run has asked about exactly one write in its
    whole life: whoever saw any pause of it saw that write. Otherwise the
    decision could land on a write its sender never saw (a repeated command
    after the run moved on to the next write) and is refused with the list.
    """
    asked = sorted({w.seq for w in engine.store.list_waits(run_id=run.run_id, status=None)
                    if w.name.startswith(APPROVAL_PREFIX) and w.seq is not None})
    batch = batch_of(run)
    if decision in ENDS_PAUSE and batch:
        first: int = batch[0]["seq"]
        return first  # cancel (or a rollback) ends the pause, whichever write it names
    if len(asked) == 1:
        return asked[0]
    if not asked and len(batch) == 1:
        only: int = batch[0]["seq"]
        return only
    if not asked and not batch:
        raise NotPaused(f"run {run.run_id} is {run.status} and has no write waiting for a decision")
    writes = pending(engine, run)
    raise SeqRequired(
        f"run {run.run_id} has asked about more than one write, so a decision must name its write; "
        f"{_pending_text(writes)}; nothing was decided",
        details={"pending": _pending_details(writes)})


def _paused_view(engine: Engine, run: RunRecord) -> RunResult:
    """The run's paused envelope with the decisions its batch holds so far."""
    result = RunResult.from_dict(run.result) if run.result else RunResult(status=run.status, run_id=run.run_id)
    if result.pending:
        decided = {w.seq: w.decision for w in pending(engine, run) if w.decision}
        writes = [dict(w, decision=decided[w["seq"]].to_dict() if w["seq"] in decided else None)
                  for w in result.pending.get("writes") or [result.pending]]
        undecided = [w for w in writes if w["decision"] is None]
        # The write the envelope names is one still to decide: a caller that decides `pending["seq"]` until the
        # run moves on (the README's loop) would otherwise repeat a decided write forever (P-27).
        first = {k: v for k, v in (undecided or writes)[0].items() if k != "decision"}
        result.pending = {**result.pending, **first, "writes": writes}
        if undecided:
            from tether._engine.attempt.envelopes import pause_instructions, tool_schemas

            # What is left to decide, not what the pause first asked.
            result.instructions = pause_instructions(run.run_id, {"writes": undecided}, tool_schemas(engine.catalog))
    return result


async def decide(engine: Engine, run_id: str, decisions: Mapping[Any, Any], *, principal: str | None = None,
                 actor: str | None = None, via: str = "python", origin: str | None = None, t0: float | None = None,
                 run: RunRecord | None = None) -> RunResult | Resumed | Rejoin:
    """Decide writes of a paused run by seq (P-10, P-27..P-29): the run's envelope, or Resumed once its whole
    pause is decided (this process won the ``paused -> running`` compare-and-set; the caller continues it).

    ``run``: the record the caller just read for ``principal`` (engine.get_run), so it is not read again.
    """
    import time

    t0 = time.perf_counter() if t0 is None else t0
    wanted = _parse(decisions)
    if via not in CHANNELS:
        raise InvalidArguments(f"via must be one of {', '.join(CHANNELS)}, not {via!r}")
    run = run if run is not None and run.run_id == run_id else await engine.astore.call(engine.get_run, run_id, principal)
    if cut_end(run) is not None:
        # An end whose process stopped half way (P-53): finished first, so this decision is judged against the
        # run as it ended (a repeat of the cancel gets its outcome, any other not_paused).
        await finish_cut(engine, run_id)
        run = await engine.astore.call(engine.get_run, run_id, principal)
    # The pause's journal entries, read once and verified before anything acts on them (P-35); each decision
    # below reads its entry from here, and a won compare-and-set updates it in place (calls/ledger.py).
    entries: dict[int, CallRecord] = {}
    if run.status == RunStatus.PAUSED:
        refused = await _untrusted(engine, run, wanted, entries)
        if refused is not None:
            return refused
    who = {"actor": actor or (principal if principal is not None else engine.settings.principal) or "local",
           "via": via, "origin": origin}
    batch = {w["seq"]: w for w in batch_of(run)}
    fresh: dict[int, tuple[str, str | None]] = {}
    repeated: list[int] = []
    for seq, (decision, reason) in sorted(wanted.items()):
        entry = entries[seq] if seq in entries else await engine.store.aio.get_call(run_id, seq)
        verdict = _verdict(run, seq, decision, entry)
        if verdict == TAKE:
            fresh[seq] = (decision, reason)
        elif verdict == REPEAT:
            if seq in batch:
                repeated.append(seq)  # a repeat of a decision taken: it changes nothing but a lost record (P-28)
        else:
            raise await engine.astore.call(_refused_now, engine, run, seq, decision, verdict, entry)

    if run.status != RunStatus.PAUSED:
        # Every named write was decided before: return what the run did since. A run still running is waited
        # for, and taken over and continued here once its owner stopped, as recovery would (a rollback's plan
        # carried out, P-53; the program continued, D-90).
        return _rollback_under_way(run) or _still_running(run) or await engine.wait_for_run(run_id)
    now = engine.clock()
    if fresh and run.expires_at is not None and now > run.expires_at:
        if not await engine.astore.call(engine.lifecycle.expire, run_id):
            # The run moved on meanwhile (expired by the sweep, cancelled): decide again against what it is now.
            return await decide(engine, run_id, decisions, principal=principal, actor=actor, via=via, origin=origin,
                                t0=t0)
        await engine.finisher.finish_awaited(run, RunStatus.FAILED,
                                             error=RunExpired(f"run {run_id} passed its approval time to live").to_dict())
        await engine.astore.call(_unsend, engine, run, now)
        await engine.astore.call(engine.waits.revoke, run_id=run_id)
        raise RunExpired(f"run {run_id} waited longer than its approval time to live; nothing was sent")

    if any(d == "cancel" for d, _ in fresh.values()):
        return await _cancel(engine, run, fresh, who, now, t0, principal)
    if any(d == "decline_and_undo" for d, _ in fresh.values()):
        return await _roll_back(engine, run, fresh, who, now, t0, principal)
    if fresh:
        # Before anything is decided (P-30): a run whose sources cannot be loaded here
        # stays paused, and an approved write's server must answer now or it is not sent.
        await engine.require_sources(run, live=tuple(batch[s]["address"] for s, (d, _) in fresh.items()
                                                 if d == "approve"))
    for seq in repeated:
        # The journal took this decision but its record may not have been written (the store failed between
        # the two): the repeat writes it, with who repeated it, unless it was written (P-29).
        await _complete_record(engine, run, batch[seq], wanted[seq][1], who, now)
    last = None
    for seq, (decision, reason) in fresh.items():
        last = await _record(engine, run, batch[seq], decision, reason, who, now, entry=entries.get(seq))
        # The run's updated_at is when it paused: nothing touches a paused run but a decision.
        metrics.APPROVAL_SECONDS.observe(max(0.0, now - run.updated_at))
    # The run continues when nothing in its pause is left undecided; whoever
    # sees that first continues it (paused -> running is a compare-and-set).
    # A write this call decided is known decided; any other is read now, as
    # another process may have decided it meanwhile.
    undecided = [s for s in batch
                 if (e := _known_decided(entries.get(s)) or await engine.store.aio.get_call(run_id, s)) is not None
                 and e.state == CallState.ASKED]
    if undecided:
        return await engine.astore.call(lambda: _paused_view(engine, engine.get_run(run_id, principal)))
    record = last.to_dict() if last is not None else (run.decision or {})
    resumed = await engine.astore.call(engine.lifecycle.resume_run, run, record)
    if resumed is None:
        return await engine.wait_for_run(run_id)
    return Resumed(resumed)


def _known_decided(entry: CallRecord | None) -> CallRecord | None:
    """``entry`` if this process has seen it leave ``asked`` (a move it won); None when it must be read again."""
    return entry if entry is not None and entry.state != CallState.ASKED else None


async def _untrusted(engine: Engine, run: RunRecord, wanted: dict[int, tuple[str, str | None]],
                     entries: dict[int, CallRecord]) -> RunResult | None:
    """Check what a decision acts on before acting (P-35): None when the run and its pause verify, and then
    ``entries`` holds the pause's journal entries as read and verified, by seq.

    A tampered run ends ``run_tampered``; a cancel needs no trusted record and
    simply ends the run. ``WrongSecret`` propagates and leaves the run paused
    for a process holding the secret it was signed with.
    """
    from tether._engine.integrity import verify_calls, verify_run
    from tether.errors import RunTampered, WrongSecret

    cancel = next((reason for decision, reason in wanted.values() if decision == "cancel"), "")
    try:
        verify_run(engine.keyring, run)
        read = [e for w in batch_of(run) if (e := await engine.store.aio.get_call(run.run_id, w["seq"])) is not None]
        verify_calls(engine.keyring, run.run_id, read)
        entries.update((e.seq, e) for e in read)
    except (RunTampered, WrongSecret) as exc:
        if any(d == "cancel" for d, _ in wanted.values()):
            ended = engine.finisher.cancel_now(run, cancel or "cancelled")
            if ended is not None:
                return ended
        if isinstance(exc, WrongSecret):
            raise
        await engine.astore.call(engine.waits.revoke, run_id=run.run_id)
        return await engine.finisher.finish_awaited(run, RunStatus.FAILED, error=exc.to_dict())
    return None


async def _record(engine: Engine, run: RunRecord, write: dict[str, Any], decision: str, reason: str | None,
                  who: dict[str, Any], now: float, expect: tuple[str, ...] = (CallState.ASKED,),
                  entry: CallRecord | None = None) -> Decision:
    """Take one decision: the journal's compare-and-set decides who wins (P-28); then say who (P-29).

    ``entry``: the write's entry as just read and verified, else it is read here; the compare-and-set is
    on the stored row either way, so an entry read a moment ago loses to a decision taken since. The
    store's work runs off the event loop (D-43): a person's click does not hold up the replica's runs.
    """
    record, won = await engine.astore.call(_take, engine, run, write, decision, reason, who, now, expect, entry)
    if won:
        await engine.events.emit_awaited(run.run_id, "decided", record.event(write["address"]))
    return record


async def _complete_record(engine: Engine, run: RunRecord, write: dict[str, Any], reason: str | None,
                           who: dict[str, Any], now: float) -> None:
    """Record a decision the journal holds whose approval wait is still pending (P-29): a repeat of it."""
    def settle() -> Decision | None:
        entry = engine.store.get_call(run.run_id, write["seq"])
        which = taken(entry)
        if which is None or which in ENDS_PAUSE:
            return None
        row = engine.store.get_wait(engine.waits.key(run.run_id, approval_wait_name(write["seq"])))
        if row is None or row.status != WaitStatus.PENDING:
            return None
        record = Decision(write["seq"], which, reason, **who, at=now)
        return record if _settle_approval(engine, run.run_id, record) else None

    record = await engine.astore.call(settle)
    if record is not None:
        await engine.events.emit_awaited(run.run_id, "decided", record.event(write["address"]))


def _take(engine: Engine, run: RunRecord, write: dict[str, Any], decision: str, reason: str | None,
          who: dict[str, Any], now: float, expect: tuple[str, ...], entry: CallRecord | None) -> tuple[Decision, bool]:
    """``_record``'s store work, in one of the store's threads: (the decision, whether this process won it)."""
    from tether._engine.attempt.guest_errors import guest_error

    seq = write["seq"]
    entry = entry if entry is not None else engine.store.get_call(run.run_id, seq)
    # An approval or a decline moves the entry only while the run is paused, in the transaction that checks
    # it: a run that ended (cancelled, rolled back, expired) meanwhile takes no decision (P-51). A cancel's
    # own moves come after the run left `paused`, held by the process cancelling it.
    while_run = () if decision in ENDS_PAUSE else (RunStatus.PAUSED,)
    if decision == "approve":
        won = ledger.move(engine.store, engine.keyring, entry, expect, while_run=while_run, state=CallState.APPROVED)
    else:
        why = "cancelled" if decision == "cancel" else "declined"
        err = guest_error(f"write_{why}",
                          f"the write {write['address']} was {why}{': ' + reason if reason else ''}; it was not sent",
                          "PermissionError")
        won = ledger.move(engine.store, engine.keyring, entry, expect, while_run=while_run,
                          state=CallState.DECLINED, error={"type": err.exc_type, "message": err.message},
                          finished_at=now)
    if not won:
        now_run, now_entry = engine.store.get_run(run.run_id), engine.store.get_call(run.run_id, seq)
        if decision in ENDS_PAUSE:
            if taken(now_entry) != decision:
                raise AlreadyDecided(f"call {seq} of run {run.run_id} was already decided: {taken(now_entry)}; "
                                     "nothing was changed", details={"decision": taken(now_entry), "seq": seq})
        elif now_run is not None:
            verdict = _verdict(now_run, seq, decision, now_entry)
            if verdict != REPEAT:
                raise refused_as(engine, now_run, seq, decision, verdict, now_entry)
    record = Decision(seq, decision, reason, **who, at=now)
    if won and not _settle_approval(engine, run.run_id, record) and CallState.APPROVED not in expect:
        won = False  # a repeat of this decision recorded it first (_complete_record): one `decided` event
    return record, won


def _settle_approval(engine: Engine, run_id: str, record: Decision) -> bool:
    name = approval_wait_name(record.seq)
    now = engine.clock()
    settled, _ = waits_mod.settle(engine.store, WaitRecord(engine.waits.key(run_id, name), run_id, name,
                                                           WaitStatus.RESOLVED, now, seq=record.seq,
                                                           value=record.wait_value(), resolved_at=now))
    return settled


async def _cancel(engine: Engine, run: RunRecord, fresh: dict[int, tuple[str, str | None]], who: dict[str, Any],
                  now: float, t0: float, principal: str | None) -> RunResult | Resumed | Rejoin:
    """A cancel of any write of the pause ends the run; no write of it is sent (P-10)."""
    seq, (_, reason) = next((s, v) for s, v in fresh.items() if v[0] == "cancel")
    record = Decision(seq, "cancel", reason, **who, at=now)
    if not await engine.astore.call(engine.lifecycle.cancel_decided, run.run_id, record.to_dict()):
        # The run moved on meanwhile: decide again against what it is now.
        return await decide(engine, run.run_id, dict(fresh), principal=principal, t0=t0, **who)
    for write in batch_of(run):
        entry = await engine.store.aio.get_call(run.run_id, write["seq"])
        # A write approved earlier in this batch was not sent, and now never will be.
        if entry is not None and entry.state in (CallState.ASKED, CallState.APPROVED):
            await _record(engine, run, write, "cancel", reason if write["seq"] == seq else None, who, now,
                          expect=(CallState.ASKED, CallState.APPROVED))
    address = next(w["address"] for w in batch_of(run) if w["seq"] == seq)
    return await engine.finisher.finish_awaited(run, RunStatus.CANCELLED, error=cancelled_error(
        f"the run was cancelled at the write {address}; nothing further was sent", {"reason": reason}))


async def _roll_back(engine: Engine, run: RunRecord, fresh: dict[int, tuple[str, str | None]], who: dict[str, Any],
                     now: float, t0: float, principal: str | None) -> RunResult | Resumed | Rejoin:
    """A decline-and-undo of any write of the pause declines the whole pause and undoes the writes the run
    applied (P-46): the plan is recorded with the run's move to running here; the caller carries it out."""
    from tether._engine.rollback import runner

    seq, (_, reason) = next((s, v) for s, v in fresh.items() if v[0] == "decline_and_undo")
    record = Decision(seq, "decline_and_undo", reason, **who, at=now)
    taken = await runner.begin(engine, run, declined=batch_of(run), decision=record.to_dict())
    if taken is None:
        # The run moved on meanwhile: decide again against what it is now.
        return await decide(engine, run.run_id, dict(fresh), principal=principal, t0=t0, **who)
    await rollback_recorded(engine, taken)
    return Resumed(taken)


async def rollback_recorded(engine: Engine, run: RunRecord) -> None:
    """The decline-and-undo a rollback's plan was begun by (its ``by``), recorded on the named write's approval wait
    with its ``decided`` event, and the pause's other keys revoked (they decide nothing now).

    Done once the plan is stored (``_roll_back``) and again by whoever carries the plan out (the launcher), so a
    process stopped between the two leaves no key of the pause open and the decision named (P-53); the wait
    settles once, so the second changes nothing.
    """
    from tether._engine.rollback.runner import plan_of

    plan = plan_of(run) or {}
    by = plan.get("by")
    if not isinstance(by, dict) or by.get("decision") != "decline_and_undo" or not isinstance(by.get("seq"), int):
        return
    def text(name: str) -> str | None:
        value = by.get(name)
        return value if isinstance(value, str) else None

    at = by.get("at")
    record = Decision(by["seq"], "decline_and_undo", text("reason"), text("actor"), text("via"), text("origin"),
                      float(at) if isinstance(at, (int, float)) else None)
    won = await engine.astore.call(_settle_approval, engine, run.run_id, record)
    await engine.astore.call(engine.waits.revoke, run_id=run.run_id)
    if won:
        entry = await engine.store.aio.get_call(run.run_id, record.seq)
        address = entry.address if entry is not None else str(plan.get("declined_address"))
        await engine.events.emit_awaited(run.run_id, "decided", record.event(address))


def _verdict(run: RunRecord, seq: int, decision: str, entry: CallRecord | None) -> str:
    """``judge`` on what was read: the run as stored and the write's journal entry (or, while the end of its pause
    is carried out, the decision that ended it: P-53)."""
    return judge(decision, ended_with(run, seq, entry) or taken(entry), paused=run.status == RunStatus.PAUSED,
                 in_pause=any(w["seq"] == seq for w in batch_of(run)),
                 asked=entry is not None and entry.state == CallState.ASKED)


def _fate(entry: CallRecord | None) -> str:
    """What became of a write, as its journal entry says: sent or not."""
    if entry is None:
        return "has no journal entry; it was not sent"
    if entry.state in (CallState.SENT, CallState.FAILED):
        return "was sent"
    if entry.state == CallState.SENDING:
        return "was being sent"
    if entry.state == CallState.UNKNOWN:
        return "may have been sent (its outcome is unknown)"
    return "was not sent"


def _how_ended(run: RunRecord) -> str:
    """How a run that is no longer paused got there, as a person reads it: its status and who or what did it."""
    from tether._engine.rollback.runner import ROLLBACK

    record = run.decision if isinstance(run.decision, dict) else {}
    by = f" by {record.get('actor')} via {record.get('via')}" if record.get("actor") else ""
    why = f" ({record['reason']})" if record.get("reason") else ""
    if run.status == RunStatus.CANCELLED:
        return f"was cancelled{by if record.get('decision') == 'cancel' else ''}{why}"
    if run.status == RunStatus.ROLLED_BACK or (run.status == RunStatus.RUNNING
                                              and isinstance(run.pending, dict) and ROLLBACK in run.pending):
        done = "was rolled back" if run.status == RunStatus.ROLLED_BACK else "is being rolled back"
        return f"{done}{by if record.get('decision') in ('decline_and_undo', 'undo') else ''}{why}"
    if run.status == RunStatus.FAILED:
        code = (run.error or {}).get("code") if isinstance(run.error, dict) else None
        return f"failed ({code})" if code else "failed"
    if RunStatus(run.status).terminal:
        return f"has {run.status}"
    return f"is {run.status}, not paused"


def _refused_now(engine: Engine, run: RunRecord, seq: int, decision: str, verdict: str,
                 entry: CallRecord | None) -> TetherError:
    """``refused_as`` against the run as stored now: a caller may have handed ``decide`` the run as it read it a
    moment ago (still paused), and the refusal is to say what the run is, as every door's does (P-51)."""
    now = engine.store.get_run(run.run_id)
    if now is not None and now.status != run.status:
        now_entry = engine.store.get_call(run.run_id, seq)
        now_verdict = _verdict(now, seq, decision, now_entry)
        if now_verdict not in (TAKE, REPEAT):
            return refused_as(engine, now, seq, decision, now_verdict, now_entry)
    return refused_as(engine, run, seq, decision, verdict, entry)


def refused_as(engine: Engine, run: RunRecord, seq: int, decision: str, verdict: str,
               entry: CallRecord | None) -> TetherError:
    """The error a decision ``judge`` refused gets, the same at every door (P-51): what it names, what the
    run and the write are now, and that nothing was decided."""
    address = f" {entry.address}" if entry is not None else ""
    if verdict == ENDED:
        return NotPaused(f"run {run.run_id} {_how_ended(run)}; call {seq}{address} {_fate(entry)}; "
                         f"the {decision} was not recorded and nothing was decided",
                         details={"seq": seq, "status": str(run.status), "state": entry.state if entry else None})
    if verdict == CONFLICT:
        already = taken(entry)
        ended = "" if run.status == RunStatus.PAUSED else f"; the run {_how_ended(run)}"
        return AlreadyDecided(f"call {seq}{address} of run {run.run_id} was already decided: {already}; "
                              f"it {_fate(entry)}{ended}; the {decision} changed nothing",
                              details={"decision": already, "seq": seq})
    if run.status != RunStatus.PAUSED:
        return NotPaused(f"run {run.run_id} is {run.status}; call {seq} is not a write waiting for a decision; "
                         "nothing was decided", details={"seq": seq, "status": str(run.status)})
    writes = pending(engine, run)
    return WriteNotPending(f"call {seq} of run {run.run_id} is not a write waiting for a decision; "
                           f"{_pending_text(writes)}; nothing was decided",
                           details={"seq": seq, "pending": _pending_details(writes)})


def refusal(engine: Engine, run_id: str, seqs: list[int], decision: str, *, principal: str | None,
            allowed: tuple[str, ...] = DECISIONS) -> tuple[RunRecord | None, TetherError | None]:
    """(the run, why a decision on writes ``seqs`` would take nothing — or None when it would take effect).

    Asked by a surface that queues the decision (the console and links answer
    at once, and decide in the background); ``decide`` itself refuses the same
    cases as it acts.
    """
    if decision not in allowed:
        return None, InvalidArguments(f"a decision is {' or '.join(allowed)}")
    try:
        run = engine.get_run(run_id, principal)
    except RunNotFound:
        return None, RunNotFound(f"there is no run {run_id} for you")
    if not seqs:
        return run, NotPaused(f"run {run.run_id} is {run.status}; no write was named; nothing was decided")
    verdicts = []
    for seq in sorted(seqs):
        entry = engine.store.get_call(run.run_id, seq)
        verdict = _verdict(run, seq, decision, entry)
        if verdict not in (TAKE, REPEAT):
            # The same rule and the same words as decide's (P-51): every door refuses alike.
            return run, refused_as(engine, run, seq, decision, verdict, entry)
        verdicts.append(verdict)
    if TAKE in verdicts and run.expires_at is not None and engine.clock() > run.expires_at:
        return run, RunExpired("the approval's time to live has passed; nothing was decided and nothing was sent")
    return run, None


def _unsend(engine: Engine, run: RunRecord, now: float) -> None:
    """A write of the pause approved before the run expired was never sent, and never will be: its entry says so
    (``[run_expired]``, a decision nobody took), never ``approved`` on an ended run (P-51)."""
    from tether._engine.attempt.guest_errors import guest_error

    for write in pause_of(run):
        entry = engine.store.get_call(run.run_id, write["seq"])
        if entry is None or entry.state != CallState.APPROVED:
            continue
        err = guest_error(EXPIRED_WRITE, f"the write {write['address']} was approved, but the run waited longer "
                          "than its approval time to live for the rest of its pause; it was not sent",
                          "PermissionError")
        ledger.move(engine.store, engine.keyring, entry, (CallState.APPROVED,), state=CallState.DECLINED,
                    error={"type": err.exc_type, "message": err.message}, finished_at=now)


def expire(engine: Engine) -> list[str]:
    """End paused runs past their approval time to live (`run_expired`); nothing was sent for them."""
    ended = []
    for run in engine.store.paused_runs_past_expiry(engine.clock()):
        err = RunExpired(f"run {run.run_id} waited longer than its approval time to live; "
                         f"the write {(run.pending or {}).get('address')} was not sent")
        if engine.lifecycle.expire(run.run_id):
            _unsend(engine, run, engine.clock())
            engine.waits.revoke(run_id=run.run_id)
            engine.finisher.finish(run, RunStatus.FAILED, error=err.to_dict())
            ended.append(run.run_id)
    return ended


def _rollback_under_way(run: RunRecord) -> Rejoin | None:
    """A repeat of the decline-and-undo whose rollback is under way: the caller waits for its outcome, taking it
    over and carrying it out if the process that recorded its plan stopped (P-53)."""
    from tether._engine.rollback.runner import plan_of

    plan = plan_of(run)
    if plan is None or not isinstance(plan.get("by"), dict) or plan["by"].get("decision") != "decline_and_undo":
        return None
    return Rejoin(run)


def _still_running(run: RunRecord) -> Rejoin | None:
    """A repeat of a decision on a run that continued since (D-90): the caller waits for its outcome, taking it over
    and continuing it if the process that continued it stopped (launcher.rejoin, counted as a takeover, P-39)."""
    return Rejoin(run) if run.status == RunStatus.RUNNING else None


def _held_elsewhere(engine: Engine, run: RunRecord) -> bool:
    """Whether a live process other than this one holds ``run`` (it is still carrying out the end it recorded)."""
    from tether._engine.ownership import owner_gone

    return (run.owner is not None and run.owner != engine.lifecycle.owner and not owner_gone(run.owner)
            and run.lease_until is not None and run.lease_until >= engine.clock())


async def finish_cut(engine: Engine, run_id: str, *, wait: bool = True) -> RunResult:
    """Finish the end of a pause whose process stopped half way (P-53): the run's outcome once it is finished.

    A cancel recorded on the run (``cancel_decided``) settles each write of the pause still ``asked`` or
    ``approved`` as the cancel of whoever cancelled, as ``_cancel`` would have; an expiry recorded
    (``Lifecycle.expire``) declines the approved ones ``write_expired`` and revokes the pause's keys; a cancel of a
    run nobody was executing (``cancel_idle``, D-90) cancels the run's waits. Then the envelope is written. Nothing is
    ever sent. A process that still holds the run is given its lease to finish
    (``wait``), else it is left to it; each write's compare-and-set keeps two finishers from settling one twice.
    """
    run = await engine.astore.get_run(run_id)
    if run is not None and _held_elsewhere(engine, run):
        if not wait:
            return engine.recorded(run)
        await engine.wait_for_run(run_id, timeout=max(0.0, (run.lease_until or 0.0) - engine.clock()) + 1.0)
        run = await engine.astore.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id}")
    how = cut_end(run)
    if how is None:
        return await engine.wait_for_run(run_id)
    if how == CUT_IDLE:
        return await engine.finisher.finish_cancel(run)
    writes = pause_of(run)
    if how == CUT_CANCEL:
        ended = run.decision if isinstance(run.decision, dict) else {}
        seq = ended.get("seq") if isinstance(ended.get("seq"), int) else writes[0]["seq"]
        reason = ended.get("reason") if isinstance(ended.get("reason"), str) else None
        who = {"actor": ended.get("actor"), "via": ended.get("via"), "origin": ended.get("origin")}
        recorded_at = ended.get("at")
        at = float(recorded_at) if isinstance(recorded_at, (int, float)) else engine.clock()
        for write in writes:
            entry = await engine.store.aio.get_call(run.run_id, write["seq"])
            if entry is not None and entry.state in (CallState.ASKED, CallState.APPROVED):
                await _record(engine, run, write, "cancel", reason if write["seq"] == seq else None, who, at,
                              expect=(CallState.ASKED, CallState.APPROVED))
        address = next((w["address"] for w in writes if w["seq"] == seq), writes[0]["address"])
        return await engine.finisher.finish_awaited(run, RunStatus.CANCELLED, error=cancelled_error(
            f"the run was cancelled at the write {address}; nothing further was sent", {"reason": reason}))
    await engine.astore.call(_unsend, engine, run, engine.clock())
    await engine.astore.call(engine.waits.revoke, run_id=run.run_id)
    return await engine.finisher.finish_awaited(run, RunStatus.FAILED, error=RunExpired(
        f"run {run.run_id} waited longer than its approval time to live; the write {writes[0]['address']} was not "
        "sent").to_dict())


async def finish_cuts(engine: Engine, limit: int = 100) -> list[RunResult]:
    """Recovery's part (P-53): every ended run whose end was cut in half and that no live process holds, finished."""
    out = []
    for run in await engine.store.aio.ended_runs_holding_pause(limit):
        if cut_end(run) is not None and not _held_elsewhere(engine, run):
            out.append(await finish_cut(engine, run.run_id, wait=False))
    return out


__all__ = ["Rejoin", "Resumed", "ask", "decide", "expire", "finish_cut", "finish_cuts", "pending", "recorded_decision",
           "refusal", "rollback_recorded", "unnamed_target"]
