"""Poison runs (P-39): a run whose attempts keep ending with their process gone is ended, not taken over again.

A takeover is the only sign a process leaves when it dies holding a run: it
crashed, it was killed because the run held it past its limits, or it lost
its lease. Each process that takes a run over records one line on the run
(``meta.takeovers``: whose attempt ended, how it was noticed, when, by whom);
an attempt that parks (paused or waiting) clears them, so they count attempts
*in a row*. When the run's ``limits.quarantine_after`` is reached, the process
that would take it over next ends it ``failed`` with ``run_quarantined``
instead, before anything of the program runs: nothing is sent by that attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether._engine.attempt.result import RunResult
from tether._engine.lifecycle import cancelled_error
from tether._engine.rules.limits import Limits
from tether._store.base import RunRecord
from tether._store.states import CallState, RunStatus
from tether.errors import RunQuarantined

if TYPE_CHECKING:
    from tether._engine.engine import Engine

TAKEOVERS = "takeovers"
# The run's meta key a cancel asked of a live owner is recorded under (Lifecycle.request_cancel).
CANCEL_REQUESTED = "cancel_requested"


def takeovers(run: RunRecord) -> list[dict[str, Any]]:
    """The attempts of ``run`` that ended with their process gone, in a row, oldest first."""
    found = (run.meta or {}).get(TAKEOVERS)
    return [dict(t) for t in found if isinstance(t, dict)] if isinstance(found, list) else []


def without_takeovers(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """``meta`` for an attempt that ends normally: None when there is nothing to clear (the write is skipped)."""
    if not meta or TAKEOVERS not in meta:
        return None
    return {k: v for k, v in meta.items() if k != TAKEOVERS}


async def continue_or_quarantine(engine: Engine, run: RunRecord, *, gone_owner: str | None,
                                 how: str) -> tuple[RunRecord | None, RunResult | None]:
    """Record this takeover of ``run`` (owned here now); the run to continue, or its envelope if quarantined (or
    cancelled: a cancel its dead process never saw, D-91)."""
    cancelled = await _cancel_requested(engine, run)
    if cancelled is not None:
        return None, cancelled
    now = engine.clock()
    ended = [*takeovers(run), {"owner": gone_owner, "ended": how, "noticed_at": now, "taken_by": engine.owner}]
    limit = Limits.from_dict(run.limits).quarantine_after
    if len(ended) < limit:
        meta = {**(run.meta or {}), TAKEOVERS: ended}
        if not await engine.astore.call(engine.lifecycle.note_takeover, run.run_id, meta):
            return None, None  # no longer ours or no longer running: nothing to continue here
        return await engine.astore.get_run(run.run_id), None
    in_doubt = await _in_doubt(engine, run)
    last = await engine.astore.get_calls(run.run_id, after=max(0, await engine.astore.count_calls(run.run_id) - 1))
    err = RunQuarantined(
        f"run {run.run_id} was not taken over again: its last {len(ended)} attempts in a row ended with their "
        f"process gone (a crash, a hang past its limits, or a lost lease; limits.quarantine_after = {limit}). "
        "Nothing was sent by this attempt"
        + (f"; the outcome of writes {in_doubt} left sending is unknown and they were not re-sent" if in_doubt
           else ""),
        details={"attempts": ended, "calls_in_doubt": in_doubt,
                 "last_call": {"seq": last[-1].seq, "address": last[-1].address, "state": str(last[-1].state)}
                 if last else None},
    )
    envelope = await engine.finisher.end_attempt(run, RunStatus.FAILED, error=err.to_dict(),
                                             calls=last[-1].seq if last else 0)
    return None, envelope


async def _in_doubt(engine: Engine, run: RunRecord) -> list[int]:
    return [e.seq for e in await engine.astore.get_calls(run.run_id, states=[CallState.SENDING])]


async def _cancel_requested(engine: Engine, run: RunRecord) -> RunResult | None:
    """End ``run`` (owned here now) cancelled when a cancel was asked of the process that died holding it.

    The request is a line on the run its owner's heartbeat reads (control.cancel); a process killed before its
    next look leaves it there. Whoever takes the run over honours it before anything of the program runs, or the
    program goes on to its next write as if nobody had asked (D-91). Unsigned, like the request itself: a row
    edited to say so can only stop a run, which an edit of its status does too.
    """
    reason = (run.meta or {}).get(CANCEL_REQUESTED)
    if not reason:
        return None
    in_doubt = await _in_doubt(engine, run)
    message = (f"the run was cancelled: {str(reason)[:500]}; its process stopped before it saw the cancel, and "
               "nothing further was sent"
               + (f"; the outcome of writes {in_doubt} left sending is unknown and they were not re-sent"
                  if in_doubt else ""))
    return await engine.finisher.end_attempt(run, RunStatus.CANCELLED, error=cancelled_error(
        message, {"reason": str(reason)[:500], "calls_in_doubt": in_doubt}))
