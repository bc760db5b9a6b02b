"""The lifecycle: the one place a run changes status, owner or lease.

Every transition a run makes is one method of :class:`Lifecycle`. Each checks the
transition against ``RUN_TRANSITIONS`` (tether._store.states) and makes it with the
store's compare-and-set, so of two processes racing for the same transition exactly
one wins; the loser gets ``False`` (or ``None``) and leaves the run to the
winner. A transition the table does not list is a bug in tether: it is refused with
``InvalidTransition`` and nothing is written.

    create          (new) -> queued | running            launcher.begin, launcher.start
    claim_queued    queued -> running                    worker (work, run_queued)
    claim_due       waiting -> running (deadline came)   worker
    wake            waiting -> running (wait settled)    launcher.wake
    resume          paused -> running (pause decided)    approvals.service.decide (resume_run: the record too)
    claim_orphan    running, lease lapsed -> ours        worker (release_orphan hands it back)
    take_over       running, owner gone -> ours          worker, launcher (a keyed retry), control.cancel
    unclaim         running -> queued | waiting          worker (work, run_queued) (cannot run it here)
    renew           running: lease extended              Attempt heartbeat and checkpoints (driver.py)
    request_cancel  running: a cancel its owner sees     control.cancel
    park            running -> paused | waiting          Attempt.pause (driver.py)
    finish          -> completed | failed | cancelled    Finisher.finish (finish.py)
    fail_internal   running -> failed                    Finisher.internal_error (finish.py)
    expire          paused -> failed                     approvals.service.expire
    cancel_idle     (not executing) -> cancelled         Finisher.cancel_now (finish.py)
    cancel_decided  paused -> cancelled                  approvals.service._cancel
    begin_rollback  paused | ended -> running (undoing)  rollback.runner.begin (D-67)

``cancelled_error`` and ``outcome_unknown`` are the two records these transitions
write that used to be spelled out at each place that wrote them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from tether._engine import waits as waits_mod
from tether._store.base import CallRecord, ParkEvent, RunRecord, SnapshotRecord, Store, WaitRecord
from tether._store.states import RUN_TRANSITIONS, CallState, RunStatus, run_move_allowed
from tether.errors import InvalidTransition, WriteOutcomeUnknown

if TYPE_CHECKING:
    from tether._engine.rules.quotas import CountedStart


def check_move(run_id: str, frm: Iterable[str], to: str) -> list[RunStatus]:
    """The statuses in ``frm`` as enums, if the table allows each one's transition to ``to``; else
    ``InvalidTransition``."""
    sources = [RunStatus(s) for s in frm]
    refused = [s for s in sources if not run_move_allowed(s, to)]
    if refused or not sources:
        raise InvalidTransition(
            f"run {run_id} cannot transition from {', '.join(refused) or 'no status'} to {to}; nothing was written",
            details={"run_id": run_id, "from": [str(s) for s in refused], "to": str(to)})
    return sources


def sources_of(to: RunStatus) -> list[RunStatus]:
    """Every status a run may reach ``to`` from (itself included when it may be restated)."""
    return [s for s in RunStatus if to in RUN_TRANSITIONS[s] or s is to]


def cancelled_error(message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error of a cancelled run's envelope."""
    return {"code": "cancelled", "message": message, "next_action": "Start a new run if the work is still needed.",
            "details": details or {}}


def outcome_unknown(entry: CallRecord) -> tuple[dict[str, Any], WriteOutcomeUnknown]:
    """A write lost mid-send (P-11): the journal fields that say so, and the run's error. It is never re-sent."""
    fields = {"state": CallState.UNKNOWN,
              "error": {"type": "TimeoutError",
                        "message": f"[write_outcome_unknown] {entry.address} may or may not have happened"}}
    sent = (f" (sent {entry.sends} times with idempotency key {entry.idempotency_key})"
            if entry.sends > 1 and entry.idempotency_key else "")
    err = WriteOutcomeUnknown(
        f"the write {entry.address} (call {entry.seq}) was being sent{sent} when the run's process stopped; "
        "whether it happened is unknown and it was not sent again",
        details={"seq": entry.seq, "address": entry.address, "args": entry.args},
    )
    return fields, err


class Lifecycle:
    """Takes runs from status to status for one process (``owner``); each transition is a compare-and-set."""

    def __init__(self, store: Store, *, owner: str, clock: Callable[[], float], lease_seconds: float) -> None:
        self.store = store
        self.owner = owner
        self.clock = clock
        self.lease_seconds = lease_seconds

    def _move(self, run_id: str, frm: Sequence[str] | None, to: RunStatus, **fields: Any) -> bool:
        expect = check_move(run_id, frm, to) if frm is not None else sources_of(to)
        return self.store.update_run(run_id, expect, status=to, **fields)

    def _owned(self, now: float) -> dict[str, Any]:
        return {"owner": self.owner, "lease_until": now + self.lease_seconds, "updated_at": now}

    # -- starting and claiming --------------------------------------------------------

    def create(self, run: RunRecord, counted: CountedStart | None = None) -> None:
        """Record a new run: queued for a worker, or running and owned by this process.

        With ``counted``, its principal's runs quotas are counted in the same transaction (D-54).
        """
        if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            raise InvalidTransition(f"run {run.run_id} cannot start {run.status}; nothing was written",
                                    details={"run_id": run.run_id, "to": str(run.status)})
        if counted is None:
            self.store.create_run(run)
        else:
            counted.create(self.store, run)

    def claim_queued(self, skip: Sequence[str] = ()) -> RunRecord | None:
        """The oldest queued run not in ``skip``, now running here; None if there is none."""
        now = self.clock()
        return self.store.claim_queued(self.owner, now + self.lease_seconds, now, skip=skip)

    def claim_due(self, skip: Sequence[str] = ()) -> RunRecord | None:
        """The waiting run whose timer or wait deadline came first, now running here; None if none."""
        now = self.clock()
        return self.store.claim_due(self.owner, now + self.lease_seconds, now, skip=skip)

    def wake(self, run_id: str) -> bool:
        """A parked run whose wait was settled: waiting -> running here."""
        return self._move(run_id, [RunStatus.WAITING], RunStatus.RUNNING, **self._owned(self.clock()))

    def resume(self, run_id: str, decision: dict[str, Any]) -> bool:
        """A paused run whose pause is decided: paused -> running here, with the decision that let it go on."""
        return self._move(run_id, [RunStatus.PAUSED], RunStatus.RUNNING, decision=decision,
                          **self._owned(self.clock()))

    def resume_run(self, run: RunRecord, decision: dict[str, Any]) -> RunRecord | None:
        """:meth:`resume` for the paused ``run`` as read: the record as stored now, without reading it back
        (nothing but this compare-and-set changes a paused run); None if it was no longer paused."""
        owned = self._owned(self.clock())
        if not self._move(run.run_id, [RunStatus.PAUSED], RunStatus.RUNNING, decision=decision, **owned):
            return None
        return dataclasses.replace(run, status=RunStatus.RUNNING, decision=decision, **owned)

    def claim_orphan(self, skip: Sequence[str] = ()) -> RunRecord | None:
        """A running run whose lease lapsed, now leased here; returned as it was before (for release_orphan)."""
        now = self.clock()
        return self.store.claim_orphan(self.owner, now + self.lease_seconds, now, skip=skip)

    def release_orphan(self, before: RunRecord) -> bool:
        """Hand back an orphan claimed here: its previous owner and lapsed lease again."""
        return self.store.release_orphan(before, self.owner)

    def take_over(self, run_id: str, gone_owner: str | None = None) -> bool:
        """Own a run nobody holds: no owner, a lapsed lease, or ``gone_owner`` (a process known ended)."""
        now = self.clock()
        return self.store.claim_run(run_id, self.owner, now + self.lease_seconds, now, gone_owner=gone_owner)

    def unclaim(self, run: RunRecord, to: RunStatus) -> bool:
        """Give back a run claimed here that this process cannot run (back to the queue, or to waiting)."""
        if to not in (RunStatus.QUEUED, RunStatus.WAITING):
            raise InvalidTransition(f"run {run.run_id} cannot be handed back as {to}; nothing was written",
                                    details={"run_id": run.run_id, "from": [str(RunStatus.RUNNING)], "to": str(to)})
        return self._move(run.run_id, [RunStatus.RUNNING], to, owner=None, lease_until=None)

    # -- while it runs --------------------------------------------------------------------

    def renew(self, run_id: str, *, touch: bool = False) -> bool:
        """Extend this attempt's lease (``touch``: and say the run changed, at a checkpoint)."""
        now = self.clock()
        fields: dict[str, Any] = {"lease_until": now + self.lease_seconds}
        if touch:
            fields["updated_at"] = now
        return self.store.update_run(run_id, [RunStatus.RUNNING], **fields)

    def request_cancel(self, run: RunRecord, reason: str) -> bool:
        """Ask the process running ``run`` to stop it: a durable request its heartbeat sees."""
        return self.store.update_run(run.run_id, [RunStatus.RUNNING],
                                     meta={**run.meta, "cancel_requested": reason})

    def park(self, run_id: str, to: RunStatus, *, pending: dict[str, Any], expires_at: float | None,
             envelope: dict[str, Any], mac: dict[str, Any], meta: dict[str, Any] | None = None,
             snapshot: SnapshotRecord | None = None, waits: Sequence[WaitRecord] = (),
             event: ParkEvent | None = None) -> bool:
        """Stop at a write that asks (paused) or a wait (waiting); no process holds the run meanwhile.

        ``meta``: the run's meta as it is to be from now (an attempt that parks clears its takeovers, P-39).
        ``snapshot``, ``waits``, ``event``: the stop's signed dump, the waits it creates (a pause's approval
        waits) and its event, written with the move in one transaction (store.park_run; nothing of it when
        the move loses).
        """
        if to not in (RunStatus.PAUSED, RunStatus.WAITING):
            raise InvalidTransition(f"run {run_id} cannot park as {to}; nothing was written",
                                    details={"run_id": run_id, "from": [str(RunStatus.RUNNING)], "to": str(to)})
        more = {"meta": meta} if meta is not None else {}
        fields = dict(pending=pending, expires_at=expires_at, owner=None, lease_until=None, updated_at=self.clock(),
                      decision=None, result=envelope, mac=mac, **more)
        expect = check_move(run_id, [RunStatus.RUNNING], to)
        if snapshot is not None:
            return waits_mod.create_parking(self.store, waits, run_id, expect, snapshot, event, status=to, **fields)
        return self.store.update_run(run_id, expect, status=to, **fields)

    def note_takeover(self, run_id: str, meta: dict[str, Any]) -> bool:
        """Record on a run just taken over here how its earlier attempts ended (``meta``, P-39)."""
        return self.store.update_run(run_id, [RunStatus.RUNNING], owner=self.owner, meta=meta)

    # -- ending ---------------------------------------------------------------------------

    def finish(self, run_id: str, to: RunStatus, envelope: dict[str, Any], error: dict[str, Any] | None, *,
               calls: Sequence[CallRecord] = (), notice: str | None = None) -> bool:
        """Record how a run ended, with its envelope. From any status that may end so, or restating it
        (a compare-and-set elsewhere ended it first; this writes the envelope).

        ``calls``: the attempt's last journal batch, written in the same transaction, before the end
        (P-7); ``notice``: the other processes' notice of the end, sent with it (store.end_run).
        """
        if not RunStatus(to).terminal:
            raise InvalidTransition(f"run {run_id} cannot finish as {to}; nothing was written",
                                    details={"run_id": run_id, "to": str(to)})
        fields = dict(result=envelope, error=error, updated_at=self.clock(), owner=None, lease_until=None,
                      pending=None)
        if calls or notice is not None:
            return self.store.end_run(run_id, sources_of(to), calls, notice, status=to, **fields)
        return self._move(run_id, None, to, **fields)

    def fail_internal(self, run_id: str, envelope: dict[str, Any], error: dict[str, Any]) -> bool:
        """A running run tether itself failed ends failed; one that had ended or paused keeps that record."""
        return self._move(run_id, [RunStatus.RUNNING], RunStatus.FAILED, result=envelope, error=error,
                          updated_at=self.clock(), owner=None, lease_until=None, pending=None)

    def expire(self, run_id: str) -> bool:
        """A paused run past its approval time to live: paused -> failed, held here while its approved writes
        are unsent (its envelope is written by finish; a cut in between is finished by another, P-53)."""
        return self._move(run_id, [RunStatus.PAUSED], RunStatus.FAILED, **self._owned(self.clock()))

    def cancel_idle(self, run: RunRecord, error: dict[str, Any] | None = None) -> bool:
        """End a run no process is executing, from the status it was read in; False if that changed. The cancel's
        ``error`` is recorded with the move and the run held here until its envelope is written (finish), so a cut in
        between is recognised and finished by another (approvals.model.cut_end, D-90)."""
        if RunStatus(run.status).terminal:
            return False  # it ended meanwhile: a race lost, not a transition to refuse
        return self._move(run.run_id, [run.status], RunStatus.CANCELLED, error=error, **self._owned(self.clock()))

    def cancel_decided(self, run_id: str, decision: dict[str, Any]) -> bool:
        """A cancel decided on a paused write: paused -> cancelled, held here while its writes are settled."""
        return self._move(run_id, [RunStatus.PAUSED], RunStatus.CANCELLED, decision=decision,
                          **self._owned(self.clock()))

    # -- undoing ----------------------------------------------------------------------------

    def begin_rollback(self, run: RunRecord, pending: dict[str, Any], decision: dict[str, Any] | None,
                       sign: Callable[[RunRecord], dict[str, Any]]) -> RunRecord | None:
        """A person asked to undo the run's writes (D-67, P-46): from the status it was read in (paused, or
        ended) to running here, holding the rollback's plan as its signed ``pending``; None if that status
        changed meanwhile. It ends ``rolled_back`` through :meth:`finish`."""
        owned = self._owned(self.clock())
        taken = dataclasses.replace(run, status=RunStatus.RUNNING, pending=pending, expires_at=None,
                                    decision=decision if decision is not None else run.decision, **owned)
        taken.mac = sign(taken)
        expect = check_move(run.run_id, [run.status], RunStatus.RUNNING)
        if not self.store.update_run(run.run_id, expect, status=RunStatus.RUNNING, pending=pending, expires_at=None,
                                     decision=taken.decision, mac=taken.mac, **owned):
            return None
        return taken
