"""A run that stops at a host call, stored in one transaction: its snapshot, its new waits, its record, its event.

A pause used to be four transactions (the snapshot, each approval wait, ``running -> paused``, the ``paused``
event), each locking or reading the run on its own (D-50). They are one here, in this order: the run's
compare-and-set first — it locks the run row, which is what the snapshot and the event each locked it for
(event ids become visible in id order, P-20) — then the snapshot, the waits, the event. A compare-and-set that
loses writes nothing: a run no longer running (cancelled, expired) needs no snapshot, waits or event.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from tether._store._rows import (
    _INSERT_SNAPSHOT,
    _INSERT_WAIT,
    _SELECT_WAIT,
    SNAPSHOT_COLUMNS,
    WAIT_COLUMNS,
    _encode,
    _in,
    _run_update,
    _run_where,
    _wait,
    dump_json,
)
from tether._store.base import ParkEvent, SnapshotRecord, WaitRecord, wait_digest
from tether._store.states import WaitStatus
from tether.errors import InvalidTransition

if TYPE_CHECKING:
    from tether._store._schema import SQLStore, Tx


def park_run(store: SQLStore, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
             waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
    """``update_run`` with the stop's snapshot, its new waits (created pending unless they exist) and its event,
    in one transaction; False, and nothing written, when the compare-and-set loses."""
    where = _run_where(run_id, expect_status, fields)
    if where is None or not fields:
        return False
    _check(run_id, waits)
    with store._transaction(write=True, run_id=run_id) as tx:
        if tx.run(*_run_update(where, fields)).rowcount != 1:
            return False
        values = [_encode(SNAPSHOT_COLUMNS, n, getattr(snapshot, n)) for n in SNAPSHOT_COLUMNS]
        # Older snapshots of the same kind are never read again: keep one per kind (as put_snapshot).
        tx.run("DELETE FROM snapshots WHERE run_id = ? AND kind = ?", (run_id, snapshot.kind))
        tx.run(_INSERT_SNAPSHOT, values)
        if waits:
            _create_waits(tx, waits)
        if event is not None:
            tx.run("INSERT INTO events (run_id, type, data, created_at) VALUES (?, ?, ?, ?)",
                   (run_id, event.type, dump_json(event.data), event.at))
            store._announce_event(tx, run_id)
        return True


def _check(run_id: str, waits: Sequence[WaitRecord]) -> None:
    """A stop creates its own run's waits, pending (a wait starts so, WAIT_TRANSITIONS); else nothing is written."""
    for w in waits:
        if w.status != WaitStatus.PENDING or w.run_id != run_id:
            raise InvalidTransition(f"wait {w.name} of run {w.run_id} cannot start {w.status} with run {run_id}'s "
                                    "stop; nothing was written", details={"run_id": w.run_id, "to": str(w.status)})


def _create_waits(tx: Tx, waits: Sequence[WaitRecord]) -> None:
    """``create_wait`` for several waits in one read and one insert: a wait whose row exists (a resolution
    buffered before the run reached it, or an earlier attempt's) is kept, given its seq and deadline if it
    had none; the others are inserted pending."""
    keys = [k for w in waits for k in (wait_digest(w.key), w.key)]
    rows = tx.run(f"{_SELECT_WAIT} WHERE key_digest IN {_in(len(keys))}", keys).fetchall()
    found = {w.key: w for w in map(_wait, rows)}
    new = []
    for w in waits:
        row = found.get(wait_digest(w.key)) or found.get(w.key)
        if row is None:
            new.append(dataclasses.replace(w, key=wait_digest(w.key)))
        elif row.seq is None and w.seq is not None:
            tx.run("UPDATE waits SET seq = ?, deadline = ? WHERE key_digest = ?", (w.seq, w.deadline, row.key))
    if new:
        one = _INSERT_WAIT.split(" VALUES ")
        many = ", ".join([one[1]] * len(new))
        tx.run(f"{one[0]} VALUES {many}",
               [_encode(WAIT_COLUMNS, n, getattr(w, n)) for w in new for n in WAIT_COLUMNS])


def park_run_statement(store: SQLStore, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                       waits: Sequence[WaitRecord], event: ParkEvent | None, channel: str, **fields: Any) -> bool:
    """``park_run`` as one statement (Postgres): data-modifying CTEs, each of the snapshot, wait and event
    writes conditional on the run's move (``EXISTS (SELECT 1 FROM parked)``), and the event's notice (on
    ``channel``) selected from the move's row, so a lost move writes and sends nothing. One statement needs
    no ``BEGIN``/``COMMIT`` (D-40): one round trip. The event waits for the move's row lock, as ``add_event``
    waits for its own: it takes its id only once ``parked`` has a row. A CTE sees the tables as they were
    before the statement, so the snapshot replaces the one of its kind by an upsert (a ``DELETE`` beside the
    ``INSERT`` could run after it), and a wait is inserted only where no row had its key (``create_wait``'s rule: a row already there is kept, given
    its seq and deadline if it had none)."""
    where = _run_where(run_id, expect_status, fields)
    if where is None or not fields:
        return False
    _check(run_id, waits)
    moved = " WHERE EXISTS (SELECT 1 FROM parked)"
    update, params = _run_update(where, fields)
    parts = [f"parked AS ({update} RETURNING 1)"]
    # The one snapshot of its kind replaced, under a new id: ids are write order (the latest is restored).
    replaced = ", ".join(f"{n} = EXCLUDED.{n}" for n in SNAPSHOT_COLUMNS if n not in ("run_id", "kind"))
    parts.append(f"snap AS ({_as_select(_INSERT_SNAPSHOT)}{moved}"
                 f" ON CONFLICT (run_id, kind) DO UPDATE SET id = DEFAULT, {replaced})")
    params += [_encode(SNAPSHOT_COLUMNS, n, getattr(snapshot, n)) for n in SNAPSHOT_COLUMNS]
    for i, w in enumerate(waits):
        digest = wait_digest(w.key)
        parts.append(f"seen{i} AS (UPDATE waits SET seq = ?, deadline = ? WHERE key_digest IN (?, ?) AND seq IS NULL"
                     " AND EXISTS (SELECT 1 FROM parked))")
        params += [w.seq, w.deadline, digest, w.key]
        parts.append(f"wait{i} AS ({_as_select(_INSERT_WAIT)}{moved}"
                     " AND NOT EXISTS (SELECT 1 FROM waits WHERE key_digest IN (?, ?)))")
        stored = dataclasses.replace(w, key=digest)
        params += [_encode(WAIT_COLUMNS, n, getattr(stored, n)) for n in WAIT_COLUMNS] + [digest, w.key]
    if event is not None:
        parts.append("ev AS (INSERT INTO events (run_id, type, data, created_at) SELECT ?, ?, ?, ?"
                     f"{moved})")
        params += [run_id, event.type, dump_json(event.data), event.at]
        select = "SELECT 1, pg_notify(?, ?) FROM parked"
        params += [channel, run_id]
    else:
        select = "SELECT 1 FROM parked"
    with store._transaction(write=True, run_id=run_id, single=True) as tx:
        return tx.run(f"WITH {', '.join(parts)} {select}", params).fetchone() is not None


def _as_select(insert: str) -> str:
    """``INSERT INTO t (...) VALUES (?, ...)`` as ``INSERT INTO t (...) SELECT ?, ...`` (a WHERE may follow)."""
    head, values = insert.split(" VALUES ")
    return f"{head} SELECT {values.strip()[1:-1]}"
