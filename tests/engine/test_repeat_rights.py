"""A repeated decision takes an ownerless run over only for a principal who may see the run (D-90, D-91, P-39).

The repeat is judged against the journal and, when the run still `running` lost its owner, continues the run here
(launcher.rejoin). Another principal repeating the same decision on it must learn nothing and move nothing: not take
the run over, not count a takeover towards its quarantine, not continue it.
"""

from __future__ import annotations

import asyncio

import pytest

from helpers import Clock, Recorder
from tether._engine.calls import ledger
from tether._runtime import Runtime
from tether.errors import RunNotFound

CODE = "import tools\nawait tools.helpdesk.close_ticket(id=1)\n(await tools.helpdesk.get_ticket(id=2))['title']"


async def test_d91_another_principals_repeat_neither_takes_over_nor_continues_an_ownerless_run(backend):
    rec = Recorder()
    clock = Clock()
    async with Runtime(store=backend.store(), tools=rec.tools(), clock=clock, type_check=False) as rt:
        paused = await rt.execute(CODE, principal="alice")
        # Approved by alice, then the process continuing it stopped before sending: running, its lease gone.
        assert ledger.move(rt.engine.store, rt.engine.keyring, rt.store.get_call(paused.run_id, 1), ["asked"],
                           state="approved")
        assert rt.store.update_run(paused.run_id, ["paused"], status="running", owner="gone:1",
                                   lease_until=clock.now - 1, decision={"seq": 1, "decision": "approve"})
        with pytest.raises(RunNotFound):
            await asyncio.wait_for(rt.resume(paused.run_id, "approve", seq=1, principal="mallory"), 30)
        run = rt.store.get_run(paused.run_id)
        assert (run.status, run.owner) == ("running", "gone:1") and "takeovers" not in (run.meta or {})
        assert rec.deliveries == []
        # Its own principal's repeat continues it, as D-90 says.
        done = await asyncio.wait_for(rt.resume(paused.run_id, "approve", seq=1, principal="alice"), 60)
        assert (done.status, done.result) == ("completed", "ticket 2")
        assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_d91_p39_a_repeat_cannot_revive_a_run_at_its_quarantine_limit(backend):
    """A repeat's takeover is counted like a worker's: at `quarantine_after` the run ends `run_quarantined` and
    nothing of the program runs, however often the person (or an agent) repeats the decision."""
    from tether._engine.rules.limits import Limits

    rec = Recorder()
    clock = Clock()
    async with Runtime(store=backend.store(), tools=rec.tools(), clock=clock, type_check=False,
                       limits=Limits(quarantine_after=2)) as rt:
        paused = await rt.execute(CODE)
        assert ledger.move(rt.engine.store, rt.engine.keyring, rt.store.get_call(paused.run_id, 1), ["asked"],
                           state="approved")
        before = [{"owner": "gone:0", "ended": "process_gone", "noticed_at": clock.now, "taken_by": "x"}]
        assert rt.store.update_run(paused.run_id, ["paused"], status="running", owner="gone:1",
                                   lease_until=clock.now - 1, decision={"seq": 1, "decision": "approve"},
                                   meta={**rt.store.get_run(paused.run_id).meta, "takeovers": before})
        r = await asyncio.wait_for(rt.resume(paused.run_id, "approve", seq=1), 60)
        assert (r.status, r.error["code"]) == ("failed", "run_quarantined"), r.error
        again = await asyncio.wait_for(rt.resume(paused.run_id, "approve", seq=1), 60)
        assert (again.status, again.error["code"]) == ("failed", "run_quarantined")
        assert rec.deliveries == []
