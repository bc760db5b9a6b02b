"""Steering a run from outside it: deciding a paused write (resume), cancelling, resolving a wait.

Apart from the launcher because these reach the approvals service, which
continues a decided run through the launcher; each takes the Engine. A wait is
settled by the waits service (the one writer of wait rows); continuing its run
(waking it, or deciding the paused write an approval's wait stands for) is done
here, so the waits service needs nothing handed back to it.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Mapping

from tether._engine import launcher
from tether._engine.approvals import service
from tether._engine.approvals.model import APPROVAL_PREFIX, DECISIONS, UNDO, Decision, batch_of, cut_end, decision_of
from tether._engine.attempt.result import RunResult
from tether._engine.calls.boundary import Cancelled
from tether._engine.engine import NO_HOOKS, Hooks
from tether._engine.notices import CANCEL, SETTLED
from tether._engine.ownership import owner_gone
from tether._engine.rollback import runner as rollback
from tether._engine.waits import SIGNAL_PREFIX, wait_view
from tether._store.base import WAIT_DIGEST_PREFIX, RunRecord
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus, WaitStatus
from tether.errors import AlreadyDecided, InvalidArguments, NotPaused, ToolsUnavailable, WrongSecret

if TYPE_CHECKING:
    from tether._engine.engine import Engine


async def resume(engine: Engine, run_id: str, decision: str, reason: str | None = None, *, seq: int | None = None,
                 principal: str | None = None, actor: str | None = None, via: str = "python",
                 origin: str | None = None, hooks: Hooks = NO_HOOKS) -> RunResult:
    """Decide the paused write ``seq`` of ``run_id`` (Runtime.resume; P-10, P-28)."""
    t0 = time.perf_counter()
    if decision == UNDO:
        return await undo(engine, run_id, reason, principal=principal, actor=actor, via=via, origin=origin,
                          hooks=hooks, t0=t0)
    if decision not in DECISIONS:
        raise InvalidArguments(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    run = None
    if seq is None:
        # The run read to find the write is the one decided on: service.decide does not read it again.
        run = await engine.astore.call(engine.get_run, run_id, principal)
        seq = await engine.astore.call(service.unnamed_target, engine, run, decision)
    return await decide(engine, run_id, {seq: (decision, reason)}, principal=principal, actor=actor, via=via,
                        origin=origin, hooks=hooks, t0=t0, run=run)


async def decide(engine: Engine, run_id: str, decisions: Mapping[Any, Any], *, principal: str | None = None,
                 actor: str | None = None, via: str = "python", origin: str | None = None, hooks: Hooks = NO_HOOKS,
                 t0: float | None = None, run: RunRecord | None = None) -> RunResult:
    """Decide writes of a paused run by seq (Runtime.decide); once its whole pause is decided, continue it
    here with the caller's ``hooks`` (P-10, P-27..P-29). ``run``: the record just read for ``principal``."""
    t0 = time.perf_counter() if t0 is None else t0
    out = await service.decide(engine, run_id, decisions, principal=principal, actor=actor, via=via,
                               origin=origin, t0=t0, run=run)
    if isinstance(out, service.Resumed):
        return await launcher.launch(engine, out.run, mode="continue", hooks=hooks, t0=t0).result()
    if isinstance(out, service.Rejoin):
        return await launcher.rejoin(engine, out.run, wait_seconds=engine.settings.rejoin_wait_seconds, hooks=hooks,
                                     named_by="this decision")
    return out


async def undo(engine: Engine, run_id: str, reason: str | None = None, *, principal: str | None = None,
               actor: str | None = None, via: str = "python", origin: str | None = None, hooks: Hooks = NO_HOOKS,
               t0: float | None = None) -> RunResult:
    """Undo the writes of ``run_id`` (P-46): a paused run's pause is declined and undone; an ended run's
    writes are undone; the run ends ``rolled_back``. A repeat returns the rollback's outcome."""
    t0 = time.perf_counter() if t0 is None else t0
    run = await engine.astore.call(engine.get_run, run_id, principal)
    if run.status == RunStatus.PAUSED and batch_of(run):
        return await resume(engine, run_id, "decline_and_undo", reason, seq=batch_of(run)[0]["seq"],
                            principal=principal, actor=actor, via=via, origin=origin, hooks=hooks)
    if run.status == RunStatus.ROLLED_BACK or rollback.plan_of(run) is not None:
        return await engine.wait_for_run(run_id)
    if run.status not in TERMINAL_RUN_STATUSES:
        raise NotPaused(f"run {run_id} is {run.status}; its writes are undone at a pause (decline_and_undo) or "
                        "once it has ended; nothing was undone",
                        next_action="Wait for the run to pause or end (tether runs show), or cancel it first.")
    who = {"actor": actor or (principal if principal is not None else engine.settings.principal) or "local",
           "via": via, "origin": origin}
    record = Decision(0, UNDO, reason, **who, at=engine.clock())
    taken = await rollback.begin(engine, run, decision=record.to_dict())
    if taken is None:  # its status changed meanwhile (another undo won): what that one did
        return await engine.wait_for_run(run_id)
    engine.events.emit(run_id, "decided", record.event("*"))
    return await launcher.launch(engine, taken, mode="continue", hooks=hooks, t0=t0).result()


async def cancel(engine: Engine, run_id: str, reason: str = "cancelled by the client", *,
                 principal: str | None = None) -> RunResult:
    """Stop a run: nothing further is sent; a write already on the wire finishes and is journaled."""
    run = await engine.astore.call(engine.get_run, run_id, principal)
    if run.status == RunStatus.PAUSED:
        return await resume(engine, run_id, "cancel", reason, seq=(run.pending or {}).get("seq"),
                            principal=principal)
    if run.status in TERMINAL_RUN_STATUSES:
        if cut_end(run) is not None:  # cancelled (or expired) by a process that stopped half way: finished (P-53)
            return await service.finish_cut(engine, run_id)
        return RunResult.from_dict(run.result) if run.result else RunResult(status=run.status, run_id=run_id)
    if run.status in (RunStatus.QUEUED, RunStatus.WAITING):
        # Nothing is executing: end it here. Its waits end with it.
        return engine.finisher.cancel_now(run, reason) or await cancel(engine, run_id, reason, principal=principal)
    if engine.attempts.handle(run_id) is not None:
        # Executing here: stop its program once its sandbox is up (a just-started
        # attempt may still be preparing), then report how it ended.
        result = await _stop_here(engine, run_id, reason)
        if result.status in (RunStatus.PAUSED, RunStatus.WAITING):  # it stopped at a pause first: cancel that
            return await cancel(engine, run_id, reason, principal=principal)
        return result
    now = engine.clock()
    gone = owner_gone(run.owner)
    if run.lease_until is None or run.lease_until < now or gone:
        # No process owns it (its process stopped): take it, so no recoverer starts it, and end it.
        if engine.lifecycle.take_over(run_id, gone_owner=run.owner if gone else None):
            taken = await engine.store.aio.get_run(run_id)
            return (engine.finisher.cancel_now(taken, reason) if taken is not None else None) or await cancel(
                engine, run_id, reason, principal=principal)
    # Running in another process: a durable request its heartbeat sees, and a notice so it looks now.
    if not engine.lifecycle.request_cancel(run, reason):
        return await cancel(engine, run_id, reason, principal=principal)  # it stopped running meanwhile
    engine.events.notices.publish(CANCEL, run_id)
    result = await engine.wait_for_run(run_id, timeout=max(engine.lifecycle.lease_seconds, 1.0) * 2)
    if result.status in (RunStatus.PAUSED, RunStatus.WAITING):
        # It paused or parked before its owner saw the request (a parked run has none): end it as it is.
        return await cancel(engine, run_id, reason, principal=principal)
    return result


async def _stop_here(engine: Engine, run_id: str, reason: str) -> RunResult:
    handle = engine.attempts.handles[run_id]
    delay = 0.002
    while not handle.done():
        boundary = engine.attempts.live.get(run_id)
        if boundary is not None and boundary.execution is not None:
            boundary.execution.stop(Cancelled(reason))
            boundary.release_held()
            break
        await asyncio.wait({handle.task}, timeout=delay)
        delay = min(delay * 2, 0.05)
    return await engine.wait_for_run(run_id)


async def cancel_for_handle(engine: Engine, run_id: str, reason: str) -> RunResult:
    """A RunHandle's cancel(): as its run's own principal."""
    run = await engine.store.aio.get_run(run_id)
    return await cancel(engine, run_id, reason, principal=run.principal if run is not None else None)


# -- resolving a wait from outside (P-18) ------------------------------------------------


async def resolve_wait(engine: Engine, key: str, value: Any = None, *, error: str | None = None,
                       continue_run: bool = True) -> dict[str, Any]:
    """Settle a wait (Runtime.resolve_wait): the first resolution wins; the run continues here if it was
    parked on it. An approval's wait is its paused write's decision, made through :func:`resume`."""
    waits, astore = engine.waits, engine.astore
    parsed = waits.parse(key)
    if (parsed is None and isinstance(key, str) and not key.startswith(WAIT_DIGEST_PREFIX)
            and await astore.get_wait(key) is not None):
        # tether made this key (it names a stored wait), under a secret no longer held here.
        raise WrongSecret("the wait key was made with a secret this process does not hold; nothing was "
                          "resolved or sent", details={"key": key})
    run = await astore.get_run(parsed[0]) if parsed else None
    existing = await astore.get_wait(key) if parsed else None
    if parsed is None or run is None or (existing is not None and existing.status == WaitStatus.REVOKED):
        return {"status": "unknown_or_revoked", "key": key,
                "next_action": "Check the key (tether waits list); the wait may have been revoked."}
    run_id, name = parsed
    if name.startswith(APPROVAL_PREFIX):
        if not continue_run:
            # Settling the wait row alone would record a decision the journal never took, and a name in
            # the timeline nobody checked: an approval is decided by the approvals service, or not at all.
            raise InvalidArguments(
                f"{name} of run {run_id} is a paused write's approval; it is decided through the approvals "
                "service, which continues the run, so it cannot be resolved with continue_run=False. Nothing "
                "was decided or sent",
                next_action="Resolve the key with continue_run=True, or decide with rt.decide / "
                            "`tether resume RUN_ID --approve --seq N`.")
        # The key is the capability: whoever holds it decides as the run's owner.
        return await _resolve_approval(engine, key, run_id, name, value, error, run.principal)
    if run.status in TERMINAL_RUN_STATUSES and (existing is None or existing.status == WaitStatus.PENDING):
        # A wait still open on an ended run is one a cancel cut in half left (D-90): that cancel is finished, and
        # the resolution is not taken for a run that will never read it (D-91).
        if cut_end(run) is not None:
            await service.finish_cut(engine, run_id, wait=False)  # one a live process holds is left to it
        return {"status": "unknown_or_revoked", "key": key, "next_action": f"Run {run_id} has ended."}
    accepted, row = await astore.call(waits.resolve, key, run_id, name, value, error)
    out = {"status": "accepted" if accepted else "already_resolved", "key": key, "wait": wait_view(row, key)}
    # A resolution kept while the run could not continue (tools_unavailable) wakes it on a later try.
    result = None
    if continue_run and (accepted or (row.status == WaitStatus.RESOLVED and run.status == RunStatus.WAITING)):
        try:
            result = await launcher.wake(engine, run_id, key=key)
        except ToolsUnavailable as exc:
            engine.events.notices.publish(SETTLED, run_id)
            raise ToolsUnavailable(
                f"{exc.message}; the wait's resolution is kept: resolve it again where the sources load "
                "(or let a worker that has them wake the run)",
                details={**exc.details, "wait": out["status"]}) from None
        if result is not None:
            out["run"] = result.to_dict()
    if accepted and result is None:
        # Parked here on it, a runner continues it (told at once through a notice); running, it finds
        # the value itself.
        engine.events.notices.publish(SETTLED, run_id)
    return out


async def signal(engine: Engine, run_id: str, name: str, value: Any = None) -> dict[str, Any]:
    """Send a named signal (Runtime.signal); ``await wait_for_signal(name)`` receives it (kept if it comes
    first)."""
    return await resolve_wait(engine, engine.waits.key(run_id, SIGNAL_PREFIX + name), value)


async def _resolve_approval(engine: Engine, key: str, run_id: str, name: str, value: Any,
                            error: str | None, owner: str | None) -> dict[str, Any]:
    """Resolving an approval wait is deciding the paused write: resume() does the work."""
    seq = int(name.split(":", 1)[1])
    decision, reason = decision_of(value, error)
    if decision not in DECISIONS:
        return {"status": "invalid_value", "key": key,
                "next_action": 'Resolve an approval with {"decision": "approve" | "decline" | "cancel", '
                               '"reason": "..."}.'}
    row = await engine.astore.get_wait(key)
    if row is not None and row.status != WaitStatus.PENDING:
        return {"status": "already_resolved", "key": key, "wait": wait_view(row, key)}
    try:
        result = await resume(engine, run_id, decision, reason, seq=seq, principal=owner, via="key")
    except AlreadyDecided:
        return {"status": "already_resolved", "key": key, "wait": engine.waits.view(key)}
    return {"status": "accepted", "key": key, "wait": engine.waits.view(key), "run": result.to_dict()}
