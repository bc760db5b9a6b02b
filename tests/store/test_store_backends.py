"""A new store backend is one module: it registers its URL scheme and brings its dialect's own statements;
``open_store``, the config's ``[store] url`` and ``TETHER_STORE_URL``, and the one migration list take it
from there (docs/architecture.md, "A new store backend").

This file is such a module: a SQLite variant under the scheme ``litevariant:///`` with one statement only
its dialect runs, registered below and nowhere else (for each test, so that other files see only the
built-in schemes), then driven through a slice of the contract suite
(tests/store/test_store_{runs,journal,events,schema}.py) and through a runtime assembled from a config file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contract import Backend
from test_store_events import (
    test_events_after_a_cursor,
    test_latest_snapshot_is_the_last_written_and_one_is_kept_per_kind,
    test_the_outbox_queues_once_claims_once_and_keeps_attempts,
)
from test_store_journal import test_a_call_round_trips, test_update_call_cas
from test_store_runs import (
    test_a_run_round_trips_every_field,
    test_a_terminal_status_never_changes,
    test_update_run_cas_has_one_winner_and_the_loser_changes_nothing,
)
from test_store_schema import (
    test_a_given_secret_wins_and_is_not_stored,
    test_migrations_apply_once_and_a_newer_schema_is_refused,
    test_the_secret_is_stable_across_reopening,
)
from tether._app import open_runtime
from tether._config import load_config
from tether._store import BACKENDS, StoreBackend, open_store, register_backend
from tether._store._migrations import MIGRATIONS, Dialect, render
from tether._store._schema import SQLStore
from tether._store.sqlite import SQLITE, SQLiteStore
from tether.errors import ConfigError

# --- the backend: everything a new one needs, in one module ---------------------------------------------

SCHEME = "litevariant:///"
# Its own statement joins schema version 1, after the shared ones (as Postgres's store_secret does); SQLite's
# own statements (which have none at version 1) stay.
VARIANT = dataclasses.replace(SQLITE, name="litevariant", own={
    **SQLITE.own, 1: ("CREATE TABLE variant_marks (mark TEXT NOT NULL, at {real} NOT NULL)",)})


class VariantStore(SQLiteStore):
    migrations = render(VARIANT)

    def __init__(self, url: str, secret: bytes | None = None) -> None:
        super().__init__("sqlite:///" + url.removeprefix(SCHEME), secret)


BACKEND = StoreBackend((SCHEME,), VariantStore, example="litevariant:///path")


@pytest.fixture(autouse=True)
def _registered():
    # Registered per test, not at import: other test files in the session check the built-in schemes' messages.
    register_backend(BACKEND)
    yield
    del BACKENDS[SCHEME]

# --- the contract suite's slice, on this backend --------------------------------------------------------

__all__ = [  # collected here, against the fixtures below
    "test_a_call_round_trips", "test_a_given_secret_wins_and_is_not_stored", "test_a_run_round_trips_every_field",
    "test_a_terminal_status_never_changes", "test_events_after_a_cursor",
    "test_latest_snapshot_is_the_last_written_and_one_is_kept_per_kind",
    "test_migrations_apply_once_and_a_newer_schema_is_refused",
    "test_the_outbox_queues_once_claims_once_and_keeps_attempts", "test_the_secret_is_stable_across_reopening",
    "test_update_call_cas", "test_update_run_cas_has_one_winner_and_the_loser_changes_nothing",
]


@dataclasses.dataclass
class VariantBackend(Backend):
    def open(self, secret: bytes | None = None) -> SQLStore:
        # Through open_store, as tether opens it; a given secret is a constructor argument open_store has not.
        store = open_store(self.url) if secret is None else VariantStore(self.url, secret=secret)
        assert isinstance(store, VariantStore)
        self.opened.append(store)
        return store


@pytest.fixture
def backend(tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    # kind "sqlite": it keeps its secret in a file beside the database, as the SQLite store does.
    b = VariantBackend("sqlite", f"{SCHEME}{tmp_path}/store/variant.db")
    yield b
    for store in b.opened:
        store.close()


@pytest.fixture
def store(backend):
    return backend.open()


# --- what the registration gives ----------------------------------------------------------------------


def _tables(store: SQLStore) -> set[str]:
    with store._transaction(write=False) as tx:
        return {row[0] for row in tx.run("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}


def test_open_store_opens_the_registered_scheme_with_its_own_statement(tmp_path):
    with open_store(f"{SCHEME}{tmp_path}/v.db") as store:
        assert type(store) is VariantStore
        assert store.schema_version() == len(MIGRATIONS)
        assert "variant_marks" in _tables(store)
    with open_store(f"sqlite:///{tmp_path}/plain.db") as plain:
        assert "variant_marks" not in _tables(plain)


def test_the_dialect_adds_its_statements_without_editing_the_one_list():
    plain, variant = render(SQLITE), render(VARIANT)
    assert variant[0] == (*plain[0], "CREATE TABLE variant_marks (mark TEXT NOT NULL, at REAL NOT NULL)")
    assert variant[1:] == plain[1:]


def test_a_dialect_statement_for_a_version_the_list_has_not_is_refused():
    beyond = len(MIGRATIONS) + 1
    with pytest.raises(ValueError, match=rf"schema versions \[{beyond}\]"):
        render(Dialect("x", real="REAL", blob="BLOB", serial="INTEGER PRIMARY KEY", own={beyond: ("SELECT 1",)}))


def test_a_scheme_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_backend(StoreBackend((SCHEME,), SQLiteStore, example="litevariant:///path"))
    assert BACKENDS[SCHEME] is BACKEND


def test_the_config_accepts_the_scheme_and_the_runtime_runs_on_it(tmp_path: Path):
    url = f"{SCHEME}{tmp_path}/from-config.db"
    (tmp_path / "tether.toml").write_text(f'[store]\nurl = "{url}"\n')
    config = load_config(tmp_path / "tether.toml", env={})
    assert config.store.url == url
    assert load_config(env={"TETHER_STORE_URL": url}).store.url == url

    async def run() -> None:
        async with open_runtime(config) as rt:
            assert type(rt.store) is VariantStore
            assert (await rt.execute("1 + 1")).result == 2

    import asyncio

    asyncio.run(run())
    with open_store(url) as reopened:
        assert [run.status for run in reopened.list_runs()] == ["completed"]


def test_an_unknown_scheme_is_refused_naming_every_registered_one(tmp_path: Path):
    (tmp_path / "tether.toml").write_text('[store]\nurl = "mysql://h/db"\n')
    with pytest.raises(ConfigError) as file_error:
        load_config(tmp_path / "tether.toml", env={})
    with pytest.raises(ConfigError) as env_error:
        load_config(env={"TETHER_STORE_URL": "mysql://u:pw@h/db"})
    with pytest.raises(ConfigError) as open_error:
        open_store("mysql://u:pw@h/db")
    expected = "must be a sqlite:///path, postgresql:// or litevariant:///path URL"
    assert f"store.url: {expected} (got 'mysql://h/db')" in str(file_error.value)
    assert f"TETHER_STORE_URL: {expected} (got 'mysql://u:<redacted>@h/db')" in str(env_error.value)
    assert expected in str(open_error.value) and "pw" not in str(open_error.value)


def test_a_postgres_url_without_its_driver_says_which_extra_to_install(monkeypatch):
    """`pip install tether` has no Postgres driver: a postgresql:// URL says what to install, not a traceback."""
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    monkeypatch.delitem(sys.modules, "tether._store.postgres", raising=False)
    with pytest.raises(ConfigError) as error:
        open_store("postgresql://u:pw@h/db")
    assert "'psycopg', which is not installed; nothing was opened" in str(error.value)
    assert "pip install 'tether[postgres]'" in error.value.next_action and "pw" not in str(error.value)
