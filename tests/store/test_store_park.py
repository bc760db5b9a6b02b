"""store.park_run: a run stopping at a host call — its move, snapshot, new waits and event — in one transaction."""

from __future__ import annotations

import dataclasses
import threading
import time

from contract import make_run
from tether._store import SnapshotRecord
from tether._store.base import ParkEvent, WaitRecord, wait_digest
from tether._store.states import WaitStatus


def _snapshot(run_id: str, seq: int) -> SnapshotRecord:
    return SnapshotRecord(run_id, seq, "m", b"state", "mac", [{"seq": seq}], 1500.0, "pause")


def _wait(run_id: str, seq: int) -> WaitRecord:
    return WaitRecord(f"key-{run_id}-{seq}", run_id, f"approval:{seq}", WaitStatus.PENDING, 1500.0, seq=seq,
                      deadline=9000.0)


def test_a_pause_is_one_transaction_and_a_lost_move_writes_nothing(backend):
    """The paused record, its snapshot (the only one of its kind), its approval waits and its `paused` event
    are written together or not at all (D-50: four transactions before); a wait whose row was there
    first (a buffered resolution) is kept and given its seq and deadline."""
    store, listener = backend.open(), backend.open()
    heard: list[str] = []
    got = threading.Event()
    stop = listener.listen(lambda payload: (heard.append(payload), got.set())) if backend.kind == "postgres" else None
    if stop is not None:  # the listener connects in the background: notify until it hears
        deadline = time.monotonic() + 20
        while not got.is_set() and time.monotonic() < deadline:
            store.notify("ready")
            got.wait(0.2)
        heard.clear()
        got.clear()
    store.create_run(make_run("r1", status="running"))
    store.put_snapshot(_snapshot("r1", 1))
    # A checkpoint taken after the last pause: the new pause's snapshot is the one restored from.
    store.put_snapshot(dataclasses.replace(_snapshot("r1", 1), kind="checkpoint"))
    early = WaitRecord("key-r1-3", "r1", "approval:3", WaitStatus.RESOLVED, 1400.0, value={"decision": "approve"},
                       resolved_at=1400.0)
    assert store.settle_wait(early)[0]
    before = store.traffic.snapshot()
    won = store.park_run("r1", ["running"], _snapshot("r1", 2), [_wait("r1", 2), _wait("r1", 3)],
                         ParkEvent("paused", {"pending": {"seq": 2}}, 1500.0), status="paused",
                         pending={"seq": 2}, owner=None, updated_at=1500.0)
    after = store.traffic.snapshot()
    assert won
    assert after["transactions"] - before["transactions"] == 1
    if backend.kind == "postgres":  # one statement without BEGIN and COMMIT (D-40)
        assert (after["statements"] - before["statements"], after["round_trips"] - before["round_trips"]) == (1, 1)
    run = store.get_run("r1")
    assert (run.status, run.pending, run.updated_at) == ("paused", {"seq": 2}, 1500.0)
    latest = store.latest_snapshot("r1")
    assert (latest.seq, latest.kind) == (2, "pause")
    waits = {w.name: w for w in store.list_waits(run_id="r1", status=None)}
    assert waits["approval:2"].status == "pending" and waits["approval:2"].key == wait_digest("key-r1-2")
    assert (waits["approval:3"].status, waits["approval:3"].seq, waits["approval:3"].deadline) == (
        "resolved", 3, 9000.0)
    assert [(e.type, e.data) for e in store.get_events("r1")] == [("paused", {"pending": {"seq": 2}})]
    if stop is not None:  # other processes hear of the event (P-20), as from add_event
        assert got.wait(20) and heard == ["r1"]
        stop()
    # A run no longer running (cancelled meanwhile) is not paused, and nothing of the pause is written.
    store.create_run(make_run("r2", status="cancelled"))
    assert not store.park_run("r2", ["running"], _snapshot("r2", 1), [_wait("r2", 1)],
                              ParkEvent("paused", {}, 1500.0), status="paused", updated_at=1500.0)
    assert store.get_run("r2").status == "cancelled"
    assert store.latest_snapshot("r2") is None
    assert store.list_waits(run_id="r2", status=None) == []
    assert store.get_events("r2") == []


def test_a_park_on_a_missing_run_writes_nothing(backend):
    store = backend.open()
    assert not store.park_run("nope", ["running"], _snapshot("nope", 1), [], None, status="waiting",
                              updated_at=1.0)
    assert store.latest_snapshot("nope") is None
