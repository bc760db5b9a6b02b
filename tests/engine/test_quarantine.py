"""Poison runs are quarantined (P-39): a run whose attempts keep ending with their process gone is ended
``run_quarantined`` by the process that would take it over next, and nothing of it runs there.

The first tests take runs over inside one test process (an injected clock
lapses the leases). The last ones are the same case with real processes: a
program that wedges every ``tether worker`` taking it over (a tool that holds
the event loop), two workers sharing a store, SQLite and Postgres, while other
runs on the same store complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Clock, own_database, run_cli
from tether._engine.rules.limits import Limits
from tether._engine.rules.quarantine import TAKEOVERS
from tether._runtime import Runtime
from tether._sources.python import tool, tools_from_module
from tether._store import open_store

CALLS: list[int] = []


@tool(read_only=True, namespace="probe")
async def ping(n: int) -> int:
    """Count a call."""
    CALLS.append(n)
    return n


def _orphaned(store_url: str, clock: Clock, code: str, limits: Limits) -> str:
    """A run another process claimed and then left: its lease lapses as the clock moves on."""
    with_tools = dict(tools=[ping], clock=clock, limits=limits, type_check=False)
    ghost = Runtime(store=open_store(store_url), owner="elsewhere:1:dead", **with_tools)
    run_id = ghost.start(code)
    assert ghost.engine.lifecycle.claim_queued() is not None
    clock.now += 120
    return run_id


async def test_a_run_at_its_takeover_limit_is_ended_quarantined_and_nothing_runs(store_url):
    clock = Clock()
    CALLS.clear()
    run_id = _orphaned(store_url, clock, "import tools\nawait tools.probe.ping(n=1)", Limits(quarantine_after=1))
    async with Runtime(store=open_store(store_url), tools=[ping], clock=clock, type_check=False) as rt:
        (result,) = await rt.recover()
        stored = rt.store.get_run(run_id)
    assert result.run_id == run_id and result.status == "failed"
    assert result.error["code"] == "run_quarantined", result.error
    assert "Nothing was sent by this attempt" in result.error["message"]
    (attempt,) = result.error["details"]["attempts"]
    assert attempt["owner"] == "elsewhere:1:dead" and attempt["ended"] == "lease_lapsed"
    assert attempt["taken_by"] == rt.engine.owner
    assert CALLS == [] and stored is not None and stored.status == "failed" and stored.owner is None


async def test_the_console_says_why_a_run_was_quarantined(store_url):
    import httpx

    from tether._server.console import Console

    clock = Clock()
    run_id = _orphaned(store_url, clock, "import tools\nawait tools.probe.ping(n=3)", Limits(quarantine_after=1))
    token = "alice-token-0123456789"
    async with Runtime(store=open_store(store_url), tools=[ping], clock=clock, type_check=False,
                       local_runs="shared") as rt:
        await rt.recover()
        transport = httpx.ASGITransport(app=Console(rt, tokens=[token]).app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            login = (await c.get("/console/login")).text
            csrf = login.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            await c.post("/console/login", data={"csrf": csrf, "token": token})
            page = (await c.get(f"/console/runs/{run_id}")).text
    assert "[run_quarantined]" in page and "attempt of elsewhere:1:dead: its lease lapsed" in page, page


async def test_a_takeover_below_the_limit_is_recorded_and_the_run_goes_on(store_url):
    clock = Clock()
    CALLS.clear()
    run_id = _orphaned(store_url, clock, "import tools\nawait tools.probe.ping(n=2)", Limits())
    async with Runtime(store=open_store(store_url), tools=[ping], clock=clock, type_check=False) as rt:
        (result,) = await rt.recover()
        stored = rt.store.get_run(run_id)
    assert result.status == "completed" and result.result == 2 and CALLS == [2]
    assert stored is not None and [t["owner"] for t in stored.meta[TAKEOVERS]] == ["elsewhere:1:dead"]


HELD: asyncio.Event | None = None


@tool(read_only=True, namespace="probe")
async def hold() -> str:
    """Wait until the test lets go."""
    assert HELD is not None
    await HELD.wait()
    return "let go"


async def test_runs_show_lists_the_takeovers_of_a_run_that_is_still_running(store_url, tmp_path):
    """An operator sees a run heading for quarantine while it runs, not only once it has ended (P-39)."""
    global HELD
    HELD = asyncio.Event()
    clock = Clock()
    run_id = _orphaned(store_url, clock, "import tools\nawait tools.probe.hold()", Limits(quarantine_after=3))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(TETHER_HOME=str(tmp_path / "home"), TETHER_STORE_URL=store_url)
    async with Runtime(store=open_store(store_url), tools=[ping, hold], clock=clock, type_check=False) as rt:
        recovering = asyncio.ensure_future(rt.recover())
        while (r := rt.store.get_run(run_id)) is None or not r.meta.get(TAKEOVERS) or r.owner != rt.engine.owner:
            await asyncio.sleep(0.05)
        shown = await asyncio.to_thread(run_cli, ["runs", "show", run_id], env, tmp_path)
        as_json = await asyncio.to_thread(run_cli, ["runs", "show", run_id, "--json"], env, tmp_path)
        HELD.set()
        (result,) = await recovering
    assert result.status == "completed", result.error
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id}: running" in shown.stdout
    assert "taken over: attempt of elsewhere:1:dead lease_lapsed" in shown.stdout, shown.stdout
    [taken] = json.loads(as_json.stdout)["takeovers"]
    assert taken["owner"] == "elsewhere:1:dead" and taken["taken_by"] == rt.engine.owner


async def test_an_attempt_that_parks_clears_its_takeovers(store_url):
    clock = Clock()
    run_id = _orphaned(store_url, clock, "await wait_for('go')", Limits(quarantine_after=2))
    async with Runtime(store=open_store(store_url), tools=[ping], clock=clock, type_check=False) as rt:
        (result,) = await rt.recover()
        stored = rt.store.get_run(run_id)
    assert result.status == "waiting", result.error
    # Parked is an attempt that ended normally: the next crash starts the count again.
    assert stored is not None and TAKEOVERS not in stored.meta


# -- real processes -------------------------------------------------------------------------

WEDGE_TOOLS = '''\
import os
import time

from tether._sources.python import tool

TETHER_NAMESPACE = "wedge"


@tool(read_only=True)
def block() -> str:
    """Hold the event loop of the process that calls it (operator code run on the loop)."""
    with open(os.environ["WEDGE_LOG"], "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(600)
    return "unblocked"


@tool(read_only=True)
def echo(x: int) -> int:
    """Answer x."""
    return x
'''


class Workers:
    """``tether worker`` processes, each with a home of its own, on one store."""

    def __init__(self, root: Path, store_url: str) -> None:
        self.root, self.store_url = root, store_url
        root.mkdir(parents=True, exist_ok=True)
        self.tools = root / "wedge_tools.py"
        self.tools.write_text(WEDGE_TOOLS)
        (root / "tether.toml").write_text("[sandbox]\nmax_workers = 2\n")
        self.wedge_log = root / "wedge.log"
        self.env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN",)}
        self.env.update(TETHER_STORE_URL=store_url, TETHER_LEASE_SECONDS="1", WEDGE_LOG=str(self.wedge_log))
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str) -> subprocess.Popen:
        env = dict(self.env, TETHER_HOME=str(self.root / f"home-{name}"))
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"), "worker",
             "--tools", str(self.tools), "--poll", "0.1"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        self.procs.append(proc)
        return proc

    def wedged(self) -> list[int]:
        return [int(p) for p in self.wedge_log.read_text().split()] if self.wedge_log.exists() else []

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)


def _until(what: str, check, seconds: float = 90):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _poison_run_is_quarantined_across_two_processes(root: Path, store_url: str) -> None:
    workers = Workers(root, store_url)
    store = open_store(store_url)
    queue = Runtime(store=store, tools=tools_from_module(workers.tools), type_check=False,
                    limits=Limits(quarantine_after=2))
    meta = {"tools": [str(workers.tools)]}
    try:
        poison = queue.start("import tools\nawait tools.wedge.block()", meta=meta)
        first = workers.start("a")
        _until("worker a to wedge on the run", lambda: first.pid in workers.wedged())
        second = workers.start("b")
        # a holds its loop, so its lease lapses; b takes the run over and wedges in turn.
        _until("worker b to wedge on the run", lambda: second.pid in workers.wedged())
        others = [queue.start(f"import tools\nawait tools.wedge.echo(x={i})", meta=meta) for i in range(3)]
        # a is killed as an orchestrator would kill a stuck replica, and started again.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        workers.start("a2")
        ended = _until("the run to be quarantined",
                       lambda: (r := store.get_run(poison)) is not None and r.status == "failed" and r)
        assert ended.error is not None and ended.error["code"] == "run_quarantined", ended.error
        attempts = ended.error["details"]["attempts"]
        assert len(attempts) == 2 and all(a["ended"] in ("lease_lapsed", "process_gone") for a in attempts)
        assert [a["owner"].split(":")[1] for a in attempts] == [str(first.pid), str(second.pid)]
        # The quarantining process ran nothing of it: the tool was reached by a and b only.
        assert workers.wedged() == [first.pid, second.pid]
        for run_id in others:
            done = _until(f"run {run_id}", lambda run_id=run_id: (r := store.get_run(run_id)) is not None
                          and r.status in ("completed", "failed") and r)
            assert done.status == "completed", done.error
        shown = subprocess.run(
            [sys.executable, "-m", "tether.cli", "--config", str(root / "tether.toml"), "runs", "show", poison],
            env=dict(workers.env, TETHER_HOME=str(root / "home-cli")), capture_output=True, text=True, timeout=60)
        assert "[run_quarantined]" in shown.stdout and f"attempt of {attempts[0]['owner']}" in shown.stdout, shown
    finally:
        workers.stop()
        store.close()




@pytest.mark.slow
def test_a_run_that_wedges_every_worker_is_quarantined_across_two_processes_on_sqlite(tmp_path):
    _poison_run_is_quarantined_across_two_processes(tmp_path / "w", f"sqlite:///{tmp_path}/shared.db")


@pytest.mark.slow
@pytest.mark.postgres
def test_a_run_that_wedges_every_worker_is_quarantined_across_two_processes_on_postgres(tmp_path, pg_url):
    _poison_run_is_quarantined_across_two_processes(tmp_path / "w", own_database(pg_url, "quarantine"))


async def test_a_client_retrying_its_run_key_counts_as_a_takeover_and_is_quarantined(store_url):
    # P-36 and P-39 together: a retry with the key of a run whose owner died takes the run over, as the
    # worker would; it must count, or a client retrying its key would revive a poison run forever.
    clock = Clock()
    CALLS.clear()
    code = "import tools\nawait tools.probe.ping(n=4)"
    with_tools = dict(tools=[ping], clock=clock, limits=Limits(quarantine_after=1), type_check=False)
    ghost = Runtime(store=open_store(store_url), owner="elsewhere:1:dead", **with_tools)
    run_id = ghost.start(code, key="retry-me")
    assert ghost.engine.lifecycle.claim_queued() is not None
    clock.now += 120
    async with Runtime(store=open_store(store_url), **with_tools) as rt:
        again = await rt.execute(code, key="retry-me")
        stored = rt.store.get_run(run_id)
    assert again.run_id == run_id and again.status == "failed", again
    assert again.error["code"] == "run_quarantined"
    assert CALLS == [] and stored is not None and stored.status == "failed"
