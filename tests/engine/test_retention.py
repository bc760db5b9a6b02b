"""Retention: ended runs are forgotten after their days; paused, waiting, queued and running runs never are.

The same cases on SQLite and Postgres, through a real Runtime: runs with journals, snapshots, events,
approval waits, run keys and sessions, then time moves on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid

import pytest

from helpers import Clock, Recorder, run_cli
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._store.retention import DAY, RetentionRules, prune, prune_all, stats

RULES = RetentionRules({"completed": 30, "failed": 90, "cancelled": 30})
WRITE = "import tools\nawait tools.helpdesk.add_comment(id=1, body='x' * 2000)\nemit('done')\n'ok'"
ASK = "import tools\nawait tools.helpdesk.close_ticket(id=4)\n'closed'"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_backend(request, tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    opened, schemas = [], []

    def open_():
        if request.param == "sqlite":
            from tether._store.sqlite import SQLiteStore

            store = SQLiteStore(f"sqlite:///{tmp_path}/tether.db")
        else:
            from tether._store.postgres import PostgresStore

            if not schemas:
                schemas.append(f"t_{uuid.uuid4().hex[:16]}")
            store = PostgresStore(request.getfixturevalue("pg_url"), schema=schemas[0])
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()
    if schemas:
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schemas[0]} CASCADE")


def runtime(store, clock, rec=None) -> Runtime:
    return Runtime(store=store, tools=(rec or Recorder()).tools(), clock=clock, type_check=False,
                   policy=Policy(writes="allow", rules=(Rule("helpdesk.close_ticket", "ask"),)),
                   checkpoint_every_calls=1, approval_ttl_seconds=1000 * DAY)


async def _every_kind_of_run(rt: Runtime) -> dict[str, str]:
    ids = {}
    ids["completed"] = (await rt.execute(WRITE, key="req-old")).run_id
    ids["failed"] = (await rt.execute("1/0")).run_id
    cancelled = await rt.execute(ASK)
    ids["cancelled"] = (await rt.cancel(cancelled.run_id)).run_id
    paused = await rt.execute(ASK)
    assert paused.status == "paused"
    ids["paused"] = paused.run_id
    waiting = await rt.execute("await wait_for('reply', timeout=400 * 86400)\n'answered'")
    assert waiting.status == "waiting"
    ids["waiting"] = waiting.run_id
    ids["queued"] = rt.start("1 + 1")
    ids["running"] = rt.start("2 + 2")
    claimed = rt.store.claim_queued("another-process", rt.engine.clock() + 10**9, rt.engine.clock(), skip=[ids["queued"]])
    assert claimed is not None and claimed.run_id == ids["running"]
    return ids


async def test_prune_keeps_every_unended_run_and_removes_what_the_policy_says(open_backend):
    clock = Clock()
    store = open_backend()
    rec = Recorder()
    async with runtime(store, clock, rec) as rt:
        ids = await _every_kind_of_run(rt)
        assert store.get_calls(ids["completed"]) and store.get_events(ids["completed"])
        assert store.get_run_by_key("local", "req-old").run_id == ids["completed"]

        # Within the days, nothing goes.
        clock.now += 29 * DAY
        assert prune(store, RULES, clock.now, dry_run=True).runs == 0
        recent = (await rt.execute(WRITE)).run_id

        # Past 30 days: completed and cancelled go; failed (90 days) stays; the rest are not ended.
        clock.now += 2 * DAY
        dry = prune(store, RULES, clock.now, dry_run=True)
        assert dry.runs == 2 and dry.calls >= 2 and dry.events >= 1 and dry.bytes > 2000
        assert store.get_run(ids["completed"]) is not None  # a dry run changes nothing
        done = prune_all(store, RULES, clock.now, batch=1)
        assert (done.runs, done.calls, done.events) == (dry.runs, dry.calls, dry.events)
        assert store.get_run(ids["completed"]) is None and store.get_run(ids["cancelled"]) is None
        assert store.get_calls(ids["completed"]) == [] and store.get_events(ids["completed"]) == []
        assert store.latest_snapshot(ids["completed"]) is None
        assert store.list_waits(run_id=ids["cancelled"], status=None) == []
        # The key lived as long as its run.
        assert store.get_run_by_key("local", "req-old") is None
        for kept in ("failed", "paused", "waiting", "queued", "running"):
            assert store.get_run(ids[kept]) is not None, kept
        assert store.get_run(recent) is not None

        # Far past every horizon: still no unended run goes, and their records are whole.
        clock.now += 400 * DAY
        prune_all(store, RULES, clock.now)
        assert store.get_run(ids["failed"]) is None
        assert store.get_run(recent) is None
        for kept, status in (("paused", "paused"), ("waiting", "waiting"), ("queued", "queued"),
                             ("running", "running")):
            assert store.get_run(ids[kept]).status == status, kept
        assert store.latest_snapshot(ids["paused"]) is not None
        assert rt.list_waits(ids["paused"])  # the approval record lives as long as the pause
        # The paused run still resumes: its approval and snapshot were kept.
        resumed = await rt.resume(ids["paused"], "approve")
        assert resumed.status == "completed" and resumed.result == "closed"
        assert rec.deliveries.count(("close_ticket", {"id": 4})) == 1
        assert prune(store, RULES, clock.now, dry_run=True).runs == 0  # it ended just now


async def test_keep_journals_keeps_the_run_and_its_journal(open_backend):
    clock = Clock()
    store = open_backend()
    async with runtime(store, clock) as rt:
        run_id = (await rt.execute(WRITE, key="kept")).run_id
        clock.now += 31 * DAY
        rules = RetentionRules({"completed": 30}, keep_journals=True)
        report = prune_all(store, rules, clock.now)
        assert report.runs == 1 and report.calls == 0 and report.events >= 1
        assert store.get_run(run_id).status == "completed" and store.get_calls(run_id)
        assert store.get_events(run_id) == [] and store.latest_snapshot(run_id) is None
        assert store.get_run_by_key("local", "kept").run_id == run_id
        assert prune(store, rules, clock.now, dry_run=True).runs == 0  # not selected again


async def test_stats_report_size_and_what_a_prune_would_free(open_backend):
    clock = Clock()
    store = open_backend()
    async with runtime(store, clock) as rt:
        await rt.execute(WRITE)
        await rt.execute(ASK)
        data = stats(store, RULES, clock.now)
        assert data["size_bytes"] > 0
        assert data["runs_by_status"] == {"completed": 1, "paused": 1}
        assert data["rows"]["runs"] == 2 and data["prune"]["runs"] == 0
        data = stats(store, RULES, clock.now + 31 * DAY)
        assert data["prune"]["runs"] == 1 and data["prune"]["bytes"] > 2000


def test_rules_never_name_an_unended_status():
    with pytest.raises(ValueError, match="completed, failed, cancelled"):
        RetentionRules({"paused": 1})


def test_cli_runs_prune_and_store_stats(tmp_path):
    import asyncio

    url = f"sqlite:///{tmp_path}/tether.db"
    (tmp_path / "tether.toml").write_text(
        f'[store]\nurl = "{url}"\n[retention]\ncompleted_days = 0.000001\nfailed_days = 0\n')
    from tether._store import open_store

    store = open_store(url)

    async def runs():
        async with Runtime(store=store, tools=Recorder().tools(), type_check=False) as rt:
            return (await rt.execute("'done'"), await rt.execute("1/0"), await rt.execute(ASK))

    done, failed, paused = asyncio.run(runs())
    time.sleep(0.2)  # past completed_days (0.0864 s)
    assert paused.status == "paused"
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_STORE_URL", None)
    out = run_cli(["store", "stats", "--json"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["size_bytes"] > 0 and data["prune"]["runs"] == 1
    assert data["retention"]["days"] == {"completed": 0.000001, "failed": None, "cancelled": 30, "rolled_back": 90}
    out = run_cli(["runs", "prune", "--dry-run", "--json"], env, tmp_path)
    assert json.loads(out.stdout)["runs"] == 1 and json.loads(out.stdout)["dry_run"] is True
    assert store.get_run(done.run_id) is not None
    out = run_cli(["store", "stats"], env, tmp_path)
    assert "a prune now would remove 1 runs" in out.stdout
    out = run_cli(["runs", "prune"], env, tmp_path)
    assert out.returncode == 0 and "removed 1 ended runs" in out.stdout
    assert store.get_run(done.run_id) is None
    assert store.get_run(failed.run_id) is not None  # failed_days = 0: kept forever
    assert store.get_run(paused.run_id).status == "paused"
    store.close()


async def test_the_worker_prunes_in_batches(tmp_path):
    from tether._config import Config
    from tether._engine.worker import Worker
    from tether._store import open_store

    clock = Clock()
    store = open_store(f"sqlite:///{tmp_path}/tether.db")
    async with runtime(store, clock) as rt:
        ended = [(await rt.execute("1 + 1")).run_id for _ in range(3)]
        paused = (await rt.execute(ASK)).run_id
        # The engine as one opened from a config with [retention] (open_runtime's): the same parts.
        engine = dataclasses.replace(rt.engine, config=Config.from_dict({"retention": {"completed_days": 1, "batch": 2}}))
        clock.now += 2 * DAY
        await Worker(engine).work(idle_exit_seconds=0.5, poll_seconds=0.05)
        assert [store.get_run(r) for r in ended] == [None, None, None]
        assert store.get_run(paused).status == "paused"
    store.close()


def test_a_backup_taken_while_serving_restores_and_its_paused_run_resumes(tmp_path):
    import asyncio
    import shutil

    url = f"sqlite:///{tmp_path}/live/tether.db"
    (tmp_path / "tether.toml").write_text(f'[store]\nurl = "{url}"\n')
    from tether._store import open_store

    rec = Recorder()

    async def pause_one(store):
        async with Runtime(store=store, tools=rec.tools(), type_check=False) as rt:
            return await rt.execute(ASK)

    live = open_store(url)
    paused = asyncio.run(pause_one(live))
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_STORE_URL", None)
    out = run_cli(["store", "backup", str(tmp_path / "copy" / "tether.db"), "--json"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["bytes"] > 0 and data["secret"] == f"{tmp_path}/live/tether.db.secret"
    # The live store is untouched and still serving.
    assert live.get_run(paused.run_id).status == "paused"
    again = run_cli(["store", "backup", str(tmp_path / "copy" / "tether.db")], env, tmp_path)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites
    live.close()
    # Restore: the copy and the secret, kept apart, put back together.
    shutil.copy(data["secret"], tmp_path / "copy" / "tether.db.secret")

    async def resume(store):
        async with Runtime(store=store, tools=rec.tools(), type_check=False) as rt:
            return await rt.resume(paused.run_id, "approve")

    restored = open_store(f"sqlite:///{tmp_path}/copy/tether.db")
    done = asyncio.run(resume(restored))
    restored.close()
    assert done.status == "completed" and done.result == "closed"
    assert rec.deliveries == [("close_ticket", {"id": 4})]


async def test_what_quotas_and_metrics_read_works_on_both_stores(open_backend):
    from tether._engine.rules.quotas import Quota, Quotas
    from tether._store import usage
    from tether._store.retention import live_counts
    from tether.errors import QuotaExceeded

    clock = Clock()
    store = open_backend()
    async with runtime(store, clock) as rt:
        await rt.execute(WRITE, session="s")
        await rt.execute(ASK)
        rt.start("1")
        assert usage.active_runs(store, "local") == 1
        assert usage.runs_started_since(store, "local", clock.now - 1) == 3
        assert usage.runs_started_since(store, "someone", clock.now - 1) == 0
        assert usage.stored_bytes(store, "local") > 2000
        assert usage.repl_sessions(store, "local", clock.now) == {"s"}
        live = live_counts(store, clock.now + 5)
        assert live["runs_by_status"] == {"completed": 1, "paused": 1, "queued": 1}
        assert live["pauses"]["paused"][0] == 1 and clock.now + 5 - live["pauses"]["paused"][1] >= 5
        assert live["outbox_pending"] == 0 and live["size_bytes"] > 0
        rt.engine.settings.quotas = Quotas(default=Quota(concurrent_runs=1))
        with pytest.raises(QuotaExceeded):
            await rt.execute("2")
