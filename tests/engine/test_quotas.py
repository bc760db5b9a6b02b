"""Per-principal quotas ([quotas]): each refusal is `quota_exceeded` naming the quota, its limit and what to do;
nothing is written; other principals are untouched; a keyed retry of an existing run is never refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from helpers import Clock, Recorder, free_port
from tether._engine.rules.policy import Policy
from tether._engine.rules.quotas import Quota, Quotas
from tether._engine.worker import Worker
from tether._runtime import Runtime
from tether._store import open_store
from tether.errors import QuotaExceeded

WRITE = "import tools\nawait tools.helpdesk.add_comment(id=1, body='x' * 4000)\n'ok'"


def runtime(store_url, quota: Quota, clock=None, **kw) -> Runtime:
    return Runtime(store=open_store(store_url), tools=Recorder().tools(), type_check=False, clock=clock or Clock(),
                   policy=Policy(writes="allow"), quotas=Quotas(default=quota, **kw))


def _refusal(exc: pytest.ExceptionInfo, quota: str, limit: int, used: int) -> None:
    err = exc.value.to_dict()
    assert err["code"] == "quota_exceeded"
    assert err["details"] == {"quota": quota, "limit": limit, "used": used}
    assert f"{quota} quota is {limit}" in err["message"] and "nothing was started" in err["message"]
    assert err["next_action"]


async def test_concurrent_runs(store_url):
    async with runtime(store_url, Quota(concurrent_runs=2)) as rt:
        rt.start("1")
        rt.start("2")
        with pytest.raises(QuotaExceeded) as exc:
            rt.start("3")
        _refusal(exc, "concurrent_runs", 2, 2)
        with pytest.raises(QuotaExceeded):
            await rt.execute("4")
        assert len(rt.store.list_runs()) == 2  # nothing half-written
        # Another principal is not held back by this one's runs.
        assert (await rt.execute("5", principal="someone-else")).status == "completed"
        # Once they ran, there is room again.
        await Worker(rt.engine).run_queued(limit=2)
        assert (await rt.execute("6")).status == "completed"


async def test_runs_per_period_and_a_keyed_retry(store_url):
    clock = Clock()
    async with runtime(store_url, Quota(runs_per_period=2, period_seconds=60), clock) as rt:
        first = await rt.execute(WRITE, key="req-1")
        await rt.execute("2")
        with pytest.raises(QuotaExceeded) as exc:
            await rt.execute("3")
        _refusal(exc, "runs_per_period", 2, 2)
        # The retry of a request that started a run starts nothing: never refused.
        again = await rt.execute(WRITE, key="req-1")
        assert again.run_id == first.run_id and again.status == "completed"
        assert len(rt.store.list_runs()) == 2
        clock.now += 61
        assert (await rt.execute("4")).status == "completed"


async def test_stored_bytes(store_url):
    async with runtime(store_url, Quota(stored_bytes=4000), stored_bytes_ttl=0.0) as rt:
        assert (await rt.execute(WRITE)).status == "completed"  # about 5 KB: the program, its call and outcome
        with pytest.raises(QuotaExceeded) as exc:
            await rt.execute("1")
        err = exc.value.to_dict()
        assert err["details"]["quota"] == "stored_bytes" and err["details"]["used"] >= 4000
        assert "tether runs prune" in err["next_action"]
        assert len(rt.store.list_runs()) == 1


async def test_repl_sessions(store_url):
    async with runtime(store_url, Quota(repl_sessions=1)) as rt:
        assert (await rt.execute("x = 1", session="a")).status == "completed"
        assert (await rt.execute("x + 1", session="a")).result == 2  # its own session: always
        with pytest.raises(QuotaExceeded) as exc:
            await rt.execute("y = 1", session="b")
        _refusal(exc, "repl_sessions", 1, 1)
        assert "sessions reset" in exc.value.next_action
        assert rt.reset_session("a")
        assert (await rt.execute("y = 1", session="b")).status == "completed"


async def test_a_principal_override_wins(store_url):
    async with runtime(store_url, Quota(concurrent_runs=1), principals={"big": Quota(concurrent_runs=3)}) as rt:
        for i in range(3):
            rt.start(str(i), principal="big")
        with pytest.raises(QuotaExceeded):
            rt.start("4", principal="big")
        rt.start("1")
        with pytest.raises(QuotaExceeded):
            rt.start("2")


# --- MCP sessions, over a real `tether serve --http` -------------------------------------------------

ALPHA, BETA = "alpha-token-0123456789", "beta-token-0123456789"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture
def server(tmp_path):
    port, scrape_port = free_port(), free_port()
    (tmp_path / "tether.toml").write_text(f'[quotas]\nmcp_sessions = 2\n[metrics]\nlisten = "127.0.0.1:{scrape_port}"\n')
    env = {k: v for k, v in os.environ.items() if k != "TETHER_STORE_URL"}
    env.update(TETHER_HOME=str(tmp_path / "home"), TETHER_TOKEN=f"{ALPHA},{BETA}")
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"),
                                 "serve", "--http", f"127.0.0.1:{port}"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{scrape_port}/metrics"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _open(client: httpx.Client, url: str, token: str) -> httpx.Response:
    return client.post(url, json=INIT, headers={**HEADERS, "authorization": f"Bearer {token}"})


def _usable(client: httpx.Client, url: str, token: str, session: str) -> bool:
    r = client.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                    headers={**HEADERS, "authorization": f"Bearer {token}", "mcp-session-id": session,
                             "mcp-protocol-version": "2025-11-25"})
    return r.status_code == 200


@pytest.mark.slow
def test_mcp_sessions_a_flood_from_one_token_never_touches_another(server):
    server, scrape_url = server
    with httpx.Client(timeout=30) as client:
        beta = _open(client, server, BETA).headers["mcp-session-id"]
        alpha = [_open(client, server, ALPHA).headers["mcp-session-id"] for _ in range(2)]
        for _ in range(5):  # the flood: refused, named, nothing opened
            r = _open(client, server, ALPHA)
            assert r.status_code == 429
            err = r.json()["error"]
            assert err["code"] == "quota_exceeded" and err["details"] == {"quota": "mcp_sessions", "limit": 2,
                                                                          "used": 2}
            assert "DELETE" in err["next_action"] and "mcp-session-id" not in r.headers
        # Every session still works: the other token's and the flooder's own.
        assert _usable(client, server, BETA, beta)
        assert all(_usable(client, server, ALPHA, s) for s in alpha)
        # The other token opens more, up to its own quota.
        assert _open(client, server, BETA).status_code == 200
        # Ending a session makes room for a new one.
        ended = client.delete(server, headers={"authorization": f"Bearer {ALPHA}", "mcp-session-id": alpha[0],
                                               "mcp-protocol-version": "2025-11-25"})
        assert ended.status_code in (200, 204)
        assert _open(client, server, ALPHA).status_code == 200
        # The same server serves /metrics behind the token (wired in `tether serve`).
        from prometheus_client.parser import text_string_to_metric_families

        metrics_url = server.removesuffix("/mcp") + "/metrics"
        assert client.get(metrics_url).status_code == 401
        scraped = client.get(metrics_url, headers={"authorization": f"Bearer {BETA}"})
        assert scraped.status_code == 200
        families = {f.name for f in text_string_to_metric_families(scraped.text)}
        assert {"tether_runs", "tether_sandbox_workers", "tether_store_call_seconds"} <= families
        # [metrics] listen: its own listener, no token, nothing else served there.
        side = client.get(scrape_url)
        assert side.status_code == 200 and "tether_runs" in side.text
        assert client.post(scrape_url.removesuffix("/metrics") + "/mcp", json=INIT).status_code == 404


async def test_a_start_reads_the_active_runs_not_the_principals_history(store_url):
    # concurrent_runs is checked at every start: its count reads the few active runs. It once read every run
    # the principal ever had, 1 ms a start at 1,000 runs and growing with the store (D-38).
    async with runtime(store_url, Quota(concurrent_runs=100)) as rt:
        await rt.execute("1")
        rt.start("2")  # one active run, to be counted
        store = rt.store
        conn = store._connection()
        cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
        ended = next(r.run_id for r in store.list_runs() if r.status == "completed")

        def steps() -> int:
            count = [0]

            def tick() -> int:
                count[0] += 1
                return 0

            conn.set_progress_handler(tick, 50)
            try:
                from tether._store import usage

                assert usage.active_runs(store, "local") == 1
            finally:
                conn.set_progress_handler(None, 0)
            return count[0]

        before = steps()
        copy = ", ".join("printf('run_old_%d', n)" if c == "run_id" else "NULL" if c == "run_key" else c for c in cols)
        with conn:
            conn.execute(f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 2000) "
                         f"INSERT INTO runs ({', '.join(cols)}) SELECT {copy} FROM seq, runs WHERE run_id = ?",
                         (ended,))
        assert len(store.list_runs(limit=5000)) >= 2002
        # 2,000 more ended runs of the same principal: the count does the same work as before.
        assert steps() <= before + 2
