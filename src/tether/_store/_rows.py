"""Rows <-> records: how each record's fields become a table's columns, and the SQL built from that.

One list per table drives INSERT, SELECT and UPDATE (``SQLStore``, ``parking``, the Postgres backend): a
column's kind says how its value is encoded (JSON columns hold canonical text, sorted keys, no spaces,
ASCII escapes; blobs are bytes; the rest as they are).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from typing import Any, Sequence

from tether._store.base import (
    LOCAL_PRINCIPAL,
    CallRecord,
    EventRecord,
    OutboxRecord,
    RunRecord,
    SessionRecord,
    SnapshotRecord,
    WaitRecord,
    escapes_alike,
)
from tether._store.states import TERMINAL_RUN_STATUSES, CallState, RunStatus, WaitStatus

RUN_STATUSES = frozenset(RunStatus)
CALL_STATES = frozenset(CallState)
# Spelled into SQL as literals: statuses are fixed strings, never user input,
# and a literal lets the planner use the partial indexes (_migrations.py).
_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in sorted(TERMINAL_RUN_STATUSES)) + ")"

# ---------------------------------------------------------------------------
# Rows <-> records. A column's kind says how it is encoded; names match the
# record fields so one list drives INSERT, SELECT and UPDATE. A field added to
# a record therefore needs a migration adding its column, or every query fails.

_JSON = "json"
_PLAIN = "plain"
_BLOB = "blob"


def _columns(record: type, json_fields: set[str], blob_fields: set[str] | None = None) -> dict[str, str]:
    kinds = {}
    for f in dataclass_fields(record):
        if f.metadata.get("column") is False:  # carried beside the row (CallRecord.texts), never stored
            continue
        kinds[f.name] = _JSON if f.name in json_fields else _BLOB if f.name in (blob_fields or ()) else _PLAIN
    return kinds


RUN_COLUMNS = _columns(
    RunRecord, {"environment", "policy", "limits", "result", "error", "pending", "decision", "meta", "mac"}
)
CALL_COLUMNS = _columns(CallRecord, {"args", "outcome", "error", "lineage"})
SNAPSHOT_COLUMNS = _columns(SnapshotRecord, {"pending"}, {"data"})
WAIT_COLUMNS = _columns(WaitRecord, {"value", "error"})
SESSION_COLUMNS = _columns(SessionRecord, set(), {"data"})
OUTBOX_COLUMNS = _columns(OutboxRecord, set())
EVENT_COLUMNS = {"id": _PLAIN, "run_id": _PLAIN, "type": _PLAIN, "data": _JSON, "created_at": _PLAIN}

# A record field whose column is named otherwise: the column says which digest it holds (migration 11,
# D-48); the field keeps the name the engine uses. The old "key" columns stay until the contract
# migration (docs/deploy.md), filled by the backends' triggers; this code never names them.
CALL_COLUMN_NAMES = {"key": "identity_digest"}
WAIT_COLUMN_NAMES = {"key": "key_digest"}

# Fields an update may set: everything but the row's key. A call's identity digest never changes.
# A journal row is built per entry on every batch: the columns' kinds as pairs, looked up once.
_CALL_KINDS = tuple(CALL_COLUMNS.items())

_RUN_UPDATABLE = frozenset(RUN_COLUMNS) - {"run_id", "run_key"}
_CALL_UPDATABLE = frozenset(CALL_COLUMNS) - {"run_id", "seq", "key"}


# Built once: json.dumps with options builds a new encoder on each call (same bytes either way).
_JSON_COLUMN = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dump_json(value: Any) -> str | None:
    if value is None:
        return None
    return _JSON_COLUMN.encode(value)


def _encode(kinds: dict[str, str], name: str, value: Any) -> Any:
    kind = kinds[name]
    if kind == _JSON:
        return dump_json(value)
    if kind == _BLOB:
        return bytes(value)
    return value


def _call_row(call: CallRecord) -> list[Any]:
    """A journal entry's column values, in ``CALL_COLUMNS`` order: its JSON fields encoded here, or taken from
    the text the entry carries of them (``CallRecord.texts``: the call boundary encoded them already)."""
    texts = call.texts
    row = []
    for name, kind in _CALL_KINDS:
        value = getattr(call, name)
        if kind == _JSON and value is not None:
            held = texts.get(name) if texts else None
            if held is not None and held[0] is value and escapes_alike(held[1]):
                value = held[1]
            else:
                value = _JSON_COLUMN.encode(value)
        row.append(value)
    return row


def _decode(kinds: dict[str, str], row: Sequence[Any]) -> dict[str, Any]:
    """A row selected with ``_select(table, kinds)``, by field name."""
    out = {}
    for (name, kind), value in zip(kinds.items(), row):
        if value is not None and kind == _JSON:
            value = json.loads(value)
        elif value is not None and kind == _BLOB:
            value = bytes(value)
        out[name] = value
    return out


def _select(table: str, kinds: dict[str, str], names: dict[str, str] | None = None) -> str:
    return f"SELECT {', '.join((names or {}).get(n, n) for n in kinds)} FROM {table}"


def _insert(table: str, kinds: dict[str, str], names: dict[str, str] | None = None) -> str:
    columns = ", ".join((names or {}).get(n, n) for n in kinds)
    return f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(kinds))})"


_SELECT_RUN = _select("runs", RUN_COLUMNS)
_SELECT_CALL = _select("calls", CALL_COLUMNS, CALL_COLUMN_NAMES)
_SELECT_SNAPSHOT = _select("snapshots", SNAPSHOT_COLUMNS)
_SELECT_EVENT = _select("events", EVENT_COLUMNS)
_SELECT_WAIT = _select("waits", WAIT_COLUMNS, WAIT_COLUMN_NAMES)
_INSERT_WAIT = _insert("waits", WAIT_COLUMNS, WAIT_COLUMN_NAMES)
_INSERT_RUN = _insert("runs", RUN_COLUMNS)
_INSERT_CALL = _insert("calls", CALL_COLUMNS, CALL_COLUMN_NAMES)
_INSERT_SNAPSHOT = _insert("snapshots", SNAPSHOT_COLUMNS)
# Rows per multi-row INSERT: journal batches fit in one statement, far below SQLite's 32,766 and Postgres's
# 65,535 parameters.
_ROWS_PER_INSERT = 100


@lru_cache(maxsize=128)
def _insert_rows(insert: str, columns: int, rows: int) -> str:
    """``insert`` (one row of ``columns`` placeholders) extended to ``rows`` rows."""
    one = "(" + ", ".join("?" * columns) + ")"
    return insert[: insert.rindex(" VALUES ")] + " VALUES " + ", ".join([one] * rows)


def _run(row: Sequence[Any]) -> RunRecord:
    values = _decode(RUN_COLUMNS, row)
    values["status"] = RunStatus(values["status"])
    return RunRecord(**values)


def _call(row: Sequence[Any]) -> CallRecord:
    values = _decode(CALL_COLUMNS, row)
    values["state"] = CallState(values["state"])
    return CallRecord(**values)


def _wait(row: Sequence[Any]) -> WaitRecord:
    values = _decode(WAIT_COLUMNS, row)
    values["status"] = WaitStatus(values["status"])
    return WaitRecord(**values)


def _event(row: Sequence[Any]) -> EventRecord:
    values = _decode(EVENT_COLUMNS, row)
    values["event_id"] = values.pop("id")
    return EventRecord(**values)


def _run_where(run_id: str, expect_status: Sequence[str] | None,
               fields: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """update_run's WHERE clause and its parameters; None when ``expect_status`` is empty (nothing matches)."""
    unknown = fields.keys() - _RUN_UPDATABLE
    if unknown:
        raise TypeError(f"update_run cannot set {sorted(unknown)}; settable: {sorted(_RUN_UPDATABLE)}")
    if "status" in fields:
        _check_status(fields["status"])
    where, params = "run_id = ?", [run_id]
    if expect_status is not None:
        expected = _expected(expect_status, "expect_status")
        if not expected:
            return None
        where += f" AND status IN {_in(len(expected))}"
        params += expected
    if "status" in fields and not _reopens(expect_status, fields["status"]):
        # Restating a terminal status is allowed: finishing writes the result envelope with it.
        where += f" AND (status NOT IN {_TERMINAL_SQL} OR status = ?)"
        params.append(fields["status"])
    return where, params


def _reopens(expect_status: Sequence[str] | None, to: str) -> bool:
    """An ended run reopened to undo its writes (D-67): to running, from ended statuses the caller names."""
    return (to == RunStatus.RUNNING and bool(expect_status)
            and all(s in TERMINAL_RUN_STATUSES for s in expect_status or ()))


def _run_update(where: tuple[str, list[Any]], fields: dict[str, Any]) -> tuple[str, list[Any]]:
    sets = ", ".join(f"{name} = ?" for name in fields)
    values = [_encode(RUN_COLUMNS, n, v) for n, v in fields.items()]
    return f"UPDATE runs SET {sets} WHERE {where[0]}", values + where[1]


def _call_inserts(calls: Sequence[CallRecord]) -> list[tuple[str, list[Any]]]:
    """A journal batch as INSERT statements: one per chunk of rows, not per row (on Postgres each statement
    is a round trip)."""
    for call in calls:
        _check_state(call.state)
    rows = [_call_row(c) for c in calls]
    chunks = [rows[i:i + _ROWS_PER_INSERT] for i in range(0, len(rows), _ROWS_PER_INSERT)]
    return [(_insert_rows(_INSERT_CALL, len(CALL_COLUMNS), len(chunk)), [v for row in chunk for v in row])
            for chunk in chunks]


# The cross-run index of untrusted marks (migration 14, P-45): one row per distinct mark of an entry, written
# after the entry in its transaction; the principal, session and created_at are the run's, the address the entry's.
_INSERT_MARK = ("INSERT INTO lineage_marks (run_id, seq, digest, principal, session, created_at, kind, address, path) "
                f"SELECT c.run_id, c.seq, ?, COALESCE(r.principal, '{LOCAL_PRINCIPAL}'), r.session, r.created_at, ?, c.address, ? "
                "FROM calls c JOIN runs r ON r.run_id = c.run_id WHERE c.run_id = ? AND c.seq = ?")
# Marks one entry puts in the index: the journal keeps them all (bounded where they are made, values.marks).
MARKS_PER_ENTRY = 256


def mark_digest(norm: str) -> str:
    """What the index keeps of a mark's normalised value: its digest (the value itself stays in the journal)."""
    return hashlib.sha256(norm.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def mark_inserts(calls: Sequence[Any]) -> list[tuple[str, list[Any]]]:
    """The index rows of each entry that carries untrusted marks (``lineage["marks"]``), one statement per
    mark; a mark seen twice in one entry once."""
    out: list[tuple[str, list[Any]]] = []
    for call in calls:
        marks = call.lineage.get("marks") if isinstance(call.lineage, dict) else None
        if not isinstance(marks, list):
            continue
        seen: set[str] = set()
        for mark in marks[:MARKS_PER_ENTRY]:
            if not (isinstance(mark, list) and len(mark) == 3 and all(isinstance(m, str) for m in mark)):
                continue
            digest = mark_digest(mark[1])
            if digest in seen:
                continue
            seen.add(digest)
            out.append((_INSERT_MARK, [digest, mark[0], mark[2][:200], call.run_id, call.seq]))
    return out


def _batch_conflict(calls: Sequence[CallRecord]) -> str | None:
    if not calls:
        return None
    return f"a call of run {calls[0].run_id!r} in seqs {calls[0].seq}..{calls[-1].seq} is already recorded"


def _expected(expect: Sequence[str], what: str) -> tuple[str, ...]:
    # A bare string is a Sequence[str] of letters and would silently match nothing.
    if isinstance(expect, str):
        raise TypeError(f"{what} must be a list of strings, not the string {expect!r}")
    return tuple(expect)


def _in(n: int) -> str:
    return "(" + ", ".join("?" * n) + ")"


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; one of {sorted(RUN_STATUSES)}")


def _check_state(state: str) -> None:
    if state not in CALL_STATES:
        raise ValueError(f"unknown call state {state!r}; one of {sorted(CALL_STATES)}")
