"""Migration 11 renames three columns by expand-and-contract (docs/decisions.md D-48), on SQLite and Postgres.

``calls.key`` became ``identity_digest``, ``waits.key`` ``key_digest``, ``source_listings.key``
``definition_digest``. This release adds and fills the new columns and keeps the old ones, which triggers
keep in step on insert, because replicas of the previous release go on writing and reading ``key`` during a
rolling upgrade (docs/deploy.md). So: a store at schema version 10 upgrades and its rows keep their
meaning, a row an older replica writes the old way is seen by this code, a row this code writes is seen by
an older replica, and this code still runs once the later contract step has dropped the old columns.

The version-10 store is made from a real one: a run is parked by this tether, then the store is taken back
to version 10 (the new columns, their triggers and indexes dropped, version 11 forgotten) with the rows the
previous release would have written, since the triggers filled their ``key`` columns.
"""

from __future__ import annotations

import json

import pytest

from helpers import Recorder, StoreBackend, each_store_backend, store_backend_params
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store._migrations import MIGRATIONS
from tether._store.base import CallRecord, RunRecord

RENAMED = {"calls": "identity_digest", "waits": "key_digest", "source_listings": "definition_digest"}

PROGRAM = """
import tools
t = await tools.helpdesk.get_ticket(id=1)
answer = await wait_for("approval", timeout=3600)
await tools.helpdesk.add_comment(id=1, body=answer["note"])
[t["title"], answer["note"]]
"""


class Backend(StoreBackend):
    def runtime(self, rec: Recorder) -> Runtime:
        return Runtime(store=self.store(), tools=rec.tools(), type_check=False, policy=Policy(writes="allow"))

    def to_version_10(self) -> None:
        """Take the store back to schema version 10: no new column, trigger or index of migration 11 (nor
        migration 12's table and 13's indexes on it, tests/store/test_quota_counts.py)."""
        self.sql("DROP TABLE run_counts")
        self.sql("DROP TABLE lineage_marks")  # migration 14's table and column (P-45)
        self.sql("ALTER TABLE calls DROP COLUMN lineage")
        self.sql("DROP TABLE outbox_watermarks")  # migration 15's table (D-81)
        self.sql("DELETE FROM schema_version WHERE version >= 12")
        for table, column in RENAMED.items():
            name = f"{table}_{column}_in_step"
            if self.kind == "sqlite":
                self.sql(f"DROP TRIGGER {name}")
            else:
                self.sql(f"DROP FUNCTION {name}() CASCADE")  # and its trigger
            if table != "calls":
                self.sql(f"DROP INDEX {table}_{column}")
            self.sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        self.sql("DELETE FROM schema_version WHERE version = 11")

    def contract(self) -> None:
        """What the later contract migration does (docs/deploy.md): no trigger, no old "key" column."""
        for table, column in RENAMED.items():
            name = f"{table}_{column}_in_step"
            if self.kind == "postgres":
                self.sql(f"DROP FUNCTION {name}() CASCADE")
                self.sql(f"ALTER TABLE {table} DROP COLUMN key")
                continue
            self.sql(f"DROP TRIGGER {name}")
            if table == "calls":
                self.sql("ALTER TABLE calls DROP COLUMN key")
                continue
            # SQLite drops no primary key column: the table is copied without it (the indexes made again).
            kept = ", ".join(sorted(self.columns(table) - {"key"}))
            indexes = [sql for (sql,) in self.sql("SELECT sql FROM sqlite_master WHERE type = 'index' "
                                                  "AND tbl_name = ? AND sql IS NOT NULL", (table,))]
            self.sql(f"CREATE TABLE {table}_c AS SELECT {kept} FROM {table}")
            self.sql(f"DROP TABLE {table}")
            self.sql(f"ALTER TABLE {table}_c RENAME TO {table}")
            for sql in indexes:
                self.sql(sql)

    def columns(self, table: str) -> set[str]:
        if self.kind == "sqlite":
            return {row[1] for row in self.sql(f"PRAGMA table_info({table})")}
        return {row[0] for row in self.sql("SELECT column_name FROM information_schema.columns "
                                           "WHERE table_schema = ? AND table_name = ?", (self.schema, table))}


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    yield from each_store_backend(request, tmp_path, monkeypatch, Backend)


async def test_a_version_10_store_upgrades_and_its_parked_run_resumes_by_its_key_replaying_its_journal(backend):
    rec = Recorder()
    async with backend.runtime(rec) as rt:
        parked = await rt.execute(PROGRAM)
    assert parked.status == "waiting"
    key = parked.pending["key"]
    backend.to_version_10()
    assert not {"identity_digest", "key_digest", "definition_digest"} & (
        backend.columns("calls") | backend.columns("waits") | backend.columns("source_listings"))
    # No snapshot: the resume replays the journal, comparing each call with its stored identity digest.
    backend.sql("DELETE FROM snapshots WHERE run_id = ?", (parked.run_id,))

    store = backend.store()
    try:
        assert store.schema_version() == len(MIGRATIONS) >= 11
        calls = store.get_calls(parked.run_id)
        old = backend.sql("SELECT seq, key FROM calls WHERE run_id = ? ORDER BY seq", (parked.run_id,))
        assert [(c.seq, c.key) for c in calls] == old and all(key for _, key in old)
        assert calls[0].address == "helpdesk.get_ticket"
    finally:
        store.close()

    async with backend.runtime(rec) as rt:
        out = await rt.resolve_wait(key, {"note": "go ahead"})
    assert out["status"] == "accepted", out
    assert out["run"]["status"] == "completed" and out["run"]["result"] == ["ticket 1", "go ahead"], out["run"]
    # The read was replayed from the journal, not called again; the write after the wait was sent once.
    assert [e for e in rec.events if e[0] == "start"] == [("start", "get_ticket", 1)]
    assert rec.deliveries == [("add_comment", {"id": 1, "body": "go ahead"})]


def _run(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, status="waiting", program="1", environment={}, policy={}, limits={},
                     created_at=1.0, updated_at=1.0, principal="local", meta={})


def test_rows_an_older_replica_writes_the_old_way_are_seen_by_this_code(backend):
    store = backend.store()
    try:
        store.create_run(_run("r_old"))
        # What the previous release's INSERTs name: "key", never the new columns.
        backend.sql("INSERT INTO calls (run_id, seq, op, address, args, key, kind, state, sends) "
                    "VALUES ('r_old', 1, 'helpdesk.get_ticket', 'helpdesk.get_ticket', '{}', 'digest-1', 'read', "
                    "'pending', 0)")
        backend.sql("INSERT INTO waits (key, run_id, name, status, created_at) "
                    "VALUES ('wd1.old', 'r_old', 'approval', 'pending', 1.0)")
        backend.sql("INSERT INTO source_listings (key, data, updated_at) VALUES ('def-1', '[1,2]', 5.0)")
        assert store.get_call("r_old", 1).key == "digest-1"
        assert store.get_wait("wd1.old").key == "wd1.old"
        assert [w.key for w in store.list_waits(run_id="r_old")] == ["wd1.old"]
        assert store.get_listing("def-1") == ([1, 2], 5.0)
        # And this code's writes land on the row the old replica wrote, not beside it.
        store.put_listing("def-1", [3], 6.0)
        assert backend.sql("SELECT key, definition_digest, data FROM source_listings") == [("def-1", "def-1", "[3]")]
    finally:
        store.close()


def test_rows_this_code_writes_are_seen_by_an_older_replica(backend):
    store = backend.store()
    try:
        store.create_run(_run("r_new"))
        store.record_call(CallRecord(run_id="r_new", seq=1, op="helpdesk.get_ticket",
                                     address="helpdesk.get_ticket", args={}, key="digest-2", kind="read",
                                     state="pending"))
        from tether._store.base import WaitRecord

        stored = store.create_wait(WaitRecord(key="w1.a.capability", run_id="r_new", name="approval",
                                              status="pending", created_at=1.0))
        store.put_listing("def-2", {"tools": []}, 7.0)
        # What the previous release's SELECTs read: "key".
        assert backend.sql("SELECT key FROM calls WHERE run_id = 'r_new' AND seq = 1") == [("digest-2",)]
        assert backend.sql("SELECT key, run_id FROM waits WHERE key = ?", (stored.key,)) == [(stored.key, "r_new")]
        assert stored.key.startswith("wd1.") and stored.key != "w1.a.capability"  # a digest, never the key
        assert json.loads(backend.sql("SELECT data FROM source_listings WHERE key = 'def-2'")[0][0]) == {"tools": []}
    finally:
        store.close()


async def test_this_release_runs_on_the_store_after_the_contract_step(backend):
    """The contract migration may roll out while this release's replicas still run: they never name "key"."""
    backend.store().close()
    backend.contract()
    assert "key" not in backend.columns("calls") | backend.columns("waits") | backend.columns("source_listings")
    rec = Recorder()
    async with backend.runtime(rec) as rt:
        parked = await rt.execute(PROGRAM)
        assert parked.status == "waiting"
        backend.sql("DELETE FROM snapshots WHERE run_id = ?", (parked.run_id,))  # the resume replays
        out = await rt.resolve_wait(parked.pending["key"], {"note": "go ahead"})
        assert out["run"]["status"] == "completed" and out["run"]["result"] == ["ticket 1", "go ahead"], out
        assert [w.status for w in rt.store.list_waits(run_id=parked.run_id, status=None)] == ["resolved"]
        rt.store.put_listing("def-3", [1], 8.0)
        rt.store.put_listing("def-3", [2], 9.0)
        assert rt.store.get_listing("def-3") == ([2], 9.0)
    assert [e for e in rec.events if e[0] == "start"] == [("start", "get_ticket", 1)]
