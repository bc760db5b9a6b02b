"""P-46 from the command line: `tether resume --decline-and-undo` at a pause, `tether runs undo` of an ended
run, and `tether runs show` listing each original write beside its compensation."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from helpers import run_cli

TOOLS = str(Path(__file__).parent.parent / "fixtures" / "undo_tools.py")


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["TETHER_HOME"] = str(tmp_path / "home")
    e["SHOP_FILE"] = str(tmp_path / "shop.jsonl")
    e.pop("TETHER_STORE_URL", None)
    return e


def effects(env) -> list[tuple[str, str]]:
    path = Path(env["SHOP_FILE"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [(x["kind"], x["value"]) for x in map(json.loads, lines)]


def test_p46_decline_and_undo_from_the_cli_then_runs_show_pairs_each_write(tmp_path, env):
    program = tmp_path / "prog.py"
    program.write_text("import tools\n"
                       "await tools.shop.charge(order='a', amount=1)\n"
                       "await tools.shop.letter(text='your order a')\n"
                       "await tools.shop.charge(order='b', amount=2)\n")
    r = run_cli(["run", str(program), "--tools", TOOLS, "--json"], env, tmp_path)
    run_id = json.loads(r.stdout)["run_id"]
    # The paused write says what would undo it (P-46).
    assert json.loads(r.stdout)["pending"]["writes"][0]["undo"] == "shop.refund"
    for seq in (1, 2):
        r = run_cli(["resume", run_id, "--approve", "--seq", str(seq), "--json"], env, tmp_path)
        assert json.loads(r.stdout)["status"] == "paused", r.stderr
    assert effects(env) == [("charge", "a"), ("letter", "your order a")]

    r = run_cli(["resume", run_id, "--decline-and-undo", "--seq", "3", "--reason", "wrong customer"], env, tmp_path)

    assert r.returncode == 1, r.stderr  # the run did not do its work
    assert "rolled_back: [rolled_back]" in r.stderr
    assert "undone: call 1 shop.charge by call 4 shop.refund" in r.stdout
    assert "not undone: call 2 shop.letter: shop.letter declares no undo" in r.stdout
    assert effects(env) == [("charge", "a"), ("letter", "your order a"), ("refund", "ch_a")]

    shown = run_cli(["runs", "show", run_id], env, tmp_path)
    assert f"run {run_id}: rolled_back" in shown.stdout
    lines = shown.stdout.splitlines()
    assert any(line.strip().startswith("#1 ") and line.endswith("undone by #4") for line in lines), shown.stdout
    assert any(line.strip().startswith("#4 ") and "shop.refund" in line and line.endswith("undoes #1")
               for line in lines), shown.stdout
    data = json.loads(run_cli(["runs", "show", run_id, "--json"], env, tmp_path).stdout)
    assert [(x["seq"], x["undone"]) for x in data["rollback"]] == [(2, False), (1, True)]
    decided = data["decisions"][-1]
    assert (decided["decision"], decided["reason"], decided["via"]) == ("decline_and_undo", "wrong customer", "cli")


def test_p46_runs_undo_undoes_an_ended_run_once(tmp_path, env):
    program = tmp_path / "prog.py"
    program.write_text("import tools\n"
                       "await tools.shop.charge(order='a', amount=1)\n"
                       "await tools.shop.charge(order='b', amount=2)\n")
    r = run_cli(["run", str(program), "--tools", TOOLS, "--json"], env, tmp_path)
    run_id = json.loads(r.stdout)["run_id"]
    r = run_cli(["resume", run_id, "--approve", "--seq", "1", "--json"], env, tmp_path)
    r = run_cli(["resume", run_id, "--approve", "--seq", "2", "--json"], env, tmp_path)
    assert json.loads(r.stdout)["status"] == "completed", r.stderr

    r = run_cli(["runs", "undo", run_id, "--reason", "refunded by request", "--json"], env, tmp_path)

    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "rolled_back"
    assert [(x["seq"], x["undone"]) for x in out["rollback"]] == [(2, True), (1, True)]
    assert effects(env)[2:] == [("refund", "ch_b"), ("refund", "ch_a")]
    again = run_cli(["runs", "undo", run_id, "--json"], env, tmp_path)
    assert json.loads(again.stdout)["status"] == "rolled_back" and len(effects(env)) == 4


def test_p46_runs_show_names_an_ended_runs_undo_as_the_runs_and_escapes_who_asked_for_it(tmp_path, env, monkeypatch):
    """An ended run's undo decides the whole run, not a call 0; whoever it names (a framework's approver is
    the host's user, a name its user chose) is printed escaped, as every other text of the run is."""
    import importlib.util

    from tether import Policy, Runtime
    from tether._sources.python import tools_from_module
    from tether._store import open_store

    env["TETHER_STORE_URL"] = f"sqlite:///{tmp_path}/tether.db"
    spec = importlib.util.spec_from_file_location("undo_tools", TOOLS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("SHOP_FILE", env["SHOP_FILE"])

    async def undo() -> str:
        async with Runtime(store=open_store(env["TETHER_STORE_URL"]), tools=tools_from_module(module),
                           policy=Policy(writes="allow"), type_check=False) as rt:
            done = await rt.execute("import tools\nawait tools.shop.charge(order='a', amount=1)\n")
            undone = await rt.resume(done.run_id, "undo", "by request", actor="mallory\x1b]0;pwned\x07\x1b[2J")
            assert undone.status == "rolled_back"
            return done.run_id

    run_id = asyncio.run(undo())
    shown = run_cli(["runs", "show", run_id], env, tmp_path).stdout

    assert "call 0" not in shown and "decided: undo (by request) by mallory" in shown, shown
    assert "\x1b" not in shown and "\x07" not in shown
