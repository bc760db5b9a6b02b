"""Late and repeated decisions (P-51): once a run's pause has ended, no decision is recorded on it.

An approver who read the run while it was paused (the console and approval
links answer at once and decide in the background; here ``decide`` is handed
the run as that approver read it) decides after another person cancelled it,
rolled it back (P-46), or after it expired. Each gets ``not_paused`` saying how
the run ended and that the write was not sent, and the journal never says
``approved`` for a write that was never sent. Both backends.
"""

from __future__ import annotations

import asyncio

import pytest

from helpers import CLOSE_TWO as TWO
from helpers import Clock, Recorder, write_states
from helpers import batched_runtime as make_runtime
from helpers import store_url_of as url_of
from tether._engine import control
from tether._engine.approvals import service
from tether._engine.approvals.model import (
    CONFLICT,
    ENDED,
    NOT_PENDING,
    REPEAT,
    TAKE,
    judge,
)
from tether._engine.inspect import run_timeline
from tether._runtime import Runtime
from tether.errors import AlreadyDecided, NotPaused

ONE = "import tools\nawait tools.helpdesk.close_ticket(id=1)\n'done'"
BACKENDS = ["sqlite", "postgres"]


def test_p51_judge_is_one_rule_for_every_door():
    """The pure rule every door and backend asks: a repeat is accepted at any time; a run that left its pause
    takes nothing but a repeat; a write decided otherwise conflicts; a cancel ends a pause whatever was taken."""
    live = dict(paused=True, in_pause=True, asked=True)
    assert judge("approve", None, **live) == TAKE
    assert judge("approve", "approve", **live) == REPEAT
    assert judge("decline", "approve", paused=True, in_pause=True, asked=False) == CONFLICT
    assert judge("cancel", "approve", paused=True, in_pause=True, asked=False) == TAKE
    assert judge("approve", None, paused=True, in_pause=False, asked=False) == NOT_PENDING
    ended = dict(paused=False, in_pause=False, asked=True)
    assert judge("approve", None, **ended) == ENDED  # expired, or mid-cancel: the entry still says asked
    assert judge("approve", "cancel", **ended) == ENDED
    assert judge("decline", "decline_and_undo", **ended) == ENDED
    assert judge("approve", "approve", **ended) == REPEAT
    assert judge("approve", "decline", **ended) == CONFLICT  # completed: a person declined this very write


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p51_an_approval_after_a_cancel_is_not_paused_and_never_journaled(backend, request):
    url = url_of(backend, request)
    rec = Recorder()
    async with make_runtime(url, rec) as a, make_runtime(url, rec) as b:
        paused = await a.execute(TWO)
        seen = await a.store.aio.get_run(paused.run_id)  # the late approver reads the run while it is paused
        await b.decide(paused.run_id, {2: ("cancel", "wrong customer")}, actor="ben", via="console")
        with pytest.raises(NotPaused) as late:
            await service.decide(a.engine, paused.run_id, {1: "approve"}, actor="ann", via="link", run=seen)
        message = late.value.message
        assert "was cancelled by ben via console (wrong customer)" in message, message
        assert "call 1 helpdesk.close_ticket was not sent" in message and "nothing was decided" in message
        # Named the same way with the run as it is now (a door that reads afresh).
        with pytest.raises(NotPaused) as fresh:
            await a.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert fresh.value.message == message
        assert write_states(a, paused.run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
        decided = [(d["seq"], d["decision"], d["actor"]) for d in run_timeline(a.store, paused.run_id)["decisions"]]
        assert ("approve" not in [d for _, d, _ in decided]) and (2, "cancel", "ben") in decided


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p51_an_approval_while_a_rollback_is_under_way_is_refused_and_the_write_ends_declined(backend, request):
    """decline_and_undo moves the run to running (its plan) before the pause's entries are declined: an approval
    landing in between moved the entry to `approved` on a run that would never send it."""
    url = url_of(backend, request)
    rec = Recorder()
    async with make_runtime(url, rec) as a, make_runtime(url, rec) as b:
        paused = await a.execute(TWO)
        seen = await a.store.aio.get_run(paused.run_id)
        rolling = await service.decide(b.engine, paused.run_id, {1: ("decline_and_undo", "no")}, actor="ben")
        assert isinstance(rolling, service.Resumed)  # recorded; not carried out yet
        assert write_states(a, paused.run_id) == {1: "asked", 2: "asked"}
        with pytest.raises(NotPaused) as late:
            await service.decide(a.engine, paused.run_id, {2: "approve"}, actor="ann", run=seen)
        assert "is being rolled back by ben via python (no)" in late.value.message, late.value.message
        assert "call 2 helpdesk.close_ticket was not sent" in late.value.message
        assert write_states(a, paused.run_id) == {1: "asked", 2: "asked"}
        from tether._engine import launcher

        done = await launcher.launch(b.engine, rolling.run, mode="continue").result()
        assert done.status == "rolled_back", done.error
        assert write_states(a, paused.run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
        with pytest.raises(NotPaused) as after:
            await a.decide(paused.run_id, {2: "approve"})
        assert "was rolled back by ben" in after.value.message


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p51_an_expired_run_takes_no_approval_and_an_approved_write_of_it_is_not_left_approved(backend,
                                                                                                     request):
    url = url_of(backend, request)
    rec = Recorder()
    clock = Clock()
    async with make_runtime(url, rec, clock=clock) as rt:
        paused = await rt.execute(TWO)
        await rt.decide(paused.run_id, {1: "approve"}, actor="ann")  # the pause still waits on write 2
        seen = await rt.store.aio.get_run(paused.run_id)
        clock.now = paused.expires_at + 1
        assert service.expire(rt.engine) == [paused.run_id]
        with pytest.raises(NotPaused) as late:
            await service.decide(rt.engine, paused.run_id, {2: "approve"}, actor="ben", run=seen)
        assert "failed (run_expired)" in late.value.message and "call 2 helpdesk.close_ticket was not sent" \
            in late.value.message, late.value.message
        states = write_states(rt, paused.run_id)
        assert states == {1: "declined", 2: "asked"} and rec.deliveries == []
        assert "[write_expired]" in rt.store.get_call(paused.run_id, 1).error["message"]
        # The approver of write 1 repeating it is told the same: the run ended, nothing was sent.
        with pytest.raises(NotPaused) as again:
            await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert "failed (run_expired)" in again.value.message and "was not sent" in again.value.message


@pytest.mark.parametrize("backend", BACKENDS)
async def test_p51_an_approval_racing_a_cancel_is_taken_before_it_or_refused_never_left_approved(backend, request):
    """Approval and cancel from two processes at once, the approval started from the run as read while paused:
    either the approval was taken first (and the cancel then declines the write) or it is refused `not_paused`;
    in every order the journal ends `declined`, nothing is sent, and `approve` is never recorded after the end."""
    url = url_of(backend, request)
    for i in range(6):
        rec = Recorder()
        async with make_runtime(url, rec) as a, make_runtime(url, rec) as b:
            paused = await a.execute(ONE)
            seen = await a.store.aio.get_run(paused.run_id)

            async def late_approve(after: float, rt: Runtime, run_id: str, seen) -> object:
                await asyncio.sleep(after)
                return await control.decide(rt.engine, run_id, {1: "approve"}, actor="ann", run=seen)

            got, _ = await asyncio.gather(late_approve(i * 0.002, a, paused.run_id, seen),
                                          b.cancel(paused.run_id, "stop"), return_exceptions=True)
            final = await a.engine.wait_for_run(paused.run_id)
            if final.status == "completed":  # the approval continued the run before the cancel
                assert rec.deliveries == [("close_ticket", {"id": 1})]
                continue
            assert final.status == "cancelled" and rec.deliveries == []
            assert write_states(a, paused.run_id) == {1: "declined"}
            if isinstance(got, BaseException):
                assert isinstance(got, NotPaused) and "was cancelled" in got.message, got
            else:
                assert got.status == "cancelled"  # taken first, then cancelled: the approver sees the end
            events = a.store.get_events(paused.run_id)
            ended_at = next(e.event_id for e in events if e.type == "decided" and e.data["decision"] == "cancel")
            approvals = [e.event_id for e in events if e.type == "decided" and e.data["decision"] == "approve"]
            assert all(x < ended_at for x in approvals), [(e.type, e.data) for e in events]


async def test_p51_a_conflicting_decision_on_a_completed_run_says_what_was_sent(store_url):
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(ONE)
        done = await rt.decide(paused.run_id, {1: "approve"}, actor="ann")
        assert done.status == "completed"
        with pytest.raises(AlreadyDecided) as late:
            await rt.decide(paused.run_id, {1: "decline"}, actor="ben")
        assert "already decided: approve; it was sent; the run has completed" in late.value.message
        again = await rt.decide(paused.run_id, {1: "approve"}, actor="ann")  # a repeat: accepted, the outcome
        assert again.to_dict() == done.to_dict() and len(rec.deliveries) == 1


async def test_p51_p29_a_write_approved_then_cancelled_with_its_pause_is_recorded_as_the_cancel_of_who_cancelled(
        store_url):
    """Approved by one person, then the pause cancelled by another before the run went on: the write's
    decision is the cancel, by whoever cancelled (its approval wait keeps the approval it was given); the
    timeline has both, in order."""
    rec = Recorder()
    async with make_runtime(store_url, rec) as rt:
        paused = await rt.execute(TWO)
        await rt.decide(paused.run_id, {1: "approve"}, actor="ann", via="link")
        await rt.decide(paused.run_id, {2: ("cancel", "stop")}, actor="ben", via="console")
        decision = service.recorded_decision(rt.engine, paused.run_id, 1)
        assert (decision.decision, decision.actor, decision.via, decision.reason) == ("cancel", "ben", "console", "stop")
        assert write_states(rt, paused.run_id) == {1: "declined", 2: "declined"} and rec.deliveries == []
        timeline = [(d["seq"], d["decision"], d["actor"]) for d in run_timeline(rt.store, paused.run_id)["decisions"]]
        assert timeline[0] == (1, "approve", "ann") and (1, "cancel", "ben") in timeline[1:]
