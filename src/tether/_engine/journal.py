"""Pure journal decisions shared by every backend: replay or live?

The boundary numbers calls in the order the program issues them (``seq``).
On a fresh run the journal is empty and every call is live. After a restore
or during a replay, the journal already holds entries; :func:`decide` says,
for one call, what the boundary must do. It reads nothing and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tether._engine.limits import Limits
from tether._store.base import CallRecord
from tether._store.states import SETTLED_CALL_STATES, CallState

# Built once: json.dumps with options builds a new encoder on each call (same text either way).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept."""
    return _CANONICAL.encode(value)


def call_key(op: str, address: str, args: dict[str, Any]) -> str:
    """The identity of a call: what it does and with which arguments (P-3)."""
    return call_key_and_size(op, address, args)[0]


def call_key_and_size(op: str, address: str, args: dict[str, Any]) -> tuple[str, int]:
    """The call's key and the size in bytes of what identifies it, from one serialization."""
    data = canonical_json([op, address, args]).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest(), len(data)


def value_size(value: Any) -> int:
    """Bytes of a JSON value's text: what journaling it costs (P-22)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def refuse_value(limits: Limits, journaled: int, size: int, what: str, part: str, sent: bool) -> tuple[str, str] | None:
    """Why a value of ``size`` bytes may not be journaled, as (code, message); None if it may (P-22).

    ``part`` is "arguments" or "result". A value over ``journal_value_bytes``
    (a result also over ``memory_bytes``, what the sandbox could hold) fails
    its call; one that would take the run past ``journal_bytes`` ends the run.
    """
    cap = limits.journal_value_bytes if part == "arguments" else min(limits.journal_value_bytes, limits.memory_bytes)
    done = "it was sent and happened, but its result was not kept" if sent else (
        "it was not sent" if part == "arguments" else "it was not kept or given to the program")
    if size > cap:
        verb = "are" if part == "arguments" else "is"
        return (f"{part}_too_large", f"the {part} of {what} {verb} {size} bytes, over the {cap}-byte limit "
                                     f"(limits.journal_value_bytes); {done}")
    if journaled + size > limits.journal_bytes:
        return ("journal_limit", f"the run's journal would pass its {limits.journal_bytes}-byte total with the "
                                 f"{size}-byte {part} of {what}; {done}, and the run stopped")
    return None


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


def decide(entry: CallRecord | None, key: str, seq: int, last_recorded_seq: int) -> JournalAnswer:
    """Replay or live for the call at ``seq`` with identity ``key`` (P-5, P-6)."""
    if entry is None:
        if seq <= last_recorded_seq:
            # A gap below the last recorded call means the program took a
            # different path than the one the journal recorded.
            return JournalAnswer(DIVERGED, None, f"call {seq} is missing from the journal but later calls are recorded")
        return JournalAnswer(LIVE)
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
