"""Admission control: slots, the line shared by principal (D-74), overload, cancellation, retry hints."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tether._server.admission import DEFAULT_RUN_SECONDS, MIN_RETRY_AFTER_MS, Admission
from tether.errors import Overloaded


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_slots_are_given_at_once_up_to_the_limit():
    adm = Admission(2, queue_depth=0, queue_timeout=1)
    a = await adm.acquire()
    b = await adm.acquire()
    assert adm.running == 2
    with pytest.raises(Overloaded):
        await adm.acquire()
    a.release()
    a.release()  # idempotent: one slot back, not two
    assert adm.running == 1
    b.release()
    assert adm.running == 0


async def test_waiters_get_slots_in_arrival_order():
    adm = Admission(1, queue_depth=5, queue_timeout=5)
    first = await adm.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        slot = await adm.acquire()
        order.append(i)
        slot.release()

    tasks = [asyncio.ensure_future(wait(i)) for i in range(5)]
    await settle()
    assert adm.queued == 5 and order == []
    first.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert adm.running == 0 and adm.queued == 0


async def test_a_newcomer_does_not_overtake_the_line():
    adm = Admission(1, queue_depth=2, queue_timeout=5)
    held = await adm.acquire()
    waiter = asyncio.ensure_future(adm.acquire())
    await settle()
    held.release()  # handed straight to the waiter: the count never dips
    assert adm.running == 1
    newcomer = asyncio.ensure_future(adm.acquire())
    await settle()
    assert waiter.done() and not newcomer.done()
    (await waiter).release()
    (await newcomer).release()
    assert adm.running == 0


async def test_beyond_the_queue_fails_fast_with_a_retry_hint():
    adm = Admission(2, queue_depth=2, queue_timeout=30)
    slots = [await adm.acquire() for _ in range(2)]
    queued = [asyncio.ensure_future(adm.acquire()) for _ in range(2)]
    await settle()
    with pytest.raises(Overloaded) as info:
        await adm.acquire()
    err = info.value
    assert err.code == "overloaded"
    assert err.details["retry_after_ms"] >= MIN_RETRY_AFTER_MS
    assert err.details["running"] == 2 and err.details["queued"] == 2
    for s in slots:
        s.release()
    for q in queued:
        (await q).release()
    assert adm.running == 0


async def test_waiting_longer_than_the_queue_timeout_fails_and_leaves_the_queue():
    adm = Admission(1, queue_depth=4, queue_timeout=0.01)
    held = await adm.acquire()
    with pytest.raises(Overloaded) as info:
        await adm.acquire()
    assert "waited" in info.value.message
    assert info.value.details["retry_after_ms"] >= MIN_RETRY_AFTER_MS
    assert adm.queued == 0
    held.release()
    assert adm.running == 0


async def test_a_request_cancelled_while_queued_never_starts():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire()
    started: list[str] = []

    async def run(name: str) -> None:
        async with adm.slot():
            started.append(name)

    doomed = asyncio.ensure_future(run("doomed"))
    patient = asyncio.ensure_future(run("patient"))
    await settle()
    doomed.cancel()
    await settle()
    assert adm.queued == 1
    held.release()
    await patient
    assert doomed.cancelled()
    assert started == ["patient"]
    assert adm.running == 0 and adm.queued == 0


async def test_a_slot_granted_to_a_cancelled_waiter_passes_to_the_next():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire()
    first = asyncio.ensure_future(adm.acquire())
    second = asyncio.ensure_future(adm.acquire())
    await settle()
    held.release()  # grants `first` ...
    first.cancel()  # ... which is cancelled before it runs again
    await settle()
    assert first.cancelled()
    slot = await second
    assert adm.running == 1
    slot.release()
    assert adm.running == 0


async def test_retry_after_follows_recent_run_durations():
    clock = FakeClock()
    adm = Admission(2, queue_depth=0, queue_timeout=1, clock=clock)
    assert adm.retry_after_ms() == round(DEFAULT_RUN_SECONDS / 2 * 1000)
    for seconds in (4.0, 4.0, 4.0, 100.0):  # one outlier does not move the median
        slot = await adm.acquire()
        clock.now += seconds
        slot.release()
    # one newcomer, two slots, runs of ~4 s: a slot frees in about 2 s
    assert adm.retry_after_ms() == 2000
    a, b = await adm.acquire(), await adm.acquire()
    with pytest.raises(Overloaded) as info:
        await adm.acquire()
    assert info.value.details["retry_after_ms"] == 2000
    a.release()
    b.release()


async def test_ten_at_once_with_two_slots_and_a_queue_of_two():
    adm = Admission(2, queue_depth=2, queue_timeout=30)
    ran: list[int] = []
    gate = asyncio.Event()

    async def job(i: int) -> str:
        try:
            async with adm.slot():
                ran.append(i)
                await gate.wait()
                return "ok"
        except Overloaded as exc:
            assert exc.details["retry_after_ms"] > 0
            return "overloaded"

    tasks = [asyncio.ensure_future(job(i)) for i in range(10)]
    await settle()
    gate.set()
    outcomes = await asyncio.gather(*tasks)
    assert outcomes.count("ok") == 4 and outcomes.count("overloaded") == 6
    assert sorted(ran) == [0, 1, 2, 3]  # first come, first served; none twice
    assert adm.running == 0 and adm.queued == 0


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        Admission(0, queue_depth=1, queue_timeout=1)
    with pytest.raises(ValueError):
        Admission(1, queue_depth=-1, queue_timeout=1)


# -- shared by principal (D-74) --------------------------------------------------------------


def in_line(adm: Admission, principal: str | None, order: list[str], name: str,
            gate: asyncio.Event | None = None) -> asyncio.Future[None]:
    """A request of ``principal`` that records ``name`` when it gets its slot, and gives it back (once ``gate`` is set)."""

    async def run() -> None:
        async with adm.slot(principal):
            order.append(name)
            if gate is not None:
                await gate.wait()

    return asyncio.ensure_future(run())


async def test_d74_another_principals_one_request_gets_the_next_freed_slot():
    adm = Admission(2, queue_depth=8, queue_timeout=30)
    held = [await adm.acquire("A"), await adm.acquire("A")]
    order: list[str] = []
    gate = asyncio.Event()
    a_waiting = [in_line(adm, "A", order, f"a{i}", gate) for i in range(5)]
    await settle()
    b = in_line(adm, "B", order, "b", gate)
    await settle()
    assert adm.queued == 6 and adm.queued_for("A") == 5 and adm.queued_for("B") == 1
    held[0].release()
    await settle()
    assert order == ["b"]  # before any of A's five, which came first
    assert adm.running_for("B") == 1 and adm.queued_for("A") == 5
    gate.set()
    held[1].release()
    await asyncio.gather(b, *a_waiting)
    assert order == ["b", "a0", "a1", "a2", "a3", "a4"]
    assert adm.running == 0 and adm.queued == 0 and adm.principals == 0


async def test_d74_slots_go_round_robin_over_three_principals_fifo_within_each():
    adm = Admission(1, queue_depth=9, queue_timeout=30)
    held = await adm.acquire("A")
    order: list[str] = []
    # A queues all of its requests first, then B, then C.
    tasks = [in_line(adm, p, order, f"{p.lower()}{i}") for p in "ABC" for i in range(3)]
    await settle()
    assert adm.queued == 9 and order == []
    held.release()
    await asyncio.gather(*tasks)
    # A was just served (its held slot); B and C had none: they come first, then turns.
    assert order == ["b0", "c0", "a0", "b1", "c1", "a1", "b2", "c2", "a2"]
    assert adm.principals == 0


async def test_d74_requests_without_a_principal_are_one_principal_local():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire()
    assert adm.running_for("local") == 1 and adm.running_for(None) == 1
    order: list[str] = []
    tasks = [in_line(adm, None, order, "n0"), in_line(adm, "local", order, "l1"), in_line(adm, "B", order, "b")]
    await settle()
    assert adm.queued_for(None) == 2 and adm.principals == 2
    held.release()
    await asyncio.gather(*tasks)
    assert order == ["b", "n0", "l1"]


async def test_d74_a_freed_slot_goes_to_the_waiting_principal_holding_fewest():
    adm = Admission(4, queue_depth=8, queue_timeout=30)
    a_held = [await adm.acquire("A") for _ in range(3)]
    b_held = await adm.acquire("B")
    order: list[str] = []
    gate = asyncio.Event()
    a0 = in_line(adm, "A", order, "a0", gate)
    await settle()
    b0 = in_line(adm, "B", order, "b0", gate)
    await settle()
    # A frees one of its three: B, holding one, is further from its share than A with two, though A came first.
    a_held[0].release()
    await settle()
    assert order == ["b0"] and adm.running_for("A") == 2 and adm.running_for("B") == 2
    a_held[1].release()  # A at one, B at two: A's turn
    await settle()
    assert order == ["b0", "a0"]
    gate.set()
    b_held.release()
    a_held[2].release()
    await asyncio.gather(a0, b0)
    assert adm.running == 0 and adm.principals == 0


async def test_d74_one_principal_filling_the_line_cannot_make_anothers_request_fail():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("A")
    order: list[str] = []
    a_waiting = [in_line(adm, "A", order, f"a{i}") for i in range(4)]
    await settle()
    with pytest.raises(Overloaded) as own:  # A's own fifth meets A's own full line
        await adm.acquire("A")
    assert "with your own programs: you have 1 program running and 4 waiting" in own.value.message
    assert own.value.message.endswith("this program was not started")
    assert own.value.details["your_queued"] == 4 and own.value.details["retry_after_ms"] >= MIN_RETRY_AFTER_MS
    b = in_line(adm, "B", order, "b")
    await settle()
    # A's latest gave its place to B's request, and said so to A's caller.
    assert a_waiting[3].done()
    with pytest.raises(Overloaded) as gave:
        a_waiting[3].result()
    err = gave.value
    assert err.code == "overloaded" and "gave up its place" in err.message and "not started" in err.message
    assert err.details["your_queued"] == 3 and err.details["retry_after_ms"] >= MIN_RETRY_AFTER_MS
    held.release()
    await asyncio.gather(b, *a_waiting[:3])
    assert order == ["b", "a0", "a1", "a2"]
    assert adm.running == 0 and adm.queued == 0 and adm.principals == 0


async def test_d74_a_full_line_is_shared_evenly_and_stays_so():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("A")
    order: list[str] = []
    waiting: dict[str, list[asyncio.Future[None]]] = {p: [] for p in "ABC"}

    def enter(p: str) -> None:
        waiting[p].append(in_line(adm, p, order, f"{p.lower()}{len(waiting[p])}"))

    for _ in range(4):
        enter("A")
    await settle()
    enter("B")
    enter("B")  # A still has two more than B: takes another of A's places
    await settle()
    assert (adm.queued_for("A"), adm.queued_for("B")) == (2, 2)
    enter("B")  # even now: no place is given up, B's third is refused
    await settle()
    with pytest.raises(Overloaded) as info:
        waiting["B"][2].result()
    assert "shared evenly" in info.value.message
    enter("C")  # C has none: A and B have two each, A holds the slot too, so A gives up a place
    await settle()
    assert (adm.queued_for("A"), adm.queued_for("B"), adm.queued_for("C")) == (1, 2, 1)
    given_up = [t for t in waiting["A"] if t.done()]
    assert len(given_up) == 3  # A's latest three, each told so
    held.release()
    await asyncio.gather(waiting["A"][0], *waiting["B"][:2], waiting["C"][0])
    assert order == ["b0", "c0", "a0", "b1"]
    assert adm.running == 0 and adm.queued == 0 and adm.principals == 0


async def test_d74_retry_after_counts_the_turns_ahead_of_the_caller():
    clock = FakeClock()
    adm = Admission(1, queue_depth=8, queue_timeout=30, clock=clock)
    for _ in range(3):
        slot = await adm.acquire("A")
        clock.now += 2.0
        slot.release()
    held = await adm.acquire("A")
    tasks = [asyncio.ensure_future(adm.acquire("A")) for _ in range(4)]
    await settle()
    # B's next request waits behind one of A's (turns alternate), A's behind its own four: runs of 2 s.
    assert adm.retry_after_ms("B") == 2 * 2000
    assert adm.retry_after_ms("A") == 5 * 2000
    for t in tasks:
        t.cancel()
    await settle()
    held.release()
    assert adm.principals == 0


async def test_d74_timeout_is_per_request_and_leaves_the_other_principals_line_alone():
    adm = Admission(1, queue_depth=4, queue_timeout=0.05)
    held = await adm.acquire("A")
    a_next = asyncio.ensure_future(adm.acquire("A"))
    with pytest.raises(Overloaded) as info:
        await adm.acquire("B")
    assert "waited" in info.value.message and info.value.message.endswith("this program was not started")
    assert info.value.details["your_queued"] == 0
    assert adm.queued_for("B") == 0 and adm.running_for("B") == 0
    with pytest.raises(Overloaded):
        await a_next  # A's own waited as long
    held.release()
    assert adm.principals == 0 and adm.running == 0


async def test_d74_a_cancelled_waiter_never_starts_and_the_slot_goes_to_the_next_principal():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("A")
    order: list[str] = []
    doomed = in_line(adm, "B", order, "b-doomed")
    a_next = in_line(adm, "A", order, "a")
    await settle()
    doomed.cancel()
    await settle()
    assert adm.queued == 1 and adm.queued_for("B") == 0 and adm.principals == 1
    held.release()
    await a_next
    assert doomed.cancelled() and order == ["a"]
    assert adm.principals == 0


async def test_d74_a_slot_granted_to_a_cancelled_waiter_passes_to_another_principal():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("A")
    first = asyncio.ensure_future(adm.acquire("B"))
    second = asyncio.ensure_future(adm.acquire("A"))
    await settle()
    held.release()  # B's turn: granted, the count never dips ...
    assert adm.running == 1 and adm.running_for("B") == 1
    first.cancel()  # ... and cancelled before it runs again: the slot goes on to A
    await settle()
    assert first.cancelled()
    slot = await second
    assert adm.running == 1 and adm.running_for("A") == 1 and adm.running_for("B") == 0
    slot.release()
    assert adm.running == 0 and adm.principals == 0


async def test_d74_a_newcomer_of_another_principal_does_not_overtake_the_line():
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("A")
    waiter = asyncio.ensure_future(adm.acquire("B"))
    await settle()
    held.release()  # straight to B's waiter
    newcomer = asyncio.ensure_future(adm.acquire("C"))
    await settle()
    assert waiter.done() and not newcomer.done() and adm.running == 1
    (await waiter).release()
    (await newcomer).release()
    assert adm.running == 0 and adm.principals == 0


async def test_d74_many_principals_arriving_and_leaving_leave_nothing_behind():
    # Termination: whatever principals come, wait, give up or are pushed out, the per-principal
    # table holds only those holding or waiting for a slot, and is empty once they are gone.
    rng = random.Random(74)
    adm = Admission(3, queue_depth=6, queue_timeout=30)
    gate = asyncio.Event()
    outcomes: list[str] = []

    async def job(principal: str) -> None:
        try:
            async with adm.slot(principal):
                await gate.wait()
            outcomes.append("ran")
        except Overloaded:
            outcomes.append("overloaded")

    live: list[asyncio.Future[None]] = []
    for i in range(400):
        principal = f"p{rng.randrange(60)}"
        live.append(asyncio.ensure_future(job(principal)))
        if rng.random() < 0.5 and live:
            live.pop(rng.randrange(len(live))).cancel()
        if i % 50 == 49:
            gate.set()  # let what holds a slot finish, then close the gate again
            await settle()
            gate.clear()
        await settle()
        assert adm.principals <= adm.max_running + adm.queue_depth
        assert len(adm._left) <= adm.max_running + adm.queue_depth  # who left, remembered for their turn: bounded
        assert adm.queued <= adm.queue_depth and adm.running <= adm.max_running
    for t in live:
        t.cancel()
    await asyncio.gather(*live, return_exceptions=True)
    assert adm.running == 0 and adm.queued == 0 and adm.principals == 0
    assert adm._shares == {}
    assert "ran" in outcomes and "overloaded" in outcomes


async def test_d74_a_slot_handed_over_as_the_timeout_fires_is_used():
    adm = Admission(1, queue_depth=4, queue_timeout=0.5)
    held = await adm.acquire("A")
    waiter = asyncio.ensure_future(adm.acquire("B"))
    await settle()
    loop = asyncio.get_running_loop()
    loop.call_at(loop.time() + 0.01, held.release)  # due before the waiter's timeout ...
    # ... and blocking the loop past both makes them run in one pass: the release first, then the
    # timeout, before the waiter wakes. Its slot is used, not lost.
    time.sleep(0.8)  # noqa: ASYNC251 - blocking the loop is the point here
    slot = await waiter
    assert adm.running == 1 and adm.running_for("B") == 1 and adm.principals == 1
    slot.release()
    assert adm.running == 0 and adm.principals == 0


async def test_d74_a_decision_from_the_console_waits_for_a_slot_as_the_run_owner(rt, rec):
    from tether._server.approvals import Decider

    paused = await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=3)\n'done'", principal="token:bob")
    assert paused.status == "paused"
    adm = Admission(1, queue_depth=2, queue_timeout=30)
    held = await adm.acquire("token:alice")
    alice = [asyncio.ensure_future(adm.acquire("token:alice")) for _ in range(2)]
    await settle()
    decider = Decider(rt, adm, settle_seconds=0.05)
    try:
        out = await decider.decide(paused.run_id, [paused.pending["seq"]], "approve", None,
                                   principal=rt.store.get_run(paused.run_id).principal, who="carol", via="console")
        assert out.ok and out.status == "queued"
        # The decision waits as bob's, the run's owner: it took alice's latest place in the full line ...
        assert adm.queued_for("token:bob") == 1 and adm.queued_for("token:alice") == 1
        with pytest.raises(Overloaded):
            alice[1].result()
        held.release()
        # ... and gets the slot alice frees before alice's earlier waiter.
        assert adm.running_for("token:bob") == 1 and not alice[0].done()
    finally:
        await decider.close()
    assert rec.deliveries == [("close_ticket", {"id": 3})]
    (await alice[0]).release()
    assert adm.running == 0 and adm.principals == 0


async def test_d74_a_principal_that_leaves_the_line_between_runs_does_not_jump_ahead_on_return():
    """D-74, attacked: a principal timing its requests at the hand-over — asking again only once its slot is
    back, so it holds and waits for nothing in between — must not count as "never served" each time and take
    every other slot from principals that keep waiting. Its turns stay one in three among three."""
    adm = Admission(1, queue_depth=40, queue_timeout=30)
    held = await adm.acquire("B")
    order: list[str] = []
    waiting = [in_line(adm, p, order, p) for _ in range(12) for p in "BC"]
    await settle()

    async def churn() -> None:
        for _ in range(12):
            async with adm.slot("A"):
                order.append("A")
            # Nothing held, nothing waiting: A's entry goes, and A asks again at once.
            assert adm.running_for("A") == 0 and adm.queued_for("A") == 0

    a = asyncio.ensure_future(churn())
    await settle()
    held.release()
    await asyncio.gather(a, *waiting)
    first = order[:18]
    assert first.count("A") <= 7, first  # an even share is 6 of 18; jumping ahead gave A 9
    assert adm.principals == 0


async def test_d74_join_and_cancel_churn_cannot_push_out_anothers_oldest_waiter_nor_take_its_turn():
    """D-74, attacked: B asks and cancels 50 times against a line A filled. Each ask may take the place of A's
    latest waiter (told so), never A's oldest, which gets the next freed slot: churn costs A queued requests beyond
    an even share, not its turn."""
    adm = Admission(1, queue_depth=4, queue_timeout=30)
    held = await adm.acquire("C")
    order: list[str] = []
    a_waiting = [in_line(adm, "A", order, f"a{i}") for i in range(4)]
    await settle()
    for _ in range(50):
        churn = asyncio.ensure_future(adm.acquire("B"))
        await settle()
        churn.cancel()
        await asyncio.gather(churn, return_exceptions=True)
        # A refills what it lost, as a client told "gave up its place" retries.
        for i, t in enumerate(a_waiting):
            if t.done():
                a_waiting[i] = in_line(adm, "A", order, f"a{i}")
        await settle()
        assert not a_waiting[0].done() and adm.queued_for("B") == 0
    held.release()
    await settle()
    assert order[:1] == ["a0"]
    await asyncio.gather(*a_waiting)
    assert adm.running == 0 and adm.queued == 0 and adm.principals == 0


async def test_d74_an_overloaded_answer_names_no_other_principal_whatever_its_name():
    """D-74: a principal id is only a key (a token's hash, an OAuth issuer and subject of any length and
    characters); what one principal is told names no other and gives no other's counts but the server's totals."""
    odd = "oauth:https://idp.example#" + "\u202e\x00'\"[].%s{}" * 2000
    adm = Admission(1, queue_depth=2, queue_timeout=30)
    held = await adm.acquire(odd)
    waiting = [asyncio.ensure_future(adm.acquire(odd)) for _ in range(2)]
    await settle()
    assert adm.running_for(odd) == 1 and adm.queued_for(odd) == 2
    with pytest.raises(Overloaded) as b_told:  # B's second meets a line shared evenly (A 1, B 1)
        b_first = asyncio.ensure_future(adm.acquire("token:b"))
        await settle()
        await adm.acquire("token:b")
    told = [b_told.value]
    with pytest.raises(Overloaded) as a_told:  # A's latest gave its place to B's first
        waiting[1].result()
    told.append(a_told.value)
    for err, other in ((b_told.value, odd), (a_told.value, "token:b")):
        shown = err.message + repr(err.details)
        assert other not in shown and other[:20] not in shown
        assert set(err.details) == {"retry_after_ms", "running", "queued", "max_running", "queue_depth",
                                    "your_running", "your_queued"}
    assert b_told.value.details["your_queued"] == 1 and a_told.value.details["your_running"] == 1
    held.release()
    await settle()
    assert b_first.done() and not waiting[0].done()  # B held none: its one request goes first
    b_first.result().release()
    (await waiting[0]).release()
    assert adm.principals == 0
