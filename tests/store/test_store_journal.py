"""The store contract for the journal: call rows, batches, compare-and-set, byte totals, and JSON values and texts
round-tripping exactly; on SQLite and Postgres."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contract import WEIRD, make_call, make_run
from tether._store import CallRecord, Conflict
from tether._store.states import CallState
from tether.errors import RunNotFound

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


@pytest.mark.parametrize("number", [2**63, 10**30, -(2**63) - 1])
def test_a_seq_or_cursor_no_row_can_have_finds_nothing(store, number):
    """A seq, or an ``after`` cursor, is a caller's number (MCP resume/cell_wait, a console form): one past a
    64-bit column finds no row rather than raising the driver's OverflowError out of a request."""
    store.create_run(make_run())
    store.record_call(make_call())
    assert store.get_call("r1", number) is None
    assert store.get_calls("r1", after=number) == ([] if number > 0 else store.get_calls("r1"))
    assert store.get_events("r1", after=number) == ([] if number > 0 else store.get_events("r1"))


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


def test_p51_update_call_while_run_moves_an_entry_only_while_its_run_is_in_a_status(store):
    store.create_run(make_run(status="paused"))
    store.record_call(make_call(kind="write", state="asked"))
    store.record_call(make_call(seq=2, kind="write", state="asked"))
    assert store.update_call("r1", 1, ["asked"], while_run=["paused"], state="approved")
    assert store.update_run("r1", ["paused"], status="cancelled")
    before = store.get_call("r1", 2)
    assert not store.update_call("r1", 2, ["asked"], while_run=["paused"], state="approved")
    assert store.get_call("r1", 2) == before
    assert not store.update_call("nope", 2, ["asked"], while_run=["paused"], state="approved")
    with pytest.raises(TypeError):
        store.update_call("r1", 2, ["asked"], while_run="paused", state="approved")
    assert store.update_call("r1", 2, ["asked"], state="declined")  # without while_run: as before


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
    MAC made over either verifies over both (D-52: the column takes the boundary's text)."""
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
