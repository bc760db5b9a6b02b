"""The store contract for its secret, its schema migrations, its size and being closed, and SQLite's specifics; on
SQLite and Postgres."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from contract import make_run, make_snapshot
from tether._store import open_store
from tether._store.sqlite import SQLiteStore
from tether.errors import ConfigError, StoreError

# ---------------------------------------------------------------------------
# Secret and schema


def test_the_secret_is_stable_across_reopening(backend):
    first = backend.open().secret()
    assert len(first) == 32
    assert backend.open().secret() == first


def test_the_sqlite_secret_file_is_private(backend):
    if backend.kind != "sqlite":
        pytest.skip("the secret file is SQLite's")
    store = backend.open()
    path = Path(f"{store.path}.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == store.secret()


def test_a_given_secret_wins_and_is_not_stored(backend):
    stored = backend.open().secret()
    given_key = b"k" * 32
    assert backend.open(secret=given_key).secret() == given_key
    assert backend.open().secret() == stored


def test_the_secret_from_the_environment(backend, monkeypatch):
    monkeypatch.setenv("TETHER_SECRET", "ab" * 32)
    assert backend.open().secret() == bytes.fromhex("ab" * 32)
    monkeypatch.setenv("TETHER_SECRET", "correct horse battery staple")
    assert backend.open().secret() == hashlib.sha256(b"correct horse battery staple").digest()


def test_a_truncated_secret_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    (tmp_path / "t.db.secret").write_bytes(b"short")
    with pytest.raises(StoreError, match="holds 5 bytes"):
        SQLiteStore(f"sqlite:///{tmp_path}/t.db")


def test_migrations_apply_once_and_a_newer_schema_is_refused(backend):
    store = backend.open()
    assert store.schema_version() == len(store.migrations)
    assert backend.open().schema_version() == len(store.migrations)
    with store._transaction(write=True) as tx:
        tx.run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (999, 0.0))
    with pytest.raises(StoreError, match="schema version 999"):
        backend.open()


def test_store_size_grows_with_data(store):
    empty = store.store_size_bytes()
    assert empty > 0
    store.create_run(make_run())
    for kind in ("pause", "checkpoint", "session"):
        store.put_snapshot(make_snapshot(data=os.urandom(256 * 1024), kind=kind))
    assert store.store_size_bytes() > empty + 512 * 1024


def test_a_closed_store_says_so(store):
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get_run("r1")


# ---------------------------------------------------------------------------
# SQLite specifics


def test_sqlite_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with SQLiteStore("sqlite:///rel/dir/t.db") as rel:
        assert (tmp_path / "rel/dir/t.db").exists() and rel.path == Path("rel/dir/t.db")
    with open_store(f"sqlite:///{tmp_path}/abs.db") as absolute:
        assert absolute.path == tmp_path / "abs.db"
    with open_store("sqlite:///:memory:") as memory:
        memory.create_run(make_run())
        assert memory.get_run("r1") and len(memory.secret()) == 32 and memory.store_size_bytes() > 0
    assert not list(tmp_path.glob(":memory:*"))
    for bad in ("sqlite:///", "sqlite://x.db", "sqlite:x.db"):
        with pytest.raises(ConfigError):
            open_store(bad)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(backend):
    if backend.kind != "sqlite":
        pytest.skip("pragmas are SQLite's")
    store = backend.open()
    with store._transaction(write=False) as tx:
        assert tx.run("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert tx.run("PRAGMA foreign_keys").fetchone()[0] == 1
        assert tx.run("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
