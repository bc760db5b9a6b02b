"""Decisions on paused writes: batches (P-27), naming the write (P-28), who decided (P-29)."""

from __future__ import annotations

import asyncio

import pytest

from helpers import Clock, Recorder
from tether import AlreadyDecided, PendingWrite, SeqRequired, UsageError, WriteNotPending
from tether._engine.calls import ledger
from tether._engine.inspect import run_timeline
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store

# Three writes issued together, each handling its own outcome, and a read.
GATHER3 = """
import asyncio
import tools

async def comment(body):
    try:
        r = await tools.helpdesk.add_comment(id=7, body=body)
        return "sent " + body
    except PermissionError as e:
        return str(e)

t = await tools.helpdesk.get_ticket(id=7)
a, b, c = await asyncio.gather(comment("one"), comment("two"), comment("three"))
[a, b, c, t["id"]]
"""

# Two writes one after the other: the second pause comes after the first is decided.
TWO_PAUSES = """
import tools
await tools.helpdesk.close_ticket(id=1)
await tools.helpdesk.close_ticket(id=2)
"done"
"""


def make_runtime(store_url, rec, **kw) -> Runtime:
    kw.setdefault("type_check", False)
    kw.setdefault("clock", Clock())
    rt = Runtime(store=open_store(store_url), tools=rec.tools(), **kw)
    # These tests are about what a batch means, not how long it takes to form:
    # a wider window keeps a starved CI machine from splitting one (D-16 measures the default).
    rt.engine.settings.batch_window_seconds = 0.2
    return rt


async def test_p27_writes_called_before_either_is_awaited_pause_together_without_asyncio(store_url):
    """A call reaches the host when the program makes it, not when it awaits it: the first of these writes
    arrives with no other call in flight, the second some milliseconds of work later (about 5 ms here). The
    pause still waits its window and lists both: nothing in flight does not mean nothing is coming (P-27)."""
    code = ("import tools\na = tools.helpdesk.add_comment(id=7, body='one')\n"
            "n = 0\nfor i in range(50000):\n    n += i\n"
            "b = tools.helpdesk.add_comment(id=7, body='two')\n[await a, await b]\n")
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(code)
        assert r.status == "paused"
        assert [w["args"]["body"] for w in r.pending["writes"]] == ["one", "two"]
        r = await rt.decide(r.run_id, {w["seq"]: "approve" for w in r.pending["writes"]})
        assert r.status == "completed", r.error
    assert rec.deliveries == [("add_comment", {"id": 7, "body": "one"}), ("add_comment", {"id": 7, "body": "two"})]


async def test_p27_gathered_writes_pause_once_listing_each(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        assert r.status == "paused"
        writes = r.pending["writes"]
        assert [(w["seq"], w["address"], w["args"]["body"]) for w in writes] == [
            (2, "helpdesk.add_comment", "one"), (3, "helpdesk.add_comment", "two"),
            (4, "helpdesk.add_comment", "three")]
        assert all(w["annotations"]["read_only"] is False and w["key"] for w in writes)
        assert len({w["key"] for w in writes}) == 3  # one approval key per write
        assert r.pending["seq"] == 2 and r.pending["key"] == writes[0]["key"]
        assert "call 2" in r.instructions and "call 4" in r.instructions
        assert rec.deliveries == []
        states = {c.seq: c.state for c in rt.store.get_calls(r.run_id) if c.kind == "write"}
        assert states == {2: "asked", 3: "asked", 4: "asked"}
        pending = rt.pending(r.run_id)
        assert all(isinstance(p, PendingWrite) for p in pending)
        assert [(p.seq, p.decision) for p in pending] == [(2, None), (3, None), (4, None)]
        assert pending[0].description == "Add a comment to a ticket." and pending[0].expires_at == r.expires_at


async def test_p27_approve_one_decline_two_each_call_sees_its_outcome_in_another_runtime(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(GATHER3)
    async with make_runtime(store_url, rec) as rt2:
        # Decided one at a time, as a console would: the run waits for the last.
        r = await rt2.decide(paused.run_id, {3: "approve"}, actor="alice", via="console")
        assert r.status == "paused" and rec.deliveries == []
        assert [w["decision"] and w["decision"]["decision"] for w in r.pending["writes"]] == [None, "approve", None]
        assert [p.decision and p.decision.decision for p in rt2.pending(paused.run_id)] == [None, "approve", None]
        assert "call 3" not in r.instructions and "call 2" in r.instructions and "call 4" in r.instructions
        r = await rt2.decide(paused.run_id, {2: ("decline", "duplicate"), 4: ("decline", "too chatty")},
                             actor="bob", via="link")
        assert r.status == "completed", r.error
        one, two, three, ticket = r.result
        assert one.startswith("[write_declined]") and "duplicate" in one
        assert two == "sent two"
        assert three.startswith("[write_declined]") and "too chatty" in three
        assert ticket == 7
        assert rec.deliveries == [("add_comment", {"id": 7, "body": "two"})]
        # Repeating any of those decisions changes nothing and sends nothing.
        again = await rt2.decide(paused.run_id, {3: "approve", 2: "decline"})
        assert again.to_dict() == r.to_dict()
        assert len(rec.deliveries) == 1
        with pytest.raises(AlreadyDecided):
            await rt2.resume(paused.run_id, "approve", seq=2)


async def test_p27_a_partly_decided_pause_names_a_write_still_undecided(store_url):
    """The README's loop (``while paused: resume(run_id, "approve", seq=result.pending["seq"])``) ends on a batch:
    after each decision the envelope's ``pending`` is a write still waiting, not the one just decided."""
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        result = await rt.execute(GATHER3)
        seen = []
        while result.status == "paused" and len(seen) < 5:
            seen.append(result.pending["seq"])
            result = await rt.resume(result.run_id, "approve", seq=result.pending["seq"])
        assert seen == [2, 3, 4]
        assert result.status == "completed", result.error
        assert len(rec.deliveries) == 3


async def test_p27_cancel_of_one_write_ends_the_run_and_sends_none_of_the_batch(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(GATHER3)
        r = await rt.decide(paused.run_id, {2: "approve"})
        assert r.status == "paused"
        r = await rt.resume(paused.run_id, "cancel", "wrong ticket", seq=3)
        assert r.status == "cancelled"
        assert rec.deliveries == []
        states = {c.seq: c.state for c in rt.store.get_calls(paused.run_id) if c.kind == "write"}
        assert states == {2: "declined", 3: "declined", 4: "declined"}


async def test_p27_a_batch_counts_against_the_write_budget(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec, policy=Policy(writes="ask", write_budget=2)) as rt:
        r = await rt.execute(GATHER3)
        # The third would exceed the budget if both others are approved: it is not asked yet.
        assert [w["seq"] for w in r.pending["writes"]] == [2, 3]
        r = await rt.decide(r.run_id, {2: "approve", 3: "approve"})
        assert r.status == "completed", r.error
        assert r.result[2].startswith("[budget_exceeded]")
        assert len(rec.deliveries) == 2


async def test_p27_a_declined_write_frees_budget_for_the_one_held(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec, policy=Policy(writes="ask", write_budget=2)) as rt:
        r = await rt.execute(GATHER3)
        r = await rt.decide(r.run_id, {2: "approve", 3: "decline"})
        # The held third write asks now, in a pause of its own.
        assert r.status == "paused" and [w["seq"] for w in r.pending["writes"]] == [4]
        r = await rt.resume(r.run_id, "approve", seq=4)
        assert r.status == "completed", r.error
        assert [d[1]["body"] for d in rec.deliveries] == ["one", "three"]


async def test_p28_a_repeated_decision_does_not_touch_the_next_write(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(TWO_PAUSES)
        first = r.pending["seq"]
        r = await rt.resume(r.run_id, "approve", seq=first)
        assert r.status == "paused" and r.pending["seq"] == 2
        # The retry, the double click: the same decision for the first write.
        again = await rt.resume(r.run_id, "approve", seq=first)
        assert again.status == "paused" and again.pending["seq"] == 2
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        assert rt.store.get_call(r.run_id, 2).state == "asked"
        # Without a seq it could only be a guess now: refused, with what waits.
        with pytest.raises(SeqRequired) as info:
            await rt.resume(r.run_id, "approve")
        assert info.value.details["pending"] == [
            {"seq": 2, "address": "helpdesk.close_ticket", "args": {"id": 2}, "decision": None}]
        assert "call 2 helpdesk.close_ticket" in info.value.message
        assert rt.store.get_call(r.run_id, 2).state == "asked" and len(rec.deliveries) == 1
        done = await rt.resume(r.run_id, "approve", seq=2)
        assert done.status == "completed" and len(rec.deliveries) == 2


async def test_p28_approve_and_decline_sent_together_decide_only_the_write_they_saw(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(TWO_PAUSES)
        # Neither names its write; the run has asked about one write, so both mean it.
        outcomes = await asyncio.gather(rt.resume(r.run_id, "approve"), rt.resume(r.run_id, "decline"),
                                        return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], AlreadyDecided), outcomes
        run = rt.engine.get_run(r.run_id)
        if run.status == "paused":  # approve won: the second write waits, undecided
            assert run.pending["seq"] == 2 and rt.store.get_call(r.run_id, 2).state == "asked"
            assert rec.deliveries == [("close_ticket", {"id": 1})]
        else:  # decline won: the program raised at the first write, which was never sent
            assert run.status == "failed" and rec.deliveries == []
            assert rt.store.get_call(r.run_id, 2) is None


async def test_p28_a_decision_without_seq_is_refused_when_more_than_one_write_waits(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        with pytest.raises(SeqRequired) as info:
            await rt.resume(r.run_id, "approve")
        assert [p["seq"] for p in info.value.details["pending"]] == [2, 3, 4]
        assert info.value.code == "seq_required"
        assert {c.state for c in rt.store.get_calls(r.run_id) if c.kind == "write"} == {"asked"}
        assert rt.engine.get_run(r.run_id).status == "paused" and rec.deliveries == []


async def test_p28_a_seq_that_is_not_pending_is_refused_with_the_pending_list(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        for stale in (1, 99):  # 1 is the read; 99 was never issued
            with pytest.raises(WriteNotPending) as info:
                await rt.resume(r.run_id, "approve", seq=stale)
            assert [p["seq"] for p in info.value.details["pending"]] == [2, 3, 4]
        with pytest.raises(WriteNotPending):
            await rt.decide(r.run_id, {2: "approve", 99: "approve"})
        # Refused as a whole: the valid part of it was not taken either.
        assert rt.store.get_call(r.run_id, 2).state == "asked" and rec.deliveries == []


async def test_p28_the_approval_key_names_its_write(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        keys = {w["seq"]: w["key"] for w in r.pending["writes"]}
        out = await rt.resolve_wait(keys[4], {"decision": "approve"})
        assert out["status"] == "accepted" and out["run"]["status"] == "paused"  # two writes still wait
        assert [p.seq for p in rt.pending(r.run_id) if p.decision is None] == [2, 3]
        out = await rt.resolve_wait(keys[4], {"decision": "decline"})
        assert out["status"] == "already_resolved"
        await rt.decide(r.run_id, {2: "decline", 3: "decline"})
        assert rec.deliveries == [("add_comment", {"id": 7, "body": "three"})]


async def test_an_approval_key_is_not_settled_around_the_approvals_service(store_url):
    # resolve_wait(..., continue_run=False) settles a wait row and nothing else: for an approval that would
    # be a decision the journal never took, under whatever name the caller put in the value.
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        keys = {w["seq"]: w["key"] for w in r.pending["writes"]}
        with pytest.raises(UsageError) as info:
            await rt.resolve_wait(keys[2], {"decision": "approve", "actor": "someone else"}, continue_run=False)
        assert info.value.code == "invalid_arguments" and "Nothing was decided or sent" in info.value.message
        assert [p.seq for p in rt.pending(r.run_id) if p.decision is None] == [2, 3, 4]
        assert rt.store.get_call(r.run_id, 2).state == "asked" and rec.deliveries == []


async def test_p29_each_decision_records_who_and_from_where(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        await rt.decide(r.run_id, {2: "approve"}, actor="alice", via="console")
        (p1,) = [p for p in rt.pending(r.run_id) if p.seq == 2]
        assert (p1.decision.actor, p1.decision.via, p1.decision.decision) == ("alice", "console", "approve")
        await rt.decide(r.run_id, {3: ("decline", "no"), 4: "approve"}, actor="bob", via="link")
        decided = [e.data for e in rt.store.get_events(r.run_id) if e.type == "decided"]
        assert [(d["seq"], d["decision"], d["actor"], d["via"]) for d in decided] == [
            (2, "approve", "alice", "console"), (3, "decline", "bob", "link"), (4, "approve", "bob", "link")]
        timeline = run_timeline(rt.store, r.run_id)
        assert [(d["seq"], d["actor"], d["via"]) for d in timeline["decisions"]] == [
            (2, "alice", "console"), (3, "bob", "link"), (4, "bob", "link")]
        with pytest.raises(Exception) as info:
            await rt.decide(r.run_id, {2: "approve"}, via="carrier pigeon")
        assert getattr(info.value, "code", None) == "invalid_arguments"


async def test_p2_a_write_approved_by_resume_spends_the_budget_once(store_url):
    # An approved write used to be counted when the run continued and again
    # when it was sent, so a budget of 2 refused the second of two approved writes.
    rec = Recorder()
    async with make_runtime(store_url, rec, policy=Policy(writes="ask", write_budget=2)) as rt:
        r = await rt.execute(TWO_PAUSES)
        r = await rt.resume(r.run_id, "approve", seq=1)
        assert r.status == "paused" and r.pending["seq"] == 2
        r = await rt.resume(r.run_id, "approve", seq=2)
        assert r.status == "completed", r.error
        assert len(rec.deliveries) == 2


async def test_p10_a_pause_decided_but_not_continued_is_continued_by_a_repeat(store_url):
    # The process died after recording the last decision of a pause and before
    # storing `running`: the journal holds every decision, the run says paused.
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3)
        await rt.decide(r.run_id, {2: "approve", 3: "decline"})
        # Recorded as that process would have (signed, P-35).
        assert ledger.move(rt.engine.store, rt.engine.keyring, rt.store.get_call(r.run_id, 4), ["asked"], state="approved")
        assert rt.engine.get_run(r.run_id).status == "paused"
        done = await rt.resume(r.run_id, "approve", seq=4)
        assert done.status == "completed", done.error
        assert [d[1]["body"] for d in rec.deliveries] == ["one", "three"]


async def test_p29_a_write_decided_inline_is_recorded_too(store_url):
    rec = Recorder()

    async def approver(pending):
        return ("approve", None) if pending["args"]["body"] != "two" else ("decline", "not that one")

    async with make_runtime(store_url, rec) as rt:
        r = await rt.execute(GATHER3, on_approval=approver)
        assert r.status == "completed", r.error
        decided = sorted((d["seq"], d["decision"], d["via"]) for d in run_timeline(rt.store, r.run_id)["decisions"])
        assert decided == [(2, "approve", "prompt"), (3, "decline", "prompt"), (4, "approve", "prompt")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_p28_concurrent_deciders_of_one_batch_in_two_processes_continue_it_once(backend, request):
    url = request.getfixturevalue("store_url" if backend == "sqlite" else "pg_url")
    rec = Recorder()
    async with make_runtime(url, rec) as a, make_runtime(url, rec) as b:
        paused = await a.execute(GATHER3)
        outcomes = await asyncio.gather(
            a.decide(paused.run_id, {2: "approve"}, actor="ann"), b.decide(paused.run_id, {3: "approve"}, actor="ben"),
            a.decide(paused.run_id, {4: ("decline", "no")}, actor="ann"), b.decide(paused.run_id, {2: "approve"}),
            return_exceptions=True)
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        final = await a.engine.wait_for_run(paused.run_id)
        assert final.status == "completed", final.error
        assert sorted(d[1]["body"] for d in rec.deliveries) == ["one", "two"]
        decided = [e.data["seq"] for e in a.store.get_events(paused.run_id) if e.type == "decided"]
        assert sorted(decided) == [2, 3, 4]  # the repeat of 2 recorded nothing


async def test_p10_cancel_ends_a_batch_that_is_partly_decided(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(GATHER3)
        await rt.decide(paused.run_id, {2: "approve", 3: "decline"})
        r = await rt.cancel(paused.run_id, "changed my mind")
        assert r.status == "cancelled" and rec.deliveries == []
        states = {c.seq: c.state for c in rt.store.get_calls(paused.run_id) if c.kind == "write"}
        assert states == {2: "declined", 3: "declined", 4: "declined"}


async def test_p27_a_gathered_write_too_large_to_journal_does_not_join_the_batch(store_url):
    from tether._engine.rules.limits import Limits

    rec = Recorder()
    code = """
import asyncio
import tools

async def comment(body):
    try:
        await tools.helpdesk.add_comment(id=7, body=body)
        return "sent"
    except Exception as e:
        return str(e)

await asyncio.gather(comment("small"), comment("x" * 5000))
"""
    async with make_runtime(store_url, rec, limits=Limits(journal_value_bytes=2000)) as rt:
        r = await rt.execute(code)
        assert [w["args"]["body"] for w in r.pending["writes"]] == ["small"]
        r = await rt.resume(r.run_id, "approve", seq=r.pending["seq"])
        assert r.status == "completed", r.error
        assert r.result[0] == "sent" and r.result[1].startswith("[arguments_too_large]")
        assert rec.deliveries == [("add_comment", {"id": 7, "body": "small"})]


async def test_only_the_approvals_service_creates_and_settles_approval_waits(store_url):
    """One home for approvals (D-46), like the Lifecycle's single ownership of run statuses:
    a write's approval wait is created when its run pauses and resolved by the decision — through
    rt.resume, rt.decide, a wait key, and the Decider behind the console and links — and every one of
    those row writes comes from tether._engine.approvals.service. (Revoking all of an ended run's waits stays
    with _engine/waits.py: it decides nothing.)"""
    import sys

    from tether._server.approvals import Decider

    writers: set[tuple[str, str]] = set()
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        for method in ("create_wait", "settle_wait"):
            real = getattr(rt.store, method)

            def noting(record, _real=real, _method=method):
                if record.name.startswith("approval:") and record.status in ("pending", "resolved"):
                    # Every wait row is written by _engine/waits.py (tests/engine/test_waits.py): who asked it to.
                    frame = sys._getframe(1)
                    while frame.f_globals["__name__"] == "tether._engine.waits":
                        frame = frame.f_back
                    writers.add((_method, frame.f_globals["__name__"]))
                return _real(record)

            setattr(rt.store, method, noting)
        park_run = rt.store.park_run

        def parking(run_id, expect, snapshot, waits, event, **fields):
            # A pause's approval waits are created with the pause (store.park_run), through waits.py and the
            # lifecycle's compare-and-set: who asked them to.
            if any(w.name.startswith("approval:") for w in waits):
                frame = sys._getframe(1)
                while frame.f_globals["__name__"] in ("tether._engine.waits", "tether._engine.lifecycle"):
                    frame = frame.f_back
                writers.add(("create_wait", frame.f_globals["__name__"]))
            return park_run(run_id, expect, snapshot, waits, event, **fields)

        rt.store.park_run = parking
        first = await rt.execute(TWO_PAUSES)
        (one,) = rt.pending(first.run_id)
        assert (await rt.resume(first.run_id, "approve", seq=one.seq)).status == "paused"
        (two,) = rt.pending(first.run_id)
        out = await rt.resolve_wait(two.key, {"decision": "decline", "reason": "not twice"})
        assert out["status"] == "accepted"
        batch = await rt.execute(GATHER3)
        decider = Decider(rt, settle_seconds=5.0)
        try:
            assert (await decider.decide(batch.run_id, [2], "approve", None, principal=None, who="alice",
                                         via="console")).ok
        finally:
            await decider.close()
        done = await rt.decide(batch.run_id, {3: ("decline", "no"), 4: "approve"}, actor="bob", via="link")
        assert done.status == "completed"
    assert rec.deliveries == [("close_ticket", {"id": 1}), ("add_comment", {"id": 7, "body": "one"}),
                              ("add_comment", {"id": 7, "body": "three"})]
    assert {m for _, m in writers} == {"tether._engine.approvals.service"}
    assert {w for w, _ in writers} == {"create_wait", "settle_wait"}  # the check saw both kinds of write


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_p10_p28_a_cancel_racing_the_approvals_of_a_whole_batch_in_two_processes(backend, request):
    """The decision's store work runs in the store's threads (D-43): a cancel from one process racing the
    approval of every write of the pause from another ends one way only: all sent and completed, or none sent
    and cancelled; never some sent, never left paused with every write decided."""
    url = request.getfixturevalue("store_url" if backend == "sqlite" else "pg_url")
    async def cancel(rt, run_id, after):
        await asyncio.sleep(after)
        return await rt.decide(run_id, {3: ("cancel", "stop")}, actor="ben")

    for i in range(6):
        rec = Recorder()
        async with make_runtime(url, rec) as a, make_runtime(url, rec) as b:
            paused = await a.execute(GATHER3)
            await asyncio.gather(a.decide(paused.run_id, {2: "approve", 3: "approve", 4: "approve"}, actor="ann"),
                                 cancel(b, paused.run_id, i * 0.003), return_exceptions=True)
            final = await a.engine.wait_for_run(paused.run_id)
            bodies = sorted(d[1]["body"] for d in rec.deliveries)
            assert (final.status, bodies) in (("completed", ["one", "three", "two"]), ("cancelled", [])), \
                (final.status, final.error, bodies)
            sent = [c.seq for c in a.store.get_calls(paused.run_id) if c.kind == "write" and c.state == "sent"]
            assert len(sent) == len(bodies)
            decided = [(e.data["seq"], e.data["decision"]) for e in a.store.get_events(paused.run_id)
                       if e.type == "decided"]
            assert len(decided) == len(set(decided)), decided  # no decision announced twice


async def test_p6_p35_a_paused_writes_row_deleted_is_asked_again_never_sent_undecided(store_url):
    """Someone who can delete rows deletes the journal entry of one write of a pause, then the others are
    approved. A restore issues a call its signed snapshot lists and the journal lacks (D-80): that write is
    judged by the policy again, so it asks again; it is never sent on the strength of the others' approvals."""
    import sqlite3

    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(GATHER3)
        assert sorted(w["seq"] for w in paused.pending["writes"]) == [2, 3, 4]
        with sqlite3.connect(store_url[len("sqlite:///"):]) as conn:
            conn.execute("DELETE FROM calls WHERE run_id = ? AND seq = 3", (paused.run_id,))
        with pytest.raises(WriteNotPending):
            await rt.decide(paused.run_id, {3: "approve"})
        r = await rt.decide(paused.run_id, {2: "approve", 4: "approve"})
        assert r.status == "paused" and [w["seq"] for w in r.pending["writes"]] == [3], r.error
        assert rt.store.get_call(paused.run_id, 3).state == "asked"
        assert "two" not in [d[1]["body"] for d in rec.deliveries]
        done = await rt.decide(paused.run_id, {3: "approve"})
        assert done.status == "completed", done.error
        assert sorted(d[1]["body"] for d in rec.deliveries) == ["one", "three", "two"]


async def test_p6_a_write_asked_by_a_dead_attempt_is_asked_again_when_its_tool_now_says_it_reads(store_url):
    """A process died after journaling a write as asked, before its pause was stored; the process that takes
    the run over lists the same tool as read-only (a source that changed its annotations, or a release that
    did). The journal says the call is a write awaiting a person: it is asked again, never sent as a read, and
    once approved it is sent once as the write it was (P-10)."""
    import dataclasses

    from tether._tools.model import Annotations

    rec = Recorder()
    async with make_runtime(store_url, rec) as a:
        paused = await a.execute("import tools\nawait tools.helpdesk.close_ticket(id=1)\n'done'")
        assert paused.status == "paused" and a.store.get_call(paused.run_id, 1).state == "asked"
        a.store.update_run(paused.run_id, ["paused"], status="running", owner="dead:1",
                           lease_until=a.engine.clock() - 1)
    reads = [dataclasses.replace(t, annotations=Annotations(read_only=True)) if t.name == "close_ticket" else t
             for t in rec.tools()]
    b = Runtime(store=open_store(store_url), tools=reads, type_check=False, clock=Clock())
    async with b:
        await b.recover()
        run = b.engine.get_run(paused.run_id)
        assert rec.deliveries == [], run.status
        assert run.status == "paused" and b.store.get_call(paused.run_id, 1).state == "asked", run.error
        # Approved, it is sent once, as the write it was journaled as (before, the run failed invalid_transition).
        done = await b.resume(paused.run_id, "approve")
        assert done.status == "completed" and done.result == "done", done.error
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        assert b.store.get_call(paused.run_id, 1).state == "sent"


async def test_p29_a_decision_whose_record_failed_is_recorded_when_it_is_repeated(store_url):
    """The store fails after the journal took an approval and before the approval's wait and its `decided` event
    were written (a statement erroring: here a trigger). The approver sees the error and repeats the decision:
    the repeat changes nothing in the journal, but records who decided, and the run goes on (P-28, P-29)."""
    import sqlite3

    from tether.errors import StoreError

    rec = Recorder()
    path = store_url[len("sqlite:///"):]
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=1)\n'done'")
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TRIGGER gone BEFORE UPDATE ON waits BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
        with pytest.raises(StoreError):
            await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert rt.store.get_call(paused.run_id, 1).state == "approved" and rec.deliveries == []
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER gone")
        done = await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert done.status == "completed", done.error
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        decided = [(d["seq"], d["decision"], d["actor"]) for d in run_timeline(rt.store, paused.run_id)["decisions"]]
        assert decided == [(1, "approve", "ann")]


async def test_p29_a_reason_is_kept_to_one_length_at_every_engine_door(store_url):
    """A decision's reason is for a person to read: however long the text a caller or an inline approver gives,
    the journal, the decision record and the program get at most MAX_REASON_CHARS characters (P-29)."""
    from tether._engine.approvals.model import MAX_REASON_CHARS

    code = ("import tools\ntry:\n    await tools.helpdesk.close_ticket(id=1)\nexcept PermissionError as e:\n"
            "    r = str(e)\nlen(r)")
    huge = "x" * 200_000
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(code)
        done = await rt.resume(paused.run_id, "decline", seq=1, reason=huge)
        inline = await rt.execute(code, on_approval=lambda w: ("decline", huge))
        for r in (done, inline):
            assert r.status == "completed", r.error
            assert MAX_REASON_CHARS < r.result < MAX_REASON_CHARS + 200  # the message around the kept reason
            [entry] = rt.store.get_calls(r.run_id)
            assert entry.state == "declined" and len(entry.error["message"]) < MAX_REASON_CHARS + 200
            [decided] = run_timeline(rt.store, r.run_id)["decisions"]
            assert decided["decision"] == "decline" and decided["reason"] == huge[:MAX_REASON_CHARS]
    assert rec.deliveries == []
