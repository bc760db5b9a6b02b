"""The ledger (_engine/calls/ledger.py): the one writer of journal entries; every change is one the call table lists.

A change the table does not list is refused with ``invalid_transition`` and leaves
the entry as it was, on SQLite and on PostgreSQL; a change it lists is made by
compare-and-set, so an entry that moved meanwhile is left to whoever moved it.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
from pathlib import Path

import pytest

from tether._engine.approvals.capabilities import keyring_for
from tether._engine.calls import ledger
from tether._engine.calls.call import Call
from tether._engine.integrity import verify_calls
from tether._store import CallRecord, RunRecord, open_store
from tether._store.states import CALL_TRANSITIONS, NEW_CALL_STATES, CallState, call_move_allowed
from tether.errors import InvalidTransition

SRC = Path(__file__).resolve().parent.parent.parent / "src" / "tether"


def _run(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, status="running", program="1", environment={"seed": 1}, policy={}, limits={},
                     created_at=1000.0, updated_at=1000.0)


def _entry(run_id: str, seq: int, state: CallState) -> CallRecord:
    return CallRecord(run_id, seq, "tool", "shop.charge", {"id": seq}, f"k{seq}", "write", state, started_at=1000.0,
                      sends=1)


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request, store_url):
    return store_url if request.param == "sqlite" else request.getfixturevalue("pg_url")


def test_every_pair_of_call_states_moves_exactly_as_the_table_says(any_url):
    """All 121 (from, to) pairs on a real store: listed moves are made and signed, others refused, nothing written."""
    store = open_store(any_url)
    try:
        keyring = keyring_for(store)
        store.create_run(_run("r"))
        for seq, (frm, to) in enumerate(itertools.product(CallState, CallState), 1):
            store.record_call(_entry("r", seq, frm))
            entry = store.get_call("r", seq)
            if call_move_allowed(frm, to):
                assert ledger.move(store, keyring, entry, [frm], state=to, finished_at=2000.0), (frm, to)
                row = store.get_call("r", seq)
                assert (row.state, row.finished_at) == (to, 2000.0)
                verify_calls(keyring, "r", [row])  # re-signed: a resume trusts it
            else:
                with pytest.raises(InvalidTransition) as raised:
                    ledger.move(store, keyring, entry, [frm], state=to, finished_at=2000.0)
                assert raised.value.code == "invalid_transition"
                assert raised.value.details == {"run_id": "r", "seq": seq, "from": [str(frm)], "to": str(to)}
                row = store.get_call("r", seq)
                assert (row.state, row.finished_at, row.mac) == (frm, None, None), (frm, to)
                assert entry.state == frm  # the record in memory is left as the store holds it
    finally:
        store.close()


def test_a_listed_move_loses_to_a_change_made_meanwhile(store_url):
    """Two deciders on one asked write: the first move wins, the second finds it moved and writes nothing."""
    store = open_store(store_url)
    keyring = keyring_for(store)
    store.create_run(_run("r"))
    store.record_call(_entry("r", 1, CallState.ASKED))
    mine, theirs = store.get_call("r", 1), store.get_call("r", 1)
    assert ledger.move(store, keyring, theirs, [CallState.ASKED], state=CallState.DECLINED)
    assert not ledger.move(store, keyring, mine, [CallState.ASKED], state=CallState.APPROVED)
    assert store.get_call("r", 1).state == CallState.DECLINED and mine.state == CallState.ASKED
    with pytest.raises(InvalidTransition):
        ledger.move(store, keyring, mine, [], state=CallState.APPROVED)  # from no state: a bug, not a race
    store.close()


async def test_an_entry_is_first_written_only_in_a_state_a_call_starts_in(store_url):
    store = open_store(store_url)
    store.create_run(_run("r"))
    book = ledger.Ledger(run_id="r", store=store, keyring=keyring_for(store), clock=lambda: 1000.0, entries=[])
    for seq, state in enumerate(sorted(set(CallState) - NEW_CALL_STATES), 1):
        with pytest.raises(InvalidTransition):
            await book.record_new(_entry("r", seq, state))
        assert store.get_call("r", seq) is None and book.get(seq) is None
    # A read held in memory settles only along the table too (pending -> done | failed).
    book.buffer_intent(Call(9, "tool", "shop.get", {"id": 9}, "k9"))
    with pytest.raises(InvalidTransition):
        await book.record_outcome(9, CallState.PENDING, CallState.SENT, outcome=1)
    await book.record_outcome(9, CallState.PENDING, CallState.DONE, outcome=1)
    await book.flush()
    assert store.get_call("r", 9).state == CallState.DONE
    store.close()


class _SlowClock:
    """The run's clock on a machine so loaded that every reading is ten seconds after the one before."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


async def _settle_reads(book: ledger.Ledger, seqs: range, value: object = 1, size: int = 1) -> None:
    for seq in seqs:
        book.buffer_intent(Call(seq, "tool", "shop.get", {"id": seq}, f"k{seq}"))
        await book.record_outcome(seq, CallState.PENDING, CallState.DONE, outcome=value, size=size)


async def test_held_reads_are_written_by_how_many_they_are_never_by_how_slow_the_run_is(store_url):
    """P-7: a batch closes at 64 settled reads (or the attempt's end), however long the run's clock says they
    took: a loaded machine writes them in as few transactions as a quiet one (D-6)."""
    store = open_store(store_url)
    store.create_run(_run("r"))
    book = ledger.Ledger(run_id="r", store=store, keyring=keyring_for(store), clock=_SlowClock(), entries=[])
    def transactions() -> int:
        return store.traffic.snapshot()["transactions"]

    before = transactions()
    await _settle_reads(book, range(1, 64))
    assert transactions() == before
    await _settle_reads(book, range(64, 101))  # the 64th closes the first batch
    assert transactions() == before + 1
    assert [c.seq for c in store.get_calls("r")] == list(range(1, 65))
    before = transactions()
    await book.close()  # the attempt's end writes the rest, in one more
    assert transactions() == before + 1
    assert [c.seq for c in store.get_calls("r")] == list(range(1, 101))
    verify_calls(keyring_for(store), "r", store.get_calls("r"))  # each signed, chained to the one before
    store.close()


async def test_held_reads_are_written_once_their_values_pass_the_byte_bound(store_url):
    store = open_store(store_url)
    store.create_run(_run("r"))
    book = ledger.Ledger(run_id="r", store=store, keyring=keyring_for(store), clock=_SlowClock(), entries=[],
                         flush_every_bytes=1000)
    await _settle_reads(book, range(1, 3), value="x" * 400, size=402)
    assert store.get_calls("r") == []
    await _settle_reads(book, range(3, 4), value="x" * 400, size=402)  # 1,206 bytes held: written
    assert [c.seq for c in store.get_calls("r")] == [1, 2, 3]
    await book.close()
    store.close()


async def test_a_settled_read_waits_no_longer_than_the_timer_allows(store_url):
    """P-7's cap: with nothing else to close the batch (the program computes, or waits on a slow call), the
    event loop's timer writes held reads — here with no quiet time at all, at its next turn."""
    store = open_store(store_url)
    store.create_run(_run("r"))
    book = ledger.Ledger(run_id="r", store=store, keyring=keyring_for(store), clock=_SlowClock(), entries=[],
                         flush_quiet_seconds=0.0)
    await _settle_reads(book, range(1, 3))
    for _ in range(100):  # turns of the loop, not time: bounded so a broken timer fails instead of hanging
        if len(store.get_calls("r")) == 2:
            break
        await asyncio.sleep(0)
    assert [c.seq for c in store.get_calls("r")] == [1, 2]
    await book.close()
    # After the attempt's end the timer writes nothing, even for a read that settles late.
    await _settle_reads(book, range(3, 4))
    for _ in range(20):
        await asyncio.sleep(0)
    assert [c.seq for c in store.get_calls("r")] == [1, 2]
    store.close()


def test_every_state_a_new_entry_starts_in_can_settle():
    settled = {s for s in CallState if not CALL_TRANSITIONS[s]}
    for state in NEW_CALL_STATES:
        reached, todo = {state}, [state]
        while todo:
            for to in CALL_TRANSITIONS[todo.pop()] - reached:
                reached.add(to)
                todo.append(to)
        assert reached & settled, state


# The store's writers of journal entries. telemetry.record_call records a span event, not a row.
_CALL_WRITERS = {"record_call", "record_calls", "update_call"}


def _calls_outside_the_ledger() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("_store/") or rel == "_engine/calls/ledger.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CALL_WRITERS
                    and ast.unparse(node.func.value) != "telemetry"):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}")
            # A reference handed on (getattr, a callback) writes as surely as a call.
            if isinstance(node, ast.Constant) and node.value in _CALL_WRITERS:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    return found


def test_only_the_ledger_writes_a_journal_entry():
    assert _calls_outside_the_ledger() == []
