"""The store contract for lineage (P-45, D-65): an entry's signed ``lineage`` field round-trips, and the
cross-run index of untrusted marks is written with the entries that carry them — on every write path — looked
up by principal, digest, creation window and session, and forgotten with its run; on SQLite and Postgres."""

from __future__ import annotations

from contract import make_call, make_run
from tether._store.retention import RetentionRules, prune
from tether._store.states import CallState

MARKS = {"trust": "untrusted", "marks": [["email", "mallory@evil.example", "[1].body"],
                                         ["url", "evil.example/pay", "[1].body"],
                                         ["email", "mallory@evil.example", "[2].body"]]}


def _norms(found):
    return sorted((m.norm, m.run_id, m.seq) for m in found)


def test_p45_an_entrys_lineage_round_trips_and_its_marks_are_indexed_once_each(store):
    store.create_run(make_run("r1", status="running", principal="alice", created_at=1000.0))
    store.record_calls([make_call("r1", 1, state="done", outcome=[1], lineage=MARKS)])
    assert store.get_call("r1", 1).lineage == MARKS
    found = store.lineage_marks("alice", ["mallory@evil.example", "evil.example/pay", "nobody@x.example"],
                                before=2000.0, since=0.0)
    assert _norms(found) == [("evil.example/pay", "r1", 1), ("mallory@evil.example", "r1", 1)]
    [hit] = [m for m in found if m.kind == "email"]
    assert (hit.address, hit.path, hit.created_at) == ("tracker.get_ticket", "[1].body", 1000.0)


def test_p45_the_lookup_keeps_to_the_principal_the_window_the_session_and_earlier_runs(store):
    store.create_run(make_run("old", status="running", principal="alice", created_at=100.0, session="desk"))
    store.create_run(make_run("new", status="running", principal="alice", created_at=1000.0))
    store.create_run(make_run("bob", status="running", principal="bob", created_at=1000.0))
    store.create_run(make_run("local", status="running", created_at=1000.0))
    for run_id in ("old", "new", "bob", "local"):
        store.record_calls([make_call(run_id, 1, state="done", outcome=[1], lineage=MARKS)])
    norm = ["mallory@evil.example"]
    # Another principal's runs are not looked at; a NULL principal is "local".
    assert {m.run_id for m in store.lineage_marks("bob", norm, before=2000.0, since=0.0)} == {"bob"}
    assert {m.run_id for m in store.lineage_marks("local", norm, before=2000.0, since=0.0)} == {"local"}
    # One row per norm, the newest; a run created at or after `before` is never one.
    assert _norms(store.lineage_marks("alice", norm, before=2000.0, since=0.0)) == [("mallory@evil.example", "new", 1)]
    assert _norms(store.lineage_marks("alice", norm, before=1000.0, since=0.0)) == [("mallory@evil.example", "old", 1)]
    # Past the window only the same session counts.
    assert store.lineage_marks("alice", norm, before=1000.0, since=500.0) == []
    assert _norms(store.lineage_marks("alice", norm, before=1000.0, since=500.0, session="desk")) == [
        ("mallory@evil.example", "old", 1)]


def test_p45_a_reissued_read_moved_to_its_outcome_is_indexed_and_a_run_end_batch_too(store):
    store.create_run(make_run("r1", status="running", principal="alice", created_at=1000.0))
    store.record_call(make_call("r1", 1))
    assert store.update_call("r1", 1, [CallState.PENDING], state=CallState.DONE, outcome=[1], lineage=MARKS)
    store.end_run("r1", ["running"], [make_call("r1", 2, state="done", outcome=[2],
                                                lineage={"trust": "untrusted",
                                                         "marks": [["iban", "CH9300762011623852957", ""]]})],
                  status="completed")
    found = store.lineage_marks("alice", ["mallory@evil.example", "CH9300762011623852957"], before=2000.0, since=0.0)
    assert _norms(found) == [("CH9300762011623852957", "r1", 2), ("mallory@evil.example", "r1", 1)]


def test_p45_many_norms_are_all_looked_up(store):
    store.create_run(make_run("r1", status="running", principal="alice", created_at=1000.0))
    store.record_calls([make_call("r1", 1, state="done", outcome=[1], lineage=MARKS)])
    noise = [f"word window {i} of a long copied body" for i in range(700)]
    found = store.lineage_marks("alice", [*noise, "mallory@evil.example"], before=2000.0, since=0.0)
    assert _norms(found) == [("mallory@evil.example", "r1", 1)]


def test_p45_the_index_is_forgotten_with_its_run(store):
    for run_id in ("gone", "kept"):
        store.create_run(make_run(run_id, status="completed", principal="alice", created_at=1000.0,
                                  updated_at=1000.0))
        store.record_calls([make_call(run_id, 1, state="done", outcome=[1], lineage=MARKS)])
    prune(store, RetentionRules(days={"completed": 1.0}), now=1000.0 + 2 * 86400, limit=1)
    left = {m.run_id for m in store.lineage_marks("alice", ["mallory@evil.example"], before=9e9, since=0.0)}
    assert len(left) == 1
    store.delete_run(left.pop())
    assert store.lineage_marks("alice", ["mallory@evil.example"], before=9e9, since=0.0) == []
