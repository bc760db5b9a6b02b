"""Rows of the store decide nothing on their own (issue 19, points 4 and 5).

Each test edits or reads SQLite and Postgres rows directly, as someone with
access to the database but not the secret would, and shows that nothing is
sent because of it: a tool-listing cache turned "read-only", an outbox row
inserted for delivery, a paused run's rows read to approve its write.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURES = Path(__file__).parent / "fixtures"


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
    for key, data in db.sql("SELECT key, data FROM source_listings"):
        listing = json.loads(data)
        for tool in listing["tools"]:
            if tool["name"] == "record":
                tool["annotations"] = {**(tool.get("annotations") or {}), "readOnlyHint": True}
                changed += 1
        db.sql("UPDATE source_listings SET data = ? WHERE key = ?", (json.dumps(listing), key))
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
