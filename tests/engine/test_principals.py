"""Every run has a principal, and the check of it never skips (P-24)."""

from __future__ import annotations

import uuid

import pytest

from helpers import Clock, Recorder
from tether._runtime import Runtime
from tether._store import RunRecord, open_store
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore
from tether.errors import RunNotFound, UsageError

TOKEN = "token:" + "a" * 32
WRITE = "import tools\nawait tools.helpdesk.close_ticket(id=1)"
# Each backend's migrations as it runs them (the one list, rendered for its dialect).
SQLITE_MIGRATIONS = SQLiteStore.migrations
POSTGRES_MIGRATIONS = PostgresStore.migrations


def runtime(store_url, rec, **kw) -> Runtime:
    return Runtime(store=open_store(store_url), tools=rec.tools(), clock=Clock(), type_check=False, **kw)


async def test_p24_python_api_runs_belong_to_local(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        done = await rt.execute("1 + 1")
        queued = rt.start("2")
        paused = await rt.execute(WRITE, session="s")
        assert [rt.store.get_run(r).principal for r in (done.run_id, queued, paused.run_id)] == ["local"] * 3


async def test_p24_a_token_cannot_act_on_a_local_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE)
        for act in (lambda: rt.resume(paused.run_id, "approve", principal=TOKEN),
                    lambda: rt.cancel(paused.run_id, principal=TOKEN),
                    lambda: rt.signal(paused.run_id, "go", principal=TOKEN),
                    lambda: rt.wait_cell(paused.run_id, principal=TOKEN, timeout_ms=0)):
            with pytest.raises(RunNotFound):
                await act()
        with pytest.raises(RunNotFound):
            rt.engine.get_run(paused.run_id, TOKEN)
        with pytest.raises(RunNotFound):
            rt.list_waits(paused.run_id, principal=TOKEN)
        assert rt.store.get_run(paused.run_id).status == "paused" and rec.deliveries == []
        # Its owner still can.
        assert (await rt.resume(paused.run_id, "approve")).status == "completed"
        assert len(rec.deliveries) == 1


async def test_p24_a_local_caller_cannot_act_on_a_tokens_run(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE, principal=TOKEN)
        with pytest.raises(RunNotFound):
            await rt.resume(paused.run_id, "approve")
        with pytest.raises(RunNotFound):
            await rt.resume(paused.run_id, "approve", principal="local")
    async with runtime(store_url, rec, local_runs="shared") as rt:
        with pytest.raises(RunNotFound):  # shared opens local runs to tokens, not the reverse
            await rt.resume(paused.run_id, "approve")
        assert rec.deliveries == []


async def test_p24_local_runs_shared_lets_tokens_act_on_local_runs(store_url):
    rec = Recorder()
    async with runtime(store_url, rec, local_runs="shared") as rt:
        paused = await rt.execute(WRITE)
        assert (await rt.resume(paused.run_id, "approve", principal=TOKEN)).status == "completed"
        other = await rt.execute(WRITE, principal="token:" + "b" * 32)
        with pytest.raises(RunNotFound):  # another token's run stays its own
            await rt.resume(other.run_id, "approve", principal=TOKEN)
    assert len(rec.deliveries) == 1


async def test_p24_a_configured_principal_is_the_runtimes_own(store_url):
    rec = Recorder()
    async with runtime(store_url, rec, principal="svc-billing") as rt:
        paused = await rt.execute(WRITE)
        assert rt.store.get_run(paused.run_id).principal == "svc-billing"
    async with runtime(store_url, rec) as rt:  # the local user is someone else
        with pytest.raises(RunNotFound):
            await rt.resume(paused.run_id, "approve")
    with pytest.raises(UsageError):
        Runtime(principal="", store=open_store(store_url))
    with pytest.raises(UsageError):
        Runtime(local_runs="everyone", store=open_store(store_url))


async def test_p24_a_wait_key_decides_as_the_runs_principal(store_url):
    # The key is the capability: holding it is enough, whoever's run it is.
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE, principal=TOKEN)
        out = await rt.resolve_wait(paused.pending["key"], {"decision": "approve"})
        assert out["status"] == "accepted" and out["run"]["status"] == "completed"
    assert len(rec.deliveries) == 1


# -- migration 4: runs from before every run had a principal --------------------------


def _owner_migration(migrations) -> int:
    return next(i for i, m in enumerate(migrations) if any("principal = 'local'" in s for s in m))


def _create_old(store, run: RunRecord) -> None:
    """Insert ``run`` into a store at an older schema: only the columns that schema has."""
    from tether._store._rows import RUN_COLUMNS, _encode

    with store._transaction(write=True) as tx:
        have = [d[0] for d in tx.run("SELECT * FROM runs WHERE 1 = 0").description]
        cols = [c for c in RUN_COLUMNS if c in have]
        tx.run(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
               [_encode(RUN_COLUMNS, c, getattr(run, c)) for c in cols])


def _old_run(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, status="paused", program="1", environment={"clock": "2026-01-01T00:00:00+00:00",
                     "seed": 1}, policy={}, limits={}, created_at=1.0, updated_at=1.0, principal=None, meta={})


def test_p24_migration_gives_ownerless_sqlite_runs_to_local(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = type("OldSQLite", (SQLiteStore,), {"migrations": SQLITE_MIGRATIONS[:_owner_migration(SQLITE_MIGRATIONS)]})
    store = old(url)
    _create_old(store, _old_run("run_old"))
    with store._transaction(write=False) as tx:
        assert tx.run("SELECT principal FROM runs WHERE run_id = 'run_old'").fetchone()[0] is None
    store.close()
    store = SQLiteStore(url)
    try:
        assert store.schema_version() == len(SQLITE_MIGRATIONS)
        assert store.get_run("run_old").principal == "local"
    finally:
        store.close()


@pytest.mark.postgres
def test_p24_migration_gives_ownerless_postgres_runs_to_local(pg_url):
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    old = type("OldPostgres", (PostgresStore,),
               {"migrations": POSTGRES_MIGRATIONS[:_owner_migration(POSTGRES_MIGRATIONS)]})
    try:
        store = old(pg_url, schema=schema)
        _create_old(store, _old_run("run_old"))
        store.close()
        store = PostgresStore(pg_url, schema=schema)
        try:
            assert store.schema_version() == len(POSTGRES_MIGRATIONS)
            assert store.get_run("run_old").principal == "local"
        finally:
            store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_p24_a_migrated_run_is_checked_like_any_other(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = type("OldSQLite", (SQLiteStore,), {"migrations": SQLITE_MIGRATIONS[:_owner_migration(SQLITE_MIGRATIONS)]})
    store = old(url)
    _create_old(store, _old_run("run_old"))
    store.close()
    async with Runtime(store=open_store(url), type_check=False) as rt:
        with pytest.raises(RunNotFound):
            rt.engine.get_run("run_old", TOKEN)
        assert rt.engine.get_run("run_old").run_id == "run_old"


async def test_p24_local_runs_comes_from_the_config(tmp_path):
    from tether._app import open_runtime
    from tether._config import load_config
    from tether.errors import ConfigError

    path = tmp_path / "tether.toml"
    path.write_text('[server]\nlocal_runs = "everyone"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "server.local_runs" in err.value.message
    path.write_text('[server]\nlocal_runs = "shared"\n')
    config = load_config(path, env={"TETHER_HOME": str(tmp_path / "home")})
    async with open_runtime(config) as rt:
        assert rt.engine.settings.local_runs == "shared" and rt.principal == "local"
