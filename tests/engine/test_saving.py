"""Saving a run never breaks it: a program holding a 25 MB string under the default 64 MiB limit.

Saving the program's state (a dump) needs room beside what it holds; at about a quarter of the limit
the worker runs out. A pause, a wait or a sleep that cannot be saved fails ``memory_limit`` before
anything of that call is sent; a checkpoint that cannot be taken is skipped with a note; a session
state that cannot be saved is a note on the completed run. Nothing is sent twice.
"""

from __future__ import annotations

import pytest

from helpers import Clock, Recorder
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._store import open_store

BIG = "import tools\nimport asyncio\nbig = 'x' * (25 * 1024 * 1024)\n" \
      "await tools.helpdesk.add_comment(id=1, body='sent first')\n"
COMMENT = ("add_comment", {"id": 1, "body": "sent first"})


def runtime(store_url, rec: Recorder, **kw) -> Runtime:
    # close_ticket asks; add_comment is allowed and goes out before the program tries to stop.
    return Runtime(store=open_store(store_url), tools=rec.tools(), clock=Clock(), type_check=False,
                   policy=Policy(writes="allow", rules=(Rule("helpdesk.close_ticket", "ask"),)), **kw)


def test_the_default_limit_is_the_one_the_cases_assume():
    assert Limits().memory_bytes == 64 * 1024 * 1024


@pytest.mark.parametrize("stop, op", [
    ("await tools.helpdesk.close_ticket(id=7)", "tool"),
    ("await wait_for('reply', timeout=600)", "wait_for"),
    ("await asyncio.sleep(5)", "sleep"),
])
async def test_a_stop_that_cannot_be_saved_fails_memory_limit_with_nothing_of_it_sent(store_url, stop, op):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        r = await rt.execute(BIG + stop + "\nlen(big)")
        assert r.status == "failed", r
        assert r.error["code"] == "memory_limit"
        assert "too large to save" in r.error["message"] and "nothing of that call was sent" in r.error["message"]
        assert r.error["details"]["call"]["seq"] == 2 and r.error["details"]["call"]["op"] == op
        assert "memory_bytes" in r.error["next_action"]
        # The write before the stop went out once; the one that asked never did.
        assert rec.deliveries == [COMMENT]
        assert rt.store.latest_snapshot(r.run_id) is None
        assert rt.list_waits(r.run_id) == []  # a wait it parked on is not left open
        # The host is fine: the next run works.
        ok = await rt.execute("1 + 1")
        assert ok.status == "completed" and ok.result == 2


async def test_a_checkpoint_that_cannot_be_taken_is_skipped_and_the_run_completes(store_url):
    rec = Recorder()
    async with runtime(store_url, rec, checkpoint_every_calls=1) as rt:
        code = BIG + "emit('half way')\nt = [await tools.helpdesk.get_ticket(id=i) for i in range(3)]\n" \
                     "await tools.helpdesk.add_comment(id=2, body='after')\nlen(big) + len(t)"
        r = await rt.execute(code)
        assert r.status == "completed", r.error
        assert r.result == 25 * 1024 * 1024 + 3
        assert any("checkpoints were skipped" in n and "nothing was sent twice" in n for n in r.notes)
        assert rec.deliveries == [COMMENT, ("add_comment", {"id": 2, "body": "after"})]
        # The replay repeated the emit; the stream holds it once.
        outputs = [e for e in rt.store.get_events(r.run_id, limit=100) if e.type == "output"]
        assert len(outputs) == 1
        calls = rt.store.get_calls(r.run_id)
        assert [c.seq for c in calls] == [1, 2, 3, 4, 5]


async def test_a_session_state_that_cannot_be_saved_is_a_note_and_a_retry_sends_nothing(store_url):
    rec = Recorder()
    async with runtime(store_url, rec) as rt:
        first = await rt.execute("kept = 'before'", session="s")
        assert first.status == "completed"
        code = BIG + "kept = 'after'\nlen(big)"
        r = await rt.execute(code, session="s", key="req-1")
        assert r.status == "completed", r.error
        assert r.result == 25 * 1024 * 1024
        assert any("session state was not saved" in n and "previous execute" in n for n in r.notes)
        assert rec.deliveries == [COMMENT]
        # The caller retries the same request (same key): the same run answers, nothing is sent again.
        again = await rt.execute(code, session="s", key="req-1")
        assert again.run_id == r.run_id and again.status == "completed"
        assert rec.deliveries == [COMMENT]
        # The session goes on from its previous state.
        after = await rt.execute("kept", session="s")
        assert after.status == "completed" and after.result == "before"


async def test_with_the_default_30_s_checkpoint_interval_too(store_url):
    """The case seen in the field: no special settings, a run that outlives the 30 s checkpoint interval."""
    from tether._tools.model import Annotations, Tool

    clock = Clock()
    rec = Recorder()

    async def tick(args: dict) -> int:
        clock.now += 31  # the run has now been going longer than checkpoint_every_seconds
        return 1

    tools = rec.tools() + [Tool("clock", "tick", "Let time pass.", {"type": "object"}, tick,
                                annotations=Annotations(read_only=True))]
    async with Runtime(store=open_store(store_url), tools=tools, clock=clock, type_check=False,
                       policy=Policy(writes="allow")) as rt:
        assert rt.engine.settings.checkpoint_every_seconds == 30 and rt.engine.settings.checkpoint_every_calls == 100
        r = await rt.execute(BIG + "await tools.clock.tick()\nawait tools.helpdesk.add_comment(id=3, body='last')\n"
                             "len(big)")
        assert r.status == "completed", r.error
        assert any("checkpoints were skipped" in n for n in r.notes)
        assert rec.deliveries == [COMMENT, ("add_comment", {"id": 3, "body": "last"})]
