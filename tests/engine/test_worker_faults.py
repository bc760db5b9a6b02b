"""A store that fails during a worker's claim round ends that round, never the worker (P-11).

``Worker.work`` is the loop of ``tether serve`` and ``tether worker``: each round it ends paused runs past
their approval time to live, then claims orphans, due runs and queued runs. The store here is the real one
(SQLite and Postgres) with one of its reads failing as a lost connection would, for the first rounds.
Before, the failure left ``work()`` with the exception: the worker stopped for good, and nothing queued was
run again until someone restarted it.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import pytest

from helpers import Clock, Recorder
from tether._engine.outage import MAX_BACKOFF_SECONDS, SUMMARY_SECONDS
from tether._engine.worker import Worker
from tether._runtime import Runtime
from tether.errors import StoreError

CLOSE = "import tools\nawait tools.helpdesk.close_ticket(id=1)\n'closed'"


def failing(store, name: str, times: int) -> dict[str, int]:
    """Make ``store.<name>`` fail ``times`` times with the store's own error, then work again."""
    real = getattr(store, name)
    count = {"left": times, "calls": 0}

    def call(*args, **kwargs):
        count["calls"] += 1
        if count["left"] > 0:
            count["left"] -= 1
            raise StoreError(f"the store at {getattr(store, 'where', 'here')} failed: connection lost")
        return real(*args, **kwargs)

    setattr(store, name, call)
    return count


@pytest.mark.parametrize("fails", ["paused_runs_past_expiry", "claim_queued"])
async def test_p11_a_store_failing_in_a_claim_round_is_logged_with_its_code_and_the_worker_goes_on(
        backend, capsys, fails):
    rec = Recorder()
    clock = Clock()
    store = backend.store()
    async with Runtime(store=store, tools=rec.tools(), clock=clock, type_check=False) as rt:
        paused = await rt.execute(CLOSE)
        assert paused.status == "paused"
        queued = rt.start("1 + 1")
        clock.now += rt.engine.settings.approval_ttl_seconds + 1
        count = failing(store, fails, times=2)
        handled = await Worker(rt.engine).work(poll_seconds=0.02, idle_exit_seconds=0.3)
        assert count["calls"] > 2  # asked again after each failed round
        assert handled == 1
        assert store.get_run(queued).status == "completed"
        expired = store.get_run(paused.run_id)
        assert expired.status == "failed" and expired.error["code"] == "run_expired"
    assert rec.deliveries == []
    err = capsys.readouterr().err
    # Said once with its code, the repeat counted (D-92), and the store's return said.
    assert err.count("failed [store_error]") == 1, err
    assert "trying again, rounds backing off" in err
    assert "the store answers again after 2 failed rounds" in err


class Rounds:
    """A worker's pause between rounds that waits for nothing: it records each wait asked for and moves the
    clock by it, so a test counts rounds and reads the backoff without sleeping through it."""

    def __init__(self, clock: Clock, stop: asyncio.Event, *, until: int) -> None:
        self.clock, self.stop, self.until = clock, stop, until
        self.waits: list[float] = []
        self.after: list[Callable[[int], None]] = []

    async def __call__(self, stop: asyncio.Event, nudge: asyncio.Event, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.now += seconds
        for hook in self.after:
            hook(len(self.waits))
        if len(self.waits) >= self.until:
            self.stop.set()
        await asyncio.sleep(0)


async def test_d92_a_store_down_for_many_rounds_is_said_once_summarised_backed_off_and_its_return_said(
        backend, capsys):
    """A store failing every round for K rounds: a bounded number of lines (not ~2 per round), rounds backing off
    up to MAX_BACKOFF_SECONDS, and once it answers again the next round comes at the usual pace and runs what
    was queued meanwhile."""
    clock = Clock()
    store = backend.store()
    failing_rounds = 200
    async with Runtime(store=store, tools=Recorder().tools(), clock=clock, type_check=False) as rt:
        expiring = failing(store, "paused_runs_past_expiry", times=failing_rounds)
        claiming = failing(store, "claim_queued", times=failing_rounds)
        stop = asyncio.Event()
        worker = Worker(rt.engine)
        rounds = worker.pause = Rounds(clock, stop, until=failing_rounds + 3)
        queued: list[str] = []
        # Queued while the store is down, a round before it answers again.
        rounds.after.append(lambda n: queued.append(rt.start("1 + 1")) if n == failing_rounds - 1 else None)
        # Claimed by the first round the store answers (round failing_rounds + 1), no backoff waited out first.
        seen: list[str] = []
        rounds.after.append(lambda n: seen.append(store.get_run(queued[0]).status) if n == failing_rounds + 1 else None)
        handled = await worker.work(stop=stop, poll_seconds=0.2)
        assert seen and seen[0] != "queued", seen
        assert expiring["calls"] > failing_rounds and claiming["calls"] > failing_rounds
        assert handled == 1 and store.get_run(queued[0]).status == "completed"
    waits = rounds.waits
    # Backing off: doubling from the usual pace, then held at the cap.
    assert waits[:5] == [0.4, 0.8, 1.6, 3.2, MAX_BACKOFF_SECONDS], waits[:8]
    assert set(waits[4:failing_rounds]) == {MAX_BACKOFF_SECONDS}
    # The first round the store answers (failing_rounds + 1) claims the queued run; the next waits the usual 0.2 s.
    assert waits[failing_rounds:] == [0.2, 0.2, 0.2], waits[failing_rounds - 2:]
    err = capsys.readouterr().err
    lines = err.splitlines()
    first = [ln for ln in lines if "failed [store_error]" in ln]
    assert len(first) == 2, err  # the expiry and the claim, each said once with its code
    summaries = [ln for ln in lines if "failed again" in ln]
    # ~990 s of failing rounds on the clock: each failure summarised once a minute, not said each round.
    outage = sum(waits[:failing_rounds])
    assert len(summaries) == 2 * int(outage // SUMMARY_SECONDS), err
    assert "claiming work failed again" in summaries[-1] and "[store_error] since" in summaries[-1], err
    assert len(lines) == len(first) + len(summaries) + 1 < failing_rounds // 5, err
    assert sum("the store answers again after 200 failed rounds since" in ln for ln in lines) == 1, err
