"""A store that fails during a worker's claim round ends that round, never the worker (P-11).

``Worker.work`` is the loop of ``tether serve`` and ``tether worker``: each round it ends paused runs past
their approval time to live, then claims orphans, due runs and queued runs. The store here is the real one
(SQLite and Postgres) with one of its reads failing as a lost connection would, for the first rounds.
Before, the failure left ``work()`` with the exception: the worker stopped for good, and nothing queued was
run again until someone restarted it.
"""

from __future__ import annotations

import pytest

from helpers import Clock, Recorder
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
    assert err.count("failed [store_error]") == 2, err
    assert "trying again next round" in err
