"""A journal entry is encoded once (issue 24): the text the call boundary made of a result is the one its row
holds and, for a large result, its MAC is made from. The boundary's texts keep UTF-8 and the columns and MACs
escape, so a text is used only where both spell it alike; whatever the result, a resume's check (P-35) of the
stored entries must pass.
"""

from __future__ import annotations

from typing import Any

import pytest

import tether
from tether._engine import integrity
from tether._engine.approvals.capabilities import keyring_for
from tether._runtime import Runtime
from tether._store import open_store
from tether._store._rows import dump_json
from tether.errors import RunTampered


@tether.tool(namespace="t", read_only=True)
async def echo(text: str, pad: int) -> dict[str, Any]:
    """The text, padded."""
    return {"text": text, "pad": "p" * pad}


@pytest.mark.parametrize("text", ["\x7f", "a\x7fb", "é\x7f", "\x00\x1f", "plain"])
@pytest.mark.parametrize("pad", [0, 300])  # a short result's MAC encodes it again; a long one's reuses its text
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
