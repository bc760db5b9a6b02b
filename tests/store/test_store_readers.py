"""Rows of the store decide nothing on their own (D-33).

Each test edits or reads SQLite and Postgres rows directly, as someone with
access to the database but not the secret would, and shows that nothing is
sent because of it: a tool-listing cache turned "read-only", an outbox row
inserted for delivery, a paused run's rows read to approve its write.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import run_cli
from tether._engine import launcher

FIXTURES = Path(__file__).parent.parent / "fixtures"


@dataclass
class Db:
    kind: str
    url: str

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Read or edit rows directly, without tether and without its secret."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            with conn:
                rows = conn.execute(statement, params).fetchall()
            conn.close()
            return rows
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SET search_path TO tether")
            cur = conn.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    monkeypatch.delenv("TETHER_SECRET_FILE", raising=False)
    if request.param == "sqlite":
        yield Db("sqlite", f"sqlite:///{tmp_path}/tether.db")
        return
    import psycopg

    base = request.getfixturevalue("pg_url")
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(base)
    params["dbname"] = name
    url = "postgresql:///" + name + "?" + "&".join(f"{k}={v}" for k, v in params.items() if k != "dbname")
    yield Db("postgres", url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def project(tmp_path, db):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TETHER_")}
    env.update(TETHER_HOME=str(tmp_path / "home"), TETHER_STORE_URL=db.url)
    cwd = tmp_path / "work"
    cwd.mkdir()
    command = [sys.executable, str(FIXTURES / "mcp_fixture_server.py")]
    (cwd / "tether.toml").write_text(
        f'[[sources]]\ntype = "mcp"\nnamespace = "fx"\ncommand = {json.dumps(command)}\n'
        '[policy]\nwrites = "ask"\n')
    return cwd, env


def _sent(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _make_record_read_only(db: Db) -> int:
    """The attack: the cached listing says the write tool ``record`` is read-only."""
    changed = 0
    for digest, data in db.sql("SELECT definition_digest, data FROM source_listings"):
        listing = json.loads(data)
        for tool in listing["tools"]:
            if tool["name"] == "record":
                tool["annotations"] = {**(tool.get("annotations") or {}), "readOnlyHint": True}
                changed += 1
        db.sql("UPDATE source_listings SET data = ? WHERE definition_digest = ?", (json.dumps(listing), digest))
    return changed


@pytest.mark.slow
def test_a_listing_cache_edited_to_read_only_sends_no_write_unasked(project, db, tmp_path):
    cwd, env = project
    log = tmp_path / "sent.log"
    (cwd / "one.py").write_text("1 + 1\n")
    first = run_cli(["run", "one.py"], env, cwd)  # lists the server once and caches its listing
    assert first.returncode == 0, first.stderr
    assert _make_record_read_only(db) == 1

    # A fresh run: the write still asks, and nothing was sent.
    (cwd / "write.py").write_text(f"import tools\nawait tools.fx.record(log={str(log)!r}, text='one')\n")
    fresh = run_cli(["run", "write.py", "--json", "--no-prompt"], env, cwd)
    out = json.loads(fresh.stdout)
    assert out["status"] == "paused", fresh.stdout + fresh.stderr
    assert out["pending"]["address"] == "fx.record"
    assert _sent(log) == []


@pytest.mark.slow
def test_resuming_a_paused_run_does_not_trust_an_edited_listing_either(project, db, tmp_path):
    cwd, env = project
    log = tmp_path / "sent.log"
    (cwd / "two.py").write_text(f"import tools\nawait tools.fx.record(log={str(log)!r}, text='first')\n"
                                f"await tools.fx.record(log={str(log)!r}, text='second')\n")
    paused = run_cli(["run", "two.py", "--json", "--no-prompt"], env, cwd)
    run = json.loads(paused.stdout)
    assert run["status"] == "paused" and _sent(log) == [], paused.stdout + paused.stderr
    assert _make_record_read_only(db) == 1

    # The person approves the first write; the second must ask again, not go out as a "read".
    resumed = run_cli(["resume", run["run_id"], "--approve", "--json"], env, cwd)
    out = json.loads(resumed.stdout)
    assert out["status"] == "paused", resumed.stdout + resumed.stderr
    assert out["pending"]["address"] == "fx.record"
    assert _sent(log) == ["first"]

    # The cache was rewritten from the live listing, signed: the next start trusts it again.
    listing = json.loads(db.sql("SELECT data FROM source_listings")[0][0])
    record = next(t for t in listing["tools"] if t["name"] == "record")
    assert not (record.get("annotations") or {}).get("readOnlyHint")


# -- point 5: the store holds no live capability -----------------------------------------------

WRITE = """
import tools
t = await tools.helpdesk.get_ticket(id=1)
await tools.helpdesk.close_ticket(id=1)
"""
# What a capability looks like: a wait key (w1.<payload>.<mac>) or an approval link token (a1.<payload>.<mac>).
CAPABILITY = re.compile(r"\b(?:w1|a1)\.[A-Za-z0-9_-]+\.[0-9a-f]{32,64}\b")
HOOK_SECRET = "whsec-store-readers-0123456789"


def _every_text(db: Db) -> str:
    """Every row of every table a read-only database user can see, as text."""
    out = []
    tables = ("runs", "calls", "waits", "events", "outbox", "snapshots", "sessions", "source_listings")
    for table in tables:
        for row in db.sql(f"SELECT * FROM {table}"):
            out.append(" ".join(str(v) for v in row))
    return "\n".join(out)


@pytest.fixture
def secret_outside(monkeypatch):
    # A deployment whose secret is not in the database.
    monkeypatch.setenv("TETHER_SECRET", "ab" * 32)


async def test_a_read_only_copy_of_the_store_approves_nothing(db, secret_outside, monkeypatch):
    from helpers import Recorder
    from tether._engine.rules.policy import Policy
    from tether._runtime import Runtime
    from tether._server.console import Console
    from tether._server.notify import Notifier, Webhook
    from tether._store import open_store

    rec = Recorder()
    async with Runtime(store=open_store(db.url), tools=rec.tools(), policy=Policy(writes="ask"),
                       type_check=False) as rt:
        notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", HOOK_SECRET.encode(), frozenset({"paused"}))],
                            public_url="https://tether.example.com")
        rt.engine.events.listeners.append(notifier)
        paused = await rt.execute(WRITE)
        assert paused.status == "paused"
        # The caller that ran the program was handed its approval key; the store was not.
        handed = paused.pending["key"]
        assert handed.startswith("w1.")
        assert await notifier.queue_hinted() == 1
        [queued] = rt.store.list_outbox()
        assert "approve/" not in queued.body and "approval_url" not in queued.body

    stolen = _every_text(db)
    assert paused.run_id in stolen and "close_ticket" in stolen  # the rows were read
    assert handed not in stolen
    assert CAPABILITY.findall(stolen) == []

    # Everything that looks like a key in the waits table, tried as one: nothing is decided. The old "key"
    # column (kept in step until the contract migration, D-48) holds the same digests.
    keys = [k for (k,) in db.sql("SELECT key_digest FROM waits")]
    assert sorted(keys) == sorted(k for (k,) in db.sql("SELECT key FROM waits"))
    assert keys and all(k.startswith("wd1.") for k in keys)
    async with Runtime(store=open_store(db.url), tools=rec.tools(), policy=Policy(writes="ask"),
                       type_check=False) as rt:
        for key in keys:
            out = await rt.resolve_wait(key, "approve")
            assert out["status"] == "unknown_or_revoked", out
        # An approval link can only be minted with the secret: the console finds none in the rows.
        console = Console(rt, tokens=["reader-token-0123456789"])
        import httpx

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                     base_url="http://127.0.0.1:8000") as c:
            for key in keys:
                assert (await c.get(f"/approve/{key}")).status_code == 404
        assert rt.store.get_run(paused.run_id).status == "paused"
        # Whoever may see the run still gets its key, recomputed from the secret.
        [wait] = rt.list_waits(paused.run_id)
        assert wait["key"] == handed
    assert rec.deliveries == []


async def test_an_inserted_outbox_row_is_never_signed_or_sent(db, secret_outside):
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from helpers import Recorder
    from tether._engine.rules.policy import Policy
    from tether._runtime import Runtime
    from tether._server.notify import Notifier, Webhook
    from tether._store import open_store

    received: list[tuple[dict, bytes]] = []

    async def hook(request: Request) -> Response:
        received.append((dict(request.headers), await request.body()))
        return Response(status_code=200)

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hook"
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/hook", hook, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    rec = Recorder()
    try:
        async with Runtime(store=open_store(db.url), tools=rec.tools(), policy=Policy(writes="ask"),
                           type_check=False) as rt:
            notifier = Notifier(rt, [Webhook(url, HOOK_SECRET.encode(), frozenset({"paused", "completed"}))],
                                public_url="https://tether.example.com")
            rt.engine.events.listeners.append(notifier)
            paused = await rt.execute(WRITE)
            assert await notifier.queue_hinted() == 1
            # The attack: a row written straight into the table, wanting the webhook's signature.
            forged = json.dumps({"v": 1, "id": "evt_forged", "type": "run.completed",
                                 "run": {"run_id": paused.run_id, "status": "completed"}})
            db.sql("INSERT INTO outbox (target, event_id, body, status, attempts, next_at, created_at)"
                   " VALUES (?, ?, ?, 'pending', 0, 0, 0)", (url, "evt_forged", forged))
            # So is a genuine row whose body was edited.
            genuine = next(r for r in rt.store.list_outbox() if r.event_id != "evt_forged")
            db.sql("UPDATE outbox SET body = ? WHERE event_id = ?",
                   (genuine.body.replace("helpdesk.close_ticket", "helpdesk.get_ticket"), genuine.event_id))
            async with httpx.AsyncClient() as http:
                await notifier.deliver_due(http)
            rows = {r.event_id: r for r in rt.store.list_outbox(status=None)}
            for event_id in ("evt_forged", genuine.event_id):
                assert rows[event_id].status == "failed" and "does not verify" in rows[event_id].last_error
            assert received == []
            # A row tether queued is delivered, with the approval link minted as it is sent.
            again = await rt.execute(WRITE)
            assert await notifier.queue_hinted() == 1
            async with httpx.AsyncClient() as http:
                await notifier.deliver_due(http)
            [(headers, body)] = received
            event = json.loads(body)
            assert event["run"]["run_id"] == again.run_id
            assert event["pending"][0]["approval_url"].startswith("https://tether.example.com/approve/a1.")
            from tether._server.notify import verify

            assert verify(HOOK_SECRET.encode(), headers["tether-signature"], body.decode())
            stored = next(r for r in rt.store.list_outbox(status=None) if again.run_id in r.body)
            assert "approval_url" not in stored.body
    finally:
        server.should_exit = True
        await serving
    assert rec.deliveries == []


# -- point 5, parked waits: a wait_for key is a capability too ---------------------------------

PARKED = "v = await wait_for('go')\nv"
WAIT_KEY = re.compile(r"\b(?:wd1|w1)\.[A-Za-z0-9_.-]+")


async def test_a_read_only_copy_of_the_store_resolves_no_parked_wait(db, secret_outside, tmp_path):
    from tether._runtime import Runtime
    from tether._store import open_store

    async with Runtime(store=open_store(db.url), type_check=False) as rt:
        parked = await rt.execute(PARKED)
        assert parked.status == "waiting"
        # The caller the run parked for was handed the key; the run's record, envelope and events were not.
        handed = parked.pending["key"]
        assert handed.startswith("w1.")

    stolen = _every_text(db)
    assert parked.run_id in stolen and "wait_for" in stolen  # the rows were read
    assert handed not in stolen
    assert CAPABILITY.findall(stolen) == []

    # Everything in the rows that looks like a wait key, or its digest, tried as one: nothing resolves.
    tried = set(WAIT_KEY.findall(stolen))
    assert any(k.startswith("wd1.") for k in tried)
    async with Runtime(store=open_store(db.url), type_check=False) as rt:
        for key in tried:
            assert (await rt.resolve_wait(key, "forged"))["status"] == "unknown_or_revoked", key
        assert rt.store.get_run(parked.run_id).status == "waiting"
        # Whoever may see the run gets the key recomputed from the secret, in its envelope and its list.
        assert (await rt.engine.wait_for_run(parked.run_id)).pending["key"] == handed
        assert [w["key"] for w in rt.list_waits(parked.run_id)] == [handed]
        # So does the operator's `tether runs show`.
        env = {k: v for k, v in __import__("os").environ.items() if k != "TETHER_HOME"}
        env.update(TETHER_STORE_URL=db.url, TETHER_HOME=str(tmp_path / "home"))
        shown = await asyncio.to_thread(run_cli, ["runs", "show", parked.run_id, "--json"], env, tmp_path)
        assert json.loads(shown.stdout)["pending"]["key"] == handed, shown.stdout + shown.stderr
        text = await asyncio.to_thread(run_cli, ["runs", "show", parked.run_id], env, tmp_path)
        assert f"key: {handed}" in text.stdout, text.stdout + text.stderr
        # A resolution kept for a runner: the runner finds the run by what its record holds.
        out = await rt.resolve_wait(handed, "real", continue_run=False)
        assert out["status"] == "accepted"
        assert parked.run_id in rt.store.runs_with_settled_wait()
        stored_key = rt.store.get_run(parked.run_id).pending["key"]
        assert stored_key.startswith("wd1.")
        done = await launcher.wake(rt.engine, parked.run_id, key=stored_key)
        assert done is not None and done.status == "completed" and done.result == "real"


async def test_a_run_parked_before_keys_were_digested_still_continues(db, secret_outside):
    """A row written by an older tether keeps its wait key in clear: it is found and woken as before."""
    import dataclasses

    from tether._engine.integrity import sign_run
    from tether._runtime import Runtime
    from tether._store import open_store

    async with Runtime(store=open_store(db.url), type_check=False) as rt:
        parked = await rt.execute(PARKED)
        handed = parked.pending["key"]
        run = rt.store.get_run(parked.run_id)
        old = {**run.pending, "key": handed}
        older = dataclasses.replace(run, pending=old, result={**run.result, "pending": old})
        assert rt.store.update_run(run.run_id, ["waiting"], pending=old, result=older.result,
                                   mac=sign_run(rt.engine.keyring, older))
        assert (await rt.engine.wait_for_run(run.run_id)).pending["key"] == handed
        await rt.resolve_wait(handed, "old", continue_run=False)
        assert run.run_id in rt.store.runs_with_settled_wait()
        done = await launcher.wake(rt.engine, run.run_id, key=rt.store.get_run(run.run_id).pending["key"])
        assert done is not None and done.status == "completed" and done.result == "old"
