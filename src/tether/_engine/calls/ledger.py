"""The ledger: the one writer of journal entries, and so the owner of the write-ahead call lifecycle.

Every call row is written here and nowhere else: an intent ahead of its send
(P-7), each change of state, each outcome. A change is checked against
``CALL_TRANSITIONS`` (tether._store.states) and made with the store's
compare-and-set, so of two processes moving the same entry exactly one wins and
the loser gets ``False``; a change the table does not list is a bug in tether:
it is refused with ``InvalidTransition`` and nothing is written. Every entry is
signed when written and re-signed when it moves on (P-35), its MAC chained to
the key of the call before it (the MACs themselves are made by
tether._engine.integrity, through the approvals capabilities' keyring).

Two faces:

- :func:`move` / :func:`move_async`: one entry moved outside an attempt (a
  decision on a paused write, a write a dead attempt left ``sending``);
- :class:`Ledger`: one attempt's journal. Reads are journaled in batches
  (P-7): a read's entry is written with its outcome, at the latest before the
  next write, wait, snapshot or the end of the attempt, so a crash loses at most
  the tail of reads after the last write, and those are simply issued again;
  writes never wait in a buffer.

A batch closes on what it holds (64 settled reads, or 1 MiB of their values),
never on how long the run has taken: a loaded machine that takes a second over
ten reads writes them in the same one transaction as a quiet one (D-6: the
old "0.25 s since the last flush" split a 10-call run into up to six on CI).
Time is only a cap, on the event loop's clock: a settled read is written once
no read has settled for 0.25 s (the program computes, or waits on a slow call)
or it has waited 2 s, whichever is first.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from tether._engine import integrity
from tether._engine.approvals.capabilities import Keyring
from tether._engine.calls.call import Call, canonical_json
from tether._engine.rules.limits import Limits
from tether._sandbox.monty import GuestRaise
from tether._store.base import AsyncStore, CallRecord, Store
from tether._store.states import CALL_TRANSITIONS, NEW_CALL_STATES, CallState
from tether._tools.context import idempotency_key
from tether.errors import InvalidTransition

_log = logging.getLogger("tether.runs")
T = TypeVar("T")
# What a call the program issued before it ended, and that reaches the journal only after, is answered: no
# entry is started for it and nothing is sent (D-82). Nobody reads the answer; it unwinds the host call.
_ENDED = GuestRaise("BaseException", "the program has ended: this call was neither journaled nor sent")

# The table as plain strings, restating included: checked on every move of every call, so no enum is built.
_MAY_BECOME: dict[str, frozenset[str]] = {
    frm.value: frozenset(to.value for to in tos) | {frm.value} for frm, tos in CALL_TRANSITIONS.items()}


def check_move(entry: CallRecord, expect: Sequence[str], fields: dict[str, Any]) -> list[str]:
    """The states in ``expect``, if the table lets each one move to the state ``fields`` give
    (the entry's own when they give none); else ``InvalidTransition``, before anything is written."""
    to = fields.get("state", entry.state)
    sources = list(expect)
    refused = [s for s in sources if to not in _MAY_BECOME.get(s, ())]
    if refused or not sources:
        raise InvalidTransition(
            f"journal entry {entry.seq} of run {entry.run_id} cannot move from "
            f"{', '.join(map(str, refused)) or 'no state'} to {to}; nothing was written",
            details={"run_id": entry.run_id, "seq": entry.seq, "from": [str(s) for s in refused], "to": str(to)})
    return sources


def check_new(record: CallRecord) -> None:
    """Refuse, with ``InvalidTransition``, an entry first written in a state no call starts in."""
    if record.state not in NEW_CALL_STATES:
        raise InvalidTransition(
            f"journal entry {record.seq} of run {record.run_id} cannot be first written as {record.state}; "
            "nothing was written",
            details={"run_id": record.run_id, "seq": record.seq, "from": [], "to": str(record.state)})


def _signed(keyring: Keyring, entry: CallRecord, expect: Sequence[str],
            fields: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    return check_move(entry, expect, fields), integrity.signed_update(keyring, entry, **fields)


def _apply(entry: CallRecord, fields: dict[str, Any]) -> None:
    """Give ``entry`` the values the store now holds."""
    for name, value in fields.items():
        setattr(entry, name, value)


def move(store: Store, keyring: Keyring, entry: CallRecord | None, expect: Sequence[str],
         *, while_run: Sequence[str] = (), **fields: Any) -> bool:
    """Move an entry on from one of ``expect`` (compare-and-set), re-signed; on success ``entry`` holds
    the new values. False when there is no entry or it is no longer in ``expect`` (or, with ``while_run``,
    its run is no longer in one of those statuses: a decision moves an entry only while its run is paused,
    P-51).

    Every signed field that can change is written with the MAC, not only
    ``fields``: the row then always holds exactly what was signed, even if a
    process that lost its lease wrote the same entry meanwhile.
    """
    if entry is None:
        return False
    sources, signed = _signed(keyring, entry, expect, fields)
    if not store.update_call(entry.run_id, entry.seq, sources, while_run=while_run, **signed):
        return False
    _apply(entry, signed)
    return True


async def move_async(astore: AsyncStore, keyring: Keyring, entry: CallRecord | None,
                     expect: Sequence[str], **fields: Any) -> bool:
    """:func:`move` for a caller on the event loop: the write leaves it on Postgres (D-27)."""
    if entry is None:
        return False
    sources, signed = _signed(keyring, entry, expect, fields)
    if not await astore.update_call(entry.run_id, entry.seq, sources, **signed):
        return False
    _apply(entry, signed)
    return True


def value_size(value: Any) -> int:
    """Bytes of a JSON value's text: what journaling it costs (P-22)."""
    return value_text(value)[1]


def value_text(value: Any) -> tuple[str, int]:
    """A JSON value's canonical text and its bytes (P-22): the size check's encoding, which the entry's MAC
    reuses (:meth:`Ledger.record_outcome`)."""
    # The canonical encoder is built once (json.dumps with options built one per call, per host call);
    # sorting keys changes no length. An ASCII text is its own byte count: no UTF-8 copy made to count it.
    try:
        text = canonical_json(value)
    except ValueError:  # a NaN from outside the sandbox (a wait's value as stored) is counted as it is written
        return "", len(_NAN_ALLOWED.encode(value).encode("utf-8", "surrogatepass"))
    return text, len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


_NAN_ALLOWED = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


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


class Ledger:
    """One attempt's view of its run's journal: what was recorded, and what it records now."""

    def __init__(self, *, run_id: str, store: Store, keyring: Keyring, clock: Callable[[], float],
                 entries: list[CallRecord], flush_every_calls: int = 64, flush_every_bytes: int = 1 << 20,
                 flush_quiet_seconds: float = 0.25, flush_wait_cap_seconds: float = 2.0) -> None:
        self.run_id = run_id
        self.store = store
        # Every write is awaited: on Postgres it leaves the event loop (D-27).
        self.astore = store.aio
        # One flush at a time: a write's intent waits for the reads a flush already took (P-7).
        self._flushing = asyncio.Lock()
        self.keyring = keyring
        self.clock = clock
        self.flush_every_calls = flush_every_calls
        self.flush_every_bytes = flush_every_bytes
        self.flush_quiet_seconds = flush_quiet_seconds
        self.flush_wait_cap_seconds = flush_wait_cap_seconds
        self._timer: asyncio.TimerHandle | None = None
        self._timed: asyncio.Task[None] | None = None  # a flush the timer started, held so it is not collected
        self.reset(entries)

    def reset(self, entries: list[CallRecord]) -> None:
        """Start from ``entries`` (a replay after a restore that could not be used reads the whole journal)."""
        self.entries: dict[int, CallRecord] = {e.seq: e for e in entries}
        # The highest seq earlier attempts recorded: a live call past it is new.
        self.last_recorded_seq = max(self.entries, default=0)
        self._unsaved: dict[int, CallRecord] = {}
        self._keys: dict[int, str] = {}  # seq -> call key, for chaining MACs (P-35)
        # seq -> {"outcome": (the value, its canonical text)} of a held read, for its row and its MAC (P-35).
        # Only the outcome: it is tether's own copy (calls/plain.py), whereas the arguments are the very dict the
        # tool was handed, which a tool could change in place after their text was made.
        self._texts: dict[int, dict[str, tuple[Any, str]]] = {}
        # Settled reads held (seq -> bytes of the value), what closes a batch; when the oldest and the
        # newest of them settled, on the loop's clock, what the timer caps.
        self._held: dict[int, int] = {}
        self._held_bytes = 0
        self._first_settled = self._last_settled = 0.0
        self._closed = False
        # Set once the program has returned, raised or stopped: no entry is started after (D-82).
        self.program_ended = False
        self._disarm()

    async def close(self, *, hold: bool = False) -> None:
        """The attempt's end: write the held reads, and the timer writes nothing after it (P-7).

        ``hold``: the run's end writes them, in its own transaction (:meth:`write_with`, Finisher.end_attempt).
        """
        try:
            if not hold:
                await self.flush()
        finally:
            self._closed = True
            self._disarm()

    async def write_with(self, write: Callable[[list[CallRecord]], Awaitable[T]]) -> T:
        """Hand the settled reads still held, checked and signed, to ``write``, which writes them with what
        else it writes (the run's end) in one transaction; they are written once it returns."""
        async with self._flushing:
            settled = sorted((r for r in self._unsaved.values() if r.state != CallState.PENDING), key=lambda r: r.seq)
            for r in settled:
                check_new(r)
                self._sign(r)
            out = await write(settled)
            for r in settled:
                r.texts = None  # written: the entry no longer holds a second copy of its values
                del self._unsaved[r.seq]
                self._held_bytes -= self._held.pop(r.seq, 0)
            return out

    def get(self, seq: int) -> CallRecord | None:
        return self.entries.get(seq)

    def note_key(self, seq: int, key: str) -> None:
        """The key of call ``seq`` as issued, which the next entry's MAC chains to."""
        self._keys[seq] = key

    def idempotency_key(self, seq: int) -> str:
        """The recorded key if the journal has one, else the derived one (P-25)."""
        entry = self.entries.get(seq)
        if entry is not None and entry.idempotency_key:
            return entry.idempotency_key
        return idempotency_key(self.run_id, seq)

    # -- writing -----------------------------------------------------------------

    def end_program(self) -> None:
        """The program has ended: a call it issued that has not started its entry yet never will (D-82)."""
        self.program_ended = True

    def buffer_intent(self, call: Call) -> None:
        """A read's intent, held until its outcome and written with it."""
        if self.program_ended:
            raise _ENDED
        seq = call.seq
        # _record's entry, built with its fields in order (every live read makes one).
        record = CallRecord(self.run_id, seq, call.op, call.address, call.args, call.key, "read", CallState.PENDING,
                            None, None, self.clock(), None,
                            self.idempotency_key(seq) if call.op == "tool" else None)
        self._unsaved[seq] = record
        self.entries[seq] = record

    def _record(self, call: Call, kind: str, state: CallState, **fields: Any) -> CallRecord:
        return CallRecord(self.run_id, call.seq, call.op, call.address, call.args, call.key, kind, state, **fields,
                          idempotency_key=self.idempotency_key(call.seq) if call.op == "tool" else None)

    async def flush(self) -> None:
        """Write the settled reads still held in memory, in one transaction."""
        if not self._unsaved:
            return  # nothing buffered, and so no flush in flight either
        async with self._flushing:
            settled = [r for r in self._unsaved.values() if r.state != CallState.PENDING]
            if not settled:
                return
            settled.sort(key=lambda r: r.seq)
            for r in settled:
                check_new(r)
                self._sign(r)
            await self.astore.record_calls(settled)
            for r in settled:
                r.texts = None  # written: the entry no longer holds a second copy of its values
                del self._unsaved[r.seq]
                self._held_bytes -= self._held.pop(r.seq, 0)
            if not self._held:
                self._disarm()
            else:  # settled while the batch was on its way: they start a batch of their own
                self._first_settled = asyncio.get_running_loop().time()

    def _settled(self, seq: int, size: int) -> Awaitable[None] | None:
        """A held read has its outcome: the batch's flush if it is full, else None, the timer made sure to cap
        its wait."""
        self._held[seq] = size
        self._held_bytes += size
        if len(self._held) >= self.flush_every_calls or self._held_bytes >= self.flush_every_bytes:
            return self.flush()
        loop = asyncio.get_running_loop()
        self._last_settled = loop.time()
        if self._timer is None:
            self._first_settled = self._last_settled
            self._timer = loop.call_at(self._last_settled + self.flush_quiet_seconds, self._due)
        return None

    def _due(self) -> None:
        """The timer: write the held reads if none settled for the quiet time or the oldest waited the cap."""
        self._timer = None
        if not self._held or self._closed:
            return
        loop = asyncio.get_running_loop()
        at = min(self._last_settled + self.flush_quiet_seconds, self._first_settled + self.flush_wait_cap_seconds)
        if loop.time() < at:
            self._timer = loop.call_at(at, self._due)
            return
        self._timed = loop.create_task(self._timed_flush())

    async def _timed_flush(self) -> None:
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - the reads stay held: the next flush (at the latest the attempt's end) writes them or fails the attempt
            _log.warning("could not write the settled reads of run %s yet; they stay held", self.run_id,
                         exc_info=True, extra={"run_id": self.run_id})

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def record_intent(self, call: Call, kind: str, state: CallState, existing: CallRecord | None,
                            lineage: dict[str, Any] | None = None) -> None:
        """Write a call's intent ahead of sending it (P-7); buffered reads go first so the order holds.
        ``lineage``: a guarded write's verdict and reasons, signed with its intent (P-45)."""
        if self.program_ended:
            raise _ENDED
        if kind != "read":
            await self.flush()
        now = self.clock()
        if existing is not None:
            # A read left pending by a dead attempt is re-issued under the same seq.
            await self.move(call.seq, [existing.state], state=state, started_at=now, outcome=None, error=None,
                            finished_at=None, **({"lineage": lineage} if lineage is not None else {}))
            return
        await self.record_new(self._record(call, kind, state, started_at=now, lineage=lineage))

    async def record_new(self, record: CallRecord) -> None:
        """Write an entry now (a write's, a wait's), after the reads before it."""
        if self.program_ended:
            raise _ENDED
        check_new(record)
        await self.flush()
        self._sign(record)
        await self.astore.record_call(record)
        record.texts = None  # written: the entry no longer holds a second copy of its values
        self.entries[record.seq] = record

    async def record_outcome(self, seq: int, from_state: CallState, state: CallState, *, outcome: Any = None,
                             error: dict[str, Any] | None = None, size: int = 0, text: str = "") -> None:
        """A call's outcome; a held read's stays held with its intent (``size``: its value's bytes, P-22;
        ``text``: its canonical JSON, which the entry's MAC reuses)."""
        written = self.settle(seq, from_state, state, outcome=outcome, error=error, size=size, text=text)
        if written is not None:
            await written

    def settle(self, seq: int, from_state: CallState, state: CallState, *, outcome: Any = None,
               error: dict[str, Any] | None = None, size: int = 0, text: str = "",
               lineage: dict[str, Any] | None = None) -> Awaitable[Any] | None:
        """:meth:`record_outcome`, for the boundary's path of every call: what is left to await, if anything.

        A held read's outcome is kept with its intent in memory, so usually nothing is: no coroutine is made
        for it (core_bench). A full batch hands back its flush; an entry already written, its move.
        ``lineage``: an untrusted read's label and marks, signed with its outcome (P-45).
        """
        buffered = self._unsaved.get(seq)
        if buffered is None:
            if lineage is not None:
                return self.move(seq, [from_state], state=state, outcome=outcome, error=error,
                                 finished_at=self.clock(), lineage=lineage)
            return self.move(seq, [from_state], state=state, outcome=outcome, error=error, finished_at=self.clock())
        if state not in _MAY_BECOME.get(from_state, ()):
            check_move(buffered, [from_state], {"state": state})  # raises InvalidTransition, naming the move
        buffered.state, buffered.outcome, buffered.error, buffered.finished_at = state, outcome, error, self.clock()
        if lineage is not None:
            buffered.lineage = lineage
        if text:
            self._texts.setdefault(seq, {})["outcome"] = (outcome, text)
        return self._settled(seq, size)

    async def record_rejected(self, call: Call, kind: str, error: dict[str, Any],
                              state: CallState = CallState.FAILED) -> None:
        """A call refused before it was sent (unknown tool, bad arguments, denied): its entry, written now."""
        if self.program_ended:
            raise _ENDED
        now = self.clock()
        record = CallRecord(self.run_id, call.seq, call.op, call.address, call.args, call.key, kind, state,
                            error=error, started_at=now, finished_at=now)
        check_new(record)
        self._unsaved[call.seq] = record
        self.entries[call.seq] = record
        await self.flush()

    async def move(self, seq: int, expect: list[str], **fields: Any) -> bool:
        """Compare-and-set an entry from one of ``expect`` to ``fields``, re-signed (P-35).

        The entry in memory changes only once the store has the change.
        """
        entry = self.entries.get(seq) or await self.astore.get_call(self.run_id, seq)
        return await move_async(self.astore, self.keyring, entry, expect, **fields)

    # -- signing -------------------------------------------------------------------

    def _prev_key(self, seq: int) -> str | None:
        before = self.entries.get(seq - 1)
        return before.key if before is not None else self._keys.get(seq - 1)

    def _sign(self, record: CallRecord) -> None:
        """Sign ``record`` from the texts of its JSON fields, and hand its row the same texts: each value is
        encoded once for both (``integrity.call_texts``; the outcome's text the call boundary made is taken
        where it is spelled alike), and the row holds the bytes that were signed (``CallRecord.texts``)."""
        texts = record.texts = integrity.call_texts(record, self._texts.pop(record.seq, None) or record.texts)
        record.mac = integrity.sign_call(self.keyring, record, self._prev_key(record.seq), texts)
