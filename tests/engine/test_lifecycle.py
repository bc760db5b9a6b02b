"""The run lifecycle (_engine/lifecycle.py): every status change is a transition the state table lists.

A transition the table does not list is refused with ``invalid_transition`` and
leaves the run as it was; a transition it lists is made by compare-and-set, so a run
that changed meanwhile is left to whoever changed it.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._engine import launcher
from tether._engine.lifecycle import Lifecycle, check_move
from tether._store import RunRecord, open_store
from tether._store.states import RUN_TRANSITIONS, TERMINAL_RUN_STATUSES, RunStatus, run_move_allowed
from tether.errors import InvalidTransition

SRC = Path(__file__).resolve().parent.parent.parent / "src" / "tether"


def _run(run_id: str, status: RunStatus) -> RunRecord:
    return RunRecord(run_id=run_id, status=status, program="1", environment={"clock": "2026-01-01T00:00:00+00:00",
                     "seed": 1}, policy={}, limits={}, created_at=1000.0, updated_at=1000.0)


@pytest.fixture
def life(store_url):
    store = open_store(store_url)
    yield Lifecycle(store, owner="me", clock=lambda: 2000.0, lease_seconds=30.0)
    store.close()


def test_every_pair_of_statuses_moves_exactly_as_the_table_says(life):
    """All 49 (from, to) pairs on a real store: listed transitions are made, others refused, nothing written."""
    for n, (frm, to) in enumerate(itertools.product(RunStatus, RunStatus)):
        run_id = f"r{n}"
        life.store.create_run(_run(run_id, frm))
        if run_move_allowed(frm, to):
            assert life._move(run_id, [frm], to, updated_at=2000.0), (frm, to)
            assert life.store.get_run(run_id).status == to
        else:
            with pytest.raises(InvalidTransition) as raised:
                life._move(run_id, [frm], to, updated_at=2000.0)
            assert raised.value.code == "invalid_transition"
            assert raised.value.details == {"run_id": run_id, "from": [str(frm)], "to": str(to)}
            row = life.store.get_run(run_id)
            assert row.status == frm and row.updated_at == 1000.0, (frm, to)


def test_the_table_has_no_dead_ends():
    """Terminal statuses never transition but to running, to undo their writes (D-67), and rolled_back never;
    every other status can end, and can be reached from where runs start."""
    for status in TERMINAL_RUN_STATUSES:
        assert RUN_TRANSITIONS[status] <= {RunStatus.RUNNING}
    assert RUN_TRANSITIONS[RunStatus.ROLLED_BACK] == frozenset()
    reached = {RunStatus.QUEUED, RunStatus.RUNNING}
    while True:
        more = {to for s in reached for to in RUN_TRANSITIONS[s]} - reached
        if not more:
            break
        reached |= more
    assert reached == set(RunStatus)
    for status in set(RunStatus) - TERMINAL_RUN_STATUSES:
        assert RUN_TRANSITIONS[status] & TERMINAL_RUN_STATUSES, status


def test_a_listed_move_loses_to_a_change_made_meanwhile(life):
    life.store.create_run(_run("r", RunStatus.PAUSED))
    assert life.expire("r")  # paused -> failed
    assert not life.resume("r", {"seq": 1, "decision": "approve"})  # paused -> running: it is not paused now
    assert life.store.get_run("r").status == RunStatus.FAILED


def test_a_finished_run_keeps_its_outcome(life):
    life.store.create_run(_run("r", RunStatus.RUNNING))
    assert life.finish("r", RunStatus.COMPLETED, {"status": "completed", "result": 1}, None)
    assert not life.finish("r", RunStatus.FAILED, {"status": "failed"}, {"code": "x"})
    assert not life.cancel_idle(life.store.get_run("r"))
    row = life.store.get_run("r")
    assert row.status == RunStatus.COMPLETED and row.result == {"status": "completed", "result": 1}


def test_moves_outside_the_table_are_refused_before_anything_is_written(life):
    with pytest.raises(InvalidTransition):
        life.create(_run("new", RunStatus.PAUSED))
    assert life.store.get_run("new") is None
    life.store.create_run(_run("r", RunStatus.RUNNING))
    with pytest.raises(InvalidTransition):
        life.finish("r", RunStatus.QUEUED, {}, None)
    with pytest.raises(InvalidTransition):
        life.park("r", RunStatus.COMPLETED, pending={}, expires_at=None, envelope={}, mac={})
    with pytest.raises(InvalidTransition):
        life.unclaim(life.store.get_run("r"), RunStatus.PAUSED)
    with pytest.raises(InvalidTransition):
        check_move("r", [], RunStatus.RUNNING)
    row = life.store.get_run("r")
    assert row.status == RunStatus.RUNNING and row.updated_at == 1000.0


def test_claims_take_the_run_for_this_owner_with_a_lease(life):
    life.store.create_run(_run("q", RunStatus.QUEUED))
    run = life.claim_queued()
    assert (run.run_id, run.status, run.owner, run.lease_until) == ("q", RunStatus.RUNNING, "me", 2030.0)
    assert life.claim_queued() is None
    assert life.unclaim(run, RunStatus.QUEUED)
    row = life.store.get_run("q")
    assert (row.status, row.owner, row.lease_until) == (RunStatus.QUEUED, None, None)


async def test_what_a_stopped_run_waits_on_is_stored_in_the_shape_runs_were_signed_with(store_url):
    """A pause and a park store ``pending`` with exactly these keys: stored runs and their MACs depend on it."""
    from helpers import Clock, Recorder
    from tether._runtime import Runtime

    rec = Recorder()
    async with Runtime(store=open_store(store_url), tools=rec.tools(), clock=Clock(), type_check=False) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=1)")
        row = rt.store.get_run(paused.run_id)
        # The approval key is the caller's, not the store's (D-33): runs stored before kept it,
        # and still verify, since their MAC covers what they stored.
        assert row.status == RunStatus.PAUSED and "key" in paused.pending
        assert row.pending == {k: v for k, v in paused.pending.items() if k not in ("key", "writes")} | {
            "writes": [{k: v for k, v in w.items() if k != "key"} for w in paused.pending["writes"]]}
        (write,) = row.pending["writes"]
        assert set(row.pending) == {"seq", "address", "args", "annotations", "writes"}
        assert set(write) == {"seq", "address", "args", "annotations"}
        assert {k: row.pending[k] for k in ("seq", "address", "args")} == {
            "seq": 1, "address": "helpdesk.close_ticket", "args": {"id": 1}}
        assert rt.store.latest_snapshot(paused.run_id).pending == [
            {"seq": 1, "op": "tool", "address": "helpdesk.close_ticket", "args": {"id": 1}}]

        parked = await rt.execute("await wait_for('go', timeout=60)")
        row = rt.store.get_run(parked.run_id)
        # The parked wait's key is the caller's too: the store keeps its digest (D-33).
        from tether._store.base import wait_digest

        assert row.status == RunStatus.WAITING and row.pending == {**parked.pending,
                                                                  "key": wait_digest(parked.pending["key"])}
        assert set(row.pending) == {"kind", "seq", "name", "key", "deadline"}
        assert (row.pending["kind"], row.pending["seq"], row.pending["name"]) == ("wait", 1, "go")
        (call,) = rt.store.latest_snapshot(parked.run_id).pending
        assert (call["seq"], call["op"], call["address"]) == (1, "wait_for", "wait_for")


def _calls_outside_lifecycle() -> list[str]:
    """Calls of the store's run compare-and-set methods anywhere but the lifecycle (and the store itself)."""
    guarded = {"update_run", "create_run", "claim_run", "claim_queued", "claim_due", "claim_orphan",
               "release_orphan", "park_run", "create_parking"}
    # A stop's compare-and-set travels with the waits it creates (store.park_run): the lifecycle hands it to
    # waits.create_parking, the one writer of wait rows, which alone calls the store's park_run.
    relayed = {("_engine/waits.py", "park_run")}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("_store/") or rel == "_engine/lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in guarded
                    and (rel, node.func.attr) not in relayed):
                # Calls on the lifecycle itself (rt.engine.lifecycle.claim_queued) are what every other place makes.
                owner = node.func.value
                via = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if via not in ("lifecycle", "life"):
                    found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def test_only_the_lifecycle_changes_a_runs_status_owner_or_lease():
    assert _calls_outside_lifecycle() == []


async def test_every_journal_entry_state_change_a_run_makes_is_listed_in_the_call_table(store_url):
    """Reads, writes approved, declined and cancelled in a batch, writes policy allows, waits settled and
    timed out: each compare-and-set of a journal entry is a transition CALL_TRANSITIONS lists."""
    from helpers import Clock, Recorder
    from tether._engine.rules.policy import Policy
    from tether._runtime import Runtime
    from tether._store.states import CALL_TRANSITIONS, CallState

    seen: set[tuple[str, str]] = set()
    store = open_store(store_url)
    update_call = store.update_call

    def recording(run_id, seq, expect_state, **fields):  # the store's own method, its moves noted
        moved = update_call(run_id, seq, expect_state, **fields)
        if moved and "state" in fields:
            seen.update((CallState(frm), CallState(fields["state"])) for frm in expect_state)
        return moved

    store.update_call = recording
    rec, clock = Recorder(), Clock()
    gather = ("import asyncio\nimport tools\n"
              "async def c(n):\n    try:\n        return await tools.helpdesk.add_comment(id=n, body='x')\n"
              "    except PermissionError:\n        return None\n"
              "await asyncio.gather(c(1), c(2))\n")
    async with Runtime(store=store, tools=rec.tools(), clock=clock, type_check=False) as rt:
        rt.engine.settings.batch_window_seconds = 0.5  # a starved machine must not split a batch (D-16)
        one = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(id=1)\n"
                               "await tools.helpdesk.close_ticket(id=1)")
        assert (await rt.resume(one.run_id, "approve")).status == "completed"
        two = await rt.execute(gather)
        assert (await rt.decide(two.run_id, {1: "approve", 2: "decline"})).status == "completed"
        three = await rt.execute(gather)
        await rt.decide(three.run_id, {1: "approve"})
        assert (await rt.decide(three.run_id, {2: "cancel"})).status == "cancelled"
        parked = await rt.execute("await wait_for('go', timeout=600)")
        await rt.resolve_wait(parked.pending["key"], 1)
        timed = await rt.execute("try:\n    await wait_for('never', timeout=60)\nexcept TimeoutError:\n    pass")
        clock.now += 120
        assert [r.status for r in await launcher.wake_due(rt.engine)] == ["completed"]
        assert timed.status == "waiting"
    async with Runtime(store=store, tools=rec.tools(), clock=clock, type_check=False,
                       policy=Policy(writes="allow")) as rt:
        assert (await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=2)")).status == "completed"
    store.close()
    C = CallState
    assert {(C.ASKED, C.APPROVED), (C.ASKED, C.DECLINED), (C.APPROVED, C.SENDING), (C.SENDING, C.SENT),
            (C.APPROVED, C.DECLINED), (C.WAITING, C.DONE), (C.WAITING, C.FAILED)} <= seen
    assert [(frm, to) for frm, to in sorted(seen) if to not in CALL_TRANSITIONS[frm]] == []


_OPS = ["claim_queued", "claim_due", "wake", "resume", "claim_orphan", "take_over", "unclaim_queued",
        "unclaim_waiting", "renew", "request_cancel", "park_paused", "park_waiting", "complete", "fail",
        "cancel", "fail_internal", "expire", "cancel_idle", "cancel_decided", "lapse"]
_ENDS = {"complete": RunStatus.COMPLETED, "fail": RunStatus.FAILED, "cancel": RunStatus.CANCELLED}


def _step(op: str, life: Lifecycle, before: RunRecord, at: float) -> object:
    if op in _ENDS:
        return life.finish("r", _ENDS[op], {"status": str(_ENDS[op])}, {"code": op})
    if op in ("park_paused", "park_waiting"):
        to = RunStatus.PAUSED if op == "park_paused" else RunStatus.WAITING
        return life.park("r", to, pending={"seq": 1}, expires_at=at + 50, envelope={}, mac={})
    if op in ("unclaim_queued", "unclaim_waiting"):
        return life.unclaim(before, RunStatus.QUEUED if op == "unclaim_queued" else RunStatus.WAITING)
    if op in ("request_cancel", "cancel_idle"):
        return life.request_cancel(before, "x") if op == "request_cancel" else life.cancel_idle(before)
    if op in ("claim_queued", "claim_due", "claim_orphan"):
        return getattr(life, op)()
    if op in ("resume", "cancel_decided"):
        return getattr(life, op)("r", {"seq": 1})
    if op == "fail_internal":
        return life.fail_internal("r", {"status": "failed"}, {"code": "internal_error"})
    return getattr(life, op)("r")  # wake, take_over, renew, expire


@settings(max_examples=80, deadline=None)
@given(start=st.sampled_from([RunStatus.QUEUED, RunStatus.RUNNING]),
       steps=st.lists(st.tuples(st.sampled_from(_OPS), st.sampled_from(["a", "b"])), max_size=25))
def test_any_sequence_of_lifecycle_calls_by_two_processes_only_makes_listed_transitions(start, steps):
    """Two processes calling the lifecycle in any order: each status change is in the table, an ended run
    keeps its status (only finishing it as that status writes its envelope), and a running run changes
    hands only to the process that claimed it (or back to the owner it was handed back to)."""
    store = open_store("sqlite:///:memory:")
    now = [2000.0]
    lives = {o: Lifecycle(store, owner=o, clock=lambda: now[0], lease_seconds=30.0) for o in ("a", "b")}
    run = _run("r", start)
    if start == RunStatus.RUNNING:
        run.owner, run.lease_until = "a", now[0] + 30.0
    lives["a"].create(run)
    for op, who in steps:
        before = store.get_run("r")
        if op == "lapse":
            now[0] += 100.0  # every lease lapses
            continue
        _step(op, lives[who], before, now[0])
        after = store.get_run("r")
        assert run_move_allowed(before.status, after.status), (op, before.status, after.status)
        if before.status in TERMINAL_RUN_STATUSES:
            assert after.status == before.status, op
            if _ENDS.get(op) != before.status:
                assert (after.result, after.error) == (before.result, before.error), op
        if after.status == RunStatus.RUNNING and (after.owner, after.lease_until) != (before.owner,
                                                                                    before.lease_until):
            assert after.owner in (who, before.owner), op
    store.close()


async def test_a_runtime_claims_runs_for_the_lease_it_is_given_even_when_changed_later(store_url):
    from helpers import Clock
    from tether._runtime import Runtime

    clock = Clock()
    async with Runtime(store=open_store(store_url), clock=clock, lease_seconds=30.0) as rt:
        rt.engine.lifecycle.lease_seconds = 5.0
        run_id = rt.start("1")
        claimed = rt.engine.lifecycle.claim_queued()
        assert (claimed.run_id, claimed.owner, claimed.lease_until) == (run_id, rt.engine.owner, clock.now + 5.0)
