"""The shared store: PostgreSQL through psycopg 3, for several hosts on one database.

The tables live in their own schema (``tether`` unless told otherwise), so
they never meet an application's tables of the same name in a shared
database. Each store object keeps a small pool of connections (``pool_size``,
opened as calls need them, the most recently used first), so calls from
several threads (the runtime's store threads, docs/decisions.md D-27) run at
once, each transaction on a connection of its own. A connection that broke is
replaced on the next call, never retried inside one, because a commit whose
answer was lost may have happened.

Compare-and-set is a conditional ``UPDATE ... WHERE status IN (...)``: under
READ COMMITTED a second writer waits for the first row lock, then re-checks
its condition against the committed row, so exactly one wins. Writers of a
run's snapshots and events first lock the run row (``FOR NO KEY UPDATE``,
which does not block journal inserts checking their foreign key): event ids
then become visible in id order within a run, and a reader polling with a
cursor misses none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence

import psycopg
import psycopg.conninfo

from tether._store._migrations import Dialect, backfill_run_counts, render
from tether._store._rows import (
    _SELECT_RUN,
    CALL_COLUMN_NAMES,
    CALL_COLUMNS,
    _batch_conflict,
    _call_row,
    _check_state,
    _run,
    _run_update,
    _run_where,
    mark_inserts,
)
from tether._store._schema import SQLStore, Tx
from tether._store.base import CallRecord, Capabilities, ParkEvent, RunRecord, SnapshotRecord, WaitRecord
from tether._store.parking import park_run, park_run_statement
from tether.errors import ConfigError

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_CONNECT_TIMEOUT_S = 10
_SECRET_BYTES = 32
# Connections per store object, and so transactions in flight at once: enough
# to keep tens of concurrent runs off each other's round trips (D-27), few
# enough that several replicas stay far below Postgres's default 100.
POOL_SIZE = 8


# Migration 11's Postgres half (D-48): before a row is inserted, whichever of the old and new column the
# writer left NULL takes the other's value (an older replica writes "key", this tether the digest column),
# so the NOT NULL and primary keys on "key" still hold. No "?" or "%" in the bodies: placeholders. Released
# SQL: this function must never change (tests/shape/test_store_shape.py pins what it renders).
def _v11_in_step(table: str, new: str) -> tuple[str, str]:
    function = f"{table}_{new}_in_step"
    return (f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"NEW.{new} := COALESCE(NEW.{new}, NEW.key); NEW.key := COALESCE(NEW.key, NEW.{new}); "
            "RETURN NEW; END $$",
            f"CREATE TRIGGER {function} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()")


POSTGRES = Dialect(
    "postgres", real="DOUBLE PRECISION", blob="BYTEA", serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    own={
        # A Postgres store has no directory of its own to keep its secret beside it (P-35).
        1: ("CREATE TABLE store_secret (id INTEGER PRIMARY KEY CHECK (id = 1), value {blob} NOT NULL)",),
        11: tuple(statement for table, new in (("calls", "identity_digest"), ("waits", "key_digest"),
                                               ("source_listings", "definition_digest"))
                  for statement in _v11_in_step(table, new)),
        12: (backfill_run_counts("(FLOOR(created_at / 60) + 1) * 60"),),
    },
)


# A journal batch is one INSERT of one parameter, the rows as a JSON array of arrays that the server takes
# apart: the same statement text for any number of rows, so psycopg converts it once (it re-parses on every
# call a query of more than 50 parameters, and 10 rows of 15 columns are 150) and the server prepares it
# once per connection, not once per batch size; and one C-encoded text instead of 150 values adapted in
# Python (D-53).
_CALL_CASTS = {"seq": "::integer", "sends": "::integer", "started_at": "::double precision",
               "finished_at": "::double precision"}
_INSERT_CALL_ROWS = (
    f"INSERT INTO calls ({', '.join(CALL_COLUMN_NAMES.get(n, n) for n in CALL_COLUMNS)}) SELECT "
    + ", ".join(f"(row ->> {i}){_CALL_CASTS.get(n, '')}" for i, n in enumerate(CALL_COLUMNS))
    + " FROM jsonb_array_elements(?::jsonb) AS row"
)
_ROWS_JSON = json.JSONEncoder(separators=(",", ":"))


# A time goes as its repr, text the cast reads back to the same double: JSON has no infinity or NaN.
_FLOAT_AT = [i for i, name in enumerate(CALL_COLUMNS) if _CALL_CASTS.get(name) == "::double precision"]


def _call_batch(calls: Sequence[CallRecord]) -> tuple[str, list[str]]:
    """A journal batch as one statement: the INSERT above and its one parameter."""
    rows = []
    for call in calls:
        _check_state(call.state)
        row = _call_row(call)  # its JSON columns as text, the boundary's own where it made one (D-52)
        for i in _FLOAT_AT:
            if row[i] is not None:
                row[i] = repr(float(row[i]))
        rows.append(row)
    return _INSERT_CALL_ROWS, [_ROWS_JSON.encode(rows)]


@lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    return sql.replace("?", "%s")


class PostgresStore(SQLStore):
    migrations = render(POSTGRES)
    driver_error = psycopg.Error
    # The byte length of a TEXT or BYTEA value (retention's estimates).
    octets = "OCTET_LENGTH({})"
    text_bytes = "CONVERT_TO({}, 'UTF8')"
    # Callers on an event loop run this store's calls in its threads (AsyncStore in _store/base.py, D-27); other processes
    # hear its NOTIFYs (listen); a secret it keeps itself is a row beside the data it signs (P-35).
    capabilities = Capabilities(offloads=True, notifies=True, secret_with_data=True)
    # A method that runs one statement runs it in autocommit (D-40); cleared, it is wrapped in BEGIN and
    # COMMIT like the rest, as before (bench/store_latency_bench.py measures both).
    autocommit_single = True

    def __init__(self, url: str, secret: bytes | None = None, schema: str = "tether",
                 pool_size: int = POOL_SIZE) -> None:
        super().__init__(secret)
        if pool_size < 1:
            raise ConfigError(f"postgres pool_size must be at least 1, not {pool_size}")
        self.pool_size = pool_size
        self._pool = _Pool(self._connect, pool_size)
        self._threads: ThreadPoolExecutor | None = None
        self._threads_pid = 0
        self._threads_lock = threading.Lock()
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(f"postgres schema {schema!r} must be a lower-case identifier")
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"postgres store url is not valid: {exc}") from None
        self.url = url
        self.schema = schema
        shown = {k: params[k] for k in ("user", "host", "port", "dbname") if k in params}
        self.where = f"postgresql [{' '.join(f'{k}={v}' for k, v in shown.items())} schema={schema}]"
        self._connect_timeout = None if "connect_timeout" in params else _CONNECT_TIMEOUT_S
        try:
            with self._transaction(write=True) as tx:
                # Openers of one schema take turns, so concurrent first starts create it once.
                tx.run("SELECT pg_advisory_xact_lock(?)", (_lock_key(schema),))
                if tx.run("SELECT 1 FROM pg_namespace WHERE nspname = ?", (schema,)).fetchone() is None:
                    tx.run(f"CREATE SCHEMA {schema}")
                self._migrate(tx)
                if self._secret is None:
                    tx.run(
                        "INSERT INTO store_secret (id, value) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
                        (secrets.token_bytes(_SECRET_BYTES),),
                    )
                    self._secret = bytes(tx.run("SELECT value FROM store_secret WHERE id = 1").fetchone()[0])
        except BaseException:
            self.close()  # a store that failed to open holds no connection
            raise

    # -- connection

    def _connect(self) -> psycopg.Connection:
        kwargs: dict[str, Any] = {} if self._connect_timeout is None else {"connect_timeout": self._connect_timeout}
        conn = psycopg.connect(self.url, autocommit=False, application_name="tether", **kwargs)
        try:
            conn.execute("SELECT set_config('search_path', %s, false)", (self.schema,))
            conn.commit()
        except BaseException:
            conn.close()
            raise
        self.traffic.connected(self._round_trips(1))
        return conn

    def _round_trips(self, statements: int, single: bool = False) -> int:
        # psycopg sends BEGIN before the first statement and COMMIT after the last, each waited for.
        return statements if single and self.autocommit_single else statements + 2 if statements else 0

    @contextmanager
    def _checkout(self) -> Iterator[psycopg.Connection]:
        if self._closed:
            raise self._closed_error()
        with self._pool.connection() as conn:
            yield conn

    def _connection(self) -> psycopg.Connection:
        """The connection the next call from this thread would use (for tests that need one)."""
        with self._checkout() as conn:
            return conn

    def close(self) -> None:
        self._closed = True
        self._pool.close()
        with self._threads_lock:
            threads, self._threads = self._threads, None
        if threads is not None and self._threads_pid == os.getpid():
            threads.shutdown(wait=False)  # a call still running finishes in its thread

    def executor(self) -> ThreadPoolExecutor:
        """The threads offloaded calls run in: one per pooled connection, started as calls need them."""
        with self._threads_lock:
            if self._threads is None or self._threads_pid != os.getpid():
                if self._closed:
                    raise self._closed_error()
                self._threads = ThreadPoolExecutor(self.pool_size, thread_name_prefix="tether-store")
                self._threads_pid = os.getpid()
            return self._threads

    @contextmanager
    def _begin(self, conn: psycopg.Connection, write: bool, single: bool = False,
               pipelined: bool = False) -> Iterator[Tx]:
        if pipelined:
            yield from self._pipelined(conn)
            return
        if single and self.autocommit_single:
            # One statement is atomic by itself: without BEGIN and COMMIT it costs one round trip, not three.
            conn.autocommit = True
            try:
                with conn.cursor() as cursor:
                    yield Tx(cursor, _placeholders, single=True)
            finally:
                # A broken connection is dropped by the pool; changing it would only hide why it broke.
                if not (conn.closed or conn.broken):
                    conn.autocommit = False
            return
        try:
            with conn.cursor() as cursor:
                yield Tx(cursor, _placeholders, single=single)
            conn.commit()
        except BaseException:
            if not conn.broken:
                try:
                    conn.rollback()
                except psycopg.Error:
                    pass  # the connection died too; the error being raised says why
            raise

    def _pipelined(self, conn: psycopg.Connection) -> Iterator[Tx]:
        """A transaction of two flights: ``BEGIN`` and its statements up to the row the caller reads, then
        ``COMMIT`` (or ``ROLLBACK``) with the pipeline's end. psycopg sends the ``BEGIN`` it opens a
        transaction with, and the ``COMMIT`` of ``conn.commit()``, each in a wait of its own, so this one
        sends its own on a connection in autocommit (measured through tests/latency_proxy.py: 4 waits → 2)."""
        conn.autocommit = True
        try:
            with conn.cursor() as cursor:
                failed = False
                try:
                    with conn.pipeline():
                        cursor.execute("BEGIN")
                        tx = Tx(cursor, _placeholders)
                        try:
                            yield tx
                        except BaseException:
                            failed = True
                            raise
                        finally:
                            # In the same flight as the pipeline's end (a statement that failed on the server
                            # left the pipeline aborted: the ROLLBACK below ends that transaction).
                            cursor.execute("ROLLBACK" if failed else "COMMIT")
                    tx.saved = 2  # BEGIN with the statements, COMMIT with the end: the two waits counted apart
                finally:
                    if not (conn.closed or conn.broken) and \
                            conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        conn.execute("ROLLBACK")
        finally:
            # A broken connection is dropped by the pool; changing it would only hide why it broke.
            if not (conn.closed or conn.broken):
                conn.autocommit = False

    def _violation(self, exc: Exception) -> str | None:
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return "unique"
        if isinstance(exc, psycopg.errors.ForeignKeyViolation):
            return "foreign_key"
        return None

    def _lock_run(self, tx: Tx, run_id: str) -> bool:
        return tx.run("SELECT 1 FROM runs WHERE run_id = ? FOR NO KEY UPDATE", (run_id,)).fetchone() is not None

    def _run_status_held(self, tx: Tx, run_id: str) -> str | None:
        # FOR SHARE: a move of the run waits for this transaction, and one committed meanwhile is what it reads
        # (READ COMMITTED reads the row's newest version after the wait), so an entry moved under it moves
        # only while the run is still in that status (P-51).
        row = tx.run("SELECT status FROM runs WHERE run_id = ? FOR SHARE", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def _insert_counting(self, tx: Tx, insert: tuple[str, Sequence[Any]], bump: tuple[str, Sequence[Any]],
                         count: tuple[str, Sequence[Any]]) -> Any:
        # One statement, one round trip, not three: the writes as data-modifying WITH clauses (always run to
        # completion, read or not), the count from the statement's snapshot, which does not see them.
        return tx.run(f"WITH new_run AS ({insert[0]}), new_count AS ({bump[0]}) {count[0]}",
                      (*insert[1], *bump[1], *count[1])).fetchone()

    def _lock_principal(self, tx: Tx, principal: str) -> None:
        # Held to commit: a replica counting this principal's starts waits until this one's run is counted.
        tx.run("SELECT pg_advisory_xact_lock(?)", (_lock_key(f"{self.schema}.quota.{principal}"),))

    # -- events across processes

    def _announce_event(self, tx: Tx, run_id: str) -> None:
        # Delivered at commit, so a listener that wakes finds the row.
        tx.run("SELECT pg_notify(?, ?)", (self._channel, run_id))

    def notify(self, payload: str) -> None:
        with self._transaction(write=True, single=True) as tx:
            tx.run("SELECT pg_notify(?, ?)", (self._channel, payload))

    def _notice(self, tx: Tx, payload: str) -> None:
        tx.run("SELECT pg_notify(?, ?)", (self._channel, payload))

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        """One statement for the whole batch, so one round trip in autocommit (D-40)."""
        if not calls:
            return
        marks = mark_inserts(calls)  # an untrusted read's index rows, after its entry (P-45)
        with self._transaction(write=True, conflict=_batch_conflict(calls), run_id=calls[0].run_id,
                               single=not marks) as tx:
            tx.run(*_call_batch(calls))
            for insert in marks:
                tx.run(*insert)

    def end_run(self, run_id: str, expect_status: Sequence[str] | None, calls: Sequence[CallRecord] = (),
                notice: str | None = None, **fields: Any) -> bool:
        """One statement, and so one round trip without BEGIN and COMMIT (D-40): the journal batch and the
        run's update as data-modifying CTEs, which both take effect whatever the outer SELECT reads, and the
        notice, delivered at commit."""
        where = _run_where(run_id, expect_status, fields)
        if where is None or not fields or mark_inserts(calls):
            # An untrusted read's index rows read its entry back (P-45): statements one after the other.
            return super().end_run(run_id, expect_status, calls, notice, **fields)
        parts, params = [], []
        if calls:
            insert, rows = _call_batch(calls)
            parts.append(f"journal AS ({insert})")
            params += rows
        update, update_params = _run_update(where, fields)
        parts.append(f"ended AS ({update} RETURNING 1)")
        params += update_params
        select = "SELECT (SELECT COUNT(*) FROM ended)"
        if notice is not None:
            select += ", pg_notify(?, ?)"
            params += [self._channel, notice]
        with self._transaction(write=True, conflict=_batch_conflict(calls), run_id=run_id, single=True) as tx:
            return bool(tx.run(f"WITH {', '.join(parts)} {select}", params).fetchone()[0] == 1)

    def park_run(self, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                 waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
        """One statement, one round trip (tether._store.parking.park_run_statement)."""
        if not self.autocommit_single:
            return park_run(self, run_id, expect_status, snapshot, waits, event, **fields)
        return park_run_statement(self, run_id, expect_status, snapshot, waits, event, self._channel, **fields)

    @property
    def _channel(self) -> str:
        return f"{self.schema}_events"

    def listen(self, on_event: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_event(payload)`` (from a thread) for every notice on this store; returns a stopper.

        A payload is a run id (an event was added) or ``<kind>:<run id>`` (tether._engine.notices).

        One extra connection, listening; if it breaks, it is opened again after a second, and the
        readers' polling covers the gap: a notification is a hint to look now, never the data.
        """
        stopped = threading.Event()

        def loop() -> None:
            while not stopped.is_set():
                try:
                    with psycopg.connect(self.url, autocommit=True, application_name="tether-listen",
                                         connect_timeout=_CONNECT_TIMEOUT_S) as conn:
                        conn.execute(f"LISTEN {self._channel}")
                        while not stopped.is_set():
                            for note in conn.notifies(timeout=0.5):
                                on_event(note.payload)
                except Exception:  # noqa: BLE001 - polling carries on; try again shortly
                    stopped.wait(1.0)

        threading.Thread(target=loop, name="tether-listen", daemon=True).start()
        return stopped.set

    # -- claiming

    def claim_queued(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        # Replicas polling the queue at once each lock a different row; none waits for another's.
        sql = (
            "UPDATE runs SET status = 'running', owner = ?, lease_until = ?, updated_at = ?"
            " WHERE run_id = (SELECT run_id FROM runs WHERE status = 'queued' AND NOT (run_id = ANY(?))"
            " ORDER BY created_at, run_id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING run_id"
        )
        with self._transaction(write=True) as tx:
            row = tx.run(sql, (owner, lease_until, now, list(skip))).fetchone()
        return None if row is None else self.get_run(row[0])

    def claim_due(self, owner: str, lease_until: float, now: float,
                  skip: Sequence[str] = ()) -> RunRecord | None:
        sql = (
            "UPDATE runs SET status = 'running', owner = ?, lease_until = ?, updated_at = ?"
            " WHERE run_id = (SELECT run_id FROM runs WHERE status = 'waiting' AND expires_at <= ?"
            " AND NOT (run_id = ANY(?)) ORDER BY expires_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING run_id"
        )
        with self._transaction(write=True) as tx:
            row = tx.run(sql, (owner, lease_until, now, now, list(skip))).fetchone()
        return None if row is None else self.get_run(row[0])

    def claim_orphan(self, owner: str, lease_until: float, now: float,
                     skip: Sequence[str] = ()) -> RunRecord | None:
        # The row as it was is read under the same lock, for release_orphan.
        pick = (
            f"{_SELECT_RUN} WHERE status = 'running' AND lease_until < ?"
            " AND NOT (run_id = ANY(?)) ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        with self._transaction(write=True) as tx:
            row = tx.run(pick, (now, list(skip))).fetchone()
            if row is None:
                return None
            before = _run(row)
            tx.run("UPDATE runs SET owner = ?, lease_until = ? WHERE run_id = ?", (owner, lease_until, before.run_id))
        return before

    # -- size

    def store_size_bytes(self) -> int:
        sql = (
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind = 'r'"
        )
        with self._transaction(write=False) as tx:
            return int(tx.run(sql, (self.schema,)).fetchone()[0])


class _Pool:
    """Up to ``size`` connections, each lent to one transaction at a time.

    Opened lazily and lent most-recently-returned first, so a caller making one
    call at a time always gets the same connection. One that broke is dropped
    when it comes back (or is found broken when lent) and replaced by a new one
    on a later call. After fork() the child opens its own: the parent's sockets
    are left alone.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: list[psycopg.Connection] = []
        self._lent = 0
        self._closed = False
        self._pid = os.getpid()
        self._cond = threading.Condition()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        conn = self._take()
        try:
            yield conn
        finally:
            self._give(conn)

    def _take(self) -> psycopg.Connection:
        with self._cond:
            self._after_fork()
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if not (conn.closed or conn.broken):
                        self._lent += 1
                        return conn
                    conn.close()
                if self._lent < self._size:
                    self._lent += 1
                    break
                self._cond.wait()
        try:
            return self._connect()  # outside the lock: connecting is a round trip or more
        except BaseException:
            with self._cond:
                self._lent -= 1
                self._cond.notify()
            raise

    def _give(self, conn: psycopg.Connection) -> None:
        with self._cond:
            if self._pid != os.getpid():
                return  # lent before a fork: the child does not touch the parent's socket
            self._lent -= 1
            keep = not (self._closed or conn.closed or conn.broken)
            if keep:
                self._idle.append(conn)
            self._cond.notify()
        if not keep:
            conn.close()

    def _after_fork(self) -> None:
        if self._pid != os.getpid():
            self._idle, self._lent, self._pid = [], 0, os.getpid()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle = self._idle if self._pid == os.getpid() else []
            self._idle = []
            self._cond.notify_all()
        for conn in idle:
            conn.close()


def _lock_key(schema: str) -> int:
    return int.from_bytes(hashlib.sha256(f"tether.migrate.{schema}".encode()).digest()[:8], "big", signed=True)


__all__ = ["POSTGRES", "PostgresStore"]
