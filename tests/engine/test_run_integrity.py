"""Run state integrity (P-35) and stuck runs ending: each attack edits the stored rows directly,
on SQLite and on Postgres, and shows that a resume refuses what was not signed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers import Recorder, StoreBackend, each_store_backend, store_backend_params
from tether._engine import launcher
from tether._engine.approvals.capabilities import secret_id
from tether._engine.calls import ledger
from tether._engine.rules.policy import Policy
from tether._engine.worker import Worker
from tether._runtime import Runtime
from tether._store import open_store
from tether.errors import WrongSecret

TWO_WRITES = """
import tools
t = await tools.helpdesk.get_ticket(id=1)
a = await tools.helpdesk.close_ticket(id=1)
b = await tools.helpdesk.close_ticket(id=2)
[t["title"], a["status"], b["status"]]
"""


class Backend(StoreBackend):
    def runtime(self, rec: Recorder, **kw: Any) -> Runtime:
        kw.setdefault("type_check", False)
        kw.setdefault("policy", Policy(writes="ask"))
        return Runtime(store=self.store(), tools=rec.tools(), **kw)


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    yield from each_store_backend(request, tmp_path, monkeypatch, Backend)


async def paused_run(backend: Backend, rec: Recorder, program: str = TWO_WRITES) -> str:
    async with backend.runtime(rec) as rt:
        paused = await rt.execute(program)
    assert paused.status == "paused" and paused.pending["seq"] == 2
    return paused.run_id


async def assert_tampered(backend: Backend, rec: Recorder, run_id: str, field: str, secret_word: str = "") -> None:
    async with backend.runtime(rec) as rt:
        r = await rt.resume(run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "run_tampered", r.error
        assert field in r.error["details"]["fields"] and field in r.error["message"]
        if secret_word:
            assert secret_word not in json.dumps(r.error)  # names the field, never the value
        assert rt.store.get_run(run_id).status == "failed"
        assert rt.store.list_waits(run_id=run_id) == []
    assert rec.deliveries == []


async def test_p35_policy_edited_from_ask_to_allow_sends_nothing(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET policy = ? WHERE run_id = ?",
                (json.dumps(Policy(writes="allow").to_dict(), sort_keys=True, separators=(",", ":")), run_id))
    await assert_tampered(backend, rec, run_id, "policy")


async def test_p35_program_edited_and_snapshot_deleted_is_not_replayed(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    evil = TWO_WRITES.replace("close_ticket(id=2)", "close_ticket(id=666)")
    backend.sql("UPDATE runs SET program = ? WHERE run_id = ?", (evil, run_id))
    backend.sql("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
    # "id=666", not "666": a run id is random hex and holds "666" now and then (CI saw run_3197772366674ff4).
    await assert_tampered(backend, rec, run_id, "program", secret_word="id=666")


async def test_p35_a_forged_journal_outcome_is_not_replayed(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE calls SET outcome = ? WHERE run_id = ? AND seq = 1",
                ('{"id":1,"status":"open","title":"forged"}', run_id))
    backend.sql("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
    await assert_tampered(backend, rec, run_id, "journal[1]", secret_word="forged")


async def test_p35_a_write_moved_from_asked_to_approved_is_not_sent(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE calls SET state = 'approved' WHERE run_id = ? AND seq = 2", (run_id,))
    await assert_tampered(backend, rec, run_id, "journal[2]")


async def test_d51_a_field_that_was_none_when_signed_is_refused_once_it_holds_a_value(backend):
    # A None field is signed by its absence (D-51): given a value in the store, it no longer verifies.
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET session = ? WHERE run_id = ?", ("someone-elses-session", run_id))
    await assert_tampered(backend, rec, run_id, "session", secret_word="someone-elses-session")


async def test_d51_a_signed_field_set_to_none_is_refused(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET expires_at = NULL WHERE run_id = ?", (run_id,))
    await assert_tampered(backend, rec, run_id, "expires_at")


async def test_p35_the_pending_call_and_limits_are_signed(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET limits = ? WHERE run_id = ?", ('{"host_calls":100000}', run_id))
    await assert_tampered(backend, rec, run_id, "limits")
    rec2 = Recorder()
    other = await paused_run(backend, rec2)
    backend.sql("UPDATE runs SET pending = replace(pending, '\"seq\":2', '\"seq\":3') WHERE run_id = ?", (other,))
    await assert_tampered(backend, rec2, other, "pending")


async def test_p35_a_run_whose_signature_was_removed_is_refused(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET mac = NULL WHERE run_id = ?", (run_id,))
    await assert_tampered(backend, rec, run_id, "mac")


async def test_p35_an_untampered_run_still_resumes_in_another_runtime(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    async with backend.runtime(rec) as rt:
        r = await rt.resume(run_id, "approve")
        assert r.status == "paused" and r.pending["seq"] == 3
        r = await rt.resume(run_id, "approve", seq=3)
        assert r.status == "completed" and r.result == ["ticket 1", "closed", "closed"], r.error
    assert rec.deliveries == [("close_ticket", {"id": 1}), ("close_ticket", {"id": 2})]


async def test_p35_a_wrong_secret_is_told_apart_and_the_run_stays_paused(backend, monkeypatch):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    monkeypatch.setenv("TETHER_SECRET", "not the secret this store was signed with")
    async with backend.runtime(rec) as rt:
        with pytest.raises(WrongSecret) as info:
            await rt.resume(run_id, "approve")
        assert info.value.code == "wrong_secret" and "signed with another key" in info.value.message
        assert rt.store.get_run(run_id).status == "paused"
        # A worker holding the wrong secret leaves it alone too.
        assert await rt.recover() == [] and await launcher.wake_due(rt.engine) == []
    monkeypatch.delenv("TETHER_SECRET")
    async with backend.runtime(rec) as rt:
        assert (await rt.resume(run_id, "approve")).status == "paused"
    assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_p35_rotation_keeps_old_runs_verifiable(backend, monkeypatch, tmp_path):
    rec = Recorder()
    monkeypatch.setenv("TETHER_SECRET", "a" * 64)
    run_id = await paused_run(backend, rec)
    monkeypatch.delenv("TETHER_SECRET")
    keys = tmp_path / "secrets"
    keys.write_text(f"# current first, then older ones\n{'b' * 64}\n{'a' * 64}\n")
    monkeypatch.setenv("TETHER_SECRET_FILE", str(keys))
    async with backend.runtime(rec) as rt:
        assert rt.store.secret_source == "file"
        r = await rt.resume(run_id, "approve")
        assert r.status == "paused", r.error
        assert rt.store.get_run(run_id).mac["secret_id"] == secret_id(bytes.fromhex("b" * 64))
        r = await rt.resume(run_id, "approve", seq=3)
        assert r.status == "completed", r.error
    assert len(rec.deliveries) == 2


async def test_p35_the_recorded_tools_path_is_never_imported_unsigned(backend, tmp_path, monkeypatch):
    # The reported attack: editing meta.tools made `tether resume` import a file and deliver to it.
    from tether import cli
    from tether.cli.runs import cmd_resume

    backend.schema = "tether"  # what a config's postgres url opens
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tether.toml").write_text(f'[store]\nurl = "{backend.url}"\n[sandbox]\ntype_check = false\n')
    deliveries = tmp_path / "delivered.txt"
    (tmp_path / "desk.py").write_text(f'''
from tether import tool

@tool(namespace="desk")
def close(id: int) -> str:
    """Close a ticket."""
    open({str(deliveries)!r}, "a").write(f"close {{id}}\\n")
    return "closed"
''')
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil.py").write_text(f'''
open({str(marker)!r}, "w").write("imported")
from tether import tool

@tool(namespace="desk")
def close(id: int) -> str:
    """Close a ticket."""
    return "stolen"
''')
    from tether._app import open_runtime

    parser = cli.build_parser()

    async with open_runtime(config_path=tmp_path / "tether.toml", tools=[str(tmp_path / "desk.py")]) as rt:
        paused = await rt.execute("import tools\nawait tools.desk.close(id=7)",
                                  meta={"tools": [str(tmp_path / "desk.py")]})
    assert paused.status == "paused"
    run_id = paused.run_id
    backend.sql("UPDATE runs SET meta = replace(meta, 'desk.py', 'evil.py') WHERE run_id = ?", (run_id,))
    code = await cmd_resume(parser.parse_args(["--config", "tether.toml", "resume", run_id, "--approve"]))
    assert code == cli.EXIT_FAILED
    assert not marker.exists() and not deliveries.exists()
    run = backend.store().get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "run_tampered"
    assert "meta.tools" in run.error["details"]["fields"]


# ---------------------------------------------------------------------------
# Stuck runs end: nothing is left `running` that no attempt can continue.


async def orphan(backend: Backend, rec: Recorder) -> str:
    """A paused run approved by a process that then died: running, its lease long gone."""
    run_id = await paused_run(backend, rec)
    async with backend.runtime(rec) as rt:
        decided = {"seq": 2, "decision": "approve", "reason": None, "at": 0.0}
        assert rt.store.update_run(run_id, ["paused"], status="running", owner="dead:1", lease_until=1.0,
                                   decision=decided)
        assert ledger.move(rt.engine.store, rt.engine.keyring, rt.store.get_call(run_id, 2), ["asked"], state="approved")
    return run_id


async def test_p35_d90_a_repeated_resume_continues_a_run_nobody_owns_at_once(backend):
    import asyncio

    rec = Recorder()
    run_id = await orphan(backend, rec)
    async with backend.runtime(rec) as rt:
        # Waiting for it answers at once that nobody owns it (before: 300 s, then "running: [None] None").
        r = await asyncio.wait_for(rt.engine.wait_for_run(run_id), timeout=60)
        assert r.status == "running" and r.error["code"] == "run_unowned"
        assert "tether recover" in r.error["next_action"]
        # The person who approved repeats it: the run is taken over and continued, as recovery would (D-90):
        # the approved write is sent once and the run goes on to its next pause.
        r = await asyncio.wait_for(rt.resume(run_id, "approve"), timeout=60)
        assert r.status == "paused" and r.pending["seq"] == 3, r.error
        assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_p35_a_serving_worker_leaves_runs_signed_with_another_secret_alone(backend, monkeypatch):
    # `tether worker` / serve's loop (Worker.work) took queued runs and orphans without vetting them, and
    # their attempt then ended them failed wrong_secret: a replica given the wrong secret file ate them.
    rec = Recorder()
    stranded = await orphan(backend, rec)
    async with backend.runtime(rec) as rt:
        queued = rt.start(TWO_WRITES)
    monkeypatch.setenv("TETHER_SECRET", "not the secret these runs were signed with")
    async with backend.runtime(rec) as rt:
        handled = await Worker(rt.engine).work(idle_exit_seconds=0)
        assert handled == 0
        assert rt.store.get_run(stranded).status == "running"
        assert rt.store.get_run(queued).status == "queued"
    monkeypatch.delenv("TETHER_SECRET")
    async with backend.runtime(rec) as rt:  # the replica holding the secret still runs both
        assert await Worker(rt.engine).work(idle_exit_seconds=0) == 2
        assert rt.store.get_run(queued).status == "paused"
        assert rt.store.get_run(stranded).status == "paused"  # its approved write sent, the next one asks
    assert rec.deliveries == [("close_ticket", {"id": 1})]


async def test_p35_runs_cancel_ends_a_run_nobody_owns(backend):
    rec = Recorder()
    run_id = await orphan(backend, rec)
    async with backend.runtime(rec) as rt:
        r = await rt.cancel(run_id, "stuck")
        assert r.status == "cancelled"
        assert rt.store.get_run(run_id).status == "cancelled"
        assert await rt.recover() == []
    assert rec.deliveries == []


async def test_p35_runs_cancel_ends_a_tampered_or_foreign_paused_run(backend, monkeypatch):
    rec = Recorder()
    tampered = await paused_run(backend, rec)
    backend.sql("UPDATE runs SET program = 'x' WHERE run_id = ?", (tampered,))
    foreign = await paused_run(backend, rec)
    monkeypatch.setenv("TETHER_SECRET", "some other secret")
    async with backend.runtime(rec) as rt:
        for run_id in (tampered, foreign):
            assert (await rt.cancel(run_id, "not wanted")).status == "cancelled"
            assert rt.store.get_run(run_id).status == "cancelled"
    assert rec.deliveries == []


async def test_p35_recovery_ends_a_tampered_running_run_instead_of_looping(backend):
    rec = Recorder()
    run_id = await orphan(backend, rec)
    backend.sql("UPDATE runs SET policy = ? WHERE run_id = ?", ('{"rules":[],"write_budget":99,"writes":"allow"}', run_id))
    async with backend.runtime(rec) as rt:
        [r] = await rt.recover()
        assert r.status == "failed" and r.error["code"] == "run_tampered"
        assert r.error["details"]["fields"] == ["policy"]
        assert rt.store.get_run(run_id).status == "failed"
        assert await rt.recover() == []
    assert rec.deliveries == []


async def test_p35_a_tampered_snapshot_ends_the_run_on_recovery(backend):
    rec = Recorder()
    run_id = await orphan(backend, rec)
    backend.sql("UPDATE snapshots SET data = ? WHERE run_id = ?", (b"not a dump", run_id))
    async with backend.runtime(rec) as rt:
        [r] = await rt.recover()
        assert r.status == "failed" and r.error["code"] == "snapshot_tampered"
        assert rt.store.get_run(run_id).status == "failed"
    assert rec.deliveries == []


def test_p35_serve_warns_when_the_secret_is_a_row_of_the_same_postgres(backend, monkeypatch, capsys):
    from tether._server.start import warn_if_secret_beside_data

    store = backend.store()
    assert warn_if_secret_beside_data(store) is (backend.kind == "postgres")
    if backend.kind == "postgres":
        assert "WARNING" in capsys.readouterr().err
    monkeypatch.setenv("TETHER_SECRET", "kept elsewhere")
    assert warn_if_secret_beside_data(backend.store()) is False


def test_p35_a_secret_file_that_cannot_be_read_is_a_clear_error(tmp_path, monkeypatch):
    from tether.errors import StoreError

    monkeypatch.delenv("TETHER_SECRET", raising=False)
    monkeypatch.setenv("TETHER_SECRET_FILE", str(tmp_path))  # a directory
    with pytest.raises(StoreError, match="cannot read the secret file"):
        open_store(f"sqlite:///{tmp_path}/t.db")
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    monkeypatch.setenv("TETHER_SECRET_FILE", str(empty))
    with pytest.raises(StoreError, match="holds no secret"):
        open_store(f"sqlite:///{tmp_path}/t.db")


async def test_p35_edited_source_definitions_are_never_loaded_by_a_worker(backend, tmp_path, monkeypatch):
    # meta.sources (P-30) names modules and commands a worker loads: only once signed.
    from tether._app import open_runtime

    backend.schema = "tether"  # what a config's postgres url opens
    monkeypatch.chdir(tmp_path)
    (tmp_path / "desk.py").write_text('from tether import tool\n\n@tool(namespace="desk", read_only=True)\n'
                                      'def get(id: int) -> int:\n    """Get."""\n    return id\n')
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil.py").write_text(f'open({str(marker)!r}, "w").write("imported")\n'
                                      'from tether import tool\n\n@tool(namespace="desk", read_only=True)\n'
                                      'def get(id: int) -> int:\n    """Get."""\n    return -1\n')
    config = tmp_path / "tether.toml"
    config.write_text(f'[store]\nurl = "{backend.url}"\n[sandbox]\ncheck = "off"\n'
                      f'[[sources]]\ntype = "python"\nmodule = "{tmp_path / "desk.py"}"\n')
    async with open_runtime(config_path=config) as rt:
        run_id = rt.start("import tools\nawait tools.desk.get(id=1)")
    assert "desk.py" in json.dumps(backend.store().get_run(run_id).meta.get("sources"))
    backend.sql("UPDATE runs SET meta = replace(meta, 'desk.py', 'evil.py') WHERE run_id = ?", (run_id,))
    (tmp_path / "tether.toml").write_text(f'[store]\nurl = "{backend.url}"\n[sandbox]\ncheck = "off"\n')
    async with open_runtime(config_path=config) as rt:
        [r] = await Worker(rt.engine).run_queued()
        assert r.status == "failed" and r.error["code"] == "run_tampered"
        assert r.error["details"]["fields"] == ["meta.sources"]
    assert not marker.exists()


async def test_p35_the_process_that_signed_a_run_still_checks_it_when_read_back(backend):
    # D-45: a record signed here is not checked again while it is the object signed, with the values signed;
    # the same runtime reading the run back from the store checks it in full.
    rec = Recorder()
    async with backend.runtime(rec) as rt:
        paused = await rt.execute(TWO_WRITES)
        assert paused.status == "paused"
        backend.sql("UPDATE runs SET policy = ? WHERE run_id = ?",
                    (json.dumps(Policy(writes="allow").to_dict(), sort_keys=True, separators=(",", ":")),
                     paused.run_id))
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "run_tampered" and "policy" in r.error["details"]["fields"]
    assert rec.deliveries == []


def test_p35_a_record_signed_here_and_then_changed_is_checked_in_full(tmp_path):
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.integrity import sign_run, verify_run
    from tether._store.base import RunRecord
    from tether._store.states import RunStatus
    from tether.errors import RunTampered

    store = open_store(f"sqlite:///{tmp_path}/tether.db")
    try:
        ring = keyring_for(store)
        run = RunRecord("r1", RunStatus.RUNNING, "1 + 1", {"clock": "2026-01-01T00:00:00", "seed": 1}, {}, {}, 0.0, 0.0)
        run.mac = sign_run(ring, run)
        verify_run(ring, run)
        run.program = "import os"  # a signed field given another value after signing
        with pytest.raises(RunTampered) as exc:
            verify_run(ring, run)
        assert exc.value.details["fields"] == ["program"]
    finally:
        store.close()


def test_p35_every_mac_is_plain_hmac_sha256_under_its_own_key():
    """A MAC is reproducible by any HMAC-SHA256 library (what an operator checks a record with), whichever
    key made the one before it: the keyed state kept per key never carries one key's MAC to another."""
    import hashlib
    import hmac

    from tether._engine.approvals.capabilities import mac_hex

    keys = [b"", b"k" * 32, b"x" * 100, b"k" * 31 + b"j"]
    for message in (b"", b"[1,2]", "é".encode() * 2000):
        for key in keys + keys[::-1]:
            assert mac_hex(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()


async def test_p35_a_read_signed_from_its_encoded_result_verifies_field_by_field(tmp_path):
    """A large read's MAC is made with the text its size check already encoded; what a resume checks —
    each entry MACed again from its stored fields — must agree, for UTF-8 and ASCII alike, also when the
    tool changed the arguments it was handed, and still refuse an entry changed afterwards."""
    import tether
    from tether._engine import integrity
    from tether._engine.approvals.capabilities import keyring_for
    from tether._tools.model import Annotations, Tool
    from tether.errors import RunTampered

    @tether.tool(namespace="big", read_only=True)
    async def rows(q: str, n: int) -> dict[str, Any]:
        """Rows matching q."""
        return {"rows": [{"id": i, "name": f"{q} {i}", "note": None, "score": i / 3} for i in range(n)]}

    async def tidy(args: dict[str, Any]) -> Any:
        args["q"] = args["q"].strip()  # in place: the very dict the journal holds
        return {"q": args["q"], "pad": "p" * 300}

    tidies = Tool(namespace="big", name="tidy", description="tidy", handler=tidy, annotations=Annotations(read_only=True),
                  input_schema={"type": "object", "additionalProperties": True})
    store = open_store(f"sqlite:///{tmp_path}/j.db")
    async with Runtime(tools=[rows, tidies], store=store, type_check=False) as rt:
        program = ("import tools\na = await tools.big.rows(q='x' * 400, n=200)\n"
                   "b = await tools.big.rows(q='é' * 300, n=50)\nc = await tools.big.rows(q='s', n=1)\n"
                   "d = await tools.big.tidy(q=' ' + 'y' * 400 + ' ')\n"
                   "len(a['rows']) + len(b['rows']) + len(c['rows']) + len(d['q'])")
        r = await rt.execute(program)
        assert r.status == "completed" and r.result == 651, r.error
        calls = rt.store.get_calls(r.run_id)
        assert len(calls) == 4
        keyring = keyring_for(rt.store)
        integrity.verify_calls(keyring, r.run_id, calls)
        calls[0].outcome["rows"][5]["name"] = "x" * 400 + " 6"
        with pytest.raises(RunTampered):
            integrity.verify_calls(keyring, r.run_id, calls)


# -- D-55: the run signature covers which fields carry a MAC ----------------------------------------------


def stored_mac(backend: Backend, run_id: str) -> dict[str, Any]:
    store = backend.store()
    try:
        mac = store.get_run(run_id).mac
    finally:
        store.close()
    return dict(mac)


def write_mac(backend: Backend, run_id: str, mac: dict[str, Any]) -> None:
    backend.sql("UPDATE runs SET mac = ? WHERE run_id = ?", (json.dumps(mac), run_id))


@pytest.mark.parametrize("field, column, none", [
    ("principal", "principal", None),  # a principal's run passed off as a local one
    ("limits", "limits", "null"),  # a NOT NULL JSON column: its JSON null reads back as None
    ("expires_at", "expires_at", None),  # a pause that never expires
])
async def test_d55_a_fields_mac_removed_with_the_field_set_to_none_is_refused_naming_it(backend, field, column, none):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    mac = stored_mac(backend, run_id)
    assert mac["format"] == 2 and field in mac["fields"]
    del mac["fields"][field]
    write_mac(backend, run_id, mac)
    backend.sql(f"UPDATE runs SET {column} = ? WHERE run_id = ?", (none, run_id))
    async with backend.runtime(rec) as rt:
        r = await rt.resume(run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "run_tampered", r.error
        assert r.error["details"]["fields"] == [field] and field in r.error["message"]
    assert rec.deliveries == []


async def test_d55_a_signature_rewritten_as_the_old_format_is_refused(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    mac = stored_mac(backend, run_id)
    old = {"secret_id": mac["secret_id"], "fields": mac["fields"]}  # format 1 has neither a format nor names
    write_mac(backend, run_id, old)
    await assert_tampered(backend, rec, run_id, "program")
    # Every MAC removed as well, every field that may be None set to None: format 1's gap, were it accepted.
    rec2 = Recorder()
    other = await paused_run(backend, rec2)
    write_mac(backend, other, {"secret_id": mac["secret_id"], "fields": {}})
    backend.sql("UPDATE runs SET principal = NULL, pending = NULL, expires_at = NULL, policy = 'null', "
                "limits = 'null', environment = 'null', meta = '{}' WHERE run_id = ?", (other,))
    async with backend.runtime(rec2) as rt:
        r = await rt.resume(other, "approve")
        assert r.status == "failed" and r.error["code"] == "run_tampered", r.error
        assert r.error["details"]["fields"] == ["program", "environment", "policy", "limits"]
    assert rec2.deliveries == []


async def test_d55_a_removed_names_mac_is_refused(backend):
    rec = Recorder()
    run_id = await paused_run(backend, rec)
    mac = stored_mac(backend, run_id)
    del mac["names"]
    write_mac(backend, run_id, mac)
    await assert_tampered(backend, rec, run_id, "mac")


async def test_d55_a_run_signed_in_the_old_format_still_verifies_and_resumes(backend):
    """Runs signed before D-55 are in stores today: they verify as they did, and the pause they next make
    is signed in the new format."""
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.integrity import sign_run

    rec = Recorder()
    run_id = await paused_run(backend, rec)
    store = backend.store()
    try:
        run = store.get_run(run_id)
        old = dict(sign_run(keyring_for(store), run, 1))
    finally:
        store.close()
    assert "format" not in old and "names" not in old
    write_mac(backend, run_id, old)
    async with backend.runtime(rec) as rt:
        r = await rt.resume(run_id, "approve")
        assert r.status == "paused" and r.pending["seq"] == 3, r.error
        assert rt.store.get_run(run_id).mac["format"] == 2
        r = await rt.resume(run_id, "approve", seq=3)
        assert r.status == "completed" and r.result == ["ticket 1", "closed", "closed"], r.error
    assert rec.deliveries == [("close_ticket", {"id": 1}), ("close_ticket", {"id": 2})]


@pytest.mark.parametrize("field", ["policy", "limits", "environment"])
async def test_d55_an_old_format_run_whose_policy_limits_or_environment_lost_its_mac_is_refused(backend, field):
    # Format 1 has the gap D-55 closes for new runs; these fields are never None on a real run, so a format-1
    # signature without their MAC was edited. Before: policy or limits set to None made resume raise a bare
    # AttributeError (no code), environment ended the run internal_error.
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.integrity import sign_run

    rec = Recorder()
    run_id = await paused_run(backend, rec)
    store = backend.store()
    try:
        old = dict(sign_run(keyring_for(store), store.get_run(run_id), 1))
    finally:
        store.close()
    old["fields"] = {k: v for k, v in old["fields"].items() if k != field}
    write_mac(backend, run_id, old)
    backend.sql(f"UPDATE runs SET {field} = 'null' WHERE run_id = ?", (run_id,))  # JSON null: read as None
    await assert_tampered(backend, rec, run_id, field)


async def test_d55_run_signature_1_writes_what_the_previous_release_reads_and_2_resumes_it(backend):
    """A rolling upgrade (docs/deploy.md): replicas of this release set to format 1 sign runs the previous
    release's replicas verify; once none is left, format 2 (the default) resumes them."""
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.integrity import signed_run_fields

    rec = Recorder()
    async with backend.runtime(rec, run_signature=1) as rt:
        paused = await rt.execute(TWO_WRITES)
        run = rt.store.get_run(paused.run_id)
        assert "format" not in run.mac and "names" not in run.mac
        # The previous release's check, by hand: one MAC per field over ["run", run_id, name, value].
        ring = keyring_for(rt.store)
        for name, value in signed_run_fields(run):
            if name in run.mac["fields"]:
                assert ring.mac(ring.current, "run", run.run_id, name, value)[:32] == run.mac["fields"][name]
    async with backend.runtime(rec) as rt:
        r = await rt.resume(paused.run_id, "approve")
        assert r.status == "paused" and rt.store.get_run(paused.run_id).mac["format"] == 2, r.error
    with pytest.raises(Exception) as info:
        backend.runtime(rec, run_signature=3)
    assert getattr(info.value, "code", None) == "invalid_arguments"


def _record(**fields: Any) -> Any:
    from tether._store.base import RunRecord
    from tether._store.states import RunStatus

    run = RunRecord("run_0123456789abcdef", RunStatus.PAUSED, "1 + 1", {"clock": "2026-01-01T00:00:00", "seed": 1},
                    {"writes": "ask"}, {"host_calls": 10}, 0.0, 0.0, principal="p", expires_at=5.0,
                    pending={"seq": 2}, session="s",
                    meta={"tools": ["m"], "config": {"a": 1}, "type_check": True, "session_base": {"b": 1},
                          "sources": [{"type": "python"}], "client": {"name": "c"},
                          "user_words": {"marks": [["email", "bob@corp.example"]]}})
    for name, value in fields.items():
        setattr(run, name, value)
    return run


_NULLABLE = ["principal", "session", "environment", "policy", "limits", "meta.tools", "meta.config",
             "meta.type_check", "meta.session_base", "meta.sources", "meta.client", "meta.user_words", "pending",
             "expires_at"]


def _set_none(run: Any, name: str) -> None:
    if name.startswith("meta."):
        run.meta.pop(name[5:])
    else:
        setattr(run, name, None)


def test_d55_any_set_of_dropped_fields_is_named_and_old_signatures_keep_verifying():
    """Property: removing the MACs of any set of fields, each set to None, is refused naming exactly those
    (format 2); the same record signed in format 1 verifies (the gap format 1 keeps, D-55) unless a field
    no run is ever without lost its MAC."""
    import copy

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.integrity import sign_run, verify_run
    from tether.errors import RunTampered

    ring = Keyring(b"k" * 32, (b"old" * 11,))

    @settings(max_examples=60, deadline=None)
    @given(st.sets(st.sampled_from(_NULLABLE), min_size=1, max_size=4), st.booleans())
    def check(dropped: set[str], rotated: bool) -> None:
        signer = Keyring(ring.previous[0]) if rotated else ring  # signed before a rotation: verifies after it
        run = _record()
        stored = copy.deepcopy(dict(sign_run(signer, run)))
        run = copy.deepcopy(run)
        run.mac = copy.deepcopy(stored)
        verify_run(ring, run)
        for name in dropped:
            del run.mac["fields"][name]
            _set_none(run, name)
        with pytest.raises(RunTampered) as info:
            verify_run(ring, run)
        assert info.value.details["fields"] == [n for n in ["principal", "session", "program", *_NULLABLE[2:]]
                                                if n in dropped]
        old = copy.deepcopy(run)
        old.mac = copy.deepcopy(dict(sign_run(signer, _record(), 1)))
        for name in dropped:
            del old.mac["fields"][name]
        always = [n for n in ["environment", "policy", "limits"] if n in dropped]  # never None on a real run
        if always:
            with pytest.raises(RunTampered) as info:
                verify_run(ring, old)
            assert info.value.details["fields"] == always
        else:
            verify_run(ring, old)  # format 1's gap, kept for the runs signed so

    check()


def test_d55_a_stored_key_spelling_two_field_names_is_refused():
    """The names MAC joins names with commas: a stored key holding one is never taken as two fields."""
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.integrity import sign_run, verify_run
    from tether.errors import RunTampered

    ring = Keyring(b"k" * 32)
    run = _record()
    run.mac = dict(sign_run(ring, run))
    limits, policy = run.mac["fields"].pop("limits"), run.mac["fields"].pop("policy")
    run.mac["fields"]["limits,policy"] = limits + policy
    run.limits = run.policy = None
    with pytest.raises(RunTampered) as info:
        verify_run(ring, run)
    assert info.value.details["fields"] == ["policy", "limits"]


def test_d55_a_format_this_tether_does_not_know_is_refused_and_said_so():
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.integrity import sign_run, verify_run
    from tether.errors import RunTampered

    ring = Keyring(b"k" * 32)
    run = _record()
    run.mac = {**sign_run(ring, run), "format": 3}
    with pytest.raises(RunTampered) as info:
        verify_run(ring, run)
    assert info.value.details["fields"] == ["mac"] and "format 3" in info.value.message
