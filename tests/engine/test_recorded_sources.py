"""P-30: what a run needs travels with the run.

A run records the definitions of its sources. Another directory, a process
missing an environment variable, a server that fails to start, a worker
without the source: none of them fails the run or sends its write; each
leaves the run as it was, says `tools_unavailable`, and a later attempt with
the sources available continues it with the write sent once. A real store on
disk, a real MCP server over stdio; commands run through ``main()`` in this
process (each opens its own runtime, as a process would), workers in processes
of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures"
TETHER = [sys.executable, "-m", "tether.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path):
    """Directory A holds tether.toml with one MCP source (a copy of the fixture server)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    server = a / "server.py"
    shutil.copy(FIXTURES / "mcp_fixture_server.py", server)
    (a / "tether.toml").write_text(
        "[[sources]]\n"
        'type = "mcp"\n'
        'namespace = "fx"\n'
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(server))}]\n"
        'env = { FX_SECRET = "${FX_SECRET}" }\n'
    )
    log = tmp_path / "writes.log"
    (a / "prog.py").write_text(
        "import tools\n"
        f"await tools.fx.record(log={str(log)!r}, text='once')\n"
        "'sent'\n"
    )
    env = dict(os.environ, TETHER_HOME=str(tmp_path / "home"), FX_SECRET="s3cret-value-123")
    env.pop("TETHER_STORE_URL", None)
    return a, b, log, env


def tether(args, env, cwd):
    """In its own process."""
    return subprocess.run(TETHER + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def cli(args, env, cwd):
    """In this process."""
    return run_cli(args, env, cwd)


def _paused(a, env):
    first = cli(["run", "prog.py", "--json"], env, a)
    assert first.returncode == 3, first.stdout + first.stderr
    out = json.loads(first.stdout)
    assert out["pending"]["address"] == "fx.record"
    return out["run_id"]


def _status(run_id, env, cwd):
    shown = cli(["runs", "show", run_id, "--json"], env, cwd)
    return json.loads(shown.stdout)["status"]


def _writes(log):
    return log.read_text().splitlines() if log.exists() else []


def test_p30_resume_from_another_directory_loads_the_recorded_sources(setup):
    a, b, log, env = setup
    run_id = _paused(a, env)
    # Directory B has no tether.toml at all.
    done = cli(["resume", run_id, "--approve", "--json"], env, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["result"] == "sent"
    assert _writes(log) == ["once"]
    # The secret was recorded as its reference, never its value.
    db = Path(env["TETHER_HOME"]) / "tether.db"
    meta = sqlite3.connect(db).execute("SELECT meta FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert "${FX_SECRET}" in meta
    assert b"s3cret-value-123" not in db.read_bytes()


def test_p30_a_missing_env_var_leaves_the_run_paused_and_a_later_resume_sends_once(setup):
    a, b, log, env = setup
    run_id = _paused(a, env)
    without = {k: v for k, v in env.items() if k != "FX_SECRET"}
    refused = cli(["resume", run_id, "--approve", "--json"], without, b)
    assert refused.returncode != 0
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "tools_unavailable"
    assert "fx" in error["message"] and "FX_SECRET" in error["message"]
    assert _status(run_id, env, b) == "paused"
    assert _writes(log) == []
    # Once more, same refusal: nothing was decided the first time.
    assert cli(["resume", run_id, "--approve", "--json"], without, b).returncode != 0

    done = cli(["resume", run_id, "--approve", "--json"], env, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _writes(log) == ["once"]


def test_p30_a_source_that_fails_to_start_leaves_the_run_paused(setup):
    a, b, log, env = setup
    run_id = _paused(a, env)
    server = a / "server.py"
    hidden = a / "server.py.away"
    server.rename(hidden)  # the command runs, but the server exits at once
    try:
        refused = cli(["resume", run_id, "--approve", "--json"], env, b)
    finally:
        hidden.rename(server)
    assert refused.returncode != 0
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "tools_unavailable", error
    assert error["details"]["sources"][0]["source"] == "fx"
    assert _status(run_id, env, b) == "paused"
    assert _writes(log) == []

    done = cli(["resume", run_id, "--approve", "--json"], env, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _writes(log) == ["once"]


def test_p30_a_worker_without_the_source_leaves_the_run_queued(setup):
    a, b, log, env = setup
    with open(a / "tether.toml", "a") as f:
        f.write('\n[policy]\nwrites = "allow"\n')
    started = cli(["start", "prog.py", "--no-worker", "--json"], env, a)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]

    without = {k: v for k, v in env.items() if k != "FX_SECRET"}
    idle = tether(["worker", "--idle-exit", "0.5"], without, b)
    assert "tools_unavailable" in idle.stderr or "FX_SECRET" in idle.stderr, idle.stderr
    assert _status(run_id, env, b) == "queued"
    assert _writes(log) == []

    worked = tether(["worker", "--idle-exit", "0.5"], env, b)
    assert worked.returncode == 0, worked.stderr
    assert _status(run_id, env, b) == "completed"
    assert _writes(log) == ["once"]


async def test_p30_a_wait_resolved_where_the_sources_cannot_load_is_kept_and_continues_later(tmp_path, monkeypatch):
    from tether._app import open_runtime
    from tether._config import Config
    from tether.errors import ToolsUnavailable

    log = tmp_path / "writes.log"
    config = Config.from_dict({
        "sources": [{"type": "mcp", "namespace": "fx", "env": {"FX_SECRET": "${FX_SECRET}"},
                     "command": [sys.executable, str(FIXTURES / "mcp_fixture_server.py")]}],
        "store": {"url": f"sqlite:///{tmp_path}/t.db"}, "policy": {"writes": "allow"},
        "sandbox": {"check": "off"}})
    program = f"import tools\nv = await wait_for('go')\nawait tools.fx.record(log={str(log)!r}, text=v)\nv\n"
    monkeypatch.setenv("FX_SECRET", "x")
    async with open_runtime(config) as rt:
        parked = await rt.execute(program)
        assert parked.status == "waiting", parked.error
        key = parked.pending["key"]
        recorded = rt.engine.get_run(parked.run_id).meta["sources"]

    monkeypatch.delenv("FX_SECRET")
    async with open_runtime(config, sources=recorded) as rt:
        with pytest.raises(ToolsUnavailable) as info:
            await rt.resolve_wait(key, "once")
        assert "FX_SECRET" in info.value.message and info.value.details["wait"] == "accepted"
        assert rt.engine.get_run(parked.run_id).status == "waiting"
    assert _writes(log) == []

    monkeypatch.setenv("FX_SECRET", "x")
    async with open_runtime(config, sources=recorded) as rt:
        out = await rt.resolve_wait(key, "ignored: the first resolution won")
        assert out["status"] == "already_resolved"
        assert out["run"]["status"] == "completed" and out["run"]["result"] == "once"
    assert _writes(log) == ["once"]


def test_p30_a_literal_secret_is_never_recorded_and_comes_from_a_matching_local_config(setup):
    a, b, log, env = setup
    toml = (a / "tether.toml").read_text().replace('"${FX_SECRET}"', '"literal-secret-value-42"')
    (a / "tether.toml").write_text(toml)
    run_id = _paused(a, env)
    db = Path(env["TETHER_HOME"]) / "tether.db"
    assert b"literal-secret-value-42" not in db.read_bytes()

    refused = cli(["resume", run_id, "--approve", "--json"], env, b)  # no config here
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "tools_unavailable" and "written literally" in error["message"]
    assert _status(run_id, env, b) == "paused"

    done = cli(["resume", run_id, "--approve", "--json"], env, a)  # the config with that value
    assert done.returncode == 0, done.stdout + done.stderr
    assert _writes(log) == ["once"]


async def test_p30_a_worker_never_loads_edited_source_definitions(tmp_path, monkeypatch):
    # The worker checks a run's sources before claiming it: that check must not load unsigned ones (P-35).
    from tether._app import open_runtime
    from tether._engine.worker import Worker

    monkeypatch.chdir(tmp_path)
    (tmp_path / "desk.py").write_text('from tether import tool\n\n@tool(namespace="desk", read_only=True)\n'
                                      'def get(id: int) -> int:\n    """Get."""\n    return id\n')
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil.py").write_text(f'open({str(marker)!r}, "w").write("imported")\n')
    url = f"sqlite:///{tmp_path}/t.db"
    config = tmp_path / "tether.toml"
    config.write_text(f'[store]\nurl = "{url}"\n[sandbox]\ncheck = "off"\n'
                      f'[[sources]]\ntype = "python"\nmodule = "{tmp_path / "desk.py"}"\n')
    async with open_runtime(config_path=config) as rt:
        run_id = rt.start("import tools\nawait tools.desk.get(id=1)")
        rt.store.update_run(run_id, None, meta={**rt.engine.get_run(run_id).meta, "sources": [
            {"type": "python", "module": str(tmp_path / "evil.py")}]})
    config.write_text(f'[store]\nurl = "{url}"\n[sandbox]\ncheck = "off"\n')
    async with open_runtime(config_path=config) as rt:
        await Worker(rt.engine).work(idle_exit_seconds=0.3)
        run = rt.engine.get_run(run_id)
    assert not marker.exists()
    assert run.status == "failed" and run.error["code"] == "run_tampered"
