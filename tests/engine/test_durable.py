"""Durable runs: pause, resume, replay, tamper, diverge. Test names cite docs/protocol.md clauses."""

from __future__ import annotations

import asyncio

import pytest

from helpers import Clock, Recorder
from tether._engine.integrity import sign_run, sign_snapshot_record
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._store import open_store
from tether._store.base import SnapshotRecord
from tether.errors import AlreadyDecided, RunExpired, RunNotFound

WRITE_PROGRAM = """
import asyncio
import tools
a, b = await asyncio.gather(tools.helpdesk.get_ticket(id=1), tools.helpdesk.get_ticket(id=2))
print("read", a["id"], b["id"])
closed = await tools.helpdesk.close_ticket(id=1)
print("closed", closed["id"])
{"a": a["title"], "closed": closed["status"]}
"""


def resigned(rt, snap, version):
    """``snap`` signed as tether signs snapshots (pending calls and kind included), as ``version``'s."""
    mac = sign_snapshot_record(rt.engine.keyring, snap.run_id, snap.seq, version, snap.data, snap.pending, snap.kind)
    return SnapshotRecord(snap.run_id, snap.seq, version, snap.data, mac, snap.pending, rt.engine.clock(), snap.kind)


def signed(rt, run):
    run.mac = sign_run(rt.engine.keyring, run)
    return run


@pytest.fixture
def clock():
    return Clock()


def make_runtime(store_url, rec, clock=None, **kw) -> Runtime:
    kw.setdefault("type_check", False)
    return Runtime(store=open_store(store_url), tools=rec.tools(), clock=clock or Clock(), **kw)


async def test_p4_a_write_needing_approval_pauses_and_holds_no_worker(store_url, clock):
    rec = Recorder()
    async with make_runtime(store_url, rec, clock) as rt:
        r = await rt.execute(WRITE_PROGRAM)
        assert r.status == "paused"
        assert r.pending["address"] == "helpdesk.close_ticket" and r.pending["args"] == {"id": 1}
        assert r.pending["annotations"]["destructive"] is True
        assert r.expires_at == clock.now + 86_400
        assert "approve" in r.instructions
        assert rec.deliveries == []  # nothing sent before the decision
        assert r.logs == ["read 1 2"]
        run = rt.engine.get_run(r.run_id)
        assert run.status == "paused" and run.owner is None
        snap = rt.store.latest_snapshot(r.run_id)
        assert snap.kind == "pause" and len(snap.data) > 0
        calls = rt.store.get_calls(r.run_id)
        assert [(c.seq, c.kind, c.state) for c in calls] == [(1, "read", "done"), (2, "read", "done"), (3, "write", "asked")]


async def test_p10_approve_sends_once_and_completes_in_another_runtime(store_url, clock):
    rec = Recorder()
    async with make_runtime(store_url, rec, clock) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
    # A second runtime over the same store: a different owner, a fresh pool.
    async with make_runtime(store_url, rec, clock) as rt2:
        done = await rt2.resume(paused.run_id, "approve")
        assert done.status == "completed", done.error
        assert done.result == {"a": "ticket 1", "closed": "closed"}
        assert done.logs == ["read 1 2", "closed 1"]
        assert done.diagnostics["attempt"] == "restore"
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        # P-10: repeating the decision returns the recorded outcome, sends nothing.
        again = await rt2.resume(paused.run_id, "approve")
        assert again.to_dict() == done.to_dict()
        assert len(rec.deliveries) == 1
        with pytest.raises(AlreadyDecided):
            await rt2.resume(paused.run_id, "decline")
        with pytest.raises(RunNotFound):
            await rt2.resume("run_nope", "approve")


async def test_p10_decline_raises_permission_error_the_program_can_handle(store_url):
    rec = Recorder()
    code = """
import tools
try:
    await tools.helpdesk.close_ticket(id=4)
    outcome = "closed"
except PermissionError as e:
    outcome = str(e)
outcome
"""
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(code)
        r = await rt.resume(paused.run_id, "decline", "customer asked to keep it open")
        assert r.status == "completed"
        assert r.result.startswith("[write_declined]") and "customer asked to keep it open" in r.result
        assert rec.deliveries == []


async def test_p10_cancel_ends_the_run_and_sends_nothing(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        r = await rt.resume(paused.run_id, "cancel")
        assert r.status == "cancelled"
        assert rec.deliveries == []
        assert rt.engine.get_run(paused.run_id).status == "cancelled"


async def test_p10_concurrent_duplicate_resumes_send_once(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        a, b, c = await asyncio.gather(*(rt.resume(paused.run_id, "approve") for _ in range(3)))
        assert a.status == b.status == c.status == "completed"
        assert a.result == b.result == c.result
        assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_p10_resume_past_ttl_is_refused(store_url, clock):
    rec = Recorder()
    async with make_runtime(store_url, rec, clock, approval_ttl_seconds=60) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        clock.now += 61
        with pytest.raises(RunExpired):
            await rt.resume(paused.run_id, "approve")
        assert rec.deliveries == []


async def test_p10_another_principal_sees_no_run(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM, principal="alice")
        with pytest.raises(RunNotFound):
            await rt.resume(paused.run_id, "approve", principal="mallory")
        r = await rt.resume(paused.run_id, "approve", principal="alice")
        assert r.status == "completed"


async def test_p4_p22_gathered_writes_pause_once_as_a_batch(store_url):
    # Before batches, these two writes paused one after the other; now one
    # pause lists both and each is decided by its seq (P-27).
    rec = Recorder()
    code = """
import asyncio
import tools
x, y, t = await asyncio.gather(tools.helpdesk.add_comment(id=1, body="first"),
                               tools.helpdesk.add_comment(id=1, body="second"),
                               tools.helpdesk.get_ticket(id=9))
[x["comment"], y["comment"], t["id"]]
"""
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(code)
        assert r.status == "paused" and r.pending["seq"] == 1
        assert [w["seq"] for w in r.pending["writes"]] == [1, 2]
        r = await rt.decide(r.run_id, {1: "approve", 2: "approve"})
        assert r.status == "completed", r.error
        assert r.result == [1, 2, 9]
        assert [d[1]["body"] for d in rec.deliveries] == ["first", "second"]


async def test_p9_a_changed_snapshot_byte_is_refused(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        store = rt.store
        snap = store.latest_snapshot(paused.run_id)
        data = bytearray(snap.data)
        data[len(data) // 2] ^= 0x01
        snap.data = bytes(data)
        store.put_snapshot(snap)
        # The run ends failed at once instead of staying running (P-35: stuck runs end).
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "snapshot_tampered"
        assert rt.store.get_run(paused.run_id).status == "failed"
        assert rec.deliveries == []


async def test_p12_another_monty_version_falls_back_to_replay(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        snap = rt.store.latest_snapshot(paused.run_id)
        # Signed as the store would have: only the version differs.
        snap = resigned(rt, snap, "pydantic-monty-0.0.1")
        rt.store.put_snapshot(snap)
        reads_before = len(rec.events)
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "completed", r.error
        assert r.diagnostics["attempt"] == "replay"
        assert r.result == {"a": "ticket 1", "closed": "closed"}
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        assert len(rec.events) == reads_before  # reads were answered from the journal


async def test_p6_journal_altered_so_replay_differs_is_execution_diverged(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        run = rt.engine.get_run(paused.run_id)
        # The program now asks for ticket 5 first: the journal says ticket 1.
        # Signed as tether would: this is divergence, not tampering (P-35 has its own tests).
        run.program = WRITE_PROGRAM.replace("id=1)", "id=5)", 1)
        rt.store.update_run(run.run_id, None, program=run.program, mac=sign_run(rt.engine.keyring, run))
        snap = rt.store.latest_snapshot(run.run_id)
        rt.store.put_snapshot(resigned(rt, snap, "pydantic-monty-0.0.1"))
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "failed"
        assert r.error["code"] == "execution_diverged"
        assert rec.deliveries == []


async def test_p2_policy_deny_and_rules(store_url):
    rec = Recorder()
    policy = Policy(writes="ask", rules=(Rule("helpdesk.add_*", "allow"), Rule("helpdesk.close_ticket", "deny")))
    code = """
import tools
c = await tools.helpdesk.add_comment(id=1, body="hi")
try:
    await tools.helpdesk.close_ticket(id=1)
    res = "closed"
except PermissionError as e:
    res = str(e)
[c["ticket"], res]
"""
    async with make_runtime(store_url, rec, policy=policy) as rt:
        r = await rt.execute(code)
        assert r.status == "completed", r.error
        assert r.result[0] == 1 and r.result[1].startswith("[write_denied]")
        assert rec.deliveries == [("add_comment", {"id": 1, "body": "hi"})]
        states = [c.state for c in rt.store.get_calls(r.run_id)]
        assert states == ["sent", "denied"]


async def test_p2_write_budget(store_url):
    rec = Recorder()
    code = """
import tools
n = 0
for i in range(5):
    try:
        await tools.helpdesk.add_comment(id=i, body="x")
        n += 1
    except PermissionError as e:
        last = str(e)
[n, last]
"""
    async with make_runtime(store_url, rec, policy=Policy(writes="allow", write_budget=3)) as rt:
        r = await rt.execute(code)
        assert r.result[0] == 3 and r.result[1].startswith("[budget_exceeded]")
        assert len(rec.deliveries) == 3


async def test_inline_approval_decides_without_pausing(store_url):
    rec = Recorder()
    asked = []

    async def approver(pending):
        asked.append(pending["address"])
        return ("approve", None) if pending["args"]["id"] == 1 else ("decline", "not that one")

    code = """
import tools
a = await tools.helpdesk.close_ticket(id=1)
try:
    await tools.helpdesk.close_ticket(id=2)
except PermissionError as e:
    b = str(e)
[a["status"], b]
"""
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(code, on_approval=approver)
        assert r.status == "completed"
        assert r.result[0] == "closed" and "not that one" in r.result[1]
        assert asked == ["helpdesk.close_ticket", "helpdesk.close_ticket"]
        assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_p5_replay_uses_the_pinned_environment(store_url):
    rec = Recorder()
    code = """
import random
import time
import tools
print(random.random(), time.time())
await tools.helpdesk.close_ticket(id=3)
'ok'
"""
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(code)
        snap = rt.store.latest_snapshot(paused.run_id)
        rt.store.put_snapshot(resigned(rt, snap, "other"))
        replayed = await rt.resume(paused.run_id, "approve")
        assert replayed.diagnostics["attempt"] == "replay"
        # The replay re-ran the program from its first line with the same
        # clock instant and seed, so it printed the same values again.
        assert replayed.logs == paused.logs
        other = await rt.execute(code)
        assert other.logs != paused.logs  # a new run gets its own seed


async def test_p15_checkpoints_bound_what_recovery_replays(store_url, clock):
    rec = Recorder()
    code = "import tools\nfor i in range(12):\n    await tools.helpdesk.get_ticket(id=i)\n'done'"
    async with make_runtime(store_url, rec, clock, checkpoint_every_calls=5) as rt:
        r = await rt.execute(code)
        assert r.status == "completed"
        snap = rt.store.latest_snapshot(r.run_id)
        assert snap.kind == "checkpoint" and snap.seq == 10


async def test_p1_every_host_call_is_journaled_in_issue_order(store_url):
    rec = Recorder()
    code = """
import asyncio
import tools
found = await search("ticket")
d = await describe(["helpdesk.get_ticket"])
s = await sources()
a, b = await asyncio.gather(tools.helpdesk.get_ticket(id=1), tools.helpdesk.get_ticket(id=2))
'ok'
"""
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(code)
        assert r.status == "completed", r.error
        calls = rt.store.get_calls(r.run_id)
        assert [(c.seq, c.op, c.address) for c in calls] == [
            (1, "search", "search"), (2, "describe", "describe"), (3, "sources", "sources"),
            (4, "tool", "helpdesk.get_ticket"), (5, "tool", "helpdesk.get_ticket")]
        assert [c.args["id"] for c in calls[3:]] == [1, 2]


def test_p3_call_key_is_canonical():
    from hypothesis import given
    from hypothesis import strategies as st

    from tether._engine.calls.call import call_key

    values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                          max_leaves=10)

    @given(st.dictionaries(st.text(), values, max_size=5))
    def same_key_whatever_the_order(args):
        reordered = dict(reversed(list(args.items())))
        assert call_key("tool", "a.b", args) == call_key("tool", "a.b", reordered)
        assert call_key("tool", "a.b", args) != call_key("tool", "a.c", args)

    same_key_whatever_the_order()


async def test_p7_sending_is_committed_before_the_request_leaves(store_url):
    from tether._tools.model import Tool

    seen = []

    async def probe(args):
        # The tool looks at the journal, from another connection, the moment the request reaches it.
        store = open_store(store_url)
        try:
            (run,) = store.list_runs()
            seen.append([(c.seq, c.state) for c in store.get_calls(run.run_id)])
        finally:
            store.close()
        return "ok"

    async with make_runtime(store_url, Recorder(), policy=Policy(writes="allow")) as rt:
        rt.add_tools(Tool("probe", "write", "A write that reads the journal.", {"type": "object", "properties": {}},
                          probe))
        r = await rt.execute("import tools\nawait tools.probe.write()")
        assert r.status == "completed", r.error
        assert seen == [[(1, "sending")]]
        assert [c.state for c in rt.store.get_calls(r.run_id)] == ["sent"]


async def test_p8_cancel_never_cuts_a_write_on_the_wire(store_url):
    rec = Recorder()
    code = "import tools\nawait tools.slowpoke.write(seconds=0.3)\nawait tools.helpdesk.close_ticket(id=1)"
    async with make_runtime(store_url, rec, policy=Policy(writes="allow")) as rt:
        task = asyncio.ensure_future(rt.execute(code))
        while not rec.deliveries:
            await asyncio.sleep(0.01)
        run_id = rt.store.list_runs()[0].run_id
        cancelled = await rt.cancel(run_id, "the user changed their mind")
        result = await task
        assert result.status == cancelled.status == "cancelled"
        assert [d[0] for d in rec.deliveries] == ["slow_write"]  # close_ticket never sent
        calls = rt.store.get_calls(run_id)
        assert [(c.address, c.state) for c in calls] == [("slowpoke.write", "sent")]


async def test_p13_a_recorded_write_the_replay_does_not_repeat_is_divergence(store_url):
    from tether._engine.calls.call import call_key
    from tether._engine.integrity import sign_call
    from tether._store.base import CallRecord

    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(WRITE_PROGRAM)
        args = {"id": 99, "body": "ghost"}
        ghost = CallRecord(paused.run_id, 9, "tool", "helpdesk.add_comment", args,
                           call_key("tool", "helpdesk.add_comment", args), "write", "sent", outcome={"ticket": 99})
        ghost.mac = sign_call(rt.engine.keyring, ghost, None)  # recorded by tether, on a path the replay does not take
        rt.store.record_call(ghost)
        snap = rt.store.latest_snapshot(paused.run_id)
        rt.store.put_snapshot(resigned(rt, snap, "other"))
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "execution_diverged"


async def test_p16_two_recoverers_one_owner(store_url, clock):
    rec = Recorder()
    # A run whose owner died: still running, its lease in the past.
    async with make_runtime(store_url, rec, clock, policy=Policy(writes="allow")) as a, \
            make_runtime(store_url, rec, clock, policy=Policy(writes="allow")) as b:
        run_id = "run_orphan"
        from tether._store.base import RunRecord

        a.store.create_run(signed(a, RunRecord(run_id, "running", "import tools\nawait tools.helpdesk.add_comment(id=5, body='x')\n'ok'",
                                     {"clock": "2027-01-15T08:00:00+00:00", "seed": 7}, Policy(writes="allow").to_dict(),
                                     a.limits.to_dict(), clock.now, clock.now, owner="dead:1", lease_until=clock.now - 1,
                                     meta={"type_check": False})))
        ra, rb = await asyncio.gather(a.recover(), b.recover())
        results = ra + rb
        assert len(results) == 1 and results[0].status == "completed"
        assert [d for d in rec.deliveries if d[0] == "add_comment"] == [("add_comment", {"id": 5, "body": "x"})]


async def test_p4_a_program_that_catches_everything_cannot_act_after_the_pause(store_url):
    """The stop unwinds the program; whatever it tries while unwinding is neither sent nor recorded."""
    rec = Recorder()
    code = """
import tools
try:
    await tools.helpdesk.close_ticket(id=1)
except Exception as e:
    await tools.helpdesk.add_comment(id=1, body="caught " + str(e))
finally:
    await tools.helpdesk.add_comment(id=2, body="finally")
'end'
"""
    async with make_runtime(store_url, rec, policy=Policy(writes="ask", rules=(Rule("helpdesk.add_*", "allow"),))) as rt:
        paused = await rt.execute(code)
        assert paused.status == "paused" and paused.pending["address"] == "helpdesk.close_ticket"
        assert rec.deliveries == []
        assert [c.address for c in rt.store.get_calls(paused.run_id)] == ["helpdesk.close_ticket"]
        done = await rt.resume(paused.run_id, "approve")
        assert done.status == "completed" and done.result == "end"
        assert rec.deliveries == [("close_ticket", {"id": 1}), ("add_comment", {"id": 2, "body": "finally"})]
