"""The embedded store: one SQLite file, shared by every process that opens it.

``sqlite:///tether.db`` is relative to the working directory,
``sqlite:////var/lib/tether.db`` absolute (what ``f"sqlite:///{path}"`` gives
for either), ``sqlite:///:memory:`` a private database for tests.

Each store object holds one connection behind a lock, so threads may share
it; processes each open their own. Writes begin with ``BEGIN IMMEDIATE``:
the write lock is taken before the first read, so a compare-and-set reads
and writes under one lock and two processes cannot both win. A process that
dies inside a transaction leaves nothing behind: its locks go with it and
the write-ahead log drops what it had not committed.

The signing secret is 32 random bytes in ``<db>.secret`` (mode 0600), made
by whichever opener first holds the write lock. It sits beside the database
rather than inside it, so a copy of the database handed over for debugging
does not carry the key that signs its snapshots.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from tether._store._migrations import Dialect, backfill_run_counts, render
from tether._store._schema import SQLStore, Tx
from tether._store.base import ParkEvent, SnapshotRecord, WaitRecord
from tether._store.parking import park_run
from tether._store.private import private_dir, private_file
from tether.errors import ConfigError, StoreError

_MEMORY = ":memory:"
# Transactions here last milliseconds; five seconds of waiting for the write
# lock means a writer is stuck, and the caller should hear about it.
_BUSY_TIMEOUT_MS = 5000
_SECRET_BYTES = 32

# Migration 11's SQLite half (D-48). A BEFORE trigger cannot change the row SQLite inserts, so an AFTER
# trigger fills whichever of the old and new column the writer left NULL: an older replica writes "key",
# this tether the digest column. For that, calls.key loses its NOT NULL, which SQLite can only do by
# rebuilding the table (same columns, same order; nothing references calls, and its only index is the
# primary key). waits.key and source_listings.key are TEXT primary keys, which SQLite lets be NULL. Released
# SQL: this function must never change (tests/shape/test_store_shape.py pins what it renders).
def _v11_in_step(table: str, new: str) -> str:
    return (f"CREATE TRIGGER {table}_{new}_in_step AFTER INSERT ON {table} "
            f"WHEN NEW.{new} IS NULL OR NEW.key IS NULL BEGIN "
            f"UPDATE {table} SET {new} = COALESCE({new}, key), key = COALESCE(key, {new}) "
            "WHERE rowid = NEW.rowid; END")


_CALLS_V11 = ("run_id, seq, op, address, args, key, kind, state, outcome, error, started_at, finished_at, "
              "idempotency_key, sends, mac, identity_digest")
SQLITE = Dialect("sqlite", real="REAL", blob="BLOB", serial="INTEGER PRIMARY KEY AUTOINCREMENT", own={11: (
    """CREATE TABLE calls_v11 (
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            op TEXT NOT NULL,
            address TEXT NOT NULL,
            args TEXT NOT NULL,
            key TEXT,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            outcome TEXT,
            error TEXT,
            started_at {real},
            finished_at {real},
            idempotency_key TEXT,
            sends INTEGER NOT NULL DEFAULT 0,
            mac TEXT,
            identity_digest TEXT,
            PRIMARY KEY (run_id, seq)
        )""",
    f"INSERT INTO calls_v11 ({_CALLS_V11}) SELECT {_CALLS_V11} FROM calls",
    "DROP TABLE calls",
    "ALTER TABLE calls_v11 RENAME TO calls",
    _v11_in_step("calls", "identity_digest"),
    _v11_in_step("waits", "key_digest"),
    _v11_in_step("source_listings", "definition_digest"),
), 12: (backfill_run_counts("(CAST(created_at / 60 AS INTEGER) + 1) * 60"),)})


def _identity(sql: str) -> str:
    return sql


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode, waiting out a busy database as a write would.

    WAL is a property of the file, so most connections only read it back. The
    switch, and a first read after a process died mid-transaction (WAL
    recovery), can answer "database is locked" at once without SQLite's busy
    handler ever being called; retry within the same busy timeout instead of
    failing a store open on a loaded machine.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


class SQLiteStore(SQLStore):
    migrations = render(SQLITE)
    driver_error = sqlite3.Error
    # The byte length of a TEXT or BLOB value (retention's estimates).
    octets = "LENGTH(CAST({} AS BLOB))"

    def __init__(self, url: str, secret: bytes | None = None) -> None:
        super().__init__(secret)
        if not url.startswith("sqlite:///"):
            raise ConfigError(f"sqlite store url {url!r} must start with sqlite:///")
        self.url = self.where = url
        name = url[len("sqlite:///") :]
        if not name:
            raise ConfigError(f"sqlite store url {url!r} names no file")
        self.path: Path | None = None if name == _MEMORY else Path(name).expanduser()
        if self.path is not None:
            try:
                # Private before SQLite creates anything: its WAL and journal files take the database's mode.
                private_dir(self.path.parent)
                private_file(self.path)
            except OSError as exc:
                raise StoreError(f"cannot create the directory for {self.path}: {exc}") from exc
        try:
            with self._transaction(write=True) as tx:
                self._migrate(tx)
                if self._secret is None:
                    self._secret = self._secret_file() if self.path is not None else secrets.token_bytes(_SECRET_BYTES)
        except BaseException:
            self.close()  # a store that failed to open holds no connection
            raise

    # -- connection

    def _connect(self) -> sqlite3.Connection:
        target = _MEMORY if self.path is None else str(self.path)
        # timeout is SQLite's busy timeout; isolation_level=None stops the
        # module from opening transactions behind our back.
        conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA foreign_keys = ON")
        if self.path is not None:
            _enter_wal(conn)
            # In WAL mode NORMAL loses at most the last commits on power loss,
            # never consistency, and saves an fsync per commit.
            conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    @contextmanager
    def _begin(self, conn: sqlite3.Connection, write: bool, single: bool = False,
               pipelined: bool = False) -> Iterator[Tx]:
        # BEGIN and COMMIT stay for one statement too: in-process they cost no round trip (nor is there a
        # wire to pipeline on).
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield Tx(conn.cursor(), _identity, single=single)
            conn.execute("COMMIT")
        except BaseException:
            # Also after a failed COMMIT: a transaction left open would refuse the next BEGIN.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _violation(self, exc: Exception) -> str | None:
        name = getattr(exc, "sqlite_errorname", "")
        if name in ("SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"):
            return "unique"
        if name == "SQLITE_CONSTRAINT_FOREIGNKEY":
            return "foreign_key"
        return None

    # -- secret file and size

    def _secret_file(self) -> bytes:
        """Read ``<db>.secret``, creating it first if missing; call under the write lock."""
        path = Path(f"{self.path}.secret")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                key = path.read_bytes()
            except OSError as exc:  # a directory, no permission: say so, no traceback
                raise StoreError(
                    f"cannot read the secret file {path}: {exc.strerror}",
                    next_action=f"Make {path} a readable file of {_SECRET_BYTES} bytes (or remove it to make a new "
                                "one; runs paused earlier could then no longer be resumed), or set TETHER_SECRET.",
                ) from None
            if len(key) != _SECRET_BYTES:
                raise StoreError(
                    f"the secret file {path} holds {len(key)} bytes, not {_SECRET_BYTES}",
                    next_action=(
                        f"Restore {path} from a backup; or delete it to make a new one, "
                        "after which runs paused earlier can no longer be resumed."
                    ),
                ) from None
            return key
        except OSError as exc:
            raise StoreError(f"cannot create the secret file {path}: {exc}") from exc
        key = secrets.token_bytes(_SECRET_BYTES)
        try:
            try:
                if os.write(fd, key) != len(key):
                    raise OSError("short write")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # A short file would stop every later open: leave none.
            path.unlink(missing_ok=True)
            raise StoreError(f"cannot write the secret file {path}: {exc}") from exc
        return key

    def backup_to(self, dest: Path) -> int:
        """A consistent copy of the database at ``dest`` (SQLite's online backup, while others write); its bytes.

        Written 0600 whatever the umask. The signing secret (``<db>.secret``) is not part of it: back it up separately, or the copy's runs
        cannot be resumed (docs/deploy.md "Backups").
        """
        private_dir(dest.parent)
        try:
            # 0600 from its first byte: the copy holds every journal, as the store does (P-44).
            private_file(dest, exclusive=True)
        except FileExistsError:
            raise StoreError(f"{dest} exists; nothing was written", next_action="Name a new file.") from None
        target = sqlite3.connect(dest)
        try:
            with self._checkout() as conn:
                # In one step: a copy made in steps restarts whenever another process writes between them.
                conn.backup(target)
        finally:
            target.close()
        return dest.stat().st_size

    def store_size_bytes(self) -> int:
        if self.path is None:
            with self._transaction(write=False) as tx:
                pages: int = tx.run("PRAGMA page_count").fetchone()[0]
                page_size: int = tx.run("PRAGMA page_size").fetchone()[0]
                return pages * page_size
        total = 0
        for suffix in ("", "-wal", "-shm"):
            try:
                total += os.path.getsize(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass
        return total

    def park_run(self, run_id: str, expect_status: Sequence[str], snapshot: SnapshotRecord,
                 waits: Sequence[WaitRecord], event: ParkEvent | None, **fields: Any) -> bool:
        return park_run(self, run_id, expect_status, snapshot, waits, event, **fields)


__all__ = ["SQLITE", "SQLiteStore"]
