"""D-89: a call's deadlines stop while a person answers its question, and get back the time they had left."""

from __future__ import annotations

import asyncio

from tether._tools.clocks import CallClocks


async def test_d89_a_held_deadline_gets_back_what_it_had_left_and_nested_holds_count_once():
    loop = asyncio.get_running_loop()
    clocks = CallClocks()
    async with asyncio.timeout(0.3) as scope:
        clocks.watch(scope)
        clocks.watch(scope)  # watched once however often it is given
        with clocks.held():
            assert scope.when() is None and clocks.holding
            with clocks.held():  # two questions of one call at once
                await asyncio.sleep(0.2)
            assert scope.when() is None  # still held by the outer question
            await asyncio.sleep(0.2)
        left = scope.when() - loop.time()
        assert 0.2 < left <= 0.3  # the 0.4 s held did not count
        assert 0.35 < clocks.held_seconds < 1.0 and not clocks.holding
    # Outside the hold the clock runs as before: past its time the call ends.
    try:
        async with asyncio.timeout(0.05) as scope:
            clocks.watch(scope)
            await asyncio.sleep(1)
        raise AssertionError("the deadline did not fire")
    except TimeoutError:
        pass


async def test_d89_a_scope_the_call_already_left_is_not_moved():
    clocks = CallClocks()
    async with asyncio.timeout(5) as scope:
        clocks.watch(scope)
        await asyncio.sleep(0)
    with clocks.held():  # the call ended (cancelled) while its question was out: nothing to stop or restart
        pass
    assert scope.when() is not None
