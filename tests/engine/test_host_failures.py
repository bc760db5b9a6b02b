"""The host survives what it hosts: its own failures end a run, and hostile inputs get named errors (P-26)."""

from __future__ import annotations

import json
import logging
import os
import subprocess

import pytest

from helpers import Recorder, run_cli
from tether._runtime import Runtime
from tether._sources.python import tools_from_module
from tether._store import open_store
from tether._store.sqlite import SQLiteStore
from tether.errors import UsageError


class FailsToRecordCompletion(SQLiteStore):
    """The real store, except that recording a completed run fails once (a fault point, as a disk error would)."""

    failed = False

    def update_run(self, run_id, expect_status, **fields):
        if fields.get("status") == "completed" and not self.failed:
            type(self).failed = True
            raise RuntimeError("disk I/O error while writing the envelope")
        return super().update_run(run_id, expect_status, **fields)


async def test_p26_a_failure_inside_the_host_while_finishing_ends_the_run_failed(tmp_path, caplog):
    store = FailsToRecordCompletion(f"sqlite:///{tmp_path}/t.db")
    caplog.set_level(logging.ERROR, logger="tether.runs")
    async with Runtime(store=store, type_check=False) as rt:
        r = await rt.execute("6 * 7")
        assert r.status == "failed" and r.error["code"] == "internal_error"
        correlation = r.error["details"]["correlation_id"]
        assert correlation in r.error["message"] and "disk I/O" not in json.dumps(r.error)
        run = rt.store.get_run(r.run_id)
        assert run.status == "failed" and run.owner is None and run.result["error"]["code"] == "internal_error"
        assert (await rt.execute("1 + 1")).result == 2  # the host goes on
    logged = [rec for rec in caplog.records if correlation in rec.getMessage()]
    assert logged and logged[0].exc_info is not None


def tools_file(tmp_path, body: str) -> str:
    path = tmp_path / "hostile_tools.py"
    path.write_text("import sys\nfrom tether._sources.python import tool\nTETHER_NAMESPACE = 'h'\n\n" + body)
    return str(path)


EXITING = '''
@tool(read_only=True)
def leave() -> int:
    """Calls sys.exit."""
    sys.exit(3)


@tool(read_only=True)
def interrupt() -> int:
    """Raises KeyboardInterrupt."""
    raise KeyboardInterrupt


@tool(read_only=True)
def raw() -> bytes:
    """Returns bytes that are not UTF-8."""
    return b"\\xff\\xfe"
'''


async def test_p26_a_tool_that_exits_or_interrupts_fails_its_call_and_the_run_ends(tmp_path):
    async with Runtime(tools=tools_from_module(tools_file(tmp_path, EXITING)), type_check=False) as rt:
        for name, what in (("leave", "SystemExit(3)"), ("interrupt", "KeyboardInterrupt")):
            r = await rt.execute(f"import tools\nawait tools.h.{name}()")
            assert r.status == "failed" and r.error["code"] == "tool_error" and what in r.error["message"]
            assert rt.store.get_run(r.run_id).status == "failed"
            caught = await rt.execute(f"import tools\ntry:\n    await tools.h.{name}()\nexcept RuntimeError:\n"
                                      "    x = 'caught'\nx")
            assert caught.result == "caught"


async def test_a_python_tool_returning_bytes_gives_the_program_text(tmp_path):
    async with Runtime(tools=tools_from_module(tools_file(tmp_path, EXITING)), type_check=False) as rt:
        r = await rt.execute("import tools\nawait tools.h.raw()")
        assert r.status == "completed" and r.result == "//4=" and any("base64" in n for n in r.notes)


async def test_session_names_are_bounded(store_url):
    async with Runtime(store=open_store(store_url), type_check=False) as rt:
        for name in ("", "x" * 129, "a\nb", 7):
            with pytest.raises(UsageError) as err:
                await rt.execute("1", session=name)
            assert err.value.code == "invalid_arguments" and "nothing was run" in err.value.message
        assert (await rt.execute("x = 1", session="n" * 128)).status == "completed"
        assert rt.store.list_runs(limit=10)[0].session == "n" * 128


async def test_resetting_a_session_ends_only_the_callers_waits(store_url):
    async with Runtime(store=open_store(store_url), tools=Recorder().tools(), type_check=False) as rt:
        mine = await rt.execute("await wait_for('go')", session="nb")
        theirs = await rt.execute("await wait_for('go')", session="nb", principal="token:" + "b" * 32)
        assert mine.status == theirs.status == "waiting"
        rt.reset_session("nb")
        assert [w["status"] for w in rt.list_waits(mine.run_id, status=None)] == ["revoked"]
        assert [w["status"] for w in rt.list_waits(theirs.run_id, principal="token:" + "b" * 32,
                                                    status=None)] == ["pending"]


# -- the command line ------------------------------------------------------------------


def tether(tmp_path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``tether ARGS`` through ``main()`` in this process: a traceback would fail the test itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_STORE_URL", "TETHER_SECRET", "TETHER_TOKEN")}
    env["TETHER_HOME"] = str(tmp_path / "home")
    return run_cli(list(args), env, tmp_path, stdin)


def test_cli_names_what_is_wrong_instead_of_a_traceback(tmp_path):
    (tmp_path / "ok.py").write_text("1 + 1")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "latin1.py").write_bytes("'caf\xe9'\n".encode("latin-1"))
    (tmp_path / "plain.py").write_text("def get_ticket(ticket_id):\n    return {}\n")  # no @tool
    cases = [
        (("run", "ok.py", "--tools", "plain.py"), None, 2, "[tools_invalid]", "no @tool functions"),
        (("run", "ok.py", "--tools", "raises.py"), None, 2, "[tools_invalid]", "boom at import"),
        (("run", "ok.py", "--tools", "broken.py"), None, 2, "[tools_invalid]", "line 1"),
        (("run", "latin1.py"), None, 2, "[program_not_utf8]", "0xe9"),
        (("run", "-"), b"'\xff'", 2, "[program_not_utf8]", "standard input"),
    ]
    for args, stdin, code, error, detail in cases:
        done = tether(tmp_path, *args, stdin=stdin)
        err = done.stderr
        assert done.returncode == code, (args, err)
        assert error in err and detail in err and "next:" in err and "Traceback" not in err, (args, err)


def test_cli_reports_a_secret_path_that_is_a_directory(tmp_path):
    (tmp_path / "ok.py").write_text("1 + 1")
    (tmp_path / "home" / "tether.db.secret").mkdir(parents=True)
    done = tether(tmp_path, "run", "ok.py")
    err = done.stderr
    assert done.returncode == 1 and "[store_error]" in err and "secret file" in err and "Traceback" not in err


def test_cli_a_tool_calling_sys_exit_fails_the_run_and_says_so(tmp_path):
    tools = tools_file(tmp_path, EXITING)
    (tmp_path / "p.py").write_text("import tools\nawait tools.h.leave()")
    done = tether(tmp_path, "run", "p.py", "--tools", tools, "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "failed" and out["error"]["code"] == "tool_error"
    store = open_store(f"sqlite:///{tmp_path}/home/tether.db")
    try:
        assert store.get_run(out["run_id"]).status == "failed"
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_p26_over_mcp_a_hostile_result_is_an_envelope_not_a_tool_failure(mode):
    from mcp import Client

    from tether._server.mcp import TetherServer

    async with Runtime(type_check=False) as rt:
        server = TetherServer(rt)
        async with Client(server.mcp, mode=mode) as client:
            for code, status in (("10**5000", "completed"), ("def f(n):\n    return f(n + 1)\nf(0)", "failed"),
                                 ("[b'\\xff', float('nan'), {1, 2}]", "completed")):
                r = await client.call_tool("execute", {"code": code})
                data = r.structured_content
                assert data["status"] == status and data["run_id"], r.content[0].text[:300]
                assert len(r.content[0].text) < 30_000
                assert rt.store.get_run(data["run_id"]).status == status


async def test_a_program_with_a_nul_or_a_lone_surrogate_is_refused_before_it_is_stored(store_url):
    async with Runtime(store=open_store(store_url), type_check=False) as rt:
        for code in ("x = '\x00'\nx", "'\udcff'"):
            with pytest.raises(UsageError) as err:
                await rt.execute(code)
            assert err.value.code == "syntax_error" and "nothing was run" in err.value.message
        assert rt.store.list_runs() == []
        assert (await rt.execute("'a\\x00b'")).result == "a\x00b"  # the escape, as Python writes it, is fine


async def test_wait_names_are_bounded_and_printable(store_url):
    async with Runtime(store=open_store(store_url), type_check=False) as rt:
        for name in ("'a\\x00b'", "'x' * 201", "'two\\nlines'"):
            r = await rt.execute(f"await wait_for({name})")
            assert r.status == "failed" and r.error["code"] == "invalid_arguments", r.error
        r = await rt.execute("try:\n    await wait_for_signal('\\x00')\nexcept TypeError:\n    x = 'caught'\nx")
        assert r.result == "caught"


@pytest.mark.postgres
async def test_p26_hostile_values_on_postgres(pg_url):
    import uuid

    import psycopg

    from tether._store.postgres import PostgresStore
    from tether._tools.model import Annotations, Tool

    async def give(args: dict) -> object:
        return {"nul": "a\x00b", "surrogate": "\udcff", "big": 10**5000, "raw": b"\x00\xff", "nan": float("nan")}

    schema = f"t_{uuid.uuid4().hex[:16]}"
    tool = Tool(namespace="t", name="give", description="d", input_schema={"type": "object"}, handler=give,
                annotations=Annotations(read_only=True))
    try:
        async with Runtime(store=PostgresStore(pg_url, schema=schema), tools=[tool], type_check=False) as rt:
            r = await rt.execute("import tools\nx = await tools.t.give()\nprint(x['nul'])\nemit(x)\n[x, 'c\\x00d']")
            assert r.status == "completed", r.error
            assert r.result[0]["nul"] == "a\x00b" and r.result[1] == "c\x00d"
            assert r.result[0]["surrogate"] == "\\udcff" and r.result[0]["big"].startswith("1000")
            stored = rt.store.get_run(r.run_id)
            assert stored.status == "completed" and stored.result["result"] == r.result
            ok = await rt.execute("await wait_for('a\\x00b')")
            assert ok.error["code"] == "invalid_arguments"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
