"""The store contract for runs: records, compare-and-set updates, claims (also by concurrent claimers), expiry and
deletion; on SQLite (a file) and Postgres (a throwaway cluster)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from contract import WEIRD, make_call, make_run, make_snapshot
from tether._store import Conflict

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


def test_p46_an_ended_run_reopens_only_to_running_from_the_status_named(store):
    """D-67: undoing an ended run's writes runs it again; nothing else changes a terminal status."""
    store.create_run(make_run(status="running"))
    assert store.update_run("r1", ["running"], status="completed", result={"value": 1})
    assert not store.update_run("r1", ["failed"], status="running")
    assert not store.update_run("r1", None, status="running")
    assert store.update_run("r1", ["completed"], status="running")
    assert store.get_run("r1").status == "running"


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
def test_p51_on_postgres_an_entry_moved_while_its_run_is_paused_waits_for_a_move_of_the_run_in_flight(backend):
    """Under READ COMMITTED a plain read of the run's status sees the last committed one: an approval would pass
    a cancel committing at that moment and land on a cancelled run. The status is read FOR SHARE: the approval
    waits for the cancel's transaction, then reads the run as cancelled and moves nothing."""
    import psycopg

    if backend.kind != "postgres":
        pytest.skip("row locks are Postgres's")
    store = backend.open()
    store.create_run(make_run(status="paused"))
    store.record_call(make_call(kind="write", state="asked"))
    with psycopg.connect(backend.url) as other:
        other.execute(f"UPDATE {backend.schema}.runs SET status = 'cancelled' WHERE run_id = 'r1'")
        moved: list[bool] = []
        t = threading.Thread(target=lambda: moved.append(
            store.update_call("r1", 1, ["asked"], while_run=["paused"], state="approved")))
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive(), "the approval did not wait for the cancel in flight"
        other.commit()
        t.join(timeout=20)
    assert moved == [False] and store.get_call("r1", 1).state == "asked"


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
    processes wait on, one transaction — on Postgres one statement, one round trip (D-49)."""
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
