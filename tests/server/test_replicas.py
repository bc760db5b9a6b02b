"""Three ``tether serve --http`` replicas on one Postgres: any replica serves any request.

Real processes sharing a throwaway Postgres (tests/pg.py). A pause taken on one
replica is decided on another and its write is sent once; a 2026-07-28 client's
input-required round trip completes with each request on a different replica;
``cell_wait``, ``resume``, waits, signals and cancellation work from a replica
that does not run the program. Legacy (2025-11-25) clients are served by
replicas in stateless HTTP mode (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest
from mcp_types import ElicitResult

from replicas import ReplicaSet, RoundRobin, connect
from tether._store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, pg_url):
    rs = ReplicaSet(tmp_path_factory.mktemp("replicas"), pg_url, 3, server_extra="stateless_http = true")
    try:
        yield rs
    finally:
        rs.stop()
    for r in rs.replicas:
        assert r.proc.returncode == 0, r.log.read_text()


async def approve(context, params):
    return ElicitResult(action="accept", content={"decision": "approve"})


def guarded(tag: str) -> str:
    return f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["legacy-stateless", "modern"])
async def test_a_pause_decided_on_two_other_replicas_at_once_is_sent_once(replicas, mode):
    a, b, c = replicas.replicas
    tag = f"cross-{mode}"
    async with connect(a.url, mode) as on_a:
        paused = (await on_a.call_tool("execute", {"code": guarded(tag)})).structured_content
    assert paused["status"] == "paused", paused
    assert tag not in replicas.tags()

    async def decide(r):
        async with connect(r.url, mode) as client:
            return await client.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve",
                                                     "seq": paused["pending"]["seq"]})

    results = await asyncio.gather(decide(b), decide(c))
    done = [r.structured_content for r in results if not r.is_error]
    refused = [r.structured_content["error"]["code"] for r in results if r.is_error]
    assert len(done) >= 1 and all(d["status"] == "completed" and d["result"] == tag for d in done), results
    # The loser either saw the decision already taken or waited for it and got the same result.
    assert len(done) + len(refused) == 2 and set(refused) <= {"already_decided"}, refused
    assert replicas.tags().count(tag) == 1


async def test_a_modern_input_required_round_trip_lands_on_different_replicas(replicas):
    tag = "round-trip"
    rr = RoundRobin([r.port for r in replicas.replicas])
    async with connect(replicas.replicas[0].url, "auto", transport=rr, elicitation_callback=approve) as client:
        before = len(rr.seen)
        r = await client.call_tool("execute", {"code": guarded(tag)})
    assert r.structured_content["status"] == "completed", r.content[0].text
    # The first request paused the run; the retry carrying the answer went to the next replica.
    assert len(set(rr.seen[before:])) >= 2, rr.seen
    assert replicas.tags().count(tag) == 1


async def test_a_legacy_client_round_robined_over_stateless_replicas(replicas):
    tag = "legacy-rr"
    rr = RoundRobin([r.port for r in replicas.replicas])
    async with connect(replicas.replicas[0].url, "legacy", transport=rr) as client:
        assert (await client.call_tool("execute", {"code": "6 * 7"})).structured_content["result"] == 42
        paused = (await client.call_tool("execute", {"code": guarded(tag)})).structured_content
        assert paused["status"] == "paused"
        r = await client.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve",
                                              "seq": paused["pending"]["seq"]})
        assert r.structured_content["status"] == "completed"
    assert len(set(rr.seen)) == 3, rr.seen  # initialize, list and calls spread over all three
    assert replicas.tags().count(tag) == 1


CELL = """
emit({"step": 1})
v = await wait_for_signal("go")
emit({"step": 2, "got": v})
v
"""


async def _watch(client, cell_id: str, until: str, after: int = 0, seconds: float = 60):
    events = []
    with anyio.fail_after(seconds):
        while True:
            obs = (await client.call_tool("cell_wait", {"cell_id": cell_id, "after": after,
                                                        "timeout_ms": 2000})).structured_content
            events += obs["events"]
            after = obs["cursor"]
            if obs["status"] == until or obs["status"] in ("completed", "failed", "terminated"):
                return obs, events


async def test_cell_started_on_one_replica_watched_on_another_and_signalled_from_a_third(replicas):
    a, b, _ = replicas.replicas
    async with connect(a.url, "auto") as on_a, connect(b.url, "auto") as on_b:
        obs = (await on_a.call_tool("cell_start", {"code": CELL, "yield_after_ms": 200})).structured_content
        cell_id = obs["cell_id"]
        obs, events = await _watch(on_b, cell_id, "paused")  # a cell parked on a wait is "paused"
        assert obs["status"] == "paused" and any(e.get("value") == {"step": 1} or e.get("step") == 1
                                                  for e in events), events
        done = replicas.cli("runs", "signal", cell_id, "go", json.dumps("now"), *replicas.tools_args())
        assert done.returncode == 0, done.stderr
        obs, events = await _watch(on_b, cell_id, "completed", after=obs["cursor"])
    assert obs["status"] == "completed", obs
    assert "now" in json.dumps(events)


WAITING = """
import tools
await tools.ledger.write(tag=TAG)
v = await wait_for("confirm", timeout=600)
[v]
"""


async def test_a_wait_resolved_on_another_process_continues_the_run_there(replicas):
    a = replicas.replicas[0]
    async with connect(a.url, "auto") as on_a:
        r = (await on_a.call_tool("execute", {"code": WAITING.replace("TAG", "'before-wait'")})).structured_content
    assert r["status"] == "waiting", r
    done = replicas.cli("waits", "resolve", r["pending"]["key"], "--value", '"yes"', "--json",
                        *replicas.tools_args())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "accepted" and out["run"]["status"] == "completed" and out["run"]["result"] == ["yes"]
    assert replicas.tags().count("before-wait") == 1  # the write before the wait was not sent again


LONG = """
import tools
await tools.ledger.wait(seconds=60)
await tools.ledger.write(tag="after-cancel")
"""


async def test_a_run_executing_on_one_replica_is_cancelled_from_another_process(replicas):
    a, b, _ = replicas.replicas
    async with connect(a.url, "auto") as on_a, connect(b.url, "auto") as on_b:
        started = (await on_a.call_tool("cell_start", {"code": LONG, "yield_after_ms": 100})).structured_content
        assert "cell_id" in started, started
        cell_id = started["cell_id"]
        store = open_store(replicas.store_url)
        try:
            with anyio.fail_after(30):
                while (store.get_run(cell_id).status) != "running":
                    await asyncio.sleep(0.05)
            owner = store.get_run(cell_id).owner
        finally:
            store.close()
        done = replicas.cli("runs", "cancel", cell_id, "--reason", "operator stop", *replicas.tools_args())
        assert done.returncode == 0, done.stderr
        obs, _ = await _watch(on_b, cell_id, "terminated", seconds=30)
    assert obs["status"] == "terminated", obs
    assert owner and "home-cli" not in owner
    await asyncio.sleep(0.3)
    assert "after-cancel" not in replicas.tags()


async def test_queued_runs_are_shared_by_the_replicas_runners_and_each_runs_once(replicas):
    from tether._engine.rules.policy import Policy
    from tether._runtime import Runtime

    # The policy is recorded with each run when it is queued.
    async with Runtime(store=open_store(replicas.store_url), type_check=False, policy=Policy(writes="allow")) as rt:
        ids = [rt.start(f"import tools\nawait tools.ledger.write(tag='queued-{i}')\n{i}") for i in range(12)]
        with anyio.fail_after(120):
            while any(rt.store.get_run(i).status in ("queued", "running") for i in ids):
                await asyncio.sleep(0.1)
        runs = [rt.store.get_run(i) for i in ids]
    assert [r.status for r in runs] == ["completed"] * 12, [r.error for r in runs]
    tags = replicas.tags()
    assert all(tags.count(f"queued-{i}") == 1 for i in range(12)), tags


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["legacy-stateless", "modern"])
async def test_p36_a_keyed_retry_on_another_replica_while_the_first_runs_gets_that_run(replicas, mode):
    # The client's first request is still running the program on replica a when its retry (same key)
    # reaches replica b: b waits for the run a executes and answers with its outcome; nothing runs twice.
    a, b, _ = replicas.replicas
    tag = f"keyed-retry-{mode}"
    code = f"import tools\nawait tools.ledger.write(tag='{tag}')\nawait tools.ledger.wait(seconds=1.5)\n'{tag}'"
    async with connect(a.url, mode) as on_a, connect(b.url, mode) as on_b:
        first = asyncio.ensure_future(on_a.call_tool("execute", {"code": code, "key": tag}))
        with anyio.fail_after(30):
            while tag not in replicas.tags():  # the write is done; a is in the program's slow read
                await asyncio.sleep(0.02)
        retried = (await on_b.call_tool("execute", {"code": code, "key": tag})).structured_content
        original = (await first).structured_content
    assert retried["status"] == original["status"] == "completed", (retried, original)
    assert retried["run_id"] == original["run_id"] and retried["result"] == tag
    assert replicas.tags().count(tag) == 1
    store = open_store(replicas.store_url)
    try:
        assert [r.run_id for r in store.list_runs(limit=200) if r.run_key == tag] == [original["run_id"]]
    finally:
        store.close()
