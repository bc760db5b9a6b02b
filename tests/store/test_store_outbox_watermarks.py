"""The outbox's reconciliation reads (P-49, D-81), the same on SQLite and Postgres: a watermark per webhook
that only moves forward, the runs changed since it in keyset pages, and which events are queued already."""

from __future__ import annotations

from tether._store.base import RunRecord
from tether._store.states import RunStatus


def _run(run_id: str, status: RunStatus, updated_at: float, pending: dict | None = None) -> RunRecord:
    return RunRecord(run_id=run_id, status=status, program="1", environment={}, policy={}, limits={},
                     created_at=updated_at, updated_at=updated_at, pending=pending)


def test_p49_a_watermark_starts_once_and_never_moves_back(store):
    assert store.outbox_watermarks(["https://a.example/hook"], 100.0) == {"https://a.example/hook": 100.0}
    # A second replica seeing the webhook later reads the first one's watermark, not its own start.
    assert store.outbox_watermarks(["https://a.example/hook", "https://b.example/hook"], 150.0) == {
        "https://a.example/hook": 100.0, "https://b.example/hook": 150.0}
    store.advance_outbox_watermark("https://a.example/hook", 120.0)
    store.advance_outbox_watermark("https://a.example/hook", 110.0)  # a replica behind: ignored
    assert store.outbox_watermarks(["https://a.example/hook"], 0.0) == {"https://a.example/hook": 120.0}
    assert store.outbox_watermarks([], 0.0) == {}


def test_p49_run_changes_are_read_in_keyset_pages_of_the_statuses_asked(store):
    for run_id, status, at in [("r1", RunStatus.COMPLETED, 10.0), ("r2", RunStatus.PAUSED, 20.0),
                               ("r3", RunStatus.RUNNING, 20.0), ("r4", RunStatus.FAILED, 20.0),
                               ("r5", RunStatus.COMPLETED, 30.0)]:
        store.create_run(_run(run_id, status, at, {"seq": 2} if status == RunStatus.PAUSED else None))
    wanted = ["completed", "failed", "paused"]
    first = store.run_changes(wanted, 10.0, "", limit=2)
    assert [(c.run_id, c.status, c.updated_at) for c in first] == [("r1", "completed", 10.0), ("r2", "paused", 20.0)]
    assert first[1].pending == '{"seq":2}'
    # The next page starts after the last (updated_at, run_id) read: a tie at 20.0 is neither skipped nor repeated.
    rest = store.run_changes(wanted, first[-1].updated_at, first[-1].run_id, limit=2)
    assert [c.run_id for c in rest] == ["r4", "r5"]
    assert store.run_changes(wanted, 30.0, "r5", limit=2) == []
    assert store.run_changes([], 0.0) == []


def test_p49_the_outbox_says_which_events_are_queued_for_which_webhook(store):
    store.add_outbox("https://a.example/hook", "evt_1", "{}", 1.0)
    store.add_outbox("https://b.example/hook", "evt_1", "{}", 1.0)
    store.add_outbox("https://a.example/hook", "evt_2", "{}", 1.0)
    assert store.outbox_known(["evt_1", "evt_3"]) == {("https://a.example/hook", "evt_1"),
                                                      ("https://b.example/hook", "evt_1")}
    assert store.outbox_known([]) == set()
