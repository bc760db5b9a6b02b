"""Replay or live: what the boundary does with one call, given what the journal holds (P-5, P-6).

The boundary numbers calls in the order the program issues them (``seq``).
On a fresh run the journal is empty and every call is live. After a restore
or during a replay, the journal already holds entries; :func:`decide` says,
for one call, what the boundary must do, and a settled entry is answered
from the journal (:func:`raised`, or its outcome) without sending anything.
Pure: it reads nothing and writes nothing, the same for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether._sandbox.monty import GuestRaise
from tether._store.base import CallRecord
from tether._store.states import SETTLED_CALL_STATES, CallState

# What the boundary does with one call.
LIVE = "live"  # not journaled (or a read left pending): decide policy, dispatch
REPLAY = "replay"  # settled: answer from the journal, send nothing
ASK = "ask"  # a write awaiting a decision: pause (or ask inline) again
SEND = "send"  # approved but never marked sending: safe to send now
UNKNOWN = "unknown"  # marked sending, no outcome: the write may have happened
DIVERGED = "diverged"  # the program asks for something else than the journal holds
WAIT = "wait"  # parked on a wait, signal or timer: look at the wait again


@dataclass(frozen=True)
class JournalAnswer:
    """What the journal answers for one call of the program: its action (live, replay, ask, …) and entry."""

    action: str
    entry: CallRecord | None = None
    reason: str = ""


# The answer for every call of a fresh run, made once: a frozen dataclass costs ~1 µs to build, per host call.
_LIVE = JournalAnswer(LIVE)


def decide(entry: CallRecord | None, key: str, seq: int, last_recorded_seq: int, *,
           unrecorded_ok: bool = False) -> JournalAnswer:
    """Replay or live for the call at ``seq`` with identity ``key`` (P-5, P-6).

    ``unrecorded_ok``: the call may be missing below the last recorded one — a read (a tool that does not
    write, or search/describe/sources), or a call the restored snapshot's signed record lists as held (P-9);
    the boundary works it out only for such a call.
    """
    if entry is None:
        if seq <= last_recorded_seq:
            if unrecorded_ok:
                # A read's intent waits in memory for its outcome (D-6) and a call held while a pause forms is
                # not journaled (P-4), so a gathered call can be missing below a write recorded after it; a
                # read is safe to issue again, like a read left pending, and a held call was never sent (D-80).
                return _LIVE
            # Anything else missing below the last recorded call means the program
            # took a different path than the one the journal recorded.
            return JournalAnswer(DIVERGED, None, f"call {seq} is missing from the journal but later calls are recorded")
        return _LIVE
    if entry.key != key:
        return JournalAnswer(
            DIVERGED,
            entry,
            f"call {seq} was journaled as {entry.op} {entry.address} with other arguments",
        )
    state = entry.state
    if state in SETTLED_CALL_STATES:
        return JournalAnswer(REPLAY, entry)
    if state == CallState.PENDING:
        # A read whose outcome was never recorded: reads are safe to re-issue.
        return JournalAnswer(LIVE, entry)
    if state == CallState.ASKED:
        return JournalAnswer(ASK, entry)
    if state == CallState.APPROVED:
        return JournalAnswer(SEND, entry)
    if state == CallState.SENDING:
        return JournalAnswer(UNKNOWN, entry)
    if state == CallState.WAITING:
        return JournalAnswer(WAIT, entry)
    return JournalAnswer(DIVERGED, entry, f"call {seq} is in unexpected state {state!r}")


def entry_of(decision: JournalAnswer) -> CallRecord:
    """The journal entry a replayed or unknown call's decision always carries (:func:`decide`)."""
    if decision.entry is None:
        raise RuntimeError(f"journal decision {decision.action!r} without its entry")
    return decision.entry


def raised(entry: CallRecord) -> GuestRaise | None:
    """What a replayed call raises in the program: the error its entry recorded, if any (else its outcome)."""
    if not entry.error:
        return None
    return GuestRaise(entry.error.get("type", "RuntimeError"), entry.error.get("message", ""))
