"""P-48, D-75: the user's words a host gives with a run (``Runtime.execute(..., user_words=...)``) are a trusted
source under ``writes = "guard"``. An address the user typed that an untrusted result also holds goes out
without a person, and the reason names the user's words; an address they do not hold still asks, naming the
untrusted result. The words are kept as marks on the run, signed: an edit is refused, a run under any other
mode records nothing, a bad value starts no run, and a resume in another process decides the same way.
SQLite and Postgres.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.frameworks.mail import ALICE, ASKED, ATTACKER, READ, guarded, send_each, sent

from helpers import StoreBackend, each_store_backend, store_backend_params
from tether._engine.lineage.words import MARKS_CHARS, record
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether.errors import InvalidArguments

FIXTURES = Path(__file__).parent.parent / "fixtures"


class Backend(StoreBackend):
    def runtime(self, **kw: Any) -> Runtime:
        return guarded(store=self.store(), **kw)


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    monkeypatch.setenv("MAILBOX_SENT", str(tmp_path / "sent.jsonl"))
    yield from each_store_backend(request, tmp_path, monkeypatch, Backend)


def reasons(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    return [r for e in rt.store.get_calls(run_id) if e.kind == "write" for r in e.lineage["reasons"]]


async def test_p48_an_address_the_user_typed_goes_out_though_the_inbox_holds_it_too(backend, tmp_path):
    async with backend.runtime() as rt:
        assert (await rt.execute(READ)).status == "completed"
        # Without the user's words the copy looks like one taken from the inbox the model read: it asks.
        paused = await rt.execute(send_each(ALICE))
        assert paused.status == "paused", paused.error
        [why] = [r for r in paused.pending["writes"][0]["reasons"] if r["asks"]]
        assert "mail.get_received_emails" in why["says"]
        await rt.cancel(paused.run_id)
        # With them, it is the user's own: it goes, and the journal says why.
        done = await rt.execute(send_each(ALICE), user_words=[ASKED])
        assert done.status == "completed", done.error
        [judged] = reasons(rt, done.run_id)
        assert not judged["asks"] and "the user's own words" in judged["says"], judged
        meta = rt.store.get_run(done.run_id).meta
        assert ["email", ALICE] in meta["user_words"]["marks"]
    assert sent(tmp_path / "sent.jsonl") == [[ALICE]]


async def test_p48_the_user_words_do_not_vouch_for_an_address_they_do_not_hold(backend, tmp_path):
    async with backend.runtime() as rt:
        assert (await rt.execute(READ)).status == "completed"
        paused = await rt.execute(send_each(ALICE, ATTACKER), user_words=ASKED)
        assert paused.status == "paused" and paused.pending["seq"] == 2, paused.error
        [why] = [r for r in paused.pending["writes"][0]["reasons"] if r["asks"]]
        assert "mail.get_received_emails" in why["says"] and why["untrusted"]
    assert sent(tmp_path / "sent.jsonl") == [[ALICE]]


async def test_p48_a_bad_value_starts_no_run_and_other_modes_record_nothing(backend):
    async with backend.runtime() as rt:
        for bad in (42, [ASKED, 3], {"text": ASKED}, b"bytes"):
            with pytest.raises(InvalidArguments, match="user_words"):
                await rt.execute(send_each(ALICE), user_words=bad)  # type: ignore[arg-type]
        assert rt.store.count_runs() == 0
    async with backend.runtime(policy=Policy(writes="allow")) as rt:
        done = await rt.execute(send_each(ALICE), user_words=ASKED)
        assert done.status == "completed"
        assert "user_words" not in rt.store.get_run(done.run_id).meta


async def test_p48_p35_edited_user_words_are_refused_and_nothing_is_sent(backend, tmp_path):
    async with backend.runtime() as rt:
        assert (await rt.execute(READ)).status == "completed"
        paused = await rt.execute(send_each(ATTACKER, ALICE), user_words=ASKED)
        assert paused.status == "paused" and paused.pending["seq"] == 1
    # Someone with write access to the store makes the attacker's address one the user typed.
    backend.sql("UPDATE runs SET meta = replace(meta, ?, ?) WHERE run_id = ?", (ALICE, ATTACKER, paused.run_id))
    async with backend.runtime() as rt:
        refused = await rt.resume(paused.run_id, "approve")
        assert refused.status == "failed" and refused.error["code"] == "run_tampered", refused
        assert refused.error["details"]["fields"] == ["meta.user_words"]
    assert sent(tmp_path / "sent.jsonl") == []


RESUME = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[3])
    import mailbox_tools
    from tether import Policy, Runtime
    from tether._store import open_store
    from tether._store.postgres import PostgresStore

    async def main():
        kind, url, _, schema, run_id = sys.argv[1:6]
        store = open_store(url) if kind == "sqlite" else PostgresStore(url, schema=schema)
        async with Runtime(store=store, tools=[mailbox_tools], policy=Policy(writes="guard"), type_check=False) as rt:
            done = await rt.resume(run_id, "approve")
            calls = [{"seq": e.seq, "lineage": e.lineage} for e in rt.store.get_calls(run_id) if e.kind == "write"]
            print(json.dumps({"status": done.status, "error": done.error, "calls": calls}))
        store.close()

    asyncio.run(main())
""")


async def test_p48_a_resume_in_another_process_trusts_the_same_words(backend, tmp_path):
    async with backend.runtime() as rt:
        assert (await rt.execute(READ)).status == "completed"
        # The attacker's address asks first; the user's address is reached, and judged, in the other process.
        paused = await rt.execute(send_each(ATTACKER, ALICE), user_words=ASKED)
        assert paused.status == "paused" and paused.pending["seq"] == 1, paused.error
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = dict(os.environ, MAILBOX_SENT=str(tmp_path / "sent.jsonl"))
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(script), backend.kind, backend.url, str(FIXTURES), backend.schema,
                         paused.run_id], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout.strip().splitlines()[-1])
    assert done["status"] == "completed", done
    verdicts = {c["seq"]: c["lineage"]["ask"] for c in done["calls"]}
    assert verdicts == {1: True, 2: False}
    [alice] = done["calls"][1]["lineage"]["reasons"]
    assert "the user's own words" in alice["says"]
    assert sent(tmp_path / "sent.jsonl") == [[ATTACKER], [ALICE]]


def test_p48_what_a_run_keeps_is_bounded_and_a_string_is_one_message():
    assert record(ASKED) == record([ASKED])
    assert record(None) is None and record(ASKED, guarded=False) is None
    assert record("") == {"marks": []}
    # A long paste keeps its marks to a bound the run's signed record can carry.
    many = " ".join(f"user{i}@corp{i}.example" for i in range(20_000))
    kept = record([many, many])
    assert kept is not None
    assert sum(len(n) for _, n in kept["marks"]) <= MARKS_CHARS
    assert len({n for _, n in kept["marks"]}) == len(kept["marks"])
    # Past the bound, the latest message is the one kept: a long conversation still trusts what was said last.
    later = record([many, ASKED])
    assert later is not None and ["email", ALICE] in later["marks"]
