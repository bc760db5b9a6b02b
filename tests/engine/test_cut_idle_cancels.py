"""A cancel of a queued or waiting run cut before its envelope is finished by a retry and by recovery (D-90, P-53).

Cancelling a run nobody executes is two steps: the run's move to ``cancelled`` (``Lifecycle.cancel_idle``),
then its waits cancelled and its envelope written. Here the store fails between the two (every later write
refused, as a disk gone would) and the process carries on. Before, such a run stayed ``cancelled`` with the
envelope it had before (a waiting run's ``waiting`` one, a queued run's none): ``rt.cancel`` again returned
that stale envelope, ``await`` answered ``waiting`` for a cancelled run or waited out its timeout, its wait stayed
open, and recovery never looked at it. On SQLite and Postgres.
"""

from __future__ import annotations

import pytest

from helpers import Clock, Recorder
from helpers import batched_runtime as make_runtime
from helpers import store_url_of as url_of
from tether._runtime import Runtime

BACKENDS = ["sqlite", "postgres"]
WAITING = 'v = await wait_for_signal("go")\n["got", v]'


class DiskGone(RuntimeError):
    pass


def cut_after_cancel(store) -> dict[str, bool]:
    """While ``armed``: once a run's move to ``cancelled`` is stored, every later write fails (the process stopped)."""
    real_update, real_settle = store.update_run, store.settle_wait
    fault = {"armed": False, "cut": False}

    def update_run(run_id, expect_status, **fields):
        if fault["cut"]:
            raise DiskGone("disk I/O error while writing the run")
        won = real_update(run_id, expect_status, **fields)
        if fault["armed"] and fields.get("status") == "cancelled" and "result" not in fields:
            fault["cut"] = True
        return won

    def settle_wait(wait):
        if fault["cut"]:
            raise DiskGone("disk I/O error while writing the wait")
        return real_settle(wait)

    store.update_run, store.settle_wait = update_run, settle_wait
    return fault


async def cancelled_in_half(rt: Runtime, fault: dict[str, bool], run_id: str) -> None:
    fault["armed"] = True
    with pytest.raises(DiskGone):
        await rt.cancel(run_id, "wrong customer")
    fault.update(armed=False, cut=False)
    assert rt.store.get_run(run_id).status == "cancelled"


def assert_cancelled(rt: Runtime, run_id: str) -> None:
    run = rt.store.get_run(run_id)
    assert run.owner is None and run.pending is None
    assert run.result["status"] == "cancelled" and run.error["code"] == "cancelled"
    assert "wrong customer" in run.error["message"] and run.result["error"] == run.error
    assert all(w.status != "pending" for w in rt.store.list_waits(run_id=run_id, status=None))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d90_p53_a_cut_cancel_of_a_waiting_run_is_finished_by_a_retry(backend, request):
    url = url_of(backend, request)
    clock = Clock()
    async with make_runtime(url, Recorder(), clock=clock) as rt:
        fault = cut_after_cancel(rt.store)
        waiting = await rt.execute(WAITING)
        assert waiting.status == "waiting"
        await cancelled_in_half(rt, fault, waiting.run_id)
        clock.now += 3600  # the process that cancelled stopped: its hold on the run lapsed
        # Waiting for the run answers at once with the end the cancel recorded, never the stale `waiting`.
        seen = await rt.engine.wait_for_run(waiting.run_id, timeout=5)
        assert seen.status == "cancelled" and seen.error["code"] == "cancelled", seen
        # `tether runs show` shows the same (its outcome is engine.recorded), not the wait's instructions.
        shown = rt.engine.recorded(rt.store.get_run(waiting.run_id))
        assert shown.status == "cancelled" and "wrong customer" in shown.error["message"] and not shown.instructions
        again = await rt.cancel(waiting.run_id, "again")
        assert again.status == "cancelled" and "wrong customer" in again.error["message"], again
        assert_cancelled(rt, waiting.run_id)
        # Its wait ended with it: a late signal finds nothing to wake.
        late = await rt.signal(waiting.run_id, "go", 1)
        assert late["status"] != "accepted", late
        assert (await rt.cancel(waiting.run_id)).to_dict() == again.to_dict()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d90_p53_a_cut_cancel_of_a_queued_run_is_finished_by_recovery_once_its_holder_stopped(backend,
                                                                                                   request):
    url = url_of(backend, request)
    clock = Clock()
    async with make_runtime(url, Recorder(), clock=clock) as a, make_runtime(url, Recorder(), clock=clock) as b:
        fault = cut_after_cancel(a.store)
        queued = a.start("1 + 1")
        await cancelled_in_half(a, fault, queued)
        # a still holds the run (its lease): another process leaves it to a, and no worker claims it.
        assert await b.recover() == []
        assert b.store.get_run(queued).result is None
        clock.now += 3600  # a's lease lapsed: a stopped
        done = await b.recover()
        assert [(r.run_id, r.status) for r in done] == [(queued, "cancelled")]
        assert_cancelled(b, queued)
        assert await b.recover() == []
        assert (await b.engine.wait_for_run(queued, timeout=5)).error["code"] == "cancelled"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d91_p53_a_late_signal_to_a_cut_cancelled_run_is_not_accepted_and_finishes_the_cancel(backend, request):
    """A resolution arriving after the cancel's move but before its envelope (the cut D-90 finishes) found the wait
    still open: it was `accepted` for a run that had ended, and left the cut as it was."""
    url = url_of(backend, request)
    clock = Clock()
    async with make_runtime(url, Recorder(), clock=clock) as rt:
        fault = cut_after_cancel(rt.store)
        waiting = await rt.execute(WAITING)
        await cancelled_in_half(rt, fault, waiting.run_id)
        clock.now += 3600  # the process that cancelled stopped: its hold on the run lapsed
        late = await rt.signal(waiting.run_id, "go", 1)
        assert late["status"] == "unknown_or_revoked" and "has ended" in late["next_action"], late
        assert_cancelled(rt, waiting.run_id)
