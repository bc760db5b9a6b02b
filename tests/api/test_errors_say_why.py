"""Errors that say why: an unavailable source, a tool's uncaught KeyError, another owner's run."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from helpers import Clock, Recorder, run_cli
from tether import tool
from tether._runtime import Runtime
from tether._sources.python import PythonSource  # noqa: F401 - the module a config names must import
from tether._store import open_store

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOKEN = "token:" + "c" * 32


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["TETHER_HOME"] = str(tmp_path / "home")
    e.pop("TETHER_STORE_URL", None)
    e.pop("GITHUB_TOKEN_FOR_TEST", None)
    return e


def test_precheck_says_a_source_is_unavailable_and_why(tmp_path, env):
    """GitHub configured with its token unset: not `unknown_tool ... no namespace`, but why it is missing."""
    (tmp_path / "tether.toml").write_text(
        f'[[sources]]\ntype = "openapi"\nnamespace = "github"\nspec = "{FIXTURES / "real_github_trim.json"}"\n'
        'auth = {type = "bearer", token_env = "GITHUB_TOKEN_FOR_TEST"}\n')
    (tmp_path / "p.py").write_text('import tools\nawait tools.github.issues_add_labels("o", "r", 1, labels=["x"])\n')
    r = run_cli(["run", "p.py", "--json"], env, tmp_path)
    error = json.loads(r.stdout)["error"]
    assert error["code"] == "source_unavailable", error
    assert "GITHUB_TOKEN_FOR_TEST" in error["message"] and "nothing was run" in error["message"]
    assert error["details"]["source"] == "github" and error["details"]["line"] == 2
    assert "tether sources list" in error["details"]["suggestions"]


async def test_an_uncaught_keyerror_from_a_tool_reports_the_call(tmp_path):
    """KeyError's message is quoted by str(); the run still reports tool_error with details.call."""

    @tool(read_only=True, namespace="kv")
    async def lookup(key: str) -> str:
        """Look a key up."""
        return {"a": "1"}[key]

    async with Runtime(store=open_store(f"sqlite:///{tmp_path / 't.db'}"), tools=[lookup], type_check=False) as rt:
        result = await rt.execute('import tools\nawait tools.kv.lookup(key="zz")')
    assert result.status == "failed"
    assert result.error["code"] == "tool_error", result.error
    assert result.error["details"]["call"] == {"seq": 1, "address": "kv.lookup"}
    assert result.error["details"]["type"] == "KeyError"


def test_cli_names_the_owner_and_the_as_to_use(tmp_path, env):
    """A run started over HTTP (a token's): `runs show` prints commands that work, and one without --as says why."""
    store_url = f"sqlite:///{tmp_path / 'home' / 'tether.db'}"
    (tmp_path / "home").mkdir()

    async def start() -> object:
        rec = Recorder()
        async with Runtime(store=open_store(store_url), tools=rec.tools(), clock=Clock(), type_check=False) as rt:
            return await rt.execute("import tools\nawait tools.helpdesk.close_ticket(id=1)", principal=TOKEN)

    paused = asyncio.run(start())
    assert paused.status == "paused"

    shown = run_cli(["runs", "show", paused.run_id], env, tmp_path)
    assert f"approve: tether resume {paused.run_id} --approve --seq 1 --as {TOKEN}" in shown.stdout, shown.stdout

    refused = run_cli(["resume", paused.run_id, "--approve", "--seq", "1"], env, tmp_path)
    assert refused.returncode != 0
    assert f"owned by {TOKEN}" in refused.stderr and f"--as {TOKEN}" in refused.stderr, refused.stderr

    # The other commands the README shows with --as say the same, each naming itself in its next action.
    for command, example in ((["runs", "signal", paused.run_id, "go", "1"], f"tether runs signal {paused.run_id} go"),
                             (["waits", "list", "--run", paused.run_id], f"tether waits list --run {paused.run_id}"),
                             (["runs", "undo", paused.run_id], f"tether runs undo {paused.run_id}")):
        refused = run_cli(command, env, tmp_path)
        assert refused.returncode != 0 and f"owned by {TOKEN}" in refused.stderr, (command, refused.stderr)
        assert example in refused.stderr and f"--as {TOKEN}" in refused.stderr, (command, refused.stderr)
    listed = run_cli(["waits", "list", "--run", paused.run_id, "--as", TOKEN], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    # An approval's wait times out a day later: the line gives the date, not a time of day that reads as now.
    assert re.search(r"times out \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed.stdout), listed.stdout
