"""Legacy-era (2025-11-25) clients behind a balancer with sticky sessions, as docs/deploy.md recommends.

Two ``tether serve --http`` replicas in stateful mode (the default) on one
Postgres, behind a sticky balancer (tests/replicas.py ``Sticky``: a request
carrying ``Mcp-Session-Id`` goes to the replica that issued the session).
What the guide promises for this set-up: inline forms work; when the replica
holding a session dies, the client starts a new session and its paused run
is decided with ``resume`` on another replica, the write sent once.
The stateless set-up is tested in tests/server/test_replicas.py.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest
from mcp_types import ElicitResult

from replicas import ReplicaSet, Sticky, connect
from tether._store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stateful(tmp_path_factory, pg_url):
    rs = ReplicaSet(tmp_path_factory.mktemp("sticky"), pg_url, 2)  # no stateless_http: sessions in memory
    try:
        yield rs
    finally:
        rs.stop()


def guarded(tag: str) -> str:
    return f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')\n'{tag}'"


async def approve(context, params):
    return ElicitResult(action="accept", content={"decision": "approve"})


async def test_sticky_sessions_get_inline_forms_on_their_own_replica(stateful):
    sticky = Sticky([r.port for r in stateful.replicas])
    url = stateful.replicas[0].url
    async with connect(url, "legacy", transport=sticky, elicitation_callback=approve) as first, \
            connect(url, "legacy", transport=sticky, elicitation_callback=approve) as second:
        one = await first.call_tool("execute", {"code": guarded("sticky-one")})
        two = await second.call_tool("execute", {"code": guarded("sticky-two")})
    assert one.structured_content["status"] == "completed", one.content[0].text
    assert two.structured_content["status"] == "completed", two.content[0].text
    # Each session kept to the replica that issued it, and the two sessions were on different replicas.
    assert len(sticky.sessions) == 2 and len(set(sticky.sessions.values())) == 2, sticky.sessions
    for session, port in sticky.seen:
        assert session is None or sticky.sessions[session] == port
    assert stateful.tags().count("sticky-one") == 1 and stateful.tags().count("sticky-two") == 1


async def test_when_the_session_s_replica_dies_a_new_session_decides_the_pause_on_another(stateful):
    tag = "sticky-dies"
    sticky = Sticky([r.port for r in stateful.replicas])
    form_open, never = asyncio.Event(), asyncio.Event()

    async def hold(context, params):  # the person never answers before the replica dies
        form_open.set()
        await never.wait()

    async def call_and_lose_the_replica() -> None:
        async with connect(stateful.replicas[0].url, "legacy", transport=sticky, elicitation_callback=hold) as c:
            await c.call_tool("execute", {"code": guarded(tag)})

    doomed = asyncio.ensure_future(call_and_lose_the_replica())
    with anyio.fail_after(120):
        await form_open.wait()
    port = next(iter(sticky.sessions.values()))
    replica = next(r for r in stateful.replicas if r.port == port)
    replica.proc.kill()  # SIGKILL: the session and the open form die with it
    replica.proc.wait(timeout=30)
    sticky.down(port)
    doomed.cancel()
    await asyncio.gather(doomed, return_exceptions=True)

    # The other replica (same host) takes the run over at once and it pauses again: the pause is in the store.
    store = open_store(stateful.store_url)
    try:
        with anyio.fail_after(120):
            while True:
                runs = [r for r in store.list_runs(limit=100) if tag in r.program]
                if runs and runs[0].status == "paused":
                    break
                await asyncio.sleep(0.1)
        run = runs[0]
    finally:
        store.close()
    assert tag not in stateful.tags()

    async with connect(stateful.replicas[0].url, "legacy", transport=sticky) as fresh:
        done = await fresh.call_tool("resume", {"run_id": run.run_id, "decision": "approve",
                                                "seq": run.pending["seq"]})
    assert done.structured_content["status"] == "completed", done.content[0].text
    assert stateful.tags().count(tag) == 1
    # The new session was issued, and served, by the replica still up.
    assert len(sticky.sessions) == 2 and list(sticky.sessions.values())[-1] != port
