"""The store contract: every test runs against SQLite (a file) and Postgres (a throwaway cluster)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tether._store import CallRecord, Conflict, RunRecord, SnapshotRecord, open_store
from tether._store._schema import SQLStore
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore
from tether._store.states import CallState
from tether.errors import ConfigError, RunNotFound, StoreError

# ---------------------------------------------------------------------------
# Backends


@dataclass
class Backend:
    kind: str
    url: str
    schema: str | None = None
    opened: list[SQLStore] = field(default_factory=list)

    def open(self, secret: bytes | None = None) -> SQLStore:
        store: SQLStore
        if self.kind == "sqlite":
            store = SQLiteStore(self.url, secret=secret)
        else:
            store = PostgresStore(self.url, secret=secret, schema=self.schema or "tether")
        self.opened.append(store)
        return store

    @property
    def spec(self) -> str:
        return json.dumps({"kind": self.kind, "url": self.url, "schema": self.schema})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    if request.param == "sqlite":
        b = Backend("sqlite", f"sqlite:///{tmp_path}/store/tether.db")
    else:
        # A schema per test: a clean store without a new database each time.
        b = Backend("postgres", request.getfixturevalue("pg_url"), f"t_{uuid.uuid4().hex[:16]}")
    yield b
    for store in b.opened:
        store.close()
    if b.kind == "postgres":
        import psycopg

        with psycopg.connect(b.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {b.schema} CASCADE")


@pytest.fixture
def store(backend):
    return backend.open()


def make_run(run_id: str = "r1", status: str = "paused", **overrides: Any) -> RunRecord:
    values: dict[str, Any] = dict(
        run_id=run_id,
        status=status,
        program="x = await tools.a.b(n=1)",
        environment={"clock": "2026-01-01T00:00:00+00:00", "seed": 7},
        policy={"mode": "ask"},
        limits={"host_calls": 20},
        created_at=1000.0,
        updated_at=1000.0,
    )
    values.update(overrides)
    return RunRecord(**values)


def make_call(run_id: str = "r1", seq: int = 1, state: str = "pending", **overrides: Any) -> CallRecord:
    values: dict[str, Any] = dict(
        run_id=run_id,
        seq=seq,
        op="tool",
        address="tracker.get_ticket",
        args={"id": seq},
        key=f"k{seq}",
        kind="read",
        state=state,
    )
    values.update(overrides)
    return CallRecord(**values)


def make_snapshot(run_id: str = "r1", seq: int = 1, data: bytes = b"dump", kind: str = "pause") -> SnapshotRecord:
    return SnapshotRecord(
        run_id=run_id,
        seq=seq,
        monty_version="1.4.0",
        data=data,
        mac="ab" * 32,
        pending=[{"seq": seq, "op": "tool", "address": "a.b", "args": {}}],
        created_at=2000.0 + seq,
        kind=kind,
    )


# Values JSON carries back unchanged (NaN is never equal to itself, so it is left out).
WEIRD = {
    "nested": {"list": [1, 2.5, None, True, {"deep": ["x", {"deeper": []}]}], "empty": {}},
    "unicode": "héllo ✓ 日本語 🦀",
    "nul": "a\u0000b",
    "lone_surrogate": "\ud800",
    "big": 2**70,
    "negative_zero": -0.0,
    "inf": float("inf"),
    "quote": "it's \"quoted\" \\ ?",
    "ключ": "значение",
}


# ---------------------------------------------------------------------------
# Runs


def test_a_run_round_trips_every_field(store):
    run = make_run(
        principal="alice",
        owner="host-1",
        lease_until=1030.5,
        expires_at=87400.0,
        result={"value": WEIRD},
        error={"code": "tool_error", "message": "ünïcode"},
        pending={"seq": 3, "address": "mail.send", "args": {"to": "b@c"}, "annotations": {"destructive": True}},
        decision={"action": "approve", "reason": "ok"},
        session="s-1",
        meta=WEIRD,
    )
    store.create_run(run)
    assert store.get_run("r1") == run


def test_a_run_with_only_required_fields_round_trips(store):
    store.create_run(make_run())
    assert store.get_run("r1") == make_run()


def test_creating_a_run_twice_conflicts_and_keeps_the_first(store):
    store.create_run(make_run(program="first"))
    with pytest.raises(Conflict):
        store.create_run(make_run(program="second"))
    assert store.get_run("r1").program == "first"


def test_a_missing_run_is_none(store):
    assert store.get_run("nope") is None


def test_update_run_cas_has_one_winner_and_the_loser_changes_nothing(store):
    store.create_run(make_run(status="paused"))
    assert store.update_run("r1", ["paused"], status="running", owner="a", updated_at=1001.0)
    before = store.get_run("r1")
    assert not store.update_run("r1", ["paused"], status="running", owner="b", updated_at=1002.0)
    assert store.get_run("r1") == before
    assert before.owner == "a" and before.status == "running" and before.updated_at == 1001.0


def test_update_run_sets_json_fields_and_clears_with_none(store):
    store.create_run(make_run(pending={"seq": 1}))
    assert store.update_run("r1", None, pending=None, decision={"action": "decline"}, meta=WEIRD)
    run = store.get_run("r1")
    assert run.pending is None and run.decision == {"action": "decline"} and run.meta == WEIRD


def test_update_run_with_any_status_and_on_a_missing_run(store):
    store.create_run(make_run(status="queued"))
    assert store.update_run("r1", None, status="running")
    assert not store.update_run("nope", None, status="running")
    assert not store.update_run("r1", [], status="paused")
    assert store.get_run("r1").status == "running"


def test_update_run_without_fields_only_checks_the_status(store):
    store.create_run(make_run(status="paused"))
    assert store.update_run("r1", ["paused", "running"])
    assert not store.update_run("r1", ["running"])


def test_a_terminal_status_never_changes(store):
    store.create_run(make_run(status="running"))
    assert store.update_run("r1", ["running"], status="completed", result={"value": 1})
    assert not store.update_run("r1", None, status="running")
    assert not store.update_run("r1", ["completed"], status="failed")
    # Other fields of a finished run may still be written, with or without restating its status.
    assert store.update_run("r1", None, meta={"note": "archived"})
    assert store.update_run("r1", None, status="completed", result={"value": 2})
    run = store.get_run("r1")
    assert run.status == "completed" and run.result == {"value": 2}


def test_update_run_refuses_misuse(store):
    store.create_run(make_run())
    with pytest.raises(TypeError, match="run_id"):
        store.update_run("r1", None, run_id="r2")
    with pytest.raises(TypeError, match="colour"):
        store.update_run("r1", None, colour="red")
    with pytest.raises(TypeError, match="list of strings"):
        store.update_run("r1", "paused", status="running")
    with pytest.raises(ValueError, match="unknown run status"):
        store.update_run("r1", None, status="sleeping")
    with pytest.raises(ValueError, match="unknown run status"):
        store.create_run(make_run("r2", status="sleeping"))


def test_list_runs_is_newest_first_filtered_and_limited(store):
    for i, status in enumerate(["paused", "running", "paused", "completed", "paused"]):
        store.create_run(make_run(f"r{i}", status=status, created_at=1000.0 + i))
    assert [r.run_id for r in store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
    assert [r.run_id for r in store.list_runs(status="paused")] == ["r4", "r2", "r0"]
    assert [r.run_id for r in store.list_runs(status="paused", limit=2)] == ["r4", "r2"]
    assert store.list_runs(status="cancelled") == []
    assert store.count_runs() == 5 and store.count_runs("paused") == 3 and store.count_runs("failed") == 0


def test_claim_run(store):
    store.create_run(make_run(status="running"))
    assert store.claim_run("r1", "a", lease_until=1100.0, now=1000.0), "free run"
    assert store.claim_run("r1", "a", lease_until=1200.0, now=1050.0), "same owner renews"
    assert not store.claim_run("r1", "b", lease_until=1300.0, now=1150.0), "live lease of another owner"
    run = store.get_run("r1")
    assert (run.owner, run.lease_until) == ("a", 1200.0)
    assert store.claim_run("r1", "b", lease_until=1400.0, now=1201.0), "expired lease"
    run = store.get_run("r1")
    assert (run.owner, run.lease_until) == ("b", 1400.0)
    assert not store.claim_run("nope", "a", lease_until=1.0, now=0.0)


def test_claim_run_refuses_a_finished_run_and_takes_an_owner_without_lease(store):
    store.create_run(make_run("done", status="completed"))
    assert not store.claim_run("done", "a", lease_until=1100.0, now=1000.0)
    store.create_run(make_run("stray", status="running", owner="gone", lease_until=None))
    assert store.claim_run("stray", "a", lease_until=1100.0, now=1000.0)


def test_runs_with_expired_lease(store):
    store.create_run(make_run("expired", status="running", owner="a", lease_until=900.0))
    store.create_run(make_run("live", status="running", owner="a", lease_until=1100.0))
    store.create_run(make_run("paused", status="paused", owner="a", lease_until=900.0))
    store.create_run(make_run("at_now", status="running", owner="a", lease_until=1000.0))
    assert [r.run_id for r in store.runs_with_expired_lease(now=1000.0)] == ["expired"]


def test_claim_queued_takes_the_oldest_first_and_skips_what_it_is_told(store):
    for i, at in enumerate([1003.0, 1001.0, 1002.0]):
        store.create_run(make_run(f"q{i}", status="queued", created_at=at))
    store.create_run(make_run("busy", status="running", owner="x", lease_until=9e9))
    first = store.claim_queued("me", 1100.0, 1050.0)
    assert first.run_id == "q1" and first.status == "running" and first.owner == "me" and first.lease_until == 1100.0
    assert store.claim_queued("me", 1100.0, 1050.0, skip=["q2"]).run_id == "q0"
    assert store.claim_queued("me", 1100.0, 1050.0, skip=["q2"]) is None
    assert store.claim_queued("me", 1100.0, 1050.0).run_id == "q2"
    assert store.claim_queued("me", 1100.0, 1050.0) is None


def test_concurrent_claimers_never_take_the_same_queued_run(backend):
    n, claimers = 60, 4
    setup = backend.open()
    for i in range(n):
        setup.create_run(make_run(f"q{i:03}", status="queued", created_at=1000.0 + i))
    stores = [backend.open() for _ in range(claimers)]
    taken: list[list[str]] = [[] for _ in range(claimers)]
    start = threading.Barrier(claimers)

    def claim(k: int) -> None:
        start.wait()
        while (run := stores[k].claim_queued(f"owner{k}", 2000.0, 1500.0)) is not None:
            taken[k].append(run.run_id)

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = [r for ids in taken for r in ids]
    assert sorted(every) == [f"q{i:03}" for i in range(n)]  # each claimed exactly once
    for k, ids in enumerate(taken):
        assert all(setup.get_run(r).owner == f"owner{k}" for r in ids)


def test_concurrent_claimers_never_take_the_same_due_run_or_orphan(backend):
    n, claimers = 30, 4
    setup = backend.open()
    for i in range(n):
        setup.create_run(make_run(f"due{i:03}", status="waiting", expires_at=1000.0 + i))
        setup.create_run(make_run(f"orphan{i:03}", status="running", owner="dead", lease_until=1000.0 + i))
    setup.create_run(make_run("later", status="waiting", expires_at=9e9))
    setup.create_run(make_run("held", status="running", owner="alive", lease_until=9e9))
    stores = [backend.open() for _ in range(claimers)]
    taken: list[list[str]] = [[] for _ in range(claimers)]
    start = threading.Barrier(claimers)

    def claim(k: int) -> None:
        start.wait()
        while (run := stores[k].claim_due(f"owner{k}", 2000.0, 1500.0)) is not None:
            taken[k].append(run.run_id)
        while (run := stores[k].claim_orphan(f"owner{k}", 2000.0, 1500.0)) is not None:
            assert run.owner == "dead"  # the record as it was, for a hand-back
            taken[k].append(run.run_id)

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = sorted(r for ids in taken for r in ids)
    assert every == sorted([f"due{i:03}" for i in range(n)] + [f"orphan{i:03}" for i in range(n)])
    for k, ids in enumerate(taken):
        assert all(setup.get_run(r).owner == f"owner{k}" and setup.get_run(r).status == "running" for r in ids)
    # An orphan handed back is an orphan again, with its dead owner and lapsed lease.
    run = setup.get_run("orphan000")
    k = int(run.owner[-1])
    before = dataclasses.replace(run, owner="dead", lease_until=1000.0)
    assert stores[k].release_orphan(before, f"owner{k}")
    assert setup.claim_orphan("me", 2000.0, 1500.0).run_id == "orphan000"
    assert setup.claim_due("me", 2000.0, 1500.0) is None and setup.claim_orphan("me", 2000.0, 1500.0) is None


@pytest.mark.postgres
def test_a_claimer_on_postgres_passes_over_a_row_another_holds_instead_of_waiting(backend):
    import psycopg

    if backend.kind != "postgres":
        pytest.skip("row locks are Postgres's")
    store = backend.open()
    store.create_run(make_run("old", status="queued", created_at=1000.0))
    store.create_run(make_run("new", status="queued", created_at=1001.0))
    with psycopg.connect(backend.url) as other:
        other.execute(f"SELECT 1 FROM {backend.schema}.runs WHERE run_id = 'old' FOR UPDATE")
        # Another replica is mid-claim on the oldest: this one takes the next without blocking.
        store_done: list = []
        t = threading.Thread(target=lambda: store_done.append(store.claim_queued("me", 2000.0, 1500.0)))
        t.start()
        t.join(timeout=20)
        assert not t.is_alive(), "the claim waited for another transaction's row lock"
        assert store_done[0].run_id == "new"
        other.rollback()
    assert store.claim_queued("me", 2000.0, 1500.0).run_id == "old"


@pytest.mark.postgres
def test_a_listener_on_postgres_hears_of_events_other_stores_add(backend):
    if backend.kind != "postgres":
        pytest.skip("LISTEN/NOTIFY is Postgres's")
    listener, writer = backend.open(), backend.open()
    writer.create_run(make_run("r1", status="running"))
    heard: list[str] = []
    got = threading.Event()
    stop = listener.listen(lambda run_id: (heard.append(run_id), got.set()))
    try:
        deadline = time.monotonic() + 20
        # The listener connects in the background: add events until one is heard.
        while not got.is_set() and time.monotonic() < deadline:
            writer.add_event("r1", "output", {"n": 1}, 1000.0)
            got.wait(0.2)
    finally:
        stop()
    assert heard and set(heard) == {"r1"}


def test_end_run_writes_the_last_journal_batch_the_end_and_its_notice_in_one_transaction(backend):
    """A run's end (Finisher.end_attempt): the reads its attempt still held, the end and the notice other
    processes wait on, one transaction — on Postgres one statement, one round trip (issue 24)."""
    store, listener = backend.open(), backend.open()
    store.create_run(make_run("r1", status="running"))
    heard: list[str] = []
    got = threading.Event()
    stop = listener.listen(lambda payload: (heard.append(payload), got.set())) if backend.kind == "postgres" else None
    try:
        if stop is not None:  # the listener connects in the background: notify until it hears
            deadline = time.monotonic() + 20
            while not got.is_set() and time.monotonic() < deadline:
                store.notify("ready")
                got.wait(0.2)
            heard.clear()
            got.clear()
        reads = [make_call("r1", 1, state="done", outcome={"n": 1}), make_call("r1", 2, state="done", outcome=2)]
        before = store.traffic.snapshot()
        won = store.end_run("r1", ["running"], reads, "ended:r1" if stop is not None else None,
                            status="completed", result={"status": "completed"}, updated_at=2000.0, owner=None)
        after = store.traffic.snapshot()
        assert won
        assert after["transactions"] - before["transactions"] == 1
        if backend.kind == "postgres":
            assert after["round_trips"] - before["round_trips"] == 1
            assert got.wait(20) and heard == ["ended:r1"]
        assert [(c.seq, c.outcome) for c in store.get_calls("r1")] == [(1, {"n": 1}), (2, 2)]
        ended = store.get_run("r1")
        assert (ended.status, ended.result, ended.updated_at) == ("completed", {"status": "completed"}, 2000.0)
    finally:
        if stop is not None:
            stop()
    # A batch that cannot be written (an entry already there) leaves the run as it was: all or nothing.
    store.create_run(make_run("r2", status="running"))
    store.record_call(make_call("r2", 1, state="done"))
    with pytest.raises(Conflict):
        store.end_run("r2", ["running"], [make_call("r2", 1, state="done"), make_call("r2", 2, state="done")],
                      None, status="completed", updated_at=2000.0)
    assert store.get_run("r2").status == "running" and [c.seq for c in store.get_calls("r2")] == [1]
    # A run another process ended first keeps its end; the reads that happened are journaled all the same.
    store.create_run(make_run("r3", status="cancelled"))
    assert not store.end_run("r3", ["running"], [make_call("r3", 1, state="done")], None, status="completed",
                             updated_at=2000.0)
    assert store.get_run("r3").status == "cancelled" and [c.seq for c in store.get_calls("r3")] == [1]


def test_paused_runs_past_expiry(store):
    store.create_run(make_run("old", status="paused", expires_at=500.0))
    store.create_run(make_run("older", status="paused", expires_at=400.0))
    store.create_run(make_run("fresh", status="paused", expires_at=5000.0))
    store.create_run(make_run("forever", status="paused"))
    store.create_run(make_run("running", status="running", expires_at=400.0))
    assert [r.run_id for r in store.paused_runs_past_expiry(now=1000.0)] == ["older", "old"]
    assert [r.run_id for r in store.paused_runs_past_expiry(now=1000.0, limit=1)] == ["older"]


def test_delete_run_removes_its_journal_snapshots_and_events(store):
    for run_id in ("r1", "r2"):
        store.create_run(make_run(run_id))
        store.record_call(make_call(run_id))
        store.put_snapshot(make_snapshot(run_id))
        store.add_event(run_id, "started", {}, now=1.0)
    assert store.delete_run("r1")
    assert not store.delete_run("r1")
    assert store.get_run("r1") is None
    assert store.get_calls("r1") == [] and store.latest_snapshot("r1") is None and store.get_events("r1") == []
    assert len(store.get_calls("r2")) == 1 and store.latest_snapshot("r2") and len(store.get_events("r2")) == 1
    store.create_run(make_run("r1"))  # the id is free again
    assert store.get_calls("r1") == []


# ---------------------------------------------------------------------------
# Journal


def test_a_call_round_trips(store):
    store.create_run(make_run())
    call = make_call(
        kind="write",
        state="done",
        args=WEIRD,
        outcome={"rows": [WEIRD]},
        error={"code": "tool_error", "message": "x"},
        started_at=1.5,
        finished_at=2.25,
    )
    store.record_call(call)
    assert store.get_call("r1", 1) == call
    assert store.get_call("r1", 2) is None


def test_recording_a_seq_twice_conflicts_and_keeps_the_first(store):
    store.create_run(make_run())
    store.record_call(make_call(address="first"))
    with pytest.raises(Conflict):
        store.record_call(make_call(address="second"))
    assert store.get_call("r1", 1).address == "first"
    # The same seq in another run is another entry.
    store.create_run(make_run("r2"))
    store.record_call(make_call("r2"))


def test_a_journal_batch_of_any_size_is_recorded_whole_or_not_at_all(store):
    # Batches are written as multi-row INSERTs of up to 100 rows: 250 calls take three statements, one transaction.
    store.create_run(make_run())
    batch = [make_call(seq=i, state="done", outcome={"n": i}) for i in range(1, 251)]
    store.record_calls(batch)
    assert store.get_calls("r1") == batch
    store.create_run(make_run("r2"))
    clash = [make_call("r2", seq=i) for i in range(1, 151)] + [make_call("r2", seq=7, address="again")]
    with pytest.raises(Conflict):
        store.record_calls(clash)
    assert store.get_calls("r2") == []  # the first 150 rows were not kept either


def test_recording_a_call_for_a_missing_run_names_the_run(store):
    with pytest.raises(RunNotFound, match="nope"):
        store.record_call(make_call("nope"))


def test_update_call_cas(store):
    store.create_run(make_run())
    store.record_call(make_call(kind="write", state="approved"))
    assert store.update_call("r1", 1, ["approved"], state="sending", started_at=5.0)
    before = store.get_call("r1", 1)
    assert not store.update_call("r1", 1, ["approved"], state="sending", started_at=6.0)
    assert store.get_call("r1", 1) == before
    assert store.update_call("r1", 1, ["sending"], state="sent", outcome={"id": 9}, finished_at=7.0)
    assert store.get_call("r1", 1).outcome == {"id": 9}
    assert not store.update_call("r1", 2, ["pending"], state="done")
    assert not store.update_call("r1", 1, [], state="unknown")
    assert store.update_call("r1", 1, ["sent"])
    with pytest.raises(TypeError):
        store.update_call("r1", 1, ["sent"], seq=3)
    with pytest.raises(TypeError):
        store.update_call("r1", 1, "sent", state="unknown")
    with pytest.raises(ValueError):
        store.update_call("r1", 1, ["sent"], state="lost")


def test_get_calls_orders_by_seq(store):
    store.create_run(make_run())
    for seq in (10, 2, 1, 3):
        store.record_call(make_call(seq=seq))
    assert [c.seq for c in store.get_calls("r1")] == [1, 2, 3, 10]
    assert store.get_calls("other") == []


def test_journal_bytes_counts_stored_arguments_and_outcomes(store):
    store.create_run(make_run())
    assert store.journal_bytes("r1") == 0
    store.record_call(make_call(seq=1, args={"text": "é" * 10}))
    store.record_call(make_call(seq=2, state="done", args={}, outcome="x" * 1000))
    # Stored text escapes non-ASCII: "é" costs six bytes, as on disk.
    expected = len('{"text":"' + "\\u00e9" * 10 + '"}') + len("{}") + len('"' + "x" * 1000 + '"')
    assert store.journal_bytes("r1") == expected
    assert store.journal_bytes("other") == 0


def test_journal_totals_are_the_bytes_the_spent_writes_and_the_outputs_in_one_read(store):
    """What continuing a run reads besides its entries (driver.prepare): the same figures journal_bytes,
    count_calls and the run's output events give, in one statement."""
    store.create_run(make_run())
    spent = ["sending", "sent", "unknown", "failed"]
    assert store.journal_totals("r1", spent) == (0, 0, 0)
    store.record_call(make_call(seq=1, state="done", outcome={"a": 1}))
    store.record_call(make_call(seq=2, kind="write", state="sent", outcome=True))
    store.record_call(make_call(seq=3, kind="write", state="asked"))
    store.record_call(make_call(seq=4, kind="write", state="unknown"))
    for n in range(3):
        store.add_event("r1", "output", {"n": n}, 1000.0 + n)
    store.add_event("r1", "decided", {}, 1010.0)
    before = store.traffic.snapshot()["statements"]
    totals = store.journal_totals("r1", spent)
    assert store.traffic.snapshot()["statements"] == before + 1
    assert totals == (store.journal_bytes("r1"), store.count_calls("r1", kind="write", states=spent), 3)
    assert totals[1] == 2
    assert store.journal_totals("r1", []) == (totals[0], 0, 3)
    assert store.journal_totals("other", spent) == (0, 0, 0)


# ---------------------------------------------------------------------------
# Snapshots


def test_snapshot_bytes_round_trip_exactly(store):
    store.create_run(make_run())
    data = bytes(range(256)) * 4 + os.urandom(1 << 20)
    snap = make_snapshot(data=data)
    store.put_snapshot(snap)
    got = store.latest_snapshot("r1")
    assert got == snap and type(got.data) is bytes


def test_latest_snapshot_is_the_last_written_and_one_is_kept_per_kind(store, backend):
    store.create_run(make_run())
    assert store.latest_snapshot("r1") is None
    store.put_snapshot(make_snapshot(seq=1, data=b"one", kind="checkpoint"))
    store.put_snapshot(make_snapshot(seq=2, data=b"two", kind="pause"))
    assert store.latest_snapshot("r1").data == b"two"
    store.put_snapshot(make_snapshot(seq=3, data=b"three", kind="checkpoint"))
    assert store.latest_snapshot("r1").data == b"three"
    store.put_snapshot(make_snapshot(seq=4, data=b"four", kind="checkpoint"))
    with store._transaction(write=False) as tx:
        kept = tx.run("SELECT kind, seq FROM snapshots WHERE run_id = ? ORDER BY seq", ("r1",)).fetchall()
    assert [tuple(row) for row in kept] == [("pause", 2), ("checkpoint", 4)]


def test_a_snapshot_for_a_missing_run_is_refused(store):
    with pytest.raises(RunNotFound):
        store.put_snapshot(make_snapshot("nope"))


# ---------------------------------------------------------------------------
# Events


def test_events_after_a_cursor(store):
    store.create_run(make_run("r1"))
    store.create_run(make_run("r2"))
    ids = [store.add_event("r1", f"e{i}", {"i": i, "text": WEIRD["unicode"]}, now=10.0 + i) for i in range(5)]
    store.add_event("r2", "other", {}, now=1.0)
    assert ids == sorted(ids) and len(set(ids)) == 5
    events = store.get_events("r1")
    assert [e.event_id for e in events] == ids
    assert events[0].type == "e0" and events[0].data == {"i": 0, "text": WEIRD["unicode"]}
    assert events[0].created_at == 10.0 and events[0].run_id == "r1"
    assert [e.type for e in store.get_events("r1", after=ids[2])] == ["e3", "e4"]
    assert [e.type for e in store.get_events("r1", after=ids[0], limit=2)] == ["e1", "e2"]
    assert store.get_events("r1", after=ids[-1]) == []
    with pytest.raises(RunNotFound):
        store.add_event("nope", "x", {}, now=0.0)


# ---------------------------------------------------------------------------
# JSON


def test_json_values_round_trip_unchanged(store):
    store.create_run(make_run(result=WEIRD))
    assert store.get_run("r1").result == WEIRD
    # Stored as canonical text: sorted keys, no spaces, ASCII.
    with store._transaction(write=False) as tx:
        raw = tx.run("SELECT environment FROM runs WHERE run_id = ?", ("r1",)).fetchone()[0]
    assert raw == '{"clock":"2026-01-01T00:00:00+00:00","seed":7}'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_any_json_value_round_trips_as_a_call_outcome(store, value):
    if store.get_run("r1") is None:
        store.create_run(make_run())
    seq = store.count_runs() + len(store.get_calls("r1"))
    store.record_call(make_call(seq=seq, outcome=value, state="done"))
    assert store.get_call("r1", seq).outcome == value


# The call boundary's texts keep UTF-8 (canonical_json, ensure_ascii=False); the columns escape. Every
# character class where the two spellings can differ: non-ASCII, a lone surrogate, DEL, the other controls.
texts_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(alphabet=st.sampled_from(["a", "\x7f", "\x00", "\n", "\"", "\\", "é", "\ud800", "🦀"])) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _boundary_texts(call: CallRecord) -> dict[str, tuple[Any, str]]:
    """What the call boundary hands along: each JSON field's canonical text, where it could make one."""
    from tether._engine.calls.call import canonical_json

    texts = {}
    for name in ("args", "outcome"):
        try:
            texts[name] = (getattr(call, name), canonical_json(getattr(call, name)))
        except ValueError:  # infinity: the boundary makes no text (ledger.value_text) and the store encodes
            pass
    return texts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=texts_values, args=st.dictionaries(st.text(max_size=8), texts_values, max_size=3))
def test_a_journal_row_given_its_values_texts_holds_the_bytes_the_store_would_have_encoded(store, value, args):
    """A row built from the texts an entry carries is byte for byte the row the store encodes itself, so a
    MAC made over either verifies over both (issue 24: the column takes the boundary's text)."""
    if store.get_run("r1") is None:
        store.create_run(make_run())
    seq = len(store.get_calls("r1")) + 1
    plain = make_call(seq=seq, args=args, outcome=value, state="done")
    given_texts = make_call(seq=seq + 1, args=args, outcome=value, state="done")
    given_texts.texts = _boundary_texts(given_texts)
    store.record_calls([plain, given_texts])
    with store._transaction(write=False) as tx:
        rows = tx.run("SELECT args, outcome FROM calls WHERE run_id = ? AND seq IN (?, ?) ORDER BY seq",
                      ("r1", seq, seq + 1)).fetchall()
    assert tuple(rows[1]) == tuple(rows[0])
    assert store.get_call("r1", seq + 1).outcome == value


def test_a_journal_row_takes_the_texts_its_entry_still_holds_instead_of_encoding_again(store, monkeypatch):
    from tether._store import _rows

    encoded: list[Any] = []

    class Counting(json.JSONEncoder):
        def encode(self, o: Any) -> str:
            encoded.append(o)
            return super().encode(o)

    monkeypatch.setattr(_rows, "_JSON_COLUMN", Counting(sort_keys=True, separators=(",", ":")))
    store.create_run(make_run())
    encoded.clear()
    args, outcome = {"id": 1}, {"value": [1, 2], "name": "x"}
    taken = make_call(seq=1, args=args, outcome=outcome, state="done",
                      texts={"args": (args, '{"id":1}'), "outcome": (outcome, '{"name":"x","value":[1,2]}')})
    # A text made of another value, however equal, is not the entry's: it is encoded again.
    stale = make_call(seq=2, args=args, outcome=outcome, state="done",
                      texts={"outcome": (dict(outcome), '{"name":"x","value":[1,2]}')})
    store.record_calls([taken])
    assert encoded == []
    store.record_call(stale)
    assert encoded == [args, outcome]
    assert store.get_call("r1", 1).outcome == store.get_call("r1", 2).outcome == outcome

# Text a store of either backend keeps: Postgres's TEXT holds no NUL and UTF-8 no lone surrogate.
stored_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
journal_rows = st.lists(
    st.fixed_dictionaries({
        "op": stored_text, "address": stored_text, "args": st.dictionaries(st.text(max_size=8), json_values, max_size=4),
        "key": stored_text,
        "kind": st.sampled_from(["read", "write"]), "state": st.sampled_from(list(CallState)),
        "outcome": json_values, "error": st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=3),
        "started_at": st.none() | st.floats(allow_nan=False), "finished_at": st.none() | st.floats(allow_nan=False),
        "idempotency_key": st.none() | stored_text, "sends": st.integers(0, 2**31 - 1),
        "mac": st.none() | stored_text,
    }),
    min_size=1, max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=journal_rows, at_end=st.booleans())
@example(rows=[{"op": "tool", "address": "a.b", "args": {"q": "it's \\ \"x\" ✓"}, "key": "k", "kind": "read",
                "state": "done", "outcome": WEIRD, "error": None, "started_at": float("inf"),
                "finished_at": 5e-324, "idempotency_key": None, "sends": 0, "mac": "m"}], at_end=False)
@example(rows=[{"op": "tool", "address": "a.b", "args": {}, "key": "k", "kind": "write", "state": "sent",
                "outcome": None, "error": {"code": "x"}, "started_at": -0.0, "finished_at": -float("inf"),
                "idempotency_key": "i", "sends": 2**31 - 1, "mac": None}], at_end=True)
def test_a_journal_batch_reads_back_exactly_as_written(store, rows, at_end):
    # A batch goes as one statement however many rows it has (on Postgres the rows travel as one JSON text,
    # times included, infinities too), written alone or with the run's end; every field comes back as it was.
    run_id = uuid.uuid4().hex
    store.create_run(make_run(run_id, status="running"))
    batch = [CallRecord(run_id=run_id, seq=i, **row) for i, row in enumerate(rows, 1)]
    if at_end:
        assert store.end_run(run_id, ["running"], batch, status="completed")
    else:
        store.record_calls(batch)
    assert store.get_calls(run_id) == batch


# ---------------------------------------------------------------------------
# Secret and schema


def test_the_secret_is_stable_across_reopening(backend):
    first = backend.open().secret()
    assert len(first) == 32
    assert backend.open().secret() == first


def test_the_sqlite_secret_file_is_private(backend):
    if backend.kind != "sqlite":
        pytest.skip("the secret file is SQLite's")
    store = backend.open()
    path = Path(f"{store.path}.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == store.secret()


def test_a_given_secret_wins_and_is_not_stored(backend):
    stored = backend.open().secret()
    given_key = b"k" * 32
    assert backend.open(secret=given_key).secret() == given_key
    assert backend.open().secret() == stored


def test_the_secret_from_the_environment(backend, monkeypatch):
    monkeypatch.setenv("TETHER_SECRET", "ab" * 32)
    assert backend.open().secret() == bytes.fromhex("ab" * 32)
    monkeypatch.setenv("TETHER_SECRET", "correct horse battery staple")
    assert backend.open().secret() == hashlib.sha256(b"correct horse battery staple").digest()


def test_a_truncated_secret_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("TETHER_SECRET", raising=False)
    (tmp_path / "t.db.secret").write_bytes(b"short")
    with pytest.raises(StoreError, match="holds 5 bytes"):
        SQLiteStore(f"sqlite:///{tmp_path}/t.db")


def test_migrations_apply_once_and_a_newer_schema_is_refused(backend):
    store = backend.open()
    assert store.schema_version() == len(store.migrations)
    assert backend.open().schema_version() == len(store.migrations)
    with store._transaction(write=True) as tx:
        tx.run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (999, 0.0))
    with pytest.raises(StoreError, match="schema version 999"):
        backend.open()


def test_store_size_grows_with_data(store):
    empty = store.store_size_bytes()
    assert empty > 0
    store.create_run(make_run())
    for kind in ("pause", "checkpoint", "session"):
        store.put_snapshot(make_snapshot(data=os.urandom(256 * 1024), kind=kind))
    assert store.store_size_bytes() > empty + 512 * 1024


def test_a_closed_store_says_so(store):
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get_run("r1")


# ---------------------------------------------------------------------------
# SQLite specifics


def test_sqlite_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with SQLiteStore("sqlite:///rel/dir/t.db") as rel:
        assert (tmp_path / "rel/dir/t.db").exists() and rel.path == Path("rel/dir/t.db")
    with open_store(f"sqlite:///{tmp_path}/abs.db") as absolute:
        assert absolute.path == tmp_path / "abs.db"
    with open_store("sqlite:///:memory:") as memory:
        memory.create_run(make_run())
        assert memory.get_run("r1") and len(memory.secret()) == 32 and memory.store_size_bytes() > 0
    assert not list(tmp_path.glob(":memory:*"))
    for bad in ("sqlite:///", "sqlite://x.db", "sqlite:x.db"):
        with pytest.raises(ConfigError):
            open_store(bad)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(backend):
    if backend.kind != "sqlite":
        pytest.skip("pragmas are SQLite's")
    store = backend.open()
    with store._transaction(write=False) as tx:
        assert tx.run("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert tx.run("PRAGMA foreign_keys").fetchone()[0] == 1
        assert tx.run("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


# ---------------------------------------------------------------------------
# Concurrency: threads, processes, and a process killed mid-transaction

WORKER = r"""
import json, sys, time
spec, mode = json.loads(sys.argv[1]), sys.argv[2]

def open_store():
    if spec["kind"] == "sqlite":
        from tether._store.sqlite import SQLiteStore
        return SQLiteStore(spec["url"])
    from tether._store.postgres import PostgresStore
    return PostgresStore(spec["url"], schema=spec["schema"])

if mode == "cas":
    store = open_store()
    print("ready", flush=True)
    sys.stdin.readline()
    won = store.update_run("race", ["paused"], status="running", owner=sys.argv[3])
    print(json.dumps(won), flush=True)
elif mode == "open":
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(open_store().secret().hex()), flush=True)
elif mode == "hold":
    store = open_store()
    conn = store._connection()
    if spec["kind"] == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = 'held'")
    else:
        conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = 'held'")
    print("ready", flush=True)
    time.sleep(600)
"""


def _spawn(backend: Backend, mode: str, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, backend.spec, mode, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready", f"worker {mode} did not start"
    return proc


def _go_all(procs: list[subprocess.Popen]) -> list[Any]:
    # Release every worker at once so they contend, then collect their answers.
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    answers = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        answers.append(json.loads(out))
    return answers


@pytest.mark.slow
def test_processes_racing_one_cas_have_exactly_one_winner(backend):
    store = backend.open()
    store.create_run(make_run("race", status="paused"))
    procs = [_spawn(backend, "cas", f"worker-{i}") for i in range(8)]
    won = _go_all(procs)
    assert won.count(True) == 1, won
    run = store.get_run("race")
    assert run.status == "running" and run.owner == f"worker-{won.index(True)}"


@pytest.mark.slow
def test_processes_opening_a_new_store_at_once_agree_on_schema_and_secret(backend):
    procs = [_spawn(backend, "open") for _ in range(6)]
    secrets_seen = set(_go_all(procs))
    assert len(secrets_seen) == 1
    store = backend.open()
    assert secrets_seen == {store.secret().hex()} and store.schema_version() == len(store.migrations)


@pytest.mark.slow
def test_a_process_killed_mid_transaction_leaves_the_store_writable(backend):
    store = backend.open()
    store.create_run(make_run("held", status="paused"))
    proc = _spawn(backend, "hold")
    try:
        assert _write_lock_is_taken(backend), "the worker holds its transaction open"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert store.get_run("held").status == "paused", "the killed write was not committed"
    assert store.update_run("held", ["paused"], status="running")
    assert store.get_run("held").status == "running"


def _write_lock_is_taken(backend: Backend) -> bool:
    """Try the held run's lock without waiting, on a connection of our own."""
    if backend.kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(backend.url[len("sqlite:///") :], timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        finally:
            conn.close()
        return False
    import psycopg

    with psycopg.connect(backend.url) as conn:
        try:
            conn.execute(f"SELECT 1 FROM {backend.schema}.runs WHERE run_id = 'held' FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_threads_share_one_store(store):
    store.create_run(make_run())
    errors: list[BaseException] = []

    def record(base: int) -> None:
        try:
            for i in range(25):
                store.record_call(make_call(seq=base + i))
                assert store.update_call("r1", base + i, ["pending"], state="done")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(n * 100,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    calls = store.get_calls("r1")
    assert len(calls) == 150 and all(c.state == "done" for c in calls)


def test_records_are_plain_dataclasses(store):
    # Callers copy records with dataclasses.replace; nothing store-specific rides along.
    store.create_run(make_run())
    run = store.get_run("r1")
    assert dataclasses.replace(run, status="running").status == "running"


def test_a_broken_postgres_connection_is_replaced_on_the_next_call(backend):
    if backend.kind != "postgres":
        pytest.skip("connections are Postgres's")
    import psycopg

    store = backend.open()
    store.create_run(make_run())
    pid = store._connection().info.backend_pid
    with psycopg.connect(backend.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # The call that meets the dead connection fails as a StoreError, and is not retried:
    # a lost answer to a commit would make a retry a second write.
    with pytest.raises(StoreError):
        store.get_run("r1")
    assert store.get_run("r1") == make_run()


# -- notification outbox and the change feed ------------------------------------------


def test_the_outbox_queues_once_claims_once_and_keeps_attempts(store):
    assert store.add_outbox("https://a", "evt_1", '{"x":1}', 10.0)
    assert not store.add_outbox("https://a", "evt_1", '{"x":1}', 11.0)  # the same event, queued again
    assert store.add_outbox("https://b", "evt_1", '{"x":1}', 10.0)  # another target gets its own
    assert store.claim_outbox(5.0, 60.0) == []  # not due yet
    claimed = store.claim_outbox(10.0, 60.0)
    assert [(c.target, c.event_id, c.attempts) for c in claimed] == [("https://a", "evt_1", 0), ("https://b", "evt_1", 0)]
    assert store.claim_outbox(20.0, 60.0) == []  # held by the first claimer
    store.settle_outbox(claimed[0].id, status="pending", attempts=1, next_at=30.0, last_error="HTTP 500")
    store.settle_outbox(claimed[1].id, status="delivered", attempts=1, next_at=10.0, delivered_at=12.0)
    [again] = store.claim_outbox(30.0, 60.0)
    assert (again.target, again.attempts, again.last_error) == ("https://a", 1, "HTTP 500")
    # A claim whose holder died lapses.
    assert [c.id for c in store.claim_outbox(100.0, 60.0)] == [again.id]
    assert [r.status for r in store.list_outbox()] == ["pending", "delivered"]
    assert [r.target for r in store.list_outbox(status="delivered")] == ["https://b"]


def test_runs_updated_since_lists_changes_oldest_first(store):
    store.create_run(make_run("r1", updated_at=5.0))
    store.create_run(make_run("r2", updated_at=7.0))
    assert [r.run_id for r in store.runs_updated_since(6.0)] == ["r2"]
    store.update_run("r1", None, updated_at=9.0)
    assert [r.run_id for r in store.runs_updated_since(0.0)] == ["r2", "r1"]


def test_runs_are_listed_by_principal_in_the_query_not_after_the_limit(store):
    store.create_run(make_run("mine", principal="alice", created_at=1.0))
    store.create_run(make_run("old-local", principal=None, created_at=2.0))
    for i in range(30):
        store.create_run(make_run(f"theirs{i:02d}", principal="bob", created_at=10.0 + i))
    assert [r.run_id for r in store.list_runs(limit=5, principals=["alice"])] == ["mine"]
    # A row without a principal is local's (migration 4).
    assert [r.run_id for r in store.list_runs(limit=5, principals=["alice", "local"])] == ["old-local", "mine"]
    assert [r.run_id for r in store.list_runs(status="paused", limit=2, principals=["bob"])] == ["theirs29",
                                                                                                 "theirs28"]
    assert store.list_runs(principals=[]) == []
    assert len(store.list_runs(limit=100)) == 32


def test_a_signed_out_console_session_is_remembered_until_it_would_have_expired(store):
    assert not store.signed_out("s1")
    store.sign_out("s1", expires_at=100.0, now=10.0)
    store.sign_out("s1", expires_at=100.0, now=11.0)  # twice is once
    assert store.signed_out("s1") and not store.signed_out("s2")
    store.sign_out("s2", expires_at=300.0, now=200.0)  # past s1's expiry: s1 is forgotten
    assert not store.signed_out("s1") and store.signed_out("s2")
