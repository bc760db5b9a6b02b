"""The store protocol: the one interface every backend (SQLite, Postgres) implements.

Every method is one transaction. State changes that two processes could race
on are compare-and-set: they name the state they expect and return ``False``
when it was not there, so exactly one process wins.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

from tether._store.states import CallState, RunStatus, WaitStatus

# The principal of runs started without a token: the CLI, the Python API, stdio, --dev HTTP.
LOCAL_PRINCIPAL = "local"


@dataclass
class RunRecord:
    run_id: str
    status: RunStatus
    program: str
    # Pinned environment: {"clock": iso8601, "seed": int}
    environment: dict[str, Any]
    # Policy and limits in force when the run started (JSON).
    policy: dict[str, Any]
    limits: dict[str, Any]
    created_at: float
    updated_at: float
    # Who the run belongs to (a token's hash, or LOCAL_PRINCIPAL); only they may act on it.
    principal: str | None = None
    owner: str | None = None
    lease_until: float | None = None
    expires_at: float | None = None
    result: Any = None  # JSON result envelope fields once terminal
    error: dict[str, Any] | None = None
    # What the run waits on while paused: {"seq", "address", "args", "annotations"}.
    pending: dict[str, Any] | None = None
    # The decision taken on the pending call (approve/decline/cancel) and its reason.
    decision: dict[str, Any] | None = None
    session: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # The run MAC (P-35): {"format": 2, "secret_id", "fields": {name: mac}, "names": mac}; see _engine/integrity.py.
    mac: dict[str, Any] | None = None
    # The caller's key for the request that started it (P-36): (principal, run_key) names one run.
    run_key: str | None = None


@dataclass
class CallRecord:
    run_id: str
    seq: int
    op: str  # "tool" | "search" | "describe" | "sources" | ...
    address: str
    args: dict[str, Any]
    key: str  # hash(op, address, canonical args)
    kind: str  # "read" | "write"
    state: CallState
    outcome: Any = None  # JSON value returned to the program
    error: dict[str, Any] | None = None  # {"code", "message"} raised in the program
    started_at: float | None = None
    finished_at: float | None = None
    # Sent to the tool with every send of this call (P-25); tool calls only.
    idempotency_key: str | None = None
    # How many times a write was sent: 1, or more when re-sent by key (P-31).
    sends: int = 0
    # Under a guarded policy (P-45): an untrusted read's label and the marks of its result
    # ({"trust", "marks": [[kind, norm, path], ...]}), or a write's verdict and reasons ({"ask", "reasons"}).
    lineage: dict[str, Any] | None = None
    mac: str | None = None  # "<secret id>:<prev key>:<hex>" over the entry (P-35)
    # Not a column: JSON fields already encoded, ``{"args" | "outcome": (the value, its canonical JSON)}``, which
    # the row takes instead of encoding the value again (D-52), while the entry still holds that very value
    # and the text is spelled as the column spells it (:func:`escapes_alike`). The writer (the ledger) puts a
    # text here only for a value nobody changes before the row is written, or one the entry's MAC is made from
    # too: the row must hold what was signed.
    texts: dict[str, tuple[Any, str]] | None = field(default=None, repr=False, compare=False,
                                                     metadata={"column": False})


def escapes_alike(text: str) -> bool:
    """Whether a canonical JSON text that keeps UTF-8 (``ensure_ascii=False``, the call boundary's) is spelled
    byte for byte as the escaping encoder (the store's JSON columns, the MACs) spells the same value.

    Only ASCII text is, and not all of it: DEL (U+007F) is escaped by the ASCII encoder alone (``\\u007f``),
    the other control characters by both alike.
    """
    return text.isascii() and "\x7f" not in text


@dataclass
class SnapshotRecord:
    run_id: str
    seq: int  # the number of calls issued when the dump was taken
    monty_version: str
    data: bytes
    mac: str  # hex HMAC-SHA256 over (run_id, seq, monty_version, data)
    pending: list[dict[str, Any]]  # calls the dump waits on: [{"seq","op","address","args"}]
    created_at: float
    kind: str = "pause"  # "pause" | "checkpoint" | "session"


WAIT_DIGEST_PREFIX = "wd1."


def wait_digest(key: str) -> str:
    """What the store keeps of a wait key: its digest, which resolves nothing (a digest maps to itself).

    A wait key is a bearer capability (an approval's decides a write), so a
    reader of the ``waits`` table must not find one there.
    """
    if key.startswith(WAIT_DIGEST_PREFIX):
        return key
    return WAIT_DIGEST_PREFIX + hashlib.sha256(key.encode()).hexdigest()


@dataclass
class WaitRecord:
    """A keyed, one-shot promise a run can park on (durable wait, signal, timer).

    Given to the store with its key; read back from it with the key's digest (:func:`wait_digest`).
    """

    key: str
    run_id: str
    name: str
    status: WaitStatus
    created_at: float
    seq: int | None = None  # the call that waits; None while a resolution is buffered
    value: Any = None
    error: dict[str, Any] | None = None
    deadline: float | None = None
    resolved_at: float | None = None
    session: str | None = None


@dataclass
class SessionRecord:
    """A REPL session's globals between executes: a signed, idle sandbox dump."""

    name: str
    principal: str
    monty_version: str
    data: bytes
    mac: str
    updated_at: float
    expires_at: float | None = None


@dataclass
class EventRecord:
    event_id: int
    run_id: str
    type: str
    data: dict[str, Any]
    created_at: float


# Outbox statuses: a notification is pending until delivered, or given up on.
OUTBOX_PENDING = "pending"
OUTBOX_DELIVERED = "delivered"
OUTBOX_FAILED = "failed"


@dataclass
class OutboxRecord:
    """A notification to deliver to one target (a webhook), retried until it is taken or given up."""

    id: int
    target: str
    event_id: str
    body: str  # the JSON event as queued (approval links are added when it is sent)
    status: str
    attempts: int
    next_at: float
    created_at: float
    claimed_until: float | None = None
    last_error: str | None = None
    delivered_at: float | None = None
    mac: str | None = None  # the body signed under the store's secret: a row tether did not queue is not sent


@dataclass(frozen=True)
class RunChange:
    """Where a run stands, as the notifier reconciles the outbox with it: enough to name its event (D-81)."""

    run_id: str
    status: str
    updated_at: float
    pending: str | None  # the stored JSON text as it is: a malformed row is refused by its reader, not here


@dataclass(frozen=True)
class ParkEvent:
    """The event a run stopping at a host call adds (``paused`` or ``waiting``), its data JSON-ready."""

    type: str
    data: dict[str, Any]
    at: float


class Conflict(Exception):
    """A unique key already existed (another process recorded it first)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the ports, declared once by its class (never guessed from its name).

    ``offloads``: its calls are network round trips, so callers on an event loop run them in the store's
    threads (``store.aio``, D-27). ``notifies``: ``listen`` hears ``notify`` from other processes (else
    they find changes by polling). ``secret_with_data``: a secret the store keeps itself is a row of the
    database it signs, so whoever can write the data can read the key (P-35); beside it in a file otherwise.
    """

    offloads: bool = False
    notifies: bool = False
    secret_with_data: bool = False


class RunsPort(Protocol):
    """Runs: created, read, compare-and-set, claimed by owners with leases, listed and deleted."""

    def create_run(self, run: RunRecord) -> None:
        """Insert a run; raises Conflict if the id exists."""

    def get_run(self, run_id: str) -> RunRecord | None: ...
    def get_run_by_key(self, principal: str, run_key: str) -> RunRecord | None:
        """The run ``principal`` started with ``run_key`` (P-36), if it is kept."""

    def update_run(self, run_id: str, expect_status: Sequence[str] | None, **fields: Any) -> bool:
        """Set ``fields`` if the run's status is in ``expect_status`` (any, if None). CAS."""

    def end_run(self, run_id: str, expect_status: Sequence[str] | None, calls: Sequence[CallRecord] = (),
                notice: str | None = None, **fields: Any) -> bool:
        """``update_run`` with journal entries ``calls`` inserted before it and ``notice`` sent to the other
        processes (where the store notifies), in one transaction."""

    def park_run(self, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                 waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
        """``update_run`` of a run stopping at a host call with its snapshot, its new waits (``create_wait``
        each) and its event, in one transaction; nothing is written when the compare-and-set loses."""

    def list_runs(self, status: str | None = None, limit: int = 100,
                  principals: Sequence[str] | None = None, local: bool = True) -> list[RunRecord]:
        """The newest runs first; with ``principals``, only theirs (a NULL principal is ``local``);
        ``local=False`` leaves out ``local``'s runs (an approver for everyone who is not shown them)."""

    def claim_run(self, run_id: str, owner: str, lease_until: float, now: float,
                  gone_owner: str | None = None) -> bool:
        """Take ownership when the run has no owner, the owner is ``owner``, or its lease expired.

        ``gone_owner``: also when the owner is still that one, a process known to have ended
        (tether._engine.ownership); compare-and-set, so a run another process took meanwhile stays its own.
        """

    def claim_queued(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        """The oldest queued run not in ``skip``, now ``running`` under ``owner``; None if there is none.

        Concurrent claimers never get the same run (Postgres: ``FOR UPDATE SKIP LOCKED``, so they
        do not queue behind each other's row locks either; SQLite: compare-and-set by its one writer).
        """

    def claim_due(self, owner: str, lease_until: float, now: float,
                  skip: Sequence[str] = ()) -> RunRecord | None:
        """The waiting run whose timer or wait deadline came first (not in ``skip``), now ``running``
        under ``owner``; None if there is none. Concurrent claimers never get the same run."""

    def claim_orphan(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        """A running run whose lease lapsed (not in ``skip``), now leased to ``owner``; None if none.

        The record returned is as it was before the claim (its dead owner and lapsed lease), so a
        claimer that cannot continue it can hand it back with ``release_orphan``.
        """

    def release_orphan(self, run: RunRecord, owner: str) -> bool:
        """Give back an orphan ``owner`` claimed: its previous owner and lapsed lease again."""

    def runs_with_expired_lease(self, now: float) -> list[RunRecord]:
        """Runs in status running whose lease ended before ``now``."""

    def paused_runs_past_expiry(self, now: float, limit: int = 100) -> list[RunRecord]:
        """Runs in status paused whose ``expires_at`` is before ``now``, the longest expired first."""

    def ended_runs_holding_pause(self, limit: int = 100) -> list[RunRecord]:
        """Runs cancelled by a decision, or failed without an error, that still hold their ``pending``: an end whose
        process stopped before it settled the pause's writes and wrote the envelope (P-53); ending a run clears it.
        Also cancelled runs still held by an owner: a cancel of a run nobody executed, cut before its envelope (D-90)."""

    def count_runs(self, status: str | None = None) -> int: ...
    def delete_run(self, run_id: str) -> bool:
        """Remove a run with its journal, snapshots and events; False if there was none."""

    def runs_updated_since(self, since: float, limit: int = 200) -> list[RunRecord]:
        """Runs whose ``updated_at`` is at or after ``since``, the oldest change first."""


class JournalPort(Protocol):
    """The call journal: one row per host call of a run (its write-ahead record)."""

    def record_call(self, call: CallRecord) -> None:
        """Insert a journal entry; raises Conflict if (run_id, seq) exists."""

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        """Insert several entries in one transaction (a batch of settled reads); Conflict if any exists."""

    def update_call(self, run_id: str, seq: int, expect_state: Sequence[str], *, while_run: Sequence[str] = (),
                    **fields: Any) -> bool:
        """Set ``fields`` if the entry's state is in ``expect_state`` (and, with ``while_run``, its run's status
        is one of those, held so until the change commits: P-51). CAS."""

    def get_call(self, run_id: str, seq: int) -> CallRecord | None: ...
    def get_calls(self, run_id: str, after: int | None = None,
                  states: Sequence[str] | None = None) -> list[CallRecord]:
        """Entries (with seq > ``after`` and in ``states``, when given), by seq."""

    def count_calls(self, run_id: str, kind: str | None = None, states: Sequence[str] | None = None) -> int: ...
    def journal_bytes(self, run_id: str) -> int:
        """Bytes of the run's journaled arguments and outcomes, as stored (P-22)."""

    def journal_totals(self, run_id: str, spent_states: Sequence[str]) -> tuple[int, int, int]:
        """(``journal_bytes``, writes in ``spent_states``, the run's ``output`` events), in one read."""


@dataclass(frozen=True)
class LineageMark:
    """One untrusted value a principal's earlier run was given, found by the normalised value (P-45)."""

    norm: str
    kind: str  # what values.marks found: "email", "url", "iban", ...
    run_id: str
    seq: int  # the call that returned it
    address: str  # the tool that did
    path: str  # where in its result
    created_at: float  # the run's


class LineagePort(Protocol):
    """The cross-run index of untrusted marks, written with the journal entries that carry them (P-45)."""

    def lineage_marks(self, principal: str, norms: Sequence[str], *, before: float,
                      since: float, session: str | None = None) -> list[LineageMark]:
        """For each of ``norms``, the newest mark with it given to ``principal``'s runs created before ``before``
        and at or after ``since`` (or, with ``session``, in that session); norms never seen have none."""


class SnapshotsPort(Protocol):
    """Signed sandbox dumps of a run (pauses, checkpoints)."""

    def put_snapshot(self, snapshot: SnapshotRecord) -> None: ...
    def latest_snapshot(self, run_id: str) -> SnapshotRecord | None: ...


class WaitsPort(Protocol):
    """Keyed one-shot waits a run parks on, and the runs they wake."""

    def create_wait(self, wait: WaitRecord) -> WaitRecord:
        """Insert a pending wait; if its key exists (a buffered resolution), return that row."""

    def get_wait(self, key: str) -> WaitRecord | None: ...
    def settle_wait(self, wait: WaitRecord) -> tuple[bool, WaitRecord]:
        """First settlement wins: pending (or absent, buffered) -> ``wait.status``.

        Returns (accepted, the row as stored).
        """

    def list_waits(self, run_id: str | None = None, status: str | None = WaitStatus.PENDING,
                   session: str | None = None) -> list[WaitRecord]: ...
    def runs_due(self, now: float, limit: int = 100) -> list[RunRecord]:
        """Waiting runs whose wake-up time (expires_at) has come."""
    def runs_with_settled_wait(self, limit: int = 50) -> list[str]:
        """Ids of parked runs whose wait was settled and that nobody continued."""


class SessionsPort(Protocol):
    """REPL sessions' globals between executes."""

    def put_session(self, session: SessionRecord) -> None:
        """Insert or replace the session (name, principal)."""

    def get_session(self, name: str, principal: str) -> SessionRecord | None: ...
    def delete_session(self, name: str, principal: str) -> bool: ...


class EventsPort(Protocol):
    """A run's event timeline, and notices to other processes on the same store."""

    def add_event(self, run_id: str, type: str, data: dict[str, Any], now: float) -> int: ...
    def get_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]: ...

    def notify(self, payload: str) -> None:
        """Tell processes listening on this store that something changed (a hint: they poll anyway)."""

    def listen(self, on_event: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_event(payload)`` from a thread for every notice; returns a stopper.

        Only a store whose ``capabilities.notifies`` hears other processes; elsewhere it hears nothing.
        """


class OutboxPort(Protocol):
    """Notifications to deliver to webhooks, claimed and retried until taken or given up."""

    def add_outbox(self, target: str, event_id: str, body: str, now: float, mac: str | None = None) -> bool:
        """Queue one notification for ``target``; False if that event was already queued for it."""

    def claim_outbox(self, now: float, lease_seconds: float, limit: int = 20) -> list[OutboxRecord]:
        """Pending notifications due by ``now``, each claimed for ``lease_seconds`` (CAS: one claimer wins)."""

    def settle_outbox(self, id: int, *, status: str, attempts: int, next_at: float,
                      last_error: str | None = None, delivered_at: float | None = None) -> None:
        """Record a delivery attempt and release the claim."""

    def list_outbox(self, status: str | None = None, limit: int = 100) -> list[OutboxRecord]: ...

    def outbox_known(self, event_ids: Sequence[str]) -> set[tuple[str, str]]:
        """(target, event_id) of every row queued for one of ``event_ids``, whatever its status."""

    def outbox_watermarks(self, targets: Sequence[str], start: float) -> dict[str, float]:
        """Each target's watermark: every run change before it was reconciled (D-81); a target without one gets
        ``start``."""

    def advance_outbox_watermark(self, target: str, watermark: float) -> None:
        """Move ``target``'s watermark forward to ``watermark`` (never back: replicas advance it concurrently)."""

    def run_changes(self, statuses: Sequence[str], since: float, after: str = "",
                    limit: int = 200) -> list[RunChange]:
        """Runs in ``statuses`` whose (updated_at, run_id) is after (``since``, ``after``), the oldest change first."""


class ListingCachePort(Protocol):
    """A cache of source listings keyed by a digest of the source's definition."""

    def get_listing(self, key: str) -> tuple[Any, float] | None:
        """The cached listing and when it was stored, or None."""

    def put_listing(self, key: str, data: Any, now: float) -> None: ...


class SignOutsPort(Protocol):
    """Console sessions signed out, refused by every process sharing the store."""

    def sign_out(self, session: str, expires_at: float, now: float) -> None:
        """Record that the console session ``session`` (a digest) ended; forgotten once it would have expired."""

    def signed_out(self, session: str) -> bool: ...


class Store(RunsPort, JournalPort, LineagePort, SnapshotsPort, WaitsPort, SessionsPort, EventsPort, OutboxPort, ListingCachePort,
            SignOutsPort, Protocol):
    """What the runtime needs from durable storage: every port, and what the backend can do.

    A module that needs one concern may ask for its port alone (``WaitsPort``, ``EventsPort``, ...).
    """

    url: str
    # The same store as awaitables, made once with it: what code on an event loop calls (AsyncStore, below).
    aio: AsyncStore
    capabilities: Capabilities

    # -- housekeeping
    def close(self) -> None: ...
    def secret(self) -> bytes:
        """The secret that signs: TETHER_SECRET, else TETHER_SECRET_FILE's first, else the one kept with the store."""

    def previous_secrets(self) -> list[bytes]:
        """Older secrets that still verify (TETHER_SECRET_FILE's later lines)."""

    secret_source: str  # "given" | "env" | "file" | "stored"

    def store_size_bytes(self) -> int:
        """Bytes the store occupies (files on disk, or the tables' relations)."""


# The store as awaitables, for code on the event loop (D-27). It lives beside the protocol it
# wraps: the protocol names it as ``store.aio``.
#
# The store as awaitables, for code on the event loop (docs/decisions.md D-27).
#
# A store's methods block until their transaction commits. On Postgres that is
# a network round trip or three, and a blocked event loop stalls every other
# run and the server with it; so for a store that says so (``capabilities.offloads``:
# Postgres) ``AsyncStore`` runs each call in the store's own threads, each on a
# connection of its own. SQLite answers faster inline than a thread hand-off
# costs, so its calls run in place.
#
# A call is never cut short by cancellation: the transaction finishes (or
# fails) in its thread as it would have inline, the caller gets its outcome, and
# the cancellation is delivered at the caller's next await. So a write-ahead
# record the caller awaited is either committed and seen, or not made, never
# committed behind the back of a caller that was told otherwise.

T = TypeVar("T")


class Offloading(Protocol):
    """A store whose calls should leave the event loop: it lends the threads they run in."""

    capabilities: Capabilities  # whose offloads is true

    def executor(self) -> Executor: ...


class AsyncStore:
    """The store as event-loop code sees it: every method of the Store protocol, awaitable.

    One per store, made with it (``store.aio``): code inside ``async def`` calls the store only through
    it (tests/shape/test_store_shape.py), so no transaction blocks the loop on a backend that offloads.
    Calls run in place unless the store's capabilities say it ``offloads`` (Postgres; a
    benchmark clears that to measure the loop-blocking path, as before D-27).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def inline(self) -> bool:
        return not self.store.capabilities.offloads

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, a function of the store's (or one that calls it), off the loop if offloading."""
        if self.inline:
            return fn(*args, **kwargs)
        store: Offloading = self.store  # type: ignore[assignment]
        done = asyncio.get_running_loop().run_in_executor(store.executor(), functools.partial(fn, *args, **kwargs))
        absorbed = 0
        while not done.done():
            try:
                await asyncio.wait((done,))
            except asyncio.CancelledError:
                # Counted back now and requested again once the call is over: asyncio.timeout()
                # tells its own cancellation apart by the task's count of them.
                task = asyncio.current_task()
                if task is None:
                    raise
                task.uncancel()
                absorbed += 1
        try:
            return done.result()
        finally:
            _recancel(absorbed)

    async def store_size_bytes(self) -> int:
        return await self.call(self.store.store_size_bytes)

    # -- runs

    async def create_run(self, run: RunRecord) -> None:
        await self.call(self.store.create_run, run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.call(self.store.get_run, run_id)

    async def get_run_by_key(self, principal: str, run_key: str) -> RunRecord | None:
        return await self.call(self.store.get_run_by_key, principal, run_key)

    async def update_run(self, run_id: str, expect_status: Sequence[str] | None, **fields: Any) -> bool:
        return await self.call(self.store.update_run, run_id, expect_status, **fields)

    async def end_run(self, run_id: str, expect_status: Sequence[str] | None, calls: Sequence[CallRecord] = (),
                      notice: str | None = None, **fields: Any) -> bool:
        return await self.call(self.store.end_run, run_id, expect_status, calls, notice, **fields)

    async def park_run(self, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                       waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
        return await self.call(self.store.park_run, run_id, expect_status, snapshot, waits, event, **fields)

    async def list_runs(self, status: str | None = None, limit: int = 100,
                        principals: Sequence[str] | None = None, local: bool = True) -> list[RunRecord]:
        return await self.call(self.store.list_runs, status, limit, principals, local)

    async def claim_run(self, run_id: str, owner: str, lease_until: float, now: float,
                        gone_owner: str | None = None) -> bool:
        return await self.call(self.store.claim_run, run_id, owner, lease_until, now, gone_owner)

    async def claim_queued(self, owner: str, lease_until: float, now: float,
                           skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_queued, owner, lease_until, now, skip)

    async def claim_due(self, owner: str, lease_until: float, now: float,
                        skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_due, owner, lease_until, now, skip)

    async def claim_orphan(self, owner: str, lease_until: float, now: float,
                           skip: Sequence[str] = ()) -> RunRecord | None:
        return await self.call(self.store.claim_orphan, owner, lease_until, now, skip)

    async def release_orphan(self, run: RunRecord, owner: str) -> bool:
        return await self.call(self.store.release_orphan, run, owner)

    async def runs_with_expired_lease(self, now: float) -> list[RunRecord]:
        return await self.call(self.store.runs_with_expired_lease, now)

    async def paused_runs_past_expiry(self, now: float, limit: int = 100) -> list[RunRecord]:
        return await self.call(self.store.paused_runs_past_expiry, now, limit)

    async def ended_runs_holding_pause(self, limit: int = 100) -> list[RunRecord]:
        return await self.call(self.store.ended_runs_holding_pause, limit)

    async def count_runs(self, status: str | None = None) -> int:
        return await self.call(self.store.count_runs, status)

    async def delete_run(self, run_id: str) -> bool:
        return await self.call(self.store.delete_run, run_id)

    # -- journal

    async def record_call(self, call: CallRecord) -> None:
        await self.call(self.store.record_call, call)

    async def record_calls(self, calls: Sequence[CallRecord]) -> None:
        await self.call(self.store.record_calls, calls)

    async def update_call(self, run_id: str, seq: int, expect_state: Sequence[str], *, while_run: Sequence[str] = (),
                          **fields: Any) -> bool:
        return await self.call(self.store.update_call, run_id, seq, expect_state, while_run=while_run, **fields)

    async def get_call(self, run_id: str, seq: int) -> CallRecord | None:
        return await self.call(self.store.get_call, run_id, seq)

    async def get_calls(self, run_id: str, after: int | None = None,
                        states: Sequence[str] | None = None) -> list[CallRecord]:
        return await self.call(self.store.get_calls, run_id, after, states)

    async def count_calls(self, run_id: str, kind: str | None = None, states: Sequence[str] | None = None) -> int:
        return await self.call(self.store.count_calls, run_id, kind, states)

    async def journal_bytes(self, run_id: str) -> int:
        return await self.call(self.store.journal_bytes, run_id)

    async def journal_totals(self, run_id: str, spent_states: Sequence[str]) -> tuple[int, int, int]:
        return await self.call(self.store.journal_totals, run_id, spent_states)

    async def lineage_marks(self, principal: str, norms: Sequence[str], *, before: float,
                            since: float, session: str | None = None) -> list[LineageMark]:
        return await self.call(self.store.lineage_marks, principal, norms, before=before, since=since,
                               session=session)

    # -- snapshots

    async def put_snapshot(self, snapshot: SnapshotRecord) -> None:
        await self.call(self.store.put_snapshot, snapshot)

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        return await self.call(self.store.latest_snapshot, run_id)

    # -- waits

    async def create_wait(self, wait: WaitRecord) -> WaitRecord:
        return await self.call(self.store.create_wait, wait)

    async def get_wait(self, key: str) -> WaitRecord | None:
        return await self.call(self.store.get_wait, key)

    async def settle_wait(self, wait: WaitRecord) -> tuple[bool, WaitRecord]:
        return await self.call(self.store.settle_wait, wait)

    async def list_waits(self, run_id: str | None = None, status: str | None = WaitStatus.PENDING,
                         session: str | None = None) -> list[WaitRecord]:
        return await self.call(self.store.list_waits, run_id, status, session)

    async def runs_due(self, now: float, limit: int = 100) -> list[RunRecord]:
        return await self.call(self.store.runs_due, now, limit)

    async def runs_with_settled_wait(self, limit: int = 50) -> list[str]:
        return await self.call(self.store.runs_with_settled_wait, limit)

    # -- sessions

    async def put_session(self, session: SessionRecord) -> None:
        await self.call(self.store.put_session, session)

    async def get_session(self, name: str, principal: str) -> SessionRecord | None:
        return await self.call(self.store.get_session, name, principal)

    async def delete_session(self, name: str, principal: str) -> bool:
        return await self.call(self.store.delete_session, name, principal)

    # -- source listings

    async def get_listing(self, key: str) -> tuple[Any, float] | None:
        return await self.call(self.store.get_listing, key)

    async def put_listing(self, key: str, data: Any, now: float) -> None:
        await self.call(self.store.put_listing, key, data, now)

    # -- events

    async def add_event(self, run_id: str, type: str, data: dict[str, Any], now: float) -> int:
        return await self.call(self.store.add_event, run_id, type, data, now)

    async def notify(self, payload: str) -> None:
        await self.call(self.store.notify, payload)

    async def get_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        return await self.call(self.store.get_events, run_id, after, limit)

    # -- changes

    async def runs_updated_since(self, since: float, limit: int = 200) -> list[RunRecord]:
        return await self.call(self.store.runs_updated_since, since, limit)

    # -- outbox

    async def add_outbox(self, target: str, event_id: str, body: str, now: float, mac: str | None = None) -> bool:
        return await self.call(self.store.add_outbox, target, event_id, body, now, mac)

    async def claim_outbox(self, now: float, lease_seconds: float, limit: int = 20) -> list[OutboxRecord]:
        return await self.call(self.store.claim_outbox, now, lease_seconds, limit)

    async def settle_outbox(self, id: int, *, status: str, attempts: int, next_at: float,
                            last_error: str | None = None, delivered_at: float | None = None) -> None:
        await self.call(self.store.settle_outbox, id, status=status, attempts=attempts, next_at=next_at,
                        last_error=last_error, delivered_at=delivered_at)

    async def list_outbox(self, status: str | None = None, limit: int = 100) -> list[OutboxRecord]:
        return await self.call(self.store.list_outbox, status, limit)

    async def outbox_known(self, event_ids: Sequence[str]) -> set[tuple[str, str]]:
        return await self.call(self.store.outbox_known, event_ids)

    async def outbox_watermarks(self, targets: Sequence[str], start: float) -> dict[str, float]:
        return await self.call(self.store.outbox_watermarks, targets, start)

    async def advance_outbox_watermark(self, target: str, watermark: float) -> None:
        await self.call(self.store.advance_outbox_watermark, target, watermark)

    async def run_changes(self, statuses: Sequence[str], since: float, after: str = "",
                          limit: int = 200) -> list[RunChange]:
        return await self.call(self.store.run_changes, statuses, since, after, limit)

    # -- console sign-outs

    async def sign_out(self, session: str, expires_at: float, now: float) -> None:
        await self.call(self.store.sign_out, session, expires_at, now)

    async def signed_out(self, session: str) -> bool:
        return await self.call(self.store.signed_out, session)


def _recancel(times: int) -> None:
    """Deliver cancellations absorbed while a call finished, at the caller's next await."""
    task = asyncio.current_task()
    for _ in range(times if task is not None else 0):
        task.cancel()  # type: ignore[union-attr]


__all__ = ["AsyncStore", "Offloading"]
