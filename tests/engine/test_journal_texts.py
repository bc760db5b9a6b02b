"""A journal entry is encoded once (D-52): the text the call boundary made of a result is the one its row
holds and its MAC is made from, and each other JSON field's text is made once for both. The boundary's texts keep UTF-8 and the columns and MACs
escape, so a text is used only where both spell it alike; whatever the result, a resume's check (P-35) of the
stored entries must pass.
"""

from __future__ import annotations

from typing import Any

import pytest

import tether
from tether._engine import integrity
from tether._engine.approvals.capabilities import Keyring, keyring_for
from tether._runtime import Runtime
from tether._store import open_store
from tether._store._rows import dump_json
from tether._store.base import CallRecord
from tether._store.states import CallState
from tether.errors import RunTampered


@tether.tool(namespace="t", read_only=True)
async def echo(text: str, pad: int) -> dict[str, Any]:
    """The text, padded."""
    return {"text": text, "pad": "p" * pad}


@pytest.mark.parametrize("text", ["\x7f", "a\x7fb", "é\x7f", "\x00\x1f", "plain"])
@pytest.mark.parametrize("pad", [0, 300])  # a short result and a long one
async def test_every_stored_entry_verifies_and_holds_what_the_column_encoder_spells(tmp_path, text, pad):
    store = open_store(f"sqlite:///{tmp_path}/j.db")
    async with Runtime(tools=[echo], store=store, type_check=False) as rt:
        r = await rt.execute(f"import tools\n(await tools.t.echo(text={text!r}, pad={pad}))['text']")
        assert r.status == "completed" and r.result == text, r.error
        calls = rt.store.get_calls(r.run_id)
        # DEL is the one ASCII character only the escaping encoder escapes: a MAC spliced from the UTF-8
        # text signed "\x7f" where the check reads "\u007f", and the run was refused as tampered on resume.
        integrity.verify_calls(keyring_for(rt.store), r.run_id, calls)
        with rt.store._transaction(write=False) as tx:
            stored = tx.run("SELECT outcome FROM calls WHERE run_id = ?", (r.run_id,)).fetchone()[0]
        assert stored == dump_json(calls[0].outcome)
        calls[0].outcome["text"] += "!"
        with pytest.raises(RunTampered):
            integrity.verify_calls(keyring_for(rt.store), r.run_id, calls)


# An entry of every kind of value the MAC's encoder spells: non-ASCII, DEL, control characters, NaN, nested
# lists, a bool, a float, None; a CallState, a str subclass.
_ENTRY = dict(run_id="run_0123456789abcdef", seq=4, op="tool", address="t.echo",
              args={"text": "é\x7f\x00", "n": [1, 2.5, None, True]}, key="ab" * 32, kind="read",
              state=CallState.DONE, outcome={"z": "日本\u2028", "a": float("nan")},
              error={"code": "x", "message": "m"}, idempotency_key="tether-run_0123456789abcdef-4", sends=1)
# That entry's MAC as tether signed it before its MACs were put together from the row's texts (main at 6061d9b):
# the signed bytes are the stored format, so every entry already in a store keeps verifying.
_SIGNED_BEFORE = "180c562fe49c:cdcdcdcdcdcdcdcd:7433b92da15b1f5e8a0c5b92c819814b1271f89d9a3ef0d7a57c69c7bc37479a"


def test_an_entry_is_signed_over_the_bytes_entries_were_always_signed_over():
    keyring = Keyring(b"s" * 32)
    entry = CallRecord(**_ENTRY)  # type: ignore[arg-type]
    held = {"outcome": (entry.outcome, "not spelled alike: é")}  # a boundary text the MAC must not take
    assert integrity.sign_call(keyring, entry, "cd" * 32, integrity.call_texts(entry, held)) == _SIGNED_BEFORE
    assert integrity.sign_call(keyring, entry, "cd" * 32) == _SIGNED_BEFORE
    entry.mac = _SIGNED_BEFORE
    integrity.verify_calls(keyring, entry.run_id, [entry])


_VALUES = ["\x7f", "é", "\x00\x1f", "", 0, -1, 10**30, 2.5, float("inf"), float("nan"), True, None, [], {},
           {"b": [1, {"a": None}], "a": "x"}, CallState.SENT]


@pytest.mark.parametrize("value", _VALUES, ids=repr)
def test_an_entry_signed_from_its_row_texts_verifies_and_the_row_holds_them(value):
    """The ledger signs an entry from the texts its row then takes (integrity.call_texts): for any value,
    that MAC is the one a resume's check computes, and each text is what the column encoder spells."""
    keyring = Keyring(b"s" * 32)
    fields = {**_ENTRY, "args": {"v": value}, "outcome": value, "error": None if value is None else {"v": value},
              "idempotency_key": value if isinstance(value, str) else None}
    entry = CallRecord(**fields)  # type: ignore[arg-type]
    texts = integrity.call_texts(entry)
    entry.mac = integrity.sign_call(keyring, entry, "cd" * 32, texts)
    integrity.verify_calls(keyring, entry.run_id, [entry])
    assert all(text == dump_json(v) for v, text in texts.values())
