"""Every state a run, a journal entry and a wait can be in, and the transitions between them.

One vocabulary for the whole code base: the store persists these values,
``tether._engine.lifecycle`` is the one place that takes a run from one to the
next, ``tether._engine.calls.ledger`` the one place that writes a journal entry,
and the tables below are what they check. The members are ``str``
subclasses whose values are the strings stored and sent today, so rows,
JSON envelopes and run MACs stay byte for byte what they were.

This module imports nothing from tether: the store, the runs and the server
all read it (no layer imports upward to get it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Mapping


class RunStatus(StrEnum):
    """Where a run is in its life (docs/protocol.md). Terminal ones never change again."""

    QUEUED = "queued"  # waiting for a worker to claim it
    RUNNING = "running"  # an attempt holds a lease on it
    PAUSED = "paused"  # at a write that asks: a decision continues it
    WAITING = "waiting"  # parked on a durable wait, a signal or a sleep; expires_at is when it wakes
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its writes were undone by their compensations (D-67, P-46); the run's result lists what was and was not.
    ROLLED_BACK = "rolled_back"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_RUN_STATUSES


class CallState(StrEnum):
    """A journal entry's state (docs/protocol.md).

    reads:  pending -> done | failed
    writes: asked -> approved | declined ; approved -> sending -> sent | failed | unknown ; denied
    """

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    ASKED = "asked"
    APPROVED = "approved"
    DECLINED = "declined"
    DENIED = "denied"
    SENDING = "sending"
    SENT = "sent"
    UNKNOWN = "unknown"
    WAITING = "waiting"  # a wait_for / wait_for_signal / sleep the run is parked on


class WaitStatus(StrEnum):
    """A durable wait's status. ``pending`` is the only one that changes (the first settlement wins)."""

    PENDING = "pending"
    RESOLVED = "resolved"
    FAILED = "failed"  # resolved with an error
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    REVOKED = "revoked"


TERMINAL_RUN_STATUSES: frozenset[RunStatus] = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.ROLLED_BACK})
SETTLED_CALL_STATES: frozenset[CallState] = frozenset(
    {CallState.DONE, CallState.FAILED, CallState.SENT, CallState.DECLINED, CallState.DENIED, CallState.UNKNOWN})

_R = RunStatus
# The transitions a run may make, by the status it leaves; tether._engine.lifecycle
# makes each (the function named) and nothing else changes a run's status.
# Restating a status (a lease renewed, a run taken over, a terminal status
# written again with its envelope) is not a transition and is not listed.
RUN_TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = {
    # claim_queued; cancel_idle; finish (a tampered record ends failed)
    _R.QUEUED: frozenset({_R.RUNNING, _R.CANCELLED, _R.FAILED}),
    # park; finish, fail_internal, cancel_idle; unclaim (claimed where it cannot run); a rollback's end
    _R.RUNNING: frozenset({_R.PAUSED, _R.WAITING, _R.COMPLETED, _R.FAILED, _R.CANCELLED, _R.QUEUED,
                           _R.ROLLED_BACK}),
    # resume (its pause decided), begin_rollback; cancel_decided, cancel_idle; expire, finish
    _R.PAUSED: frozenset({_R.RUNNING, _R.CANCELLED, _R.FAILED}),
    # wake, claim_due; cancel_idle; finish
    _R.WAITING: frozenset({_R.RUNNING, _R.CANCELLED, _R.FAILED}),
    # An ended run reopens only to undo its writes (begin_rollback, D-67): running while its
    # compensations are sent, then rolled_back, which never changes again.
    _R.COMPLETED: frozenset({_R.RUNNING}),
    _R.FAILED: frozenset({_R.RUNNING}),
    _R.CANCELLED: frozenset({_R.RUNNING}),
    _R.ROLLED_BACK: frozenset(),
}

_C = CallState
# A journal entry's transitions, by the state it leaves; tether._engine.calls.ledger makes each
# (the store's update_call is their compare-and-set) and nothing else changes an entry.
# Restating a state (a read a dead attempt left pending, issued again; an entry's
# recorded idempotency key) is not a transition and is not listed.
CALL_TRANSITIONS: Mapping[CallState, frozenset[CallState]] = {
    _C.PENDING: frozenset({_C.DONE, _C.FAILED}),
    _C.ASKED: frozenset({_C.APPROVED, _C.DECLINED}),
    _C.APPROVED: frozenset({_C.SENDING, _C.DECLINED}),  # declined: a cancel of its batch before it was sent
    # sending -> sending: one more send by idempotency key (P-31)
    _C.SENDING: frozenset({_C.SENDING, _C.SENT, _C.FAILED, _C.UNKNOWN}),
    _C.WAITING: frozenset({_C.DONE, _C.FAILED}),
    _C.DONE: frozenset(),
    _C.FAILED: frozenset(),
    _C.SENT: frozenset(),
    _C.DECLINED: frozenset(),
    _C.DENIED: frozenset(),
    _C.UNKNOWN: frozenset(),
}

# The states an entry is first written in: an intent (a read's is held in memory and written with
# its outcome, P-7; a write asks or is approved by policy; a wait), or a call refused before it was sent.
NEW_CALL_STATES: frozenset[CallState] = frozenset(
    {_C.PENDING, _C.DONE, _C.FAILED, _C.ASKED, _C.APPROVED, _C.WAITING, _C.DENIED})

_W = WaitStatus
WAIT_TRANSITIONS: Mapping[WaitStatus, frozenset[WaitStatus]] = {
    _W.PENDING: frozenset({_W.RESOLVED, _W.FAILED, _W.TIMEOUT, _W.CANCELLED, _W.REVOKED}),
    **{s: frozenset() for s in WaitStatus if s is not _W.PENDING},
}


def run_move_allowed(frm: str, to: str) -> bool:
    """Whether a run in status ``frm`` may transition to ``to``; restating its status is allowed."""
    source = RunStatus(frm)
    target = RunStatus(to)
    return target in RUN_TRANSITIONS[source] or source is target


def call_move_allowed(frm: str, to: str) -> bool:
    """Whether a journal entry in state ``frm`` may move to ``to``; restating its state is allowed."""
    source = CallState(frm)
    target = CallState(to)
    return target in CALL_TRANSITIONS[source] or source is target
