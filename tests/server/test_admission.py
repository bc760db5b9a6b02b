"""Admission control on its own: slots, the FIFO queue, overload, cancellation, retry hints."""

from __future__ import annotations

import asyncio

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
