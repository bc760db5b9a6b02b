"""Ending a run: its envelope recorded, its listeners told, its observers' last event stored.

Every end goes through :class:`Finisher` — an attempt's (completed, failed,
cancelled), a cancel of a run nobody executes, a tampered run refused, a
failure of tether itself — so an ended run always carries its envelope.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any, Callable

from tether import _metrics as metrics
from tether._engine.attempt.result import RunResult
from tether._engine.events import EventBus
from tether._engine.lifecycle import Lifecycle, cancelled_error
from tether._engine.notices import ENDED, encode
from tether._store.base import CallRecord, RunRecord, Store
from tether._store.states import RunStatus
from tether.errors import TetherError

if TYPE_CHECKING:
    from tether._engine.calls.ledger import Ledger

_log = logging.getLogger("tether.runs")


def _ended(run: RunRecord, status: str, error: dict[str, Any] | None) -> None:
    """Count the end and log it, one line a pipeline can read (run_id, status, code as fields)."""
    metrics.run_ended(status, error)
    code = (error or {}).get("code")
    _log.info("run %s %s%s", run.run_id, status, f" [{code}]" if code else "",
              extra={"run_id": run.run_id, "status": status, "code": code, "principal": run.principal})


class Finisher:
    """Records how runs end; takes its collaborators, not the runtime."""

    def __init__(self, *, store: Store, lifecycle: Lifecycle, bus: EventBus, clock: Callable[[], float],
                 cancel_waits: Callable[[str], None], revoke_waits: Callable[[str], Any]) -> None:
        self.store = store
        self.astore = store.aio
        self.lifecycle = lifecycle
        self.bus = bus
        self.clock = clock
        # A cancelled run's waits end with it; a refused (tampered) run's keys stop working.
        self._cancel_waits = cancel_waits
        self._revoke_waits = revoke_waits

    def finish(self, run: RunRecord, status: str, *, result: Any = None, error: dict[str, Any] | None = None,
               logs: list[str] | None = None, calls: int = 0, diagnostics: dict[str, Any] | None = None,
               notes: list[str] | None = None, t0: float | None = None,
               rollback: list[dict[str, Any]] | None = None) -> RunResult:
        envelope = RunResult(status=status, run_id=run.run_id, result=result, logs=logs or [], error=error,
                             calls=calls, diagnostics=diagnostics or {}, notes=notes or [], rollback=rollback)
        self.lifecycle.finish(run.run_id, RunStatus(status), envelope.to_dict(), error)
        _ended(run, status, error)
        event = self._told(run, envelope)
        if event is not None:
            self.bus.emit(run.run_id, *event)  # its notice is the "ended" one too
        else:
            self.bus.notices.publish(ENDED, run.run_id)  # a waiter in another process looks now
        return envelope

    async def finish_awaited(self, run: RunRecord, status: str, *, error: dict[str, Any] | None = None,
                             rollback: list[dict[str, Any]] | None = None) -> RunResult:
        """``finish`` from the event loop, the store write awaited: off the loop on Postgres (D-27, D-43).

        The end and, when no observer's event carries it, the notice other processes wait on are one
        transaction, as ``end_attempt`` writes them.
        """
        envelope = RunResult(status=status, run_id=run.run_id, error=error, rollback=rollback)
        event = self._event(run, envelope)
        notice = encode(ENDED, run.run_id) if event is None and self.store.capabilities.notifies else None
        await self.astore.call(self.lifecycle.finish, run.run_id, RunStatus(status), envelope.to_dict(), error,
                               notice=notice)
        _ended(run, status, error)
        self._announce(run, envelope)
        if event is not None:
            await self.bus.emit_awaited(run.run_id, *event)  # its notice is the "ended" one too
        return envelope

    async def end_attempt(self, run: RunRecord, status: str, *, result: Any = None,
                          error: dict[str, Any] | None = None, logs: list[str] | None = None, calls: int = 0,
                          diagnostics: dict[str, Any] | None = None, notes: list[str] | None = None,
                          journal: Ledger | None = None) -> RunResult:
        """``finish`` for an attempt's own end, the store write awaited: off the event loop on Postgres (D-27).

        One transaction (one statement on Postgres) writes the settled reads ``journal`` still holds, the
        run's end and, when no observer's event carries it, the notice other processes wait on: the journal
        is never behind the end (P-7) and a woken waiter finds the end (D-49: three round trips before).
        """
        envelope = RunResult(status=status, run_id=run.run_id, result=result, logs=logs or [], error=error,
                             calls=calls, diagnostics=diagnostics or {}, notes=notes or [])
        event = self._event(run, envelope)
        notice = encode(ENDED, run.run_id) if event is None and self.store.capabilities.notifies else None

        async def end(entries: list[CallRecord]) -> bool:
            return await self.astore.call(self.lifecycle.finish, run.run_id, RunStatus(status), envelope.to_dict(),
                                          error, calls=entries, notice=notice)

        if journal is not None:
            await journal.write_with(end)
        else:
            await end([])
        _ended(run, status, error)
        self._announce(run, envelope)
        if event is not None:
            await self.bus.emit_awaited(run.run_id, *event)  # its notice is the "ended" one too
        return envelope

    def _told(self, run: RunRecord, envelope: RunResult) -> tuple[str, dict[str, Any]] | None:
        """Tell this process's listeners; the event observers wait for (P-20), if any observes the run."""
        self._announce(run, envelope)
        return self._event(run, envelope)

    def _announce(self, run: RunRecord, envelope: RunResult) -> None:
        self.bus.announce(run.run_id, envelope.status, {"error": envelope.error} if envelope.error else {})

    def _event(self, run: RunRecord, envelope: RunResult) -> tuple[str, dict[str, Any]] | None:
        """The event observers wait for (P-20), if any observes the run."""
        status, result, error, notes = envelope.status, envelope.result, envelope.error, envelope.notes
        # The event a cell observer waits for (P-20); a plain execute has no
        # observer and saves the write.
        if (run.meta or {}).get("cell") or self.bus.observed(run.run_id):
            kinds: dict[str, str] = {RunStatus.COMPLETED: "completed", RunStatus.FAILED: "failed"}
            kind = kinds.get(status, "terminated")
            data = {"result": result, "notes": notes or []} if status == RunStatus.COMPLETED else {"error": error}
            return kind, data
        return None

    def cancelled(self, run: RunRecord, message: str, *, details: dict[str, Any] | None = None,
                  **fields: Any) -> RunResult:
        """End ``run`` cancelled, its waits with it (the caller has moved its status, or owns the run)."""
        self._cancel_waits(run.run_id)
        return self.finish(run, RunStatus.CANCELLED, error=cancelled_error(message, details), **fields)

    def cancel_now(self, run: RunRecord, reason: str) -> RunResult | None:
        """End a run no process is executing: compare-and-set from its status; None if that changed."""
        message = f"the run was cancelled: {reason}; nothing further was sent"
        if not self.lifecycle.cancel_idle(run, cancelled_error(message)):
            return None
        return self.cancelled(run, message)

    async def finish_cancel(self, run: RunRecord) -> RunResult:
        """Finish a cancel whose process stopped between the run's move and its envelope (``cancel_now`` cut in half,
        D-90): its waits end with it, and its envelope carries the error the move recorded."""
        await self.astore.call(self._cancel_waits, run.run_id)
        error = run.error if isinstance(run.error, dict) else cancelled_error("the run was cancelled; nothing further "
                                                                              "was sent")
        return await self.finish_awaited(run, RunStatus.CANCELLED, error=error)

    def refused(self, run: RunRecord, exc: TetherError, *, t0: float | None = None) -> RunResult:
        """End a run whose record, journal or snapshot failed its check (P-35): nothing was sent."""
        self._revoke_waits(run.run_id)
        return self.finish(run, RunStatus.FAILED, error=exc.to_dict(), t0=t0)

    def internal_error(self, run: RunRecord, exc: BaseException) -> RunResult:
        """End a run that tether itself failed: `failed` with `internal_error`, never left `running`.

        The traceback goes to the log under a correlation id; the envelope
        carries only the id, so nothing of the host leaks to the caller.
        """
        correlation = secrets.token_hex(8)
        _log.error("internal error in run %s (correlation id %s)", run.run_id, correlation, exc_info=exc,
                   extra={"run_id": run.run_id, "correlation_id": correlation})
        error = TetherError(
            f"tether failed while running or finishing this run ({type(exc).__name__}); correlation id {correlation}",
            next_action="Report this as a bug in tether with the correlation id (the server's log has the details); "
                        "calls already made are in the journal (tether runs show).",
            details={"correlation_id": correlation},
        ).to_dict()
        envelope = RunResult(status=RunStatus.FAILED, run_id=run.run_id, error=error)
        try:
            ended = self.lifecycle.fail_internal(run.run_id, envelope.to_dict(), error)
            if not ended:  # it had already ended (or paused) before the failure: that record stands
                current = self.store.get_run(run.run_id)
                if current is not None and current.result:
                    return RunResult.from_dict(current.result)
        except Exception:  # noqa: BLE001 - the store failed too: the lease lapses and recovery takes it
            _log.exception("could not record the internal error of run %s (correlation id %s)",
                           run.run_id, correlation)
        return envelope
