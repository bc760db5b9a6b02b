"""Steering a run from outside it: deciding a paused write (resume) and cancelling.

Apart from the launcher because both reach the approvals service, which
continues a decided run through the launcher; each takes the Engine.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Mapping

from tether._engine import launcher
from tether._engine.approvals import service
from tether._engine.approvals.model import DECISIONS
from tether._engine.calls.boundary import Cancelled
from tether._engine.engine import NO_HOOKS, Hooks
from tether._engine.notices import CANCEL
from tether._engine.ownership import owner_gone
from tether._engine.result import RunResult
from tether._store.base import RunRecord
from tether._store.states import TERMINAL_RUN_STATUSES, RunStatus
from tether.errors import InvalidArguments

if TYPE_CHECKING:
    from tether._engine.engine import Engine


async def resume(engine: Engine, run_id: str, decision: str, reason: str | None = None, *, seq: int | None = None,
                 principal: str | None = None, actor: str | None = None, via: str = "python",
                 origin: str | None = None, hooks: Hooks = NO_HOOKS) -> RunResult:
    """Decide the paused write ``seq`` of ``run_id`` (Runtime.resume; P-10, P-28)."""
    t0 = time.perf_counter()
    if decision not in DECISIONS:
        raise InvalidArguments(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    run = None
    if seq is None:
        # The run read to find the write is the one decided on: service.decide does not read it again.
        run = engine.get_run(run_id, principal)
        seq = service.unnamed_target(engine, run, decision)
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
    return out


async def cancel(engine: Engine, run_id: str, reason: str = "cancelled by the client", *,
                 principal: str | None = None) -> RunResult:
    """Stop a run: nothing further is sent; a write already on the wire finishes and is journaled."""
    run = engine.get_run(run_id, principal)
    if run.status == RunStatus.PAUSED:
        return await resume(engine, run_id, "cancel", reason, seq=(run.pending or {}).get("seq"),
                            principal=principal)
    if run.status in TERMINAL_RUN_STATUSES:
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
