"""The store contract suite's fixtures (tests/store/contract.py has what else it shares): ``backend``, SQLite (a
file) or Postgres (a schema of its own in the throwaway cluster), and a ``store`` opened on it. A module that
defines a fixture of the same name uses its own."""

from __future__ import annotations

import uuid

import pytest

from contract import Backend


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    if request.param == "sqlite":
        b = Backend("sqlite", f"sqlite:///{tmp_path}/store/tether.db")
    else:
        # A schema per test: a clean store without a new database each time.
        b = Backend("postgres", request.getfixturevalue("pg_url"), f"t_{uuid.uuid4().hex[:16]}")
    yield b
    for store in b.opened:
        store.close()
    if b.kind == "postgres":
        import psycopg

        with psycopg.connect(b.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {b.schema} CASCADE")


@pytest.fixture
def store(backend):
    return backend.open()
