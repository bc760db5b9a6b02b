"""The store contract for snapshots, events, the notification outbox and the change feed; on SQLite and Postgres."""

from __future__ import annotations

import os

import pytest

from contract import WEIRD, make_run, make_snapshot
from tether.errors import RunNotFound

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
