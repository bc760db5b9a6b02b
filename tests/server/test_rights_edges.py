"""The smaller doors of P-44 and D-61/D-62, each on its own: stored files' modes, local runs on both stores,
scopes, webhook URLs in logs, and the default quotas.

The parts that need a served process and the identity provider are in test_doors.py.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tether import Runtime, tool
from tether._engine.approvals import APPROVE, OPERATE, RUN, Access, Grant
from tether._server.auth import principal_for_token
from tether._server.console import Console


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- stored files: 0600 and 0700 whatever the umask (D-61) -----------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o000], ids=["022", "002", "000"])
def test_d61_the_store_its_wal_and_its_directory_are_private_whatever_the_umask(tmp_path, umask):
    from tether._store.sqlite import SQLiteStore

    before = mode(tmp_path)
    old = os.umask(umask)
    try:
        store = SQLiteStore(f"sqlite:///{tmp_path}/made/here/tether.db")
        try:
            db = tmp_path / "made" / "here" / "tether.db"
            files = [db, *(Path(f"{db}{s}") for s in ("-wal", "-shm", ".secret"))]
            present = [f for f in files if f.exists()]
            assert Path(f"{db}-wal") in present  # WAL mode: the journal of every commit, in clear
            assert {f.name: oct(mode(f)) for f in present} == {f.name: "0o600" for f in present}
            assert mode(tmp_path / "made") == 0o700 and mode(tmp_path / "made" / "here") == 0o700
        finally:
            store.close()
    finally:
        os.umask(old)
    assert mode(tmp_path) == before  # a directory that existed keeps the mode the operator gave it


def test_d61_store_backup_writes_0600_and_says_where_and_with_what_mode(tmp_path):
    home = tmp_path / "home"
    program = tmp_path / "p.py"
    program.write_text("'kept'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
    env["TETHER_HOME"] = str(home)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", 'umask 022 && exec "$@"', "sh", sys.executable, "-m", "tether.cli",
                               *args], env=env, capture_output=True, text=True, timeout=120)

    assert cli("run", str(program)).returncode == 0
    assert mode(home) == 0o700 and mode(home / "tether.db") == 0o600
    dest = tmp_path / "copies" / "backup.db"
    out = cli("store", "backup", str(dest))
    assert out.returncode == 0, out.stderr
    assert mode(dest) == 0o600 and mode(dest.parent) == 0o700
    assert f"to {dest} (" in out.stdout and "mode 0600" in out.stdout, out.stdout
    shown = json.loads(cli("store", "backup", str(tmp_path / "b2.db"), "--json").stdout)
    assert shown["backup"] == str(tmp_path / "b2.db") and shown["mode"] == "0600"


# -- local runs on SQLite and Postgres (D-61) --------------------------------------------------

sent: list[dict] = []


@tool(namespace="shop")
def refund(order_id: str, amount: float) -> dict:
    """Refund an order: sends money back to the customer."""
    sent.append({"order_id": order_id})
    return {"refunded": amount}


PROGRAM = "import tools\nawait tools.shop.refund(order_id='L1', amount=1.0)"
PAT, AGENT, OP = "pat-token-0123456789abc", "agent-token-0123456789", "op-token-0123456789abcd"
IDP_PERSON = Grant("oauth:https://idp.example#ann", "Ann", frozenset({APPROVE}), frozenset({"*"}))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_for(request, tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    if request.param == "sqlite":
        from tether._store.sqlite import SQLiteStore

        yield lambda: SQLiteStore(f"sqlite:///{tmp_path}/tether.db")
        return
    from tether._store.postgres import PostgresStore

    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = request.getfixturevalue("pg_url")
    yield lambda: PostgresStore(url, schema=schema)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def csrf_of(text: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', text).group(1)


@pytest.mark.parametrize("local_runs", ["private", "shared"])
async def test_d61_approvers_for_everyone_see_local_runs_only_when_shared(store_for, local_runs):
    sent.clear()
    grants = [Grant(principal_for_token(PAT), "pat", frozenset({APPROVE}), frozenset({"*"})),
              Grant(principal_for_token(AGENT), "agent", frozenset({RUN})),
              Grant(principal_for_token(OP), "op", frozenset({OPERATE}))]
    access = Access.of(grants, local_runs=local_runs)
    async with Runtime(store=store_for(), tools=[refund]) as rt:
        local = await rt.execute(PROGRAM)  # tether run / the Python API: the operator's
        theirs = await rt.execute(PROGRAM, principal=principal_for_token(AGENT))
        assert local.status == theirs.status == "paused"
        console = Console(rt, tokens=[PAT, AGENT, OP], access=access)
        shared = local_runs == "shared"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                     base_url="http://127.0.0.1:8000") as c:
            for who in ("token", "idp"):
                c.cookies.clear()
                if who == "token":
                    page = await c.get("/console/login")
                    await c.post("/console/login", data={"csrf": csrf_of(page.text), "token": PAT})
                else:
                    # The cookie the identity provider's sign-in mints for an approver (every IdP approver: "*").
                    console.sign_in = object()
                    c.cookies.set("tether_session", console.make_session(IDP_PERSON.principal, IDP_PERSON))
                listing = (await c.get("/console/")).text
                assert (theirs.run_id in listing, local.run_id in listing) == (True, shared), who
                assert (await c.get(f"/console/runs/{local.run_id}")).status_code == (200 if shared else 404)
                page = await c.get("/console/")
                r = await c.post(f"/console/runs/{local.run_id}/decide",
                                 data={"csrf": csrf_of(page.text), "decision": "decline", "seq": "1"})
                assert (r.status_code == 404) == (not shared), (who, r.status_code)
                if shared:
                    break  # declined: the run has moved on
            # The operate right sees every run, the operator's too, as the CLI on the store does.
            c.cookies.clear()
            page = await c.get("/console/login")
            await c.post("/console/login", data={"csrf": csrf_of(page.text), "token": OP})
            assert local.run_id in (await c.get("/console/")).text
        await console.close()
    assert sent == []


# -- scopes and webhook URLs (D-62) ---------------------------------------------------------------


@pytest.mark.parametrize("space", ["\u2003", "\u00a0", "\t", "\n", "\u3000", "\x1f"])
def test_d62_scopes_are_split_on_spaces_only(space):
    """RFC 6749 §3.3: one scope string with another whitespace in it is one (unknown) scope, never two."""
    from tether._server.oauth import ResourceServer

    resource = ResourceServer(issuer="https://idp.example", audience="https://t.example/mcp", jwks_url=None,
                              algorithms=["RS256"], leeway=0)
    claims = {"iss": "https://idp.example", "sub": "ann", "scope": f"tether:run{space}tether:operate"}
    assert resource.identity(claims).rights == frozenset()
    assert resource.identity({**claims, "scope": "tether:run  tether:operate"}).rights == {RUN, OPERATE}


def test_d62_a_webhook_url_is_logged_without_its_query_or_user(capsys):
    from tether._config import Config
    from tether._server.notify import webhooks_from_config

    url = "https://hook-user:pw@hooks.example:8443/services/T0/B1?token=xoxb-secret-value#frag"
    config = Config.from_dict({"notify": [{"url": url, "secret_env": "HOOK_SECRET_UNSET"}]}, env={})
    assert webhooks_from_config(config, env={}) == []
    err = capsys.readouterr().err
    assert "https://hooks.example:8443/services/T0/B1 (query not shown)" in err, err
    assert "xoxb-secret-value" not in err and "pw@" not in err and "frag" not in err


# -- default quotas (D-62) ----------------------------------------------------------------------------


def test_d62_one_token_cannot_take_every_slot_or_fill_the_disk_by_default():
    from tether._config import Config

    quotas = Config.from_dict({}, env={}).quotas.quotas()
    token = quotas.of(principal_for_token(AGENT))
    assert token.concurrent_runs == 16 and token.stored_bytes == 1 << 30
    # The operator's own runs are not held to them unless the operator says so.
    assert quotas.of("local").concurrent_runs is None and quotas.of("local").stored_bytes is None
    said = Config.from_dict({"quotas": {"concurrent_runs": 4}}, env={}).quotas.quotas()
    assert said.of("local").concurrent_runs == 4 and said.of("local").stored_bytes is None
