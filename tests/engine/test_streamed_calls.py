"""Gathered and unawaited calls in flight, with the sandbox's streamed async calls on and off (D-80).

pydantic-monty's ``stream_async_calls`` lets a call the program does not await at once (an
``asyncio.gather``'s, or one kept in a variable) reach the host without suspending the worker. Each test
runs under both settings (``streamed`` / ``suspended``) and asserts what tether promises either way: a
pause's snapshot and its replay (P-9, P-10, P-12, P-27), a stop with calls in flight (P-14, P-19), the
journal's call order (P-1, P-7, P-13) and the per-run limits (P-2, P-22), on SQLite and Postgres where the
store takes part.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from helpers import Recorder
from helpers import own_pool_runtime as runtime
from helpers import signed_as_other_monty as other_version
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._store.base import SnapshotRecord
from tether._tools.model import Annotations, Tool


class Traced(Recorder):
    """The helpdesk tools, plus a read that takes its time and reports whether it was left running."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.running: set[int] = set()
        self.started: list[int] = []

    def tools(self) -> list[Tool]:
        async def lag(args: dict) -> Any:
            self.started.append(args["id"])
            self.running.add(args["id"])
            try:
                await asyncio.sleep(args.get("seconds", 0.05))
                return args["id"]
            finally:
                self.running.discard(args["id"])

        schema = {"type": "object", "properties": {"id": {"type": "integer"}, "seconds": {"type": "number"}},
                  "required": ["id"]}
        return [*super().tools(), Tool("slowpoke", "lag", "A read that answers after `seconds`.", schema, lag,
                                       annotations=Annotations(read_only=True))]


# Two writes that ask, gathered with reads still on the wire when the first write asks.
GATHERED_PAUSE = """
import asyncio
import tools
r = await asyncio.gather(tools.slowpoke.lag(id=1, seconds=0.2), tools.helpdesk.close_ticket(id=7),
                         tools.helpdesk.add_comment(id=7, body="x"), tools.helpdesk.get_ticket(id=2),
                         tools.slowpoke.lag(id=3, seconds=0.1))
print("after", r[0], r[3]["id"], r[4])
t = await tools.helpdesk.get_ticket(id=4)
[r[0], r[1]["status"], r[2]["comment"], r[3]["id"], r[4], t["id"]]
"""
GATHERED_RESULT = [1, "closed", None, 2, 3, 4]  # None: the comment number (see below)


@pytest.mark.parametrize("how", ["restore", "replay"])
async def test_p9_p27_a_pause_with_gathered_calls_in_flight_resumes_elsewhere_and_sends_each_write_once(
        backend, stream, how):
    rec = Traced()
    async with runtime(backend.store(), rec.tools(), stream, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute(GATHERED_PAUSE)
        assert paused.status == "paused", paused.error
        # Both writes of the gather pause as one batch; nothing is sent before the decision (P-4, P-27).
        assert sorted(w["seq"] for w in paused.pending["writes"]) == [2, 3]
        assert rec.deliveries == [] and paused.logs == []
        calls = rt.store.get_calls(paused.run_id)
        # Write-ahead, in issue order: the read on the wire when the write asked finished and is journaled.
        # A read issued while the pause formed is held, not sent (P-4), and listed in the snapshot (P-9) —
        # unless it was issued before the pause began (on Postgres the write's intent leaves the event loop).
        assert [(c.seq, c.address, c.state) for c in calls][:3] == [
            (1, "slowpoke.lag", "done"), (2, "helpdesk.close_ticket", "asked"), (3, "helpdesk.add_comment", "asked")]
        assert all(c.state == "done" for c in calls[3:]) and [c.seq for c in calls] == list(range(1, len(calls) + 1))
        snap = rt.store.latest_snapshot(paused.run_id)
        assert snap.kind == "pause" and {1, 2, 3} <= {p["seq"] for p in snap.pending}
        assert {c.seq for c in calls} | {p["seq"] for p in snap.pending} == {1, 2, 3, 4, 5}
        if how == "replay":
            other_version(rt, paused.run_id)
    assert rec.running == set()

    # Another runtime, its own pool: what another process does (P-10).
    async with runtime(backend.store(), rec.tools(), stream, policy=Policy(writes="ask")) as rt2:
        first = await rt2.resume(paused.run_id, "approve", seq=2)
        assert first.status == "paused"  # the other write of the batch is still undecided
        assert rec.deliveries == []
        done = await rt2.resume(paused.run_id, "approve", seq=3)
        assert done.status == "completed", done.error
        # The two approved writes of one gather go out concurrently: the comment's number is its place among
        # the deliveries, whichever went first.
        comment_at = 1 + [name for name, _ in rec.deliveries].index("add_comment")
        assert done.result == GATHERED_RESULT[:2] + [comment_at] + GATHERED_RESULT[3:]
        assert done.diagnostics["attempt"] == how
        assert done.logs == ["after 1 2 3"]
        assert sorted(rec.deliveries) == [("add_comment", {"id": 7, "body": "x"}), ("close_ticket", {"id": 7})]
        # Each read was sent once: before the pause, or (held) on the resume; never again from the journal.
        assert sorted(rec.started) == [1, 3]
        assert sorted(e[2] for e in rec.events if e[0] == "start") == [2, 4]
        calls = rt2.store.get_calls(paused.run_id)
        assert [(c.seq, c.state) for c in calls] == [(1, "done"), (2, "sent"), (3, "sent"), (4, "done"),
                                                     (5, "done"), (6, "done")]
        # Repeating the decision sends nothing (P-10).
        again = await rt2.resume(paused.run_id, "approve", seq=3)
        assert again.status == "completed" and len(rec.deliveries) == 2


async def test_p9_a_pause_while_a_gathered_read_is_still_on_the_wire_lists_what_it_waits_on(store_url, stream):
    """The write asks while a read of its gather is still out: the read finishes and is journaled before the
    dump, and the dump waits on every call of the gather, those issued after the write included (P-9)."""
    rec = Traced()
    code = """
import asyncio
import tools
a = tools.slowpoke.lag(id=1, seconds=0.3)
w = tools.helpdesk.close_ticket(id=1)
b = tools.helpdesk.get_ticket(id=2)
x = 0
for i in range(20000):
    x += i
c = tools.helpdesk.get_ticket(id=3)
r = await asyncio.gather(a, w, b, c)
[r[0], r[1]["status"], r[2]["id"], r[3]["id"], x]
"""
    from tether._store import open_store

    async with runtime(open_store(store_url), rec.tools(), stream, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute(code)
        assert paused.status == "paused", paused.error
        assert rec.running == set()
        snap = rt.store.latest_snapshot(paused.run_id)
        assert [p["seq"] for p in snap.pending] == [1, 2, 3, 4]
        done = await rt.resume(paused.run_id, "approve")
        assert done.status == "completed", done.error
        assert done.result == [1, "closed", 2, 3, sum(range(20000))]
        assert done.diagnostics["attempt"] == "restore"
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        assert rec.started == [1]


# -- stops with calls in flight (P-14, P-19) -------------------------------------------------------------

async def test_p19_a_cancel_with_gathered_calls_in_flight_leaves_none_running_and_sends_nothing_further(stream):
    rec = Traced()
    code = """
import asyncio
import tools
r = await asyncio.gather(tools.slowpoke.lag(id=1, seconds=0.3), tools.slowpoke.lag(id=2, seconds=0.3),
                         tools.helpdesk.get_ticket(id=3))
await tools.helpdesk.close_ticket(id=1)
"""
    async with runtime(None, rec.tools(), stream, policy=Policy(writes="allow")) as rt:
        handle = await rt.begin(code)
        while len(rec.started) < 2:
            await asyncio.sleep(0.005)
        cancelled = await handle.cancel("not needed")
        assert cancelled.status == "cancelled" and "not needed" in cancelled.error["message"]
        assert rec.running == set()  # the reads on the wire were cut short with the run (D-80)
        assert rec.deliveries == []
        calls = rt.store.get_calls(handle.run_id)
        assert all(c.kind == "read" for c in calls) and rt.engine.get_run(handle.run_id).status == "cancelled"


async def test_p7_no_read_is_left_running_past_the_end_of_its_run(stream):
    """A read the program never awaited is cut short when the run ends (D-80): it does not run on after the
    result. It has no outcome, so it is not journaled; the read that answered is (P-7). Which of the two the
    quick read is depends on whether it answered before the program's end reached the host (P-8, P-50)."""
    rec = Traced()
    program = "import tools\na = tools.slowpoke.lag(id=1, seconds=5)\nb = tools.helpdesk.get_ticket(id=2)\nraise KeyError('x')"
    async with runtime(None, rec.tools(), stream) as rt:
        r = await rt.execute(program)
        assert r.error["code"] == "program_error"
        assert rec.started == [1] and rec.running == set()
        calls = [(c.seq, c.address, c.state) for c in rt.store.get_calls(r.run_id)]
        answered = ("end", "get_ticket", 2) in rec.events
        assert calls == ([(2, "helpdesk.get_ticket", "done")] if answered else []), (calls, rec.events)


@pytest.mark.parametrize("end, code", [
    ("while True:\n    pass", "time_limit"),
    ("x = 'x' * 10**9", "memory_limit"),
    ("raise KeyError('mine')", "program_error"),
    ("await asyncio.gather(*[tools.helpdesk.get_ticket(id=i) for i in range(10)])", "call_limit"),
])
async def test_p14_a_limit_or_a_raise_with_an_unawaited_write_in_flight_keeps_its_code_and_sends_it_once(
        stream, end, code):
    """The write was sent before the program stopped: it finishes, is journaled sent, and is delivered once;
    the run ends with the stop's own code (P-7, P-14)."""
    rec = Traced()
    program = ("import asyncio\nimport tools\nw = tools.slowpoke.write(seconds=0.2)\n"
               "b = tools.helpdesk.get_ticket(id=2)\n" + end)
    async with runtime(None, rec.tools(), stream, limits=Limits(run_seconds=1.0, host_calls=5),
                       policy=Policy(writes="allow")) as rt:
        r = await rt.execute(program)
        assert r.status == "failed" and r.error["code"] == code, r.error
        assert rec.deliveries == [("slow_write", {"seconds": 0.2})]
        calls = rt.store.get_calls(r.run_id)
        assert (calls[0].seq, calls[0].address, calls[0].state) == (1, "slowpoke.write", "sent")
        assert all(c.address != "slowpoke.write" for c in calls[1:])


async def test_p14_a_gathered_tool_error_is_raised_at_the_await_with_the_tools_code(stream):
    rec = Traced()
    code = """
import asyncio
import tools

async def kept(c):
    try:
        return await c
    except LookupError as e:
        return e

r = await asyncio.gather(kept(tools.helpdesk.get_ticket(id=-1)), kept(tools.helpdesk.get_ticket(id=2)))
a = tools.helpdesk.get_ticket(id=-5)
b = tools.helpdesk.get_ticket(id=6)
got = (await b)["id"]
try:
    await a
    late = None
except LookupError as e:
    late = str(e)
[type(r[0]).__name__, r[1]["id"], got, late]
"""
    async with runtime(None, rec.tools(), stream) as rt:
        r = await rt.execute(code)
        assert r.status == "completed", r.error
        kind, second, got, late = r.result
        assert (kind, second, got) == ("LookupError", 2, 6)
        assert "ticket -5 does not exist" in late
        calls = rt.store.get_calls(r.run_id)
        assert [(c.args["id"], c.state) for c in calls] == [(-1, "failed"), (2, "done"), (-5, "failed"), (6, "done")]


# -- the journal's call order (P-1, P-7, P-13) -------------------------------------------------------------

INTERLEAVED = """
import asyncio
import tools
first = [tools.helpdesk.get_ticket(id=i) for i in range(10)]
mid = await tools.helpdesk.get_ticket(id=100)
second = [tools.helpdesk.get_ticket(id=i) for i in range(10, 20)]
r = await asyncio.gather(*first, *second)
[x["id"] for x in r] + [mid["id"]]
"""
ISSUED = [*range(10), 100, *range(10, 20)]


async def test_p1_gathered_calls_are_journaled_in_the_order_the_program_issued_them(stream):
    rec = Traced(delay=0.001)
    async with runtime(None, rec.tools(), stream) as rt:
        for _ in range(10):
            r = await rt.execute(INTERLEAVED)
            assert r.status == "completed", r.error
            calls = rt.store.get_calls(r.run_id)
            assert [c.args["id"] for c in calls] == ISSUED
            assert [c.seq for c in calls] == list(range(1, 22))


async def test_p13_a_replay_of_gathered_calls_matches_the_journal_and_sends_nothing_twice(backend, stream):
    """A run that pauses after a gather is replayed from its journal in another runtime: every gathered call
    comes back under its seq (no divergence), reads from the journal, the write once."""
    rec = Traced(delay=0.001)
    code = INTERLEAVED.replace("[x[\"id\"] for x in r] + [mid[\"id\"]]", "") + (
        "w = await asyncio.gather(tools.helpdesk.close_ticket(id=1), tools.helpdesk.get_ticket(id=50))\n"
        "[x['id'] for x in r] + [mid['id'], w[0]['status'], w[1]['id']]\n")
    async with runtime(backend.store(), rec.tools(), stream, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute(code)
        assert paused.status == "paused", paused.error
        other_version(rt, paused.run_id)
    async with runtime(backend.store(), rec.tools(), stream, policy=Policy(writes="ask")) as rt2:
        done = await rt2.resume(paused.run_id, "approve")
        assert done.status == "completed", done.error
        assert done.diagnostics["attempt"] == "replay"
        assert done.result == [*ISSUED[:10], *ISSUED[11:], 100, "closed", 50]
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        # Every read sent once: those journaled were answered from the journal; the one gathered with the
        # write, if it was held while the pause formed, was sent on the resume.
        assert sorted(e[2] for e in rec.events if e[0] == "start") == sorted([*ISSUED, 50])
        calls = rt2.store.get_calls(paused.run_id)
        assert [c.seq for c in calls] == list(range(1, 24))
        assert [c.args["id"] for c in calls] == [*ISSUED, 1, 50]


# -- the per-run limits (P-2, P-22) ---------------------------------------------------------------------

async def test_p2_the_call_limit_counts_gathered_calls_exactly(stream):
    rec = Traced()
    code = "import asyncio\nimport tools\nawait asyncio.gather(*[tools.helpdesk.get_ticket(id=i) for i in range(12)])"
    async with runtime(None, rec.tools(), stream, limits=Limits(host_calls=7)) as rt:
        r = await rt.execute(code)
        assert r.status == "failed" and r.error["code"] == "call_limit", r.error
        assert "call 8 was not sent" in r.error["message"]
        started = [e[2] for e in rec.events if e[0] == "start"]
        assert started == list(range(7))
        assert [c.seq for c in rt.store.get_calls(r.run_id)] == list(range(1, 8))


async def test_p2_gathered_writes_each_spend_the_write_budget_once(backend, stream):
    """On Postgres the intents leave the event loop (D-27), so gathered writes interleave while they are
    stored: each must still be counted before the next is checked."""
    rec = Traced()
    code = """
import asyncio
import tools

async def one(i):
    try:
        await tools.helpdesk.add_comment(id=i, body="x")
        return "sent"
    except PermissionError as e:
        return str(e).split("]")[0] + "]"

await asyncio.gather(*[one(i) for i in range(6)])
"""
    async with runtime(backend.store(), rec.tools(), stream, policy=Policy(writes="allow", write_budget=4)) as rt:
        r = await rt.execute(code)
        assert r.status == "completed", r.error
        assert sorted(r.result) == ["[budget_exceeded]"] * 2 + ["sent"] * 4
        sent = sorted(d[1]["id"] for d in rec.deliveries)
        assert len(sent) == 4
        calls = rt.store.get_calls(r.run_id)
        assert [c.seq for c in calls] == list(range(1, 7))
        assert sorted(c.args["id"] for c in calls if c.state == "sent") == sent
        assert sorted(c.state for c in calls) == ["denied"] * 2 + ["sent"] * 4


async def test_p22_the_journal_budget_counts_gathered_results_exactly(stream):
    rec = Traced()
    big = Tool("bulk", "page", "A page of 40 KB.", {"type": "object", "properties": {"id": {"type": "integer"}}},
               _page, annotations=Annotations(read_only=True))
    code = "import asyncio\nimport tools\nawait asyncio.gather(*[tools.bulk.page(id=i) for i in range(6)])"
    async with runtime(None, [*rec.tools(), big], stream, limits=Limits(journal_bytes=170_000)) as rt:
        r = await rt.execute(code)
        assert r.status == "failed" and r.error["code"] == "journal_limit", r.error
        calls = rt.store.get_calls(r.run_id)
        done = [c for c in calls if c.state == "done"]
        assert len(done) == 4  # 4 pages of ~40 KB fit in 170 KB, the fifth does not


async def _page(args: dict) -> Any:
    return "p" * 40_000


@pytest.mark.parametrize("how", ["restore", "replay"])
async def test_p27_a_read_gathered_between_two_writes_that_ask_resumes_after_both_are_approved(store_url, stream, how):
    """The read is held while the pause forms, so the journal lacks its seq below the second write's: it is
    issued on the resume, not read as divergence (D-80)."""
    rec = Traced()
    code = """
import asyncio
import tools
r = await asyncio.gather(tools.helpdesk.close_ticket(id=7), tools.helpdesk.get_ticket(id=2),
                         tools.helpdesk.add_comment(id=7, body="x"))
[r[0]["status"], r[1]["id"], r[2]["comment"]]
"""
    from tether._store import open_store

    async with runtime(open_store(store_url), rec.tools(), stream, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute(code)
        assert sorted(w["seq"] for w in paused.pending["writes"]) == [1, 3]
        assert [(c.seq, c.state) for c in rt.store.get_calls(paused.run_id)] == [(1, "asked"), (3, "asked")]
        if how == "replay":
            other_version(rt, paused.run_id)
        await rt.resume(paused.run_id, "approve", seq=1)
        done = await rt.resume(paused.run_id, "approve", seq=3)
        assert done.status == "completed", done.error
        assert done.diagnostics["attempt"] == how
        assert done.result == ["closed", 2, 2]
        assert sorted(rec.deliveries) == [("add_comment", {"id": 7, "body": "x"}), ("close_ticket", {"id": 7})]
        assert [e for e in rec.events if e[0] == "start"] == [("start", "get_ticket", 2)]
        assert [(c.seq, c.state) for c in rt.store.get_calls(paused.run_id)] == [(1, "sent"), (2, "done"), (3, "sent")]


async def test_p6_a_write_missing_below_a_recorded_call_is_still_divergence(store_url, stream):
    """Only a read may be missing below a later entry (D-80): a journal whose write row was removed replays as
    execution_diverged, and nothing more is sent."""
    rec = Traced()
    code = """
import tools
await tools.helpdesk.close_ticket(id=1)
await tools.helpdesk.get_ticket(id=2)
await tools.helpdesk.add_comment(id=3, body="y")
"""
    from tether._store import open_store

    async with runtime(open_store(store_url), rec.tools(), stream, policy=Policy(writes="ask")) as rt:
        paused = await rt.execute(code)
        again = await rt.resume(paused.run_id, "approve", seq=1)
        assert again.status == "paused" and again.pending["seq"] == 3
        assert len(rec.deliveries) == 1
        other_version(rt, paused.run_id)
        import sqlite3

        with sqlite3.connect(store_url[len("sqlite:///"):]) as db:
            db.execute("DELETE FROM calls WHERE run_id = ? AND seq = 1", (paused.run_id,))
        done = await rt.resume(paused.run_id, "approve", seq=3)
        assert done.status == "failed" and done.error["code"] == "execution_diverged", done.error
        assert "call 1 is missing from the journal" in done.error["message"]
        assert len(rec.deliveries) == 1


async def test_p1_gathered_calls_of_concurrent_runs_each_reach_their_own_run(stream):
    """Each call finds its run through the context the feed was started in: with calls streamed from two
    workers at once, every journal holds its own program's calls and no other's."""
    rec = Traced(delay=0.001)
    code = ("import asyncio\nimport tools\n"
            "rs = await asyncio.gather(*[tools.helpdesk.get_ticket(id=BASE + i) for i in range(8)])\n"
            "[r['id'] for r in rs]")
    async with runtime(None, rec.tools(), stream) as rt:  # a pool of two workers
        for _ in range(5):
            results = await asyncio.gather(*(rt.execute(code.replace("BASE", str(base))) for base in (100, 200, 300)))
            for base, r in zip((100, 200, 300), results):
                assert r.status == "completed" and r.result == [base + i for i in range(8)], r.error
                assert [c.args["id"] for c in rt.store.get_calls(r.run_id)] == [base + i for i in range(8)]


HELD_WRITE = """
import asyncio
import tools
r = await asyncio.gather(tools.helpdesk.close_ticket(id=1), tools.helpdesk.add_comment(id=5, body="a"),
                         tools.helpdesk.close_ticket(id=2))
[r[0]["status"], r[1]["comment"], r[2]["status"]]
"""
ALLOW_COMMENTS = Policy(writes="ask", rules=[{"match": "helpdesk.add_comment", "action": "allow"}])


async def test_p9_a_write_policy_allows_gathered_between_two_that_ask_is_sent_once_on_restore(store_url, stream):
    """Held while the pause formed, it is in the snapshot's signed record and not in the journal: the restore
    sends it once, after the decisions, instead of reading its missing seq as divergence (D-80)."""
    from tether._store import open_store

    rec = Traced()
    async with runtime(open_store(store_url), rec.tools(), stream, policy=ALLOW_COMMENTS) as rt:
        paused = await rt.execute(HELD_WRITE)
        assert [(c.seq, c.state) for c in rt.store.get_calls(paused.run_id)] == [(1, "asked"), (3, "asked")]
        assert rec.deliveries == []
        await rt.resume(paused.run_id, "approve", seq=1)
        done = await rt.resume(paused.run_id, "approve", seq=3)
        assert done.status == "completed", done.error
        assert done.diagnostics["attempt"] == "restore"
        assert sorted(rec.deliveries, key=repr) == [("add_comment", {"id": 5, "body": "a"}),
                                                    ("close_ticket", {"id": 1}), ("close_ticket", {"id": 2})]
        assert [(c.seq, c.state) for c in rt.store.get_calls(paused.run_id)] == [(1, "sent"), (2, "sent"), (3, "sent")]


async def test_p12_the_same_held_write_on_a_replay(store_url, stream):
    """Replayed from the journal (the snapshot is another build's), the held write's seq is missing below
    the asked ones: the snapshot's signed record lists it, so it is sent once, not read as divergence (D-80)."""
    from tether._store import open_store

    rec = Traced()
    async with runtime(open_store(store_url), rec.tools(), stream, policy=ALLOW_COMMENTS) as rt:
        paused = await rt.execute(HELD_WRITE)
        other_version(rt, paused.run_id)
        await rt.resume(paused.run_id, "approve", seq=1)
        done = await rt.resume(paused.run_id, "approve", seq=3)
        assert done.status == "completed", done.error
        assert done.diagnostics["attempt"] == "replay"
        assert sorted(rec.deliveries, key=repr) == [("add_comment", {"id": 5, "body": "a"}),
                                                    ("close_ticket", {"id": 1}), ("close_ticket", {"id": 2})]
        assert [(c.seq, c.state) for c in rt.store.get_calls(paused.run_id)] == [(1, "sent"), (2, "sent"), (3, "sent")]


async def test_p35_a_forged_snapshot_lists_nothing_a_replay_would_send(store_url, stream):
    """Only a snapshot whose signature verifies may name held calls: a forged one is refused, nothing sent."""
    from tether._store import open_store

    rec = Traced()
    async with runtime(open_store(store_url), rec.tools(), stream, policy=ALLOW_COMMENTS) as rt:
        paused = await rt.execute(HELD_WRITE)
        snap = rt.store.latest_snapshot(paused.run_id)
        rt.store.put_snapshot(SnapshotRecord(snap.run_id, snap.seq, "pydantic-monty-0.0.1", snap.data, snap.mac,
                                             snap.pending, rt.engine.clock(), snap.kind))
        await rt.resume(paused.run_id, "approve", seq=1)
        done = await rt.resume(paused.run_id, "approve", seq=3)
        assert done.status == "failed" and done.error["code"] == "snapshot_tampered", done.error
        assert rec.deliveries == []


async def test_p7_a_run_that_ends_cuts_only_its_own_reads_not_those_of_a_run_sharing_its_pool(stream):
    """Closing one run's boundary cancels the reads that run left on the wire (D-80); a concurrent run on the
    same sandbox pool, awaiting a read of the same tool at that moment, gets its answer."""
    rec = Traced()
    ending = "import tools\na = tools.slowpoke.lag(id=1, seconds=5)\nb = await tools.slowpoke.lag(id=3, seconds=0.05)\nraise KeyError('x')"
    waiting = ("import asyncio\nimport tools\nx = await tools.slowpoke.lag(id=2, seconds=0.6)\n"
               "y = await asyncio.gather(tools.slowpoke.lag(id=4, seconds=0.3), tools.slowpoke.lag(id=5, seconds=0.3))\n"
               "[x, *y]")
    async with runtime(None, rec.tools(), stream) as rt:
        other = asyncio.ensure_future(rt.execute(waiting))
        while 2 not in rec.started:
            await asyncio.sleep(0.01)
        ended = await rt.execute(ending)
        assert ended.error["code"] == "program_error"
        done = await other
        assert done.status == "completed" and done.result == [2, 4, 5], done.error
        assert rec.running == set()
