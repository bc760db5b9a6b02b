"""The operator on the host acts on runs a token owns with ``--as PRINCIPAL`` (P-24, docs/security.md).

The command line opens the store itself, so its user is the store's operator;
without ``--as`` it acts as ``local`` and another principal's run does not
exist for it, as before. HTTP callers have no such flag (tests/engine/test_principals.py,
tests/server/test_server_auth.py keep their checks). The commands run in process
(``tether.cli.main``) against a SQLite store on disk.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tether._app import open_runtime
from tether._store import open_store
from tether.cli import EXIT_OK, EXIT_USAGE, main

TOOLS = str(Path(__file__).parent.parent / "fixtures" / "notes_tools.py")
TOKEN = "token:" + "c" * 32
OTHER = "token:" + "d" * 32
PAUSES = "import tools\nawait tools.notes.add_note(text='from a token')\n'sent'"
SIGNALLED = "v = await wait_for_signal('go')\n['got', v]"


def started_by_token(code: str) -> dict:
    """A run a caller with a token started (as the HTTP server starts them), left paused or waiting."""
    async def go() -> dict:
        async with open_runtime(tools=[TOOLS], type_check=False) as rt:
            return (await rt.execute(code, principal=TOKEN, meta={"tools": [TOOLS]})).to_dict()

    return asyncio.run(go())


def tether(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip()[:1] in ("{", "[") else {"text": out})


def notes(root: Path) -> list[str]:
    path = root / "notes.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


def test_the_operator_decides_a_token_owned_pause_only_by_naming_its_principal(store_env, capsys):
    paused = started_by_token(PAUSES)
    assert paused["status"] == "paused"
    run_id, seq = paused["run_id"], str(paused["pending"]["seq"])

    code, out = tether(capsys, "resume", run_id, "--approve", "--seq", seq, "--json")
    assert code == EXIT_USAGE and out["error"]["code"] == "run_not_found", out
    code, out = tether(capsys, "resume", run_id, "--approve", "--seq", seq, "--as", OTHER, "--json")
    assert code == EXIT_USAGE and out["error"]["code"] == "run_not_found", out
    assert notes(store_env) == []  # nothing was sent for either

    code, out = tether(capsys, "runs", "show", run_id)
    assert f"(principal {TOKEN})" in out["text"]
    code, out = tether(capsys, "resume", run_id, "--approve", "--seq", seq, "--as", TOKEN, "--json")
    assert code == EXIT_OK and out["status"] == "completed" and out["result"] == "sent", out
    assert notes(store_env) == ["from a token"]
    code, out = tether(capsys, "runs", "show", run_id, "--json")
    decided = out["decisions"][0]
    assert decided["via"] == "cli" and decided["actor"].endswith(f"(as {TOKEN})"), decided
    store = open_store(f"sqlite:///{store_env}/tether.db")
    try:
        assert store.get_run(run_id).principal == TOKEN  # acting as the owner changes no ownership
    finally:
        store.close()


def test_the_operator_signals_and_lists_the_waits_of_a_token_owned_run(store_env, capsys):
    waiting = started_by_token(SIGNALLED)
    assert waiting["status"] == "waiting"
    run_id = waiting["run_id"]

    code, out = tether(capsys, "waits", "list", "--run", run_id, "--json")
    assert code == EXIT_USAGE and out["error"]["code"] == "run_not_found", out
    code, out = tether(capsys, "runs", "signal", run_id, "go", '"now"', "--json")
    assert code == EXIT_USAGE and out["error"]["code"] == "run_not_found", out

    code, out = tether(capsys, "waits", "list", "--run", run_id, "--as", TOKEN, "--json")
    assert code == EXIT_OK and [w["name"] for w in out] == ["signal:go"], out
    code, out = tether(capsys, "runs", "signal", run_id, "go", '"now"', "--as", TOKEN, "--json")
    assert code == EXIT_OK and out["status"] == "accepted", out
    assert out["run"]["status"] == "completed" and out["run"]["result"] == ["got", "now"]


def test_as_needs_a_principal(store_env, capsys):
    assert main(["runs", "signal", "run_x", "go", "1", "--as", " "]) == EXIT_USAGE


def test_where_a_refused_approve_points_the_model_is_a_command_that_approves(store_env, capsys):
    """approval_elsewhere tells the agent (to tell its user) how a person approves on the store; the command it
    names must exist and, followed as written, approve the token's write."""
    import shlex

    from tether._engine.approvals.rights import Verdict
    from tether._engine.approvals.surface import refusal

    paused = started_by_token(PAUSES)
    run_id, seq = paused["run_id"], str(paused["pending"]["seq"])
    text = refusal(Verdict(False, "approval_elsewhere", "refused"), run_id, None, console=False).message
    (command,) = [c for c in text.split("`")[1::2] if c.startswith("tether ")]
    argv = [seq if word == "N" else word for word in shlex.split(command)[1:]]
    try:
        code, out = tether(capsys, *argv)
    except SystemExit as exc:  # argparse: no such command
        pytest.fail(f"`{command}` is not a tether command ({exc.code}): {capsys.readouterr().err}")
    approve = [line.split("approve:", 1)[1] for line in out.get("text", "").splitlines()
               if line.strip().startswith("approve:")]
    if approve:  # the command showed the run, with the exact approve command for it
        code, out = tether(capsys, *shlex.split(approve[0])[1:], "--json")
    assert code == EXIT_OK and out.get("status") == "completed", (command, out)
    assert notes(store_env) == ["from a token"]
