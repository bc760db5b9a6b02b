"""The tables and the Store protocol written once in SQL.

Both backends run the same statements through ``SQLStore``; a backend only
supplies a connection, how a transaction begins, how its driver reports a
duplicate key, and where the signing secret lives. Statements use ``?``
placeholders; the Postgres backend rewrites them to ``%s``.

The migrations are one list in ``_migrations.py``, rendered for each backend's dialect;
``schema_version`` holds one row per applied migration; a store refuses to
open a database written by a newer tether.

Semantics beyond ``base.py`` that both backends share:

- JSON columns hold canonical text (sorted keys, no spaces, ASCII escapes), so
  lone surrogates and ``\\u0000`` round-trip and both backends store the same
  bytes. ``None`` is SQL ``NULL``.
- A run whose status is terminal keeps it: ``update_run`` that would change
  it returns False whatever ``expect_status`` says (restating the same status
  with other fields is allowed), and ``claim_run`` refuses such a run.
- ``put_snapshot`` keeps one snapshot per (run, kind): the new one replaces
  the previous of its kind. ``latest_snapshot`` is the one written last,
  whatever its kind (write order, not the writers' clocks).
- Calls, snapshots and events belong to a run: writing one for a run that does
  not exist raises ``RunNotFound``; ``delete_run`` removes them with the run.
- ``list_runs`` returns the newest first.
- Driver errors reach callers as ``StoreError``; a duplicate key as ``Conflict``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence

from tether._metrics import timed_store_call
from tether._store._rows import (
    _CALL_UPDATABLE,
    _INSERT_CALL,
    _INSERT_RUN,
    _INSERT_SNAPSHOT,
    _INSERT_WAIT,
    _SELECT_CALL,
    _SELECT_EVENT,
    _SELECT_RUN,
    _SELECT_SNAPSHOT,
    _SELECT_WAIT,
    _TERMINAL_SQL,
    CALL_COLUMNS,
    RUN_COLUMNS,
    SESSION_COLUMNS,
    SNAPSHOT_COLUMNS,
    WAIT_COLUMNS,
    _batch_conflict,
    _call,
    _call_inserts,
    _call_row,
    _check_state,
    _check_status,
    _decode,
    _encode,
    _event,
    _expected,
    _in,
    _insert,
    _run,
    _run_update,
    _run_where,
    _select,
    _wait,
    dump_json,
    mark_digest,
    mark_inserts,
)
from tether._store._secret import secrets_from_env
from tether._store.base import (
    LOCAL_PRINCIPAL,
    AsyncStore,
    CallRecord,
    Capabilities,
    Conflict,
    EventRecord,
    LineageMark,
    ParkEvent,
    RunRecord,
    SessionRecord,
    SnapshotRecord,
    WaitRecord,
    wait_digest,
)
from tether._store.outbox import OutboxSQL
from tether._store.states import RunStatus, WaitStatus
from tether.errors import RunNotFound, StoreError

# ---------------------------------------------------------------------------
# The shared implementation


# The normalised values one statement of a lookup asks about (a write's arguments give at most 768, values.py).
_LINEAGE_NORMS = 256


@dataclasses.dataclass(frozen=True)
class _Marked:
    """An entry's lineage moved in by update_call: what its index rows are made from."""

    run_id: str
    seq: int
    lineage: dict[str, Any]



class Cursor(Protocol):
    """What the store uses of a DB-API cursor (sqlite3's and psycopg's)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx:
    """One open transaction: ``run`` executes a statement with ``?`` placeholders."""

    __slots__ = ("cursor", "_fix", "statements", "single", "saved")

    def __init__(self, cursor: Any, fix: Callable[[str], str], single: bool = False) -> None:
        self.cursor = cursor
        self._fix = fix
        self.statements = 0
        # Declared one statement: a backend may run it without BEGIN and COMMIT, so a second would not be atomic.
        self.single = single
        self.saved = 0  # waits a pipeline saved: BEGIN, statements and COMMIT sent in fewer flights

    def run(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if self.single and self.statements:
            raise AssertionError("a transaction declared single ran a second statement; declare it single=False")
        self.statements += 1
        self.cursor.execute(self._fix(sql), params)
        cursor: Cursor = self.cursor
        return cursor


class StoreTraffic:
    """What one store object asked of its database since it opened: transactions, statements, round trips.

    ``round_trips`` are the waits for the server a backend with a wire pays (Postgres: each statement, and the
    ``BEGIN`` and ``COMMIT`` psycopg sends apart), counted as the driver sends them and checked against the
    wire in tests/store/test_store_traffic.py; SQLite runs in-process and pays none. Not counted: connection
    handshakes (``connections`` opened are counted apart) and the one extra wait psycopg spends preparing a
    statement on a connection, once, at its fifth use there. The benchmarks report the difference across one
    run (bench/roundtrip_bench.py); the counts are the store object's, not a run's, so they include any other run's
    work in between.
    """

    __slots__ = ("transactions", "statements", "round_trips", "connections", "_lock")

    def __init__(self) -> None:
        self.transactions = self.statements = self.round_trips = self.connections = 0
        self._lock = threading.Lock()

    def add(self, statements: int, round_trips: int) -> None:
        with self._lock:
            self.transactions += 1
            self.statements += statements
            self.round_trips += round_trips

    def connected(self, round_trips: int) -> None:
        with self._lock:
            self.connections += 1
            self.round_trips += round_trips

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"transactions": self.transactions, "statements": self.statements,
                    "round_trips": self.round_trips, "connections": self.connections}


class SQLStore(OutboxSQL):
    """The Store protocol over a DB-API connection; subclasses bind a driver (the outbox's part in outbox.py)."""

    url: str
    migrations: list[tuple[str, ...]]
    # Where the store is, for messages: the url without a password.
    where: str
    driver_error: type[Exception]
    # SQL for the byte length of a column ("{}" is the column), for retention's estimates.
    octets: str = "LENGTH({})"
    # SQL reading a text column as its bytes ("{}" is the column): a value that is not UTF-8 (written outside
    # tether) is then the reader's to refuse, not a driver error that fails every read of its page.
    text_bytes: str = "CAST({} AS BLOB)"
    # In process, no notices, the secret in a file of its own (SQLite); Postgres declares its own.
    capabilities = Capabilities()

    def __init__(self, secret: bytes | None) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._conn: Any = None
        self.traffic = StoreTraffic()
        # The one awaitable face of this store, for every caller on an event loop.
        self.aio = AsyncStore(self)
        self._pid = 0
        # None until the backend loads or creates the stored one while opening.
        self._secret: bytes | None = secret
        self._previous: list[bytes] = []
        self.secret_source = "given" if secret is not None else "stored"
        if secret is None:
            found = secrets_from_env()
            if found is not None:
                (self._secret, *self._previous), self.secret_source = found

    # -- what a backend supplies

    def _connect(self) -> Any:
        raise NotImplementedError

    def _usable(self, conn: Any) -> bool:
        return True

    def _begin(self, conn: Any, write: bool, single: bool = False, pipelined: bool = False) -> ContextManager[Tx]:
        """Open a transaction on ``conn``; commit on exit, roll back on error.

        ``single``: the caller runs exactly one statement, which is atomic by itself.
        """
        raise NotImplementedError

    def _violation(self, exc: Exception) -> str | None:
        """``"unique"``, ``"foreign_key"`` or None for a driver error."""
        raise NotImplementedError

    def _round_trips(self, statements: int, single: bool = False) -> int:
        """The round trips a transaction of ``statements`` statements costs (none in-process)."""
        return 0

    def _lock_run(self, tx: Tx, run_id: str) -> bool:
        """Serialize writers of one run's snapshots and events; False if the run is missing."""
        return tx.run("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None

    def _run_status_held(self, tx: Tx, run_id: str) -> str | None:
        """The run's status, which stays so until ``tx`` commits (None if there is no run): a write
        transaction already holds the database's one write lock (SQLite)."""
        row = tx.run("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def _lock_principal(self, tx: Tx, principal: str) -> None:
        """Serialize the starts of one principal that count its quota in their transaction (D-54).

        Nothing here: a write transaction already holds the database's one write lock (SQLite)."""

    def _insert_counting(self, tx: Tx, insert: tuple[str, Sequence[Any]], bump: tuple[str, Sequence[Any]],
                         count: tuple[str, Sequence[Any]]) -> Any:
        """Run the ``count`` query as it stands before the writes ``insert`` and ``bump``, then both; its row."""
        row = tx.run(*count).fetchone()
        tx.run(*insert)
        tx.run(*bump)
        return row

    def store_size_bytes(self) -> int:
        raise NotImplementedError

    # -- connection and secret

    @contextmanager
    def _checkout(self) -> Iterator[Any]:
        """A live connection for one transaction. Here: the one connection, under the lock (SQLite,
        whose writers take turns anyway); Postgres hands each thread one of a pool's."""
        with self._lock:
            if self._closed:
                raise self._closed_error()
            yield self._connection()

    def _closed_error(self) -> StoreError:
        return StoreError(f"the store at {self.where} is closed", next_action="Open the store again.")

    def _connection(self) -> Any:
        # A connection inherited through fork() shares the parent's file or
        # socket: the child opens its own instead of touching it.
        if self._conn is None or self._pid != os.getpid() or not self._usable(self._conn):
            self._conn = self._connect()
            self._pid = os.getpid()
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def secret(self) -> bytes:
        assert self._secret is not None, "set while opening"
        return self._secret

    def previous_secrets(self) -> list[bytes]:
        return list(self._previous)

    # -- transactions and errors

    @contextmanager
    def _transaction(self, write: bool, conflict: str | None = None, run_id: str | None = None,
                     single: bool = False, pipelined: bool = False) -> Iterator[Tx]:
        """One protocol method's transaction, with driver errors translated at this boundary.

        ``single``: the method runs exactly one statement (enforced by ``Tx.run``), so a backend whose
        ``BEGIN`` and ``COMMIT`` are round trips of their own may leave them out (Postgres, D-40).
        ``pipelined``: the method reads one row, at its last statement, and decides on it; a backend with a
        wire may send ``BEGIN`` and the statements in one flight and ``COMMIT`` in the next (Postgres, D-54).
        """
        with self._checkout() as conn, timed_store_call(write):
            tx: Tx | None = None
            try:
                with self._begin(conn, write, single, pipelined) as tx:
                    yield tx
            except self.driver_error as exc:
                violation = self._violation(exc)
                if violation == "unique":
                    raise Conflict(conflict or f"a row with this key already exists: {exc}") from exc
                if violation == "foreign_key" and run_id is not None:
                    raise _no_run(run_id) from exc
                raise StoreError(f"the store at {self.where} failed: {exc}") from exc
            finally:
                if tx is not None:
                    self.traffic.add(tx.statements, self._round_trips(tx.statements, tx.single) - tx.saved)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._disconnect()

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema

    def _migrate(self, tx: Tx) -> None:
        """Bring the schema up to date inside the caller's (locked) transaction."""
        tx.run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        current = tx.run("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
        known = len(self.migrations)
        if current > known:
            raise StoreError(
                f"the store at {self.url} has schema version {current}; this tether knows up to {known}",
                next_action="Upgrade tether, or point it at another store.",
            )
        for version in range(current + 1, known + 1):
            for statement in self.migrations[version - 1]:
                tx.run(statement)
            tx.run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))

    def schema_version(self) -> int:
        with self._transaction(write=False) as tx:
            count: int = tx.run("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            return count

    # -- runs

    def create_run(self, run: RunRecord) -> None:
        _check_status(run.status)
        values = [_encode(RUN_COLUMNS, n, getattr(run, n)) for n in RUN_COLUMNS]
        with self._transaction(write=True, conflict=f"run {run.run_id!r} already exists", single=True) as tx:
            tx.run(_INSERT_RUN, values)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._transaction(write=False, single=True) as tx:
            row = tx.run(f"{_SELECT_RUN} WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _run(row)

    def get_run_by_key(self, principal: str, run_key: str) -> RunRecord | None:
        with self._transaction(write=False) as tx:
            row = tx.run(f"{_SELECT_RUN} WHERE principal = ? AND run_key = ?", (principal, run_key)).fetchone()
        return None if row is None else _run(row)

    def update_run(self, run_id: str, expect_status: Sequence[str] | None, **fields: Any) -> bool:
        where = _run_where(run_id, expect_status, fields)
        if where is None:
            return False
        with self._transaction(write=bool(fields), single=True) as tx:
            if not fields:
                return tx.run(f"SELECT 1 FROM runs WHERE {where[0]}", where[1]).fetchone() is not None
            return tx.run(*_run_update(where, fields)).rowcount == 1

    def end_run(self, run_id: str, expect_status: Sequence[str] | None, calls: Sequence[CallRecord] = (),
                notice: str | None = None, **fields: Any) -> bool:
        """``update_run`` with the run's last journal batch (``calls``) written before it and ``notice`` sent
        with it where the store notifies, in one transaction: the journal is never behind the run's end
        (P-7), and a listener woken by the notice finds the end (D-49: three transactions before)."""
        where = _run_where(run_id, expect_status, fields)
        inserts = _call_inserts(calls) + mark_inserts(calls)
        with self._transaction(write=True, conflict=_batch_conflict(calls), run_id=run_id) as tx:
            for insert in inserts:
                tx.run(*insert)
            won = where is not None and bool(fields) and tx.run(*_run_update(where, fields)).rowcount == 1
            if notice is not None:
                self._notice(tx, notice)
            return won

    def park_run(self, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                 waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
        """Each backend's, from tether._store.parking (whose SQL this module, near its size limit, leaves out)."""
        raise NotImplementedError

    def _notice(self, tx: Tx, payload: str) -> None:
        """Send ``payload`` to the other processes on this store at commit; a store that cannot, does not."""

    def list_runs(self, status: str | None = None, limit: int = 100,
                  principals: Sequence[str] | None = None, local: bool = True) -> list[RunRecord]:
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if principals is not None:
            # Filtered here, not after the LIMIT: another principal's newest runs must not hide these.
            names = sorted(set(principals))
            either = [f"principal IN ({', '.join('?' for _ in names)})"] if names else []
            if LOCAL_PRINCIPAL in names:
                either.append("principal IS NULL")  # rows from before every run had an owner (migration 4)
            where.append(f"({' OR '.join(either)})" if either else "1 = 0")
            params += names
        if not local:
            where.append("principal IS NOT NULL AND principal <> ?")
            params.append(LOCAL_PRINCIPAL)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._transaction(write=False, single=True) as tx:
            rows = tx.run(f"{_SELECT_RUN}{clause} ORDER BY created_at DESC, run_id DESC LIMIT ?", (*params, limit))
            return [_run(row) for row in rows.fetchall()]

    def count_runs(self, status: str | None = None) -> int:
        with self._transaction(write=False, single=True) as tx:
            if status is None:
                count: int = tx.run("SELECT COUNT(*) FROM runs").fetchone()[0]
            else:
                count = tx.run("SELECT COUNT(*) FROM runs WHERE status = ?", (status,)).fetchone()[0]
            return count

    def claim_run(self, run_id: str, owner: str, lease_until: float, now: float,
                  gone_owner: str | None = None) -> bool:
        # A run without a lease is not held by anyone, whatever its owner says.
        sql = (
            "UPDATE runs SET owner = ?, lease_until = ? WHERE run_id = ?"
            f" AND status NOT IN {_TERMINAL_SQL}"
            " AND (owner IS NULL OR owner = ? OR owner = ? OR lease_until IS NULL OR lease_until < ?)"
        )
        with self._transaction(write=True, single=True) as tx:
            return tx.run(sql, (owner, lease_until, run_id, owner, gone_owner or owner, now)).rowcount == 1

    def claim_queued(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        # One writer at a time (SQLite): oldest first, each a compare-and-set from queued.
        for run in reversed(self.list_runs(status=RunStatus.QUEUED, limit=1000)):
            if run.run_id not in skip and self.update_run(run.run_id, [RunStatus.QUEUED], status=RunStatus.RUNNING,
                                                          owner=owner, lease_until=lease_until, updated_at=now):
                return self.get_run(run.run_id)
        return None

    def claim_due(self, owner: str, lease_until: float, now: float,
                  skip: Sequence[str] = ()) -> RunRecord | None:
        for run in self.runs_due(now):
            if run.run_id not in skip and self.update_run(run.run_id, [RunStatus.WAITING], status=RunStatus.RUNNING,
                                                          owner=owner, lease_until=lease_until, updated_at=now):
                return self.get_run(run.run_id)
        return None

    def claim_orphan(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        for run in self.runs_with_expired_lease(now):
            if run.run_id not in skip and self.claim_run(run.run_id, owner, lease_until, now):
                return run
        return None

    def release_orphan(self, run: RunRecord, owner: str) -> bool:
        sql = "UPDATE runs SET owner = ?, lease_until = ? WHERE run_id = ? AND owner = ? AND status = 'running'"
        with self._transaction(write=True, single=True) as tx:
            return tx.run(sql, (run.owner, run.lease_until, run.run_id, owner)).rowcount == 1

    def runs_with_expired_lease(self, now: float) -> list[RunRecord]:
        sql = f"{_SELECT_RUN} WHERE status = 'running' AND lease_until < ? ORDER BY lease_until"
        with self._transaction(write=False, single=True) as tx:
            return [_run(row) for row in tx.run(sql, (now,)).fetchall()]

    def paused_runs_past_expiry(self, now: float, limit: int = 100) -> list[RunRecord]:
        sql = f"{_SELECT_RUN} WHERE status = 'paused' AND expires_at < ? ORDER BY expires_at LIMIT ?"
        with self._transaction(write=False, single=True) as tx:
            return [_run(row) for row in tx.run(sql, (now, limit)).fetchall()]

    def ended_runs_holding_pause(self, limit: int = 100) -> list[RunRecord]:
        # No index: a maintenance round's read (worker.py), not a claim's.
        sql = (f"{_SELECT_RUN} WHERE (pending IS NOT NULL AND ((status = 'cancelled' AND decision IS NOT NULL) "
               "OR (status = 'failed' AND error IS NULL))) OR (status = 'cancelled' AND owner IS NOT NULL) LIMIT ?")
        with self._transaction(write=False, single=True) as tx:
            return [_run(row) for row in tx.run(sql, (limit,)).fetchall()]

    def lineage_marks(self, principal: str, norms: Sequence[str], *, before: float,
                      since: float, session: str | None = None) -> list[LineageMark]:
        by_digest = {mark_digest(n): n for n in norms}
        digests = list(by_digest)
        found: list[LineageMark] = []
        # Every norm is asked about, in chunks of bounded size, and each gets its newest row: a long body's text
        # windows can neither push a recipient's address out of the lookup nor crowd out its row.
        with self._transaction(write=False) as tx:
            for i in range(0, len(digests), _LINEAGE_NORMS):
                chunk = digests[i:i + _LINEAGE_NORMS]
                where = (f"principal = ? AND digest IN {_in(len(chunk))} AND created_at < ? "
                         "AND (created_at >= ?" + (" OR session = ?)" if session is not None else ")"))
                params: list[Any] = [principal, *chunk, before, since, *([session] if session is not None else [])]
                sql = ("SELECT digest, kind, run_id, seq, address, path, created_at FROM ("
                       "SELECT digest, kind, run_id, seq, address, path, created_at, ROW_NUMBER() OVER "
                       "(PARTITION BY digest ORDER BY created_at DESC, run_id, seq) AS newest "
                       f"FROM lineage_marks WHERE {where}) AS m WHERE newest = 1")
                found += [LineageMark(by_digest[r[0]], r[1], r[2], int(r[3]), r[4], r[5], float(r[6]))
                          for r in tx.run(sql, params).fetchall()]
        return found

    def delete_run(self, run_id: str) -> bool:
        with self._transaction(write=True, single=True) as tx:
            return tx.run("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount == 1

    # -- journal

    def record_call(self, call: CallRecord) -> None:
        _check_state(call.state)
        values = _call_row(call)
        conflict = f"call {call.seq} of run {call.run_id!r} is already recorded"
        with self._transaction(write=True, conflict=conflict, run_id=call.run_id, single=True) as tx:
            tx.run(_INSERT_CALL, values)

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        if not calls:
            return
        # An untrusted read's marks go into the cross-run index with its entry, in one transaction (P-45).
        inserts = _call_inserts(calls) + mark_inserts(calls)
        with self._transaction(write=True, conflict=_batch_conflict(calls), run_id=calls[0].run_id,
                               single=len(inserts) == 1) as tx:
            for insert in inserts:
                tx.run(*insert)

    def update_call(self, run_id: str, seq: int, expect_state: Sequence[str], *, while_run: Sequence[str] = (),
                    **fields: Any) -> bool:
        unknown = fields.keys() - _CALL_UPDATABLE
        if unknown:
            raise TypeError(f"update_call cannot set {sorted(unknown)}; settable: {sorted(_CALL_UPDATABLE)}")
        if "state" in fields:
            _check_state(fields["state"])
        expected = _expected(expect_state, "expect_state")
        if not expected:
            return False
        where = f"run_id = ? AND seq = ? AND state IN {_in(len(expected))}"
        params = [run_id, seq, *expected]
        lineage = fields.get("lineage")
        marks = mark_inserts([_Marked(run_id, seq, lineage)]) if isinstance(lineage, dict) else []
        with self._transaction(write=bool(fields), single=not marks and not while_run) as tx:
            if while_run and self._run_status_held(tx, run_id) not in _expected(while_run, "while_run"):
                return False  # the run moved on: its entry decides nothing now (P-51)
            if not fields:
                return tx.run(f"SELECT 1 FROM calls WHERE {where}", params).fetchone() is not None
            sets = ", ".join(f"{name} = ?" for name in fields)
            values = [_encode(CALL_COLUMNS, n, v) for n, v in fields.items()]
            moved = tx.run(f"UPDATE calls SET {sets} WHERE {where}", values + params).rowcount == 1
            if moved and marks:
                # A read re-issued under its seq: its index rows are its outcome's (P-45).
                tx.run("DELETE FROM lineage_marks WHERE run_id = ? AND seq = ?", (run_id, seq))
                for insert in marks:
                    tx.run(*insert)
            return moved

    def get_call(self, run_id: str, seq: int) -> CallRecord | None:
        if _int64(seq) != seq:
            return None  # a caller's number no row can have (a seq is a 64-bit column)
        with self._transaction(write=False, single=True) as tx:
            row = tx.run(f"{_SELECT_CALL} WHERE run_id = ? AND seq = ?", (run_id, seq)).fetchone()
        return None if row is None else _call(row)

    def get_calls(self, run_id: str, after: int | None = None, states: Sequence[str] | None = None) -> list[CallRecord]:
        where = "run_id = ?"
        params: list[Any] = [run_id]
        if after is not None:
            where += " AND seq > ?"
            params.append(_int64(after))
        if states is not None:
            expected = _expected(states, "states")
            if not expected:
                return []
            where += f" AND state IN {_in(len(expected))}"
            params += expected
        with self._transaction(write=False, single=True) as tx:
            rows = tx.run(f"{_SELECT_CALL} WHERE {where} ORDER BY seq", params).fetchall()
        return [_call(row) for row in rows]

    def count_calls(self, run_id: str, kind: str | None = None, states: Sequence[str] | None = None) -> int:
        where, params = "run_id = ?", [run_id]
        if kind is not None:
            where += " AND kind = ?"
            params.append(kind)
        if states is not None:
            expected = _expected(states, "states")
            if not expected:
                return 0
            where += f" AND state IN {_in(len(expected))}"
            params += expected
        with self._transaction(write=False, single=True) as tx:
            count: int = tx.run(f"SELECT COUNT(*) FROM calls WHERE {where}", params).fetchone()[0]
            return count

    def journal_bytes(self, run_id: str) -> int:
        # Stored JSON is ASCII (non-ASCII is escaped), so characters are bytes on both backends.
        sql = ("SELECT COALESCE(SUM(LENGTH(args) + COALESCE(LENGTH(outcome), 0)), 0)"
               " FROM calls WHERE run_id = ?")
        with self._transaction(write=False, single=True) as tx:
            return int(tx.run(sql, (run_id,)).fetchone()[0])

    def journal_totals(self, run_id: str, spent_states: Sequence[str]) -> tuple[int, int, int]:
        """(``journal_bytes``, writes in ``spent_states``, output events): what continuing a run needs of
        its journal besides its entries, in one statement (D-49: three reads before)."""
        expected = _expected(spent_states, "spent_states")
        spent = f"kind = ? AND state IN {_in(len(expected))}" if expected else "1 = 0"
        sql = ("SELECT COALESCE(SUM(LENGTH(args) + COALESCE(LENGTH(outcome), 0)), 0),"
               f" COALESCE(SUM(CASE WHEN {spent} THEN 1 ELSE 0 END), 0),"
               " (SELECT COUNT(*) FROM events WHERE run_id = ? AND type = ?)"
               " FROM calls WHERE run_id = ?")
        params = (["write", *expected] if expected else []) + [run_id, "output", run_id]
        with self._transaction(write=False, single=True) as tx:
            size, spent_writes, outputs = tx.run(sql, params).fetchone()
            return int(size), int(spent_writes), int(outputs)

    # -- snapshots

    def put_snapshot(self, snapshot: SnapshotRecord) -> None:
        values = [_encode(SNAPSHOT_COLUMNS, n, getattr(snapshot, n)) for n in SNAPSHOT_COLUMNS]
        with self._transaction(write=True, run_id=snapshot.run_id) as tx:
            if not self._lock_run(tx, snapshot.run_id):
                raise _no_run(snapshot.run_id)
            # Older snapshots of the same kind are never read again: keep one per kind.
            tx.run("DELETE FROM snapshots WHERE run_id = ? AND kind = ?", (snapshot.run_id, snapshot.kind))
            tx.run(_INSERT_SNAPSHOT, values)

    def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        sql = f"{_SELECT_SNAPSHOT} WHERE run_id = ? ORDER BY id DESC LIMIT 1"
        with self._transaction(write=False, single=True) as tx:
            row = tx.run(sql, (run_id,)).fetchone()
        return None if row is None else SnapshotRecord(**_decode(SNAPSHOT_COLUMNS, row))

    # -- waits

    def create_wait(self, wait: WaitRecord) -> WaitRecord:
        stored = dataclasses.replace(wait, key=wait_digest(wait.key))
        values = [_encode(WAIT_COLUMNS, n, getattr(stored, n)) for n in WAIT_COLUMNS]
        with self._transaction(write=True) as tx:
            row = tx.run(f"{_SELECT_WAIT} WHERE key_digest IN (?, ?)", (stored.key, wait.key)).fetchone()
            if row is not None:
                found = _wait(row)
                if found.seq is None and wait.seq is not None:
                    # A resolution buffered before the run reached its wait: attach it.
                    tx.run("UPDATE waits SET seq = ?, deadline = ? WHERE key_digest = ?", (wait.seq, wait.deadline, found.key))
                    found.seq, found.deadline = wait.seq, wait.deadline
                return found
            tx.run(_INSERT_WAIT, values)
            return stored

    def get_wait(self, key: str) -> WaitRecord | None:
        # The digest; or the key itself, for a row written before keys were kept as digests.
        with self._transaction(write=False, single=True) as tx:
            row = tx.run(f"{_SELECT_WAIT} WHERE key_digest IN (?, ?)", (wait_digest(key), key)).fetchone()
        return None if row is None else _wait(row)

    def settle_wait(self, wait: WaitRecord) -> tuple[bool, WaitRecord]:
        stored = dataclasses.replace(wait, key=wait_digest(wait.key))
        with self._transaction(write=True) as tx:
            row = tx.run(f"{_SELECT_WAIT} WHERE key_digest IN (?, ?)", (stored.key, wait.key)).fetchone()
            if row is None:
                values = [_encode(WAIT_COLUMNS, n, getattr(stored, n)) for n in WAIT_COLUMNS]
                tx.run(_INSERT_WAIT, values)
                return True, stored
            found = _wait(row)
            if found.status != WaitStatus.PENDING:
                return False, found
            tx.run(
                "UPDATE waits SET status = ?, value = ?, error = ?, resolved_at = ? WHERE key_digest = ? AND status = ?",
                (wait.status, dump_json(wait.value), dump_json(wait.error), wait.resolved_at, found.key,
                 WaitStatus.PENDING),
            )
            found.status, found.value, found.error, found.resolved_at = wait.status, wait.value, wait.error, wait.resolved_at
            return True, found

    def list_waits(self, run_id: str | None = None, status: str | None = WaitStatus.PENDING,
                   session: str | None = None) -> list[WaitRecord]:
        where, params = [], []
        for column, value in (("run_id", run_id), ("status", status), ("session", session)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = _SELECT_WAIT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, key_digest"
        with self._transaction(write=False, single=True) as tx:
            return [_wait(row) for row in tx.run(sql, params).fetchall()]

    def runs_with_settled_wait(self, limit: int = 50) -> list[str]:
        """Parked runs whose wait was settled and that nobody continued (the runners' fallback, P-18)."""
        # The run's pending names the wait it is parked on by its key's digest, as the waits table does:
        # LIKE on its seq narrows (dump_json sorts keys, "seq" last), the exact check is in Python.
        sql = ("SELECT r.run_id, r.pending, w.key_digest FROM runs r JOIN waits w ON w.run_id = r.run_id"
               " WHERE r.status = 'waiting' AND w.status <> 'pending' AND w.seq IS NOT NULL"
               " AND r.pending LIKE ? || w.seq || ? LIMIT ?")
        with self._transaction(write=False, single=True) as tx:
            rows = tx.run(sql, ('%"seq":', "}", limit)).fetchall()
        out = []
        for run_id, pending, key in rows:
            parked = (json.loads(pending or "{}") or {}).get("key")
            # Either may be a digest or (rows from before digests) the key itself.
            if isinstance(parked, str) and wait_digest(key) == wait_digest(parked) and run_id not in out:
                out.append(run_id)
        return out

    def runs_due(self, now: float, limit: int = 100) -> list[RunRecord]:
        sql = f"{_SELECT_RUN} WHERE status = 'waiting' AND expires_at <= ? ORDER BY expires_at LIMIT ?"
        with self._transaction(write=False, single=True) as tx:
            return [_run(row) for row in tx.run(sql, (now, limit)).fetchall()]

    # -- REPL sessions

    def put_session(self, session: SessionRecord) -> None:
        values = [_encode(SESSION_COLUMNS, n, getattr(session, n)) for n in SESSION_COLUMNS]
        with self._transaction(write=True) as tx:
            tx.run("DELETE FROM sessions WHERE name = ? AND principal = ?", (session.name, session.principal))
            tx.run(_insert("sessions", SESSION_COLUMNS), values)

    def get_session(self, name: str, principal: str) -> SessionRecord | None:
        sql = f"{_select('sessions', SESSION_COLUMNS)} WHERE name = ? AND principal = ?"
        with self._transaction(write=False, single=True) as tx:
            row = tx.run(sql, (name, principal)).fetchone()
        return None if row is None else SessionRecord(**_decode(SESSION_COLUMNS, row))

    def delete_session(self, name: str, principal: str) -> bool:
        with self._transaction(write=True, single=True) as tx:
            return tx.run("DELETE FROM sessions WHERE name = ? AND principal = ?", (name, principal)).rowcount == 1

    # -- source listings (a cache: losing a row costs one server start)

    def get_listing(self, key: str) -> tuple[Any, float] | None:
        with self._transaction(write=False, single=True) as tx:
            row = tx.run("SELECT data, updated_at FROM source_listings WHERE definition_digest = ?", (key,)).fetchone()
        return None if row is None else (json.loads(row[0]), float(row[1]))

    def put_listing(self, key: str, data: Any, now: float) -> None:
        with self._transaction(write=True) as tx:
            tx.run("DELETE FROM source_listings WHERE definition_digest = ?", (key,))
            tx.run("INSERT INTO source_listings (definition_digest, data, updated_at) VALUES (?, ?, ?)",
                   (key, dump_json(data), now))

    # -- events

    def add_event(self, run_id: str, type: str, data: dict[str, Any], now: float) -> int:
        sql = "INSERT INTO events (run_id, type, data, created_at) VALUES (?, ?, ?, ?) RETURNING id"
        with self._transaction(write=True, run_id=run_id) as tx:
            # Ids must become visible in id order for a reader's cursor to miss none.
            if not self._lock_run(tx, run_id):
                raise _no_run(run_id)
            event_id: int = tx.run(sql, (run_id, type, dump_json(data), now)).fetchone()[0]
            self._announce_event(tx, run_id)
            return event_id

    def _announce_event(self, tx: Tx, run_id: str) -> None:
        """Tell other processes watching this store that ``run_id`` has a new event (Postgres: NOTIFY)."""

    def notify(self, payload: str) -> None:
        """Tell other processes watching this store something changed (Postgres: NOTIFY; here nothing).

        Their polling finds the change anyway; ``payload`` only says where to look first.
        """

    def listen(self, on_event: Callable[[str], None]) -> Callable[[], None]:
        """Nothing to hear here (``capabilities.notifies`` is false): readers poll. Returns a stopper."""
        return lambda: None

    def get_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        sql = f"{_SELECT_EVENT} WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?"
        with self._transaction(write=False, single=True) as tx:
            return [_event(row) for row in tx.run(sql, (run_id, _int64(after), limit)).fetchall()]

    # -- changes

    def runs_updated_since(self, since: float, limit: int = 200) -> list[RunRecord]:
        sql = f"{_SELECT_RUN} WHERE updated_at >= ? ORDER BY updated_at, run_id LIMIT ?"
        with self._transaction(write=False, single=True) as tx:
            return [_run(row) for row in tx.run(sql, (since, limit)).fetchall()]

    # -- console sign-outs

    def sign_out(self, session: str, expires_at: float, now: float) -> None:
        with self._transaction(write=True) as tx:
            tx.run("DELETE FROM console_signouts WHERE expires_at < ?", (now,))
            tx.run("DELETE FROM console_signouts WHERE session = ?", (session,))
            tx.run("INSERT INTO console_signouts (session, expires_at) VALUES (?, ?)", (session, expires_at))

    def signed_out(self, session: str) -> bool:
        with self._transaction(write=False) as tx:
            return tx.run("SELECT 1 FROM console_signouts WHERE session = ?", (session,)).fetchone() is not None


# A seq or a cursor can be a caller's number (MCP resume and cell_wait, a console form). Past a 64-bit column it
# names no row, but SQLite's driver raises OverflowError for it: clamped, a comparison keeps its meaning.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int64(n: int) -> int:
    return max(_INT64_MIN, min(_INT64_MAX, n))


def _no_run(run_id: str) -> RunNotFound:
    return RunNotFound(f"run {run_id!r} does not exist in the store")


__all__ = [
    "SQLStore",
    "StoreTraffic",
    "Tx",
]
