"""An end of a pause cut in half is finished by a retry and by recovery (P-53).

A cancel decided on a paused run is two steps: the run moves to ``cancelled``, then each write of the pause is
recorded as the cancel. An expiry likewise: the run moves to ``failed``, then the writes approved before it are
declined ``write_expired`` and the envelope written. Here the store fails between the two (the journal's writes
refused while the fault is armed, as a disk gone would) and the process carries on: a repeat of the cancel, or
recovery with nobody retrying, finishes the end. Nothing is sent, on both backends.
"""

from __future__ import annotations

import pytest

from helpers import CLOSE_TWO as TWO
from helpers import Clock, Recorder
from helpers import batched_runtime as make_runtime
from helpers import store_url_of as url_of
from helpers import write_states as states
from tether._engine.approvals import service
from tether._engine.inspect import run_timeline
from tether._runtime import Runtime
from tether.errors import NotPaused

BACKENDS = ["sqlite", "postgres"]


class DiskGone(RuntimeError):
    pass


def cut(store) -> dict[str, bool]:
    """Arm a fault in the real store: while ``armed``, every journal entry's move fails before it is written."""
    real = store.update_call
    fault = {"armed": False}

    def update_call(run_id, seq, expect_state, **fields):
        if fault["armed"]:
            raise DiskGone("disk I/O error while writing the journal")
        return real(run_id, seq, expect_state, **fields)

    store.update_call = update_call
    return fault


def cut_after_plan(store) -> dict[str, bool]:
    """Arm a fault that fails every wait's settling once a rollback's plan is stored: the process stops there."""
    real_update, real_settle = store.update_run, store.settle_wait
    fault = {"armed": False}

    def update_run(run_id, expect_status, **fields):
        won = real_update(run_id, expect_status, **fields)
        if isinstance(fields.get("pending"), dict) and "rollback" in fields["pending"]:
            fault["armed"] = True
        return won

    def settle_wait(wait):
        if fault["armed"]:
            raise DiskGone("disk I/O error while writing the wait")
        return real_settle(wait)

    store.update_run, store.settle_wait = update_run, settle_wait
    return fault


async def cancel_cut_in_half(rt: Runtime, fault: dict[str, bool]) -> str:
    """A paused run of two writes, write 1 approved by ann, then ben's cancel cut after the run's move."""
    paused = await rt.execute(TWO)
    await rt.decide(paused.run_id, {1: "approve"}, actor="ann", via="link")
    fault["armed"] = True
    with pytest.raises(DiskGone):
        await rt.decide(paused.run_id, {2: ("cancel", "wrong customer")}, actor="ben", via="console")
    fault["armed"] = False
    run = rt.store.get_run(paused.run_id)
    assert run.status == "cancelled" and states(rt, paused.run_id) == {1: "approved", 2: "asked"}
    return paused.run_id


def assert_cancelled_by_ben(rt: Runtime, rec: Recorder, run_id: str) -> None:
    assert states(rt, run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
    for seq in (1, 2):
        decision = service.recorded_decision(rt.engine, run_id, seq)
        assert (decision.decision, decision.actor, decision.via) == ("cancel", "ben", "console"), decision
    assert service.recorded_decision(rt.engine, run_id, 2).reason == "wrong customer"
    run = rt.store.get_run(run_id)
    assert run.pending is None and run.owner is None
    assert run.result["status"] == "cancelled" and run.error["code"] == "cancelled"
    assert run.error["details"] == {"reason": "wrong customer"}
    assert rt.store.ended_runs_holding_pause() == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_a_repeat_of_a_cancel_cut_in_half_settles_the_pause_as_the_first_cancel(backend, request):
    url = url_of(backend, request)
    rec = Recorder()
    async with make_runtime(url, rec) as rt:
        fault = cut(rt.store)
        run_id = await cancel_cut_in_half(rt, fault)
        # Before anyone retries, a door that only checks (the console's queue) already reads the write as
        # cancelled: a late approval is refused, not queued.
        _, refused = service.refusal(rt.engine, run_id, [2], "approve", principal=None)
        assert isinstance(refused, NotPaused) and "was cancelled by ben via console" in refused.message
        # The retry (ben clicking again, as his first click failed) finishes the job, by whoever cancelled first.
        again = await rt.decide(run_id, {2: ("cancel", "again")}, actor="carl", via="python")
        assert again.status == "cancelled" and again.error["code"] == "cancelled", again
        assert_cancelled_by_ben(rt, rec, run_id)
        timeline = [(d["seq"], d["decision"], d["actor"]) for d in run_timeline(rt.store, run_id)["decisions"]]
        assert timeline[0] == (1, "approve", "ann") and {(1, "cancel", "ben"), (2, "cancel", "ben")} <= set(timeline)
        # Repeating once more changes nothing and returns the same end; a late approval is not_paused.
        assert (await rt.decide(run_id, {2: "cancel"})).to_dict() == again.to_dict()
        with pytest.raises(NotPaused):
            await rt.decide(run_id, {2: "approve"}, actor="ann")
        assert rec.deliveries == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_a_late_decision_or_a_cancel_on_a_cut_cancel_finishes_it_first(backend, request):
    """Any decision reaching the run finishes its end before it is judged; so does rt.cancel (its repeat)."""
    url = url_of(backend, request)
    rec = Recorder()
    async with make_runtime(url, rec) as rt:
        fault = cut(rt.store)
        run_id = await cancel_cut_in_half(rt, fault)
        with pytest.raises(NotPaused) as late:
            await rt.decide(run_id, {1: "approve"}, actor="ann")
        assert "was cancelled by ben via console (wrong customer)" in late.value.message, late.value.message
        assert "call 1 helpdesk.close_ticket was not sent" in late.value.message
        assert_cancelled_by_ben(rt, rec, run_id)

        second = await cancel_cut_in_half(rt, fault)
        ended = await rt.cancel(second, "stop")
        assert ended.status == "cancelled" and ended.error["details"] == {"reason": "wrong customer"}, ended
        assert_cancelled_by_ben(rt, rec, second)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_recovery_in_another_process_finishes_a_cut_cancel_without_a_retry(backend, request):
    url = url_of(backend, request)
    rec = Recorder()
    clock = Clock()
    async with make_runtime(url, rec, clock=clock) as a, make_runtime(url, rec, clock=clock) as b:
        fault = cut(a.store)
        run_id = await cancel_cut_in_half(a, fault)
        # a still holds the run (its lease): another process leaves it to a.
        assert await b.recover() == [] and states(b, run_id) == {1: "approved", 2: "asked"}
        clock.now += 3600  # a's lease lapsed: a stopped
        done = await b.recover()
        assert [(r.run_id, r.status) for r in done] == [(run_id, "cancelled")]
        assert_cancelled_by_ben(b, rec, run_id)
        assert await b.recover() == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_an_expiry_cut_in_half_is_finished_by_recovery_and_no_write_is_left_approved(backend, request):
    url = url_of(backend, request)
    rec = Recorder()
    clock = Clock()
    async with make_runtime(url, rec, clock=clock) as rt:
        fault = cut(rt.store)
        paused = await rt.execute(TWO)
        await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        clock.now = paused.expires_at + 1
        fault["armed"] = True
        with pytest.raises(DiskGone):
            service.expire(rt.engine)
        fault["armed"] = False
        assert rt.store.get_run(paused.run_id).status == "failed"
        assert states(rt, paused.run_id) == {1: "approved", 2: "asked"}
        # A repeat of ann's approval finishes the end first, then is told the run expired.
        with pytest.raises(NotPaused) as late:
            await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert "failed (run_expired)" in late.value.message and "was not sent" in late.value.message
        run = rt.store.get_run(paused.run_id)
        assert run.pending is None and run.error["code"] == "run_expired" and run.result["status"] == "failed"
        assert states(rt, paused.run_id) == {1: "declined", 2: "asked"} and rec.deliveries == []
        assert "[write_expired]" in rt.store.get_call(paused.run_id, 1).error["message"]
        assert all(w.status != "pending" for w in rt.store.list_waits(run_id=paused.run_id, status=None))

        # Nobody retrying: recovery finishes it.
        other = await rt.execute(TWO)
        await rt.decide(other.run_id, {2: "approve"}, actor="ann")
        clock.now = other.expires_at + 1
        fault["armed"] = True
        with pytest.raises(DiskGone):
            service.expire(rt.engine)
        fault["armed"] = False
        done = await rt.recover()
        assert [(r.run_id, r.error["code"]) for r in done] == [(other.run_id, "run_expired")]
        assert states(rt, other.run_id) == {1: "asked", 2: "declined"} and rec.deliveries == []
        assert all(w.status != "pending" for w in rt.store.list_waits(run_id=other.run_id, status=None))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_a_rollback_cut_between_its_plan_and_the_declines_is_carried_out_by_a_retry(backend, request):
    """decline_and_undo records its plan with the run's move to running, then declines the pause's writes as it
    carries the plan out: a process stopped between the two leaves the writes asked on a run being rolled back.
    A repeat of the decision takes the rollback over once its owner's lease lapsed and carries it out here."""
    url = url_of(backend, request)
    rec = Recorder()
    clock = Clock()
    async with make_runtime(url, rec, clock=clock) as a, make_runtime(url, rec, clock=clock) as b:
        paused = await a.execute(TWO)
        fault = cut_after_plan(a.store)
        with pytest.raises(DiskGone):
            await service.decide(a.engine, paused.run_id, {1: ("decline_and_undo", "no")}, actor="ben")
        fault["armed"] = False  # the plan stored; a stopped before recording the decision or carrying it out
        assert states(a, paused.run_id) == {1: "asked", 2: "asked"}
        clock.now += 3600  # a's lease lapsed
        done = await b.decide(paused.run_id, {1: ("decline_and_undo", "no")}, actor="ben")
        assert done.status == "rolled_back", done
        assert states(b, paused.run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
        assert_rolled_back_by_ben(b, paused.run_id, 1)
        with pytest.raises(NotPaused):
            await b.decide(paused.run_id, {2: "approve"})


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p53_a_rollback_cut_between_its_plan_and_the_declines_is_carried_out_by_recovery(backend, request):
    url = url_of(backend, request)
    rec = Recorder()
    clock = Clock()
    async with make_runtime(url, rec, clock=clock) as a, make_runtime(url, rec, clock=clock) as b:
        paused = await a.execute(TWO)
        fault = cut_after_plan(a.store)
        with pytest.raises(DiskGone):
            await service.decide(a.engine, paused.run_id, {2: ("decline_and_undo", "no")}, actor="ben")
        fault["armed"] = False
        assert states(a, paused.run_id) == {1: "asked", 2: "asked"}
        clock.now += 3600
        done = await b.recover()
        assert [(r.run_id, r.status) for r in done] == [(paused.run_id, "rolled_back")]
        assert states(b, paused.run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
        assert_rolled_back_by_ben(b, paused.run_id, 2)


def assert_rolled_back_by_ben(rt: Runtime, run_id: str, named: int) -> None:
    """The decision is named as it was taken, once, and no key of the pause is left open."""
    decision = service.recorded_decision(rt.engine, run_id, named)
    assert (decision.decision, decision.actor, decision.reason) == ("decline_and_undo", "ben", "no"), decision
    assert all(w.status != "pending" for w in rt.store.list_waits(run_id=run_id, status=None))
    decided = [e.data for e in rt.store.get_events(run_id) if e.type == "decided"]
    assert [(d["seq"], d["decision"], d["actor"]) for d in decided] == [(named, "decline_and_undo", "ben")], decided


async def test_p53_a_worker_serving_the_store_finishes_a_cut_cancel_in_its_maintenance_round(store_url):
    """`tether worker` / `tether serve`: the loop's first maintenance round finishes an end another process cut."""
    import asyncio

    from tether._engine.worker import Worker

    rec = Recorder()
    clock = Clock()
    async with make_runtime(store_url, rec, clock=clock) as a, make_runtime(store_url, rec, clock=clock) as b:
        fault = cut(a.store)
        run_id = await cancel_cut_in_half(a, fault)
        clock.now += 3600
        stop = asyncio.Event()
        loop = asyncio.ensure_future(Worker(b.engine).work(stop=stop, poll_seconds=0.05))
        for _ in range(200):
            if b.store.get_run(run_id).pending is None:
                break
            await asyncio.sleep(0.02)
        stop.set()
        await loop
        assert_cancelled_by_ben(b, rec, run_id)
