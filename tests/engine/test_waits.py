"""Durable waits, signals, sleeps and background runs (P-18, P-19)."""

from __future__ import annotations

import asyncio

import pytest

from helpers import Clock, Recorder
from tether._engine import launcher
from tether._engine.approvals.service import expire as expire_paused
from tether._engine.rules.policy import Policy
from tether._engine.worker import Worker
from tether._runtime import Runtime
from tether._store import open_store


@pytest.fixture
def clock():
    return Clock()


def runtime(store_url, clock, rec=None, **kw) -> Runtime:
    kw.setdefault("policy", Policy(writes="allow"))
    return Runtime(store=open_store(store_url), tools=(rec or Recorder()).tools(), clock=clock, type_check=False,
                   **kw)


WAIT_PROGRAM = """
import tools
print("asking")
answer = await wait_for("approval", timeout=3600)
await tools.helpdesk.add_comment(id=1, body=answer["note"])
answer["note"]
"""


async def test_p18_a_wait_parks_the_run_and_a_resolution_continues_it_elsewhere(store_url, clock):
    rec = Recorder()
    async with runtime(store_url, clock, rec) as rt:
        parked = await rt.execute(WAIT_PROGRAM)
        assert parked.status == "waiting"
        assert parked.pending["kind"] == "wait" and parked.pending["name"] == "approval"
        assert rt.engine.get_run(parked.run_id).owner is None  # no worker, no owner
        (listed,) = rt.list_waits(parked.run_id)
        key = listed["key"]
        assert key == parked.pending["key"] and parked.run_id not in key  # not derivable from the run id
    async with runtime(store_url, clock, rec) as rt2:
        out = await rt2.resolve_wait(key, {"note": "go ahead"})
        assert out["status"] == "accepted"
        assert out["run"]["status"] == "completed" and out["run"]["result"] == "go ahead"
        assert out["run"]["logs"] == ["asking"]
        assert rec.deliveries == [("add_comment", {"id": 1, "body": "go ahead"})]
        # P-18: the first resolution wins; later ones learn the terminal value.
        again = await rt2.resolve_wait(key, {"note": "something else"})
        assert again["status"] == "already_resolved" and again["wait"]["value"] == {"note": "go ahead"}
        assert len(rec.deliveries) == 1


async def test_p18_a_forged_or_unknown_key_is_rejected(store_url, clock):
    async with runtime(store_url, clock) as rt:
        parked = await rt.execute(WAIT_PROGRAM)
        key = parked.pending["key"]
        forged = key[:-4] + ("0000" if not key.endswith("0000") else "1111")
        assert (await rt.resolve_wait(forged, {"note": "x"}))["status"] == "unknown_or_revoked"
        assert (await rt.resolve_wait("w1.garbage.key", 1))["status"] == "unknown_or_revoked"
        other = Runtime(store=open_store(f"{store_url}-other"), type_check=False)
        # A key signed by another store's secret is as good as forged here.
        assert (await rt.resolve_wait(other.engine.waits.key(parked.run_id, "approval"), 1))["status"] == "unknown_or_revoked"
        assert rt.engine.get_run(parked.run_id).status == "waiting"


async def test_p18_a_resolution_before_the_wait_is_kept(store_url, clock):
    code = """
first = await wait_for_signal("go")
second = await wait_for("later")
[first, second]
"""
    async with runtime(store_url, clock) as rt:
        run_id = rt.start(code)
        # Both arrive before the run has even started.
        assert (await rt.signal(run_id, "go", 1))["status"] == "accepted"
        assert (await rt.resolve_wait(rt.engine.waits.key(run_id, "later"), 2))["status"] == "accepted"
        (result,) = await Worker(rt.engine).run_queued()
        assert result.status == "completed" and result.result == [1, 2]


async def test_p18_a_wait_times_out_with_timeout_error_in_the_program(store_url, clock):
    code = """
try:
    await wait_for("reply", timeout=60)
    out = "answered"
except TimeoutError as e:
    out = str(e)
out
"""
    async with runtime(store_url, clock) as rt:
        parked = await rt.execute(code)
        assert parked.status == "waiting" and parked.expires_at == clock.now + 60
        clock.now += 30
        assert await launcher.wake_due(rt.engine) == []  # not yet
        clock.now += 31
        (done,) = await launcher.wake_due(rt.engine)
        assert done.status == "completed" and done.result.startswith("[wait_timeout]")
        assert (await rt.resolve_wait(parked.pending["key"], 1))["status"] == "already_resolved"


async def test_p18_cancelling_a_run_cancels_its_waits(store_url, clock):
    async with runtime(store_url, clock) as rt:
        parked = await rt.execute(WAIT_PROGRAM)
        r = await rt.cancel(parked.run_id)
        assert r.status == "cancelled"
        (w,) = rt.list_waits(parked.run_id, status=None)
        assert w["status"] == "cancelled"
        assert (await rt.resolve_wait(parked.pending["key"], {"note": "late"}))["status"] == "already_resolved"


async def test_p18_revoke_removes_every_wait(store_url, clock):
    async with runtime(store_url, clock) as rt:
        parked = await rt.execute(WAIT_PROGRAM)
        assert rt.engine.waits.revoke(run_id=parked.run_id) == 1
        assert (await rt.resolve_wait(parked.pending["key"], {"note": "x"}))["status"] == "unknown_or_revoked"
        assert rt.list_waits(parked.run_id) == []


async def test_p18_a_sleep_is_a_durable_timer_across_runtimes(store_url, clock):
    code = """
import asyncio
import time
t0 = time.time()
await asyncio.sleep(300)
'woke'
"""
    async with runtime(store_url, clock) as rt:
        parked = await rt.execute(code)
        assert parked.status == "waiting" and parked.pending["kind"] == "sleep"
        assert parked.expires_at == clock.now + 300
    # A new runtime ("after a restart"), 200 s later: 100 s remain, nothing wakes.
    clock.now += 200
    async with runtime(store_url, clock) as rt2:
        assert await launcher.wake_due(rt2.engine) == []
        assert rt2.engine.get_run(parked.run_id).expires_at == parked.expires_at
        clock.now += 100
        (done,) = await launcher.wake_due(rt2.engine)
        assert done.status == "completed" and done.result == "woke"


async def test_a_sleep_past_max_sleep_seconds_fails_before_parking(store_url, clock):
    async with runtime(store_url, clock) as rt:
        r = await rt.execute("import time\ntime.sleep(10**9)")
        assert r.status == "failed" and r.error["code"] == "sleep_too_long"
        assert "max_sleep_seconds" in r.error["message"] and r.error["details"]["call"]["seq"] == 1
        assert rt.list_waits(r.run_id) == []
        # The program may catch it; a sleep within the bound still parks.
        r = await rt.execute("import asyncio\ntry:\n    await asyncio.sleep(31 * 86400)\nexcept ValueError as e:\n"
                             "    out = str(e)[:16]\nout")
        assert r.result == "[sleep_too_long]"
        r = await rt.execute("import asyncio\nawait asyncio.sleep(29 * 86400)")
        assert r.status == "waiting"


async def test_short_sleeps_are_waited_out_in_place(store_url, clock):
    async with runtime(store_url, clock) as rt:
        r = await rt.execute("import asyncio\nawait asyncio.sleep(0.05)\n'ok'")
        assert r.status == "completed" and r.result == "ok"


async def test_p19_background_runs_are_queued_and_run_by_a_worker(store_url, clock):
    from tether._engine.worker import Worker

    rec = Recorder()
    async with runtime(store_url, clock, rec) as rt:
        ids = [rt.start(f"import tools\nawait tools.helpdesk.add_comment(id={i}, body='bg')\n{i}") for i in range(3)]
        assert all(rt.engine.get_run(i).status == "queued" for i in ids)
        stop = asyncio.Event()
        worker = asyncio.ensure_future(Worker(rt.engine).work(stop=stop, poll_seconds=0.01))
        results = [await rt.engine.wait_for_run(i, timeout=30) for i in ids]
        stop.set()
        await worker
        assert [r.result for r in results] == [0, 1, 2]
        assert sorted(d[1]["id"] for d in rec.deliveries) == [0, 1, 2]


async def test_p19_cancel_a_queued_run(store_url, clock):
    async with runtime(store_url, clock) as rt:
        run_id = rt.start("1")
        r = await rt.cancel(run_id)
        assert r.status == "cancelled"
        assert await Worker(rt.engine).run_queued() == []


async def test_p18_a_paused_write_is_a_wait_whose_key_decides_it(store_url, clock):
    rec = Recorder()
    async with Runtime(store=open_store(store_url), tools=rec.tools(), clock=clock, type_check=False) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=8)\n'done'")
        assert paused.status == "paused"
        (w,) = rt.list_waits(paused.run_id)
        assert w["name"] == "approval:1" and w["key"] == paused.pending["key"]
        bad = await rt.resolve_wait(w["key"], {"decision": "maybe"})
        assert bad["status"] == "invalid_value" and rec.deliveries == []
        out = await rt.resolve_wait(w["key"], {"decision": "approve"})
        assert out["status"] == "accepted" and out["run"]["status"] == "completed"
        assert rec.deliveries == [("close_ticket", {"id": 8})]
        again = await rt.resolve_wait(w["key"], {"decision": "decline"})
        assert again["status"] == "already_resolved" and again["wait"]["value"]["decision"] == "approve"
        # resume() and the key are one mechanism: the recorded outcome either way.
        assert (await rt.resume(paused.run_id, "approve")).result == "done"
        assert len(rec.deliveries) == 1


async def test_p18_resume_settles_the_approval_wait(store_url, clock):
    async with Runtime(store=open_store(store_url), tools=Recorder().tools(), clock=clock, type_check=False) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=8)\n'done'")
        await rt.resume(paused.run_id, "decline", "not today")
        (w,) = rt.list_waits(paused.run_id, status=None)
        # P-29: the decision is recorded with who took it and from where.
        assert w["status"] == "resolved" and w["value"] == {"decision": "decline", "reason": "not today",
                                                            "actor": "local", "via": "python",
                                                            "origin": None}
        out = await rt.resolve_wait(paused.pending["key"], {"decision": "approve"})
        assert out["status"] == "already_resolved"


async def test_p10_a_worker_ends_paused_runs_past_their_ttl(store_url, clock):
    from tether.errors import NotPaused

    async with runtime(store_url, clock, approval_ttl_seconds=60, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=1)")
        assert paused.status == "paused"
        assert expire_paused(rt.engine) == []
        clock.now += 61
        assert expire_paused(rt.engine) == [paused.run_id]
        run = rt.engine.get_run(paused.run_id)
        assert run.status == "failed" and run.error["code"] == "run_expired"
        with pytest.raises(NotPaused):
            await rt.resume(paused.run_id, "approve")
        assert (await rt.resolve_wait(paused.pending["key"], {"decision": "approve"}))["status"] == "unknown_or_revoked"


async def test_p18_a_resolution_arriving_while_the_run_parks_continues_it(store_url, clock):
    # Another process resolves the wait after the run created its wait row but
    # before the run is recorded `waiting`: the resolver finds the run still
    # running and leaves it to the process running it, which must continue it
    # once parked, or the run waits for ever on a settled wait (no deadline
    # for a worker to wake it at).
    code = 'v = await wait_for_signal("go")\n["got", v]'
    async with runtime(store_url, clock) as rt, runtime(store_url, clock) as other:
        run_id = rt.start(code)
        key = rt.engine.waits.key(run_id, "signal:go")
        attempt = asyncio.ensure_future(Worker(rt.engine).run_queued())
        while other.store.get_wait(key) is None:  # the run has reached the wait ...
            assert not attempt.done(), attempt.result()
            await asyncio.sleep(0)
        assert other.engine.get_run(run_id).status == "running"  # ... and is not parked yet
        assert (await other.signal(run_id, "go", "now"))["status"] == "accepted"
        (done,) = await attempt
        assert done.status == "completed" and done.result == ["got", "now"]
        assert other.engine.get_run(run_id).status == "completed"


async def test_p19_a_cancel_from_another_process_while_the_run_parks_ends_it(store_url, clock):
    # The cancel finds the run running in another process and records the request
    # for that process's heartbeat; the run parks on a wait before the heartbeat
    # comes (a parked run has none). The cancel must end the parked run, not
    # report it waiting and leave it there.
    code = 'import tools\nawait tools.helpdesk.get_ticket(id=1)\nawait wait_for_signal("never")\n"not cancelled"'
    async with runtime(store_url, clock, Recorder(delay=0.3)) as rt, runtime(store_url, clock) as other:
        run_id = rt.start(code)
        attempt = asyncio.ensure_future(Worker(rt.engine).run_queued())
        while other.engine.get_run(run_id).status != "running":
            await asyncio.sleep(0.01)
        cancelled = await other.cancel(run_id, "stop")
        assert cancelled.status == "cancelled", cancelled
        await attempt
        assert other.engine.get_run(run_id).status == "cancelled"
        assert [w["status"] for w in other.list_waits(run_id, status=None)] == ["cancelled"]


# The store's writers of wait rows.
_WAIT_WRITERS = {"create_wait", "settle_wait", "park_run"}  # park_run: a pause's approval waits, with the pause
# Every wait row is written by _engine/waits.py; the approvals service decides when an approval wait is
# created and settled (test_decisions.py holds it to that) and has waits.py write it.
_WAIT_HOMES = {"_engine/waits.py"}


def _wait_writes_outside_their_homes() -> list[str]:
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent.parent / "src" / "tether"
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("_store/") or rel in _WAIT_HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in _WAIT_WRITERS:
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")  # a call, or the method handed on
            if isinstance(node, ast.Constant) and node.value in _WAIT_WRITERS:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    return found


def test_only_the_waits_service_writes_a_wait_row():
    """A wait the program reaches (wait_for, a signal, a sleep), a paused write's approval wait, settled, timed
    out, revoked or cancelled: its row is written by _engine/waits.py, whose keys and rules every path shares
    (P-18)."""
    assert _wait_writes_outside_their_homes() == []


def test_a_wait_row_is_created_pending_and_settled_once_or_refused(store_url):
    """waits.create / waits.settle check the wait table before writing: nothing written on a refusal."""
    from tether._engine import waits
    from tether._store import RunRecord
    from tether._store.base import WaitRecord
    from tether.errors import InvalidTransition

    store = open_store(store_url)
    rt_run = "run_1"
    store.create_run(RunRecord(run_id=rt_run, status="running", program="1", environment={}, policy={}, limits={},
                               created_at=1.0, updated_at=1.0))
    with pytest.raises(InvalidTransition):
        waits.create(store, WaitRecord("k", rt_run, "go", "resolved", 1.0))
    assert store.get_wait("k") is None
    waits.create(store, WaitRecord("k", rt_run, "go", "pending", 1.0))
    with pytest.raises(InvalidTransition):
        waits.settle(store, WaitRecord("k", rt_run, "go", "pending", 2.0))
    assert waits.settle(store, WaitRecord("k", rt_run, "go", "resolved", 2.0, value=1, resolved_at=2.0))[0]
    accepted, row = waits.settle(store, WaitRecord("k", rt_run, "go", "cancelled", 3.0, resolved_at=3.0))
    assert not accepted and (row.status, row.value) == ("resolved", 1)  # the first settlement wins
    store.close()


@pytest.mark.parametrize("name", ["approval:2", "signal:go", "sleep:3"])
async def test_p18_a_program_cannot_name_a_wait_in_tethers_own_namespace(store_url, clock, name):
    """A wait's key is HMAC(run, name): a program naming its wait ``approval:2`` would be handed (and show the
    agent) the approval key of its own next write, and park on a wait whose key resolves nothing (an approval
    key is decided through the approvals service, and the run is not paused), so it could never continue."""
    rec = Recorder()
    program = f"""
import tools
try:
    await wait_for({name!r})
    outcome = "parked"
except TypeError as exc:
    outcome = str(exc)
await tools.helpdesk.add_comment(id=1, body=outcome)
outcome
"""
    async with runtime(store_url, clock, rec, policy=Policy(writes="ask")) as rt:
        result = await rt.execute(program)
        assert result.status == "paused", result.to_dict()  # it went on to its write: nothing parked
        assert "[invalid_arguments]" in result.pending["args"]["body"]
        assert "reserved" in result.pending["args"]["body"]
        (call, _) = rt.engine.store.get_calls(result.run_id)
        assert call.state == "failed"
        # The only wait of the run is the write's own approval, made by its pause.
        assert [w["name"] for w in rt.list_waits(result.run_id)] == ["approval:2"]
