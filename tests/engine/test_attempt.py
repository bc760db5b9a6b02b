"""An attempt works from the Engine alone: no Runtime is needed to run, pause and finish a run."""

from __future__ import annotations

import time
from typing import Any

import pytest

from helpers import Recorder
from tether._engine.attempt.driver import Attempt
from tether._engine.attempt.restore import SnapshotMismatch, plan_restore
from tether._engine.build import build_engine
from tether._engine.engine import Engine, Settings
from tether._engine.integrity import sign_run
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._sandbox.monty import SandboxPool
from tether._store import open_store
from tether._store.base import RunRecord
from tether._tools.catalog import Catalog


def collaborators(store: Any, catalog: Catalog, pool: SandboxPool) -> Engine:
    settings = Settings(principal="local", check="off", local_runs="private", approval_ttl_seconds=60.0,
                        checkpoint_every_calls=100, checkpoint_every_seconds=30.0)
    return build_engine(store=store, catalog=catalog, pool=pool, policy=Policy(), limits=Limits(),
                        settings=settings, owner="me", lease_seconds=30.0)


def new_run(d: Engine, code: str, policy: Policy) -> RunRecord:
    now = time.time()
    run = RunRecord(run_id="run_attempt_test", status="running", program=code,
                    environment={"clock": "2026-01-01T00:00:00+00:00", "seed": 7}, policy=policy.to_dict(),
                    limits=Limits().to_dict(), created_at=now, updated_at=now, principal="local", owner="me",
                    lease_until=now + 30, meta={"check": "calls"})
    run.mac = sign_run(d.keyring, run)
    d.store.create_run(run)
    return run


async def test_an_attempt_runs_pauses_and_finishes_with_the_engine_alone():
    rec = Recorder()
    catalog = Catalog()
    catalog.add_many(rec.tools())
    store = open_store("sqlite:///:memory:")
    pool = SandboxPool(max_workers=1)
    await pool.start()
    try:
        d = collaborators(store, catalog, pool)
        code = "import tools\nt = await tools.helpdesk.get_ticket(id=2)\nawait tools.helpdesk.close_ticket(id=2)\nt['title']"
        run = new_run(d, code, Policy())
        paused = await Attempt(run, d, mode="fresh").run_to_end()
        assert paused.status == "paused" and paused.pending["address"] == "helpdesk.close_ticket"
        assert store.get_run(run.run_id).status == "paused" and rec.deliveries == []
        assert d.attempts.live == {}  # the attempt took its boundary out when it stopped

        # Approve as a decider would, then continue from the signed snapshot in a new attempt.
        from tether._engine.calls import ledger

        assert ledger.move(store, d.keyring, store.get_call(run.run_id, 2), ["asked"], state="approved")
        assert d.lifecycle.resume(run.run_id, {"seq": 2, "decision": "approve"})
        done = await Attempt(store.get_run(run.run_id), d, mode="continue").run_to_end()
        assert done.status == "completed" and done.result == "ticket 2"
        assert done.diagnostics["attempt"] == "restore"
        assert rec.deliveries == [("close_ticket", {"id": 2})]
    finally:
        await pool.close()


class _Announced:
    def __init__(self, call_id: int, name: str, kwargs: dict) -> None:
        self.call_id, self.name, self.args, self.kwargs = call_id, name, (), kwargs


def _parse(name: str, args: tuple, kwargs: dict) -> tuple[str, str, dict, None]:
    return "tool", name.removeprefix("tools."), dict(kwargs), None


def test_the_restore_plan_matches_announced_calls_by_what_they_are_and_the_rest_by_order():
    record = [{"seq": 3, "op": "tool", "address": "a.x", "args": {"n": 1}},
              {"seq": 4, "op": "tool", "address": "a.y", "args": {}}]
    issued = iter([9])
    plan = plan_restore(record, [11, 12, 13], [_Announced(12, "tools.a.x", {"n": 1}), _Announced(13, "tools.a.z", {})],
                        _parse, lambda: next(issued))
    assert [(p.call_id, p.seq, p.address) for p in plan] == [(12, 3, "a.x"), (11, 4, "a.y"), (13, 9, "a.z")]


def test_a_restore_plan_that_cannot_match_falls_back_to_replay():
    record = [{"seq": 3, "op": "tool", "address": "a.x", "args": {}}]
    with pytest.raises(SnapshotMismatch):
        plan_restore(record, [11, 12], [], _parse, lambda: 99)
