"""tether's MCP server driven by the official TypeScript MCP client, as desktop apps and IDEs drive it.

``tests/tsclient/client.mjs`` runs ``@modelcontextprotocol/sdk`` (pinned by tests/tsclient/package-lock.json)
through a plan of steps and prints what the client saw; these tests assert on that and on the store and the
ledger (each delivery of a ``ledger`` write is one line in a file, read back across the process boundary).
The TypeScript SDK speaks the 2025-11-25 protocol and older, never 2026-07-28: approvals reach it as
``elicitation/create`` forms inside the ``execute`` call, or as the paused result.

One ``tether serve --http`` serves the module (test_server_http's: bearer token, two run slots);
``--stdio`` servers are started by the client itself, as a desktop app does.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import npm_ci, run_cli
from test_server_http import ALPHA, CONFIG, LEDGER_TOOLS, start_server, stop_server

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent.parent / "tsclient"
SDK_VERSION = json.loads((HERE / "package.json").read_text())["dependencies"]["@modelcontextprotocol/sdk"]

DISCOVER = """\
import asyncio
import tools
found = await search("ticket comments")
addresses = [hit["address"] for hit in found["results"]]
[about] = await describe("helpdesk.get_ticket")
ticket, comments = await asyncio.gather(
    tools.helpdesk.get_ticket(ticket_id="T1001"),
    tools.helpdesk.list_comments(ticket_id="T1001"),
)
{"found": "helpdesk.list_comments" in addresses, "described": about["signature"],
 "ticket": ticket["id"], "comments": len(comments)}
"""


def ensure_installed() -> None:
    installed = HERE / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
    npm_ci(HERE, installed=installed.exists() and json.loads(installed.read_text())["version"] == SDK_VERSION,
           need="the TypeScript client tests")


def ts_client(transport: dict, steps: list[dict], *, elicitation: list[dict] | None = None,
              deadline_ms: int = 30_000) -> dict[str, Any]:
    """Run the TypeScript client through ``steps``; what it saw. A client that hangs is a failure here."""
    ensure_installed()
    plan: dict[str, Any] = {"transport": transport, "steps": steps, "deadlineMs": deadline_ms}
    if elicitation is not None:
        plan["elicitation"] = elicitation
    done = subprocess.run(["node", str(HERE / "client.mjs")], input=json.dumps(plan), capture_output=True,
                          text=True, timeout=deadline_ms / 1000 + 30, cwd=HERE)
    assert done.returncode == 0 and done.stdout, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    seen = json.loads(done.stdout.splitlines()[-1])
    assert not seen.get("hung"), seen
    return seen


def execute(code: str, **extra: Any) -> dict:
    return {"op": "callTool", "name": "execute", "arguments": {"code": code}, **extra}


def ok(step: dict) -> dict:
    """The structured result of a step the client completed (it validated it against the output schema)."""
    assert "error" not in step, step["error"]
    return step["result"]["structuredContent"]


def assert_tool_error(step: dict, code: str) -> dict:
    """An error as a tool result: isError, tether's code and next action, in the text and the structure."""
    result = step["result"]
    assert result["isError"] is True
    error = result["structuredContent"]["error"]
    assert error["code"] == code and error["next_action"], error
    text = result["content"][0]["text"]
    assert text.startswith(f"[{code}]") and "\nnext: " + error["next_action"] in text
    return error


# An approval form left open this long declines its write (D-88; 600 s by default).
FORM_WAIT = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = CONFIG.replace("[server]\n", f"[server]\nform_wait_seconds = {FORM_WAIT}\n", 1)
    s = start_server(tmp_path_factory.mktemp("ts-http"), token=ALPHA, config=config)
    try:
        yield s
    finally:
        stop_server(s.proc)
    assert s.proc.returncode == 0, s.log.read_text()


def http(served, token: str | None = ALPHA) -> dict:
    return {"http": {"url": served.url, "token": token}}


def journal(served, run_id: str) -> list[tuple[str, str]]:
    store = served.store()
    try:
        return [(c.address, c.state) for c in store.get_calls(run_id)]
    finally:
        store.close()


def run_of(served, tag: str):
    store = served.store()
    try:
        return next(r for r in store.list_runs(limit=50) if tag in r.program)
    finally:
        store.close()


def settled(served, tag: str, within: float = 10.0):
    """The run whose program names ``tag``, once it stops running (or as it is after ``within`` seconds)."""
    deadline = time.monotonic() + within
    while (run := run_of(served, tag)).status == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    return run


# -- over HTTP -------------------------------------------------------------------------------


def test_p23_without_a_token_the_ts_client_gets_a_clean_401_and_does_not_hang(served):
    for token, code in ((None, "missing_token"), ("not-the-token-0123456789", "invalid_token")):
        seen = ts_client(http(served, token), [{"op": "listTools"}], deadline_ms=10_000)
        assert seen["connected"] is False
        error = seen["connectError"]
        assert error["name"] == "StreamableHTTPError" and error["code"] == 401
        # The body the client shows its user names tether's code and what to do.
        body = json.loads(error["message"].split("Error POSTing to endpoint: ", 1)[1])["error"]
        assert body["code"] == code and "Authorization: Bearer" in body["next_action"]
        assert [m["method"] for m in seen["sent"]] == ["initialize"]


def test_the_ts_client_negotiates_2025_11_25_lists_tools_and_runs_a_program_that_discovers(served):
    seen = ts_client(http(served), [{"op": "listTools"}, execute(DISCOVER)])
    assert seen["protocolVersion"] == "2025-11-25"
    assert seen["serverInfo"] == {"name": "tether", "version": importlib.metadata.version("tether")}
    assert seen["serverCapabilities"]["tools"] is not None
    tools = {t["name"]: t for t in seen["steps"][0]["result"]["tools"]}
    assert set(tools) == {"execute", "resume", "cell_start", "cell_wait", "cell_terminate"}
    assert tools["execute"]["inputSchema"]["required"] == ["code"]
    assert tools["execute"]["outputSchema"]["required"] == ["status"]
    # The client checked structuredContent against that output schema before handing it over.
    run = ok(seen["steps"][1])
    assert run["status"] == "completed" and seen["steps"][1]["result"]["isError"] is False
    assert run["result"]["found"] is True and run["result"]["ticket"] == "T1001"
    assert run["result"]["described"].startswith("async def tools.helpdesk.get_ticket(ticket_id: str)")
    assert run["result"]["comments"] > 0 and run["calls"] == 4  # search and describe are calls too
    assert json.loads(seen["steps"][1]["result"]["content"][0]["text"]) == run  # the text twin for models
    # Progress went to the client's onprogress, one notification per finished call, never going down.
    progress = [p["progress"] for p in seen["progress"] if p["step"] == 1]
    assert progress and progress == sorted(progress) and progress[-1] == run["calls"], progress


def test_a_form_the_ts_client_accepts_sends_the_write_once_and_one_it_declines_never(served):
    code = ("import asyncio\nimport tools\n"
            "await tools.ledger.guarded_write(tag='ts-form-yes')\n"
            "try:\n    await tools.ledger.guarded_write(tag='ts-form-no')\n"
            "except PermissionError as e:\n    said = str(e)\nsaid")
    gathered = ("import asyncio\nimport tools\nawait asyncio.gather("
                "tools.ledger.guarded_write(tag='ts-gather-yes'), tools.ledger.guarded_write(tag='ts-gather-no'))")
    seen = ts_client(http(served), [{"op": "listTools"}, execute(code), execute(gathered)], elicitation=[
        {"match": "ts-form-yes", "action": "accept", "content": {"decision": "approve"}},
        {"match": "ts-form-no", "action": "accept", "content": {"decision": "decline", "reason": "not this one"}},
        {"match": "ts-gather-yes", "action": "accept", "content": {"decision": "approve"}},
        {"match": "ts-gather-no", "action": "decline"},
    ])
    # Each write was put to the client's user as a form while execute waited: the 2025-11-25 inline ask.
    forms = seen["elicitations"]
    assert [f["step"] for f in forms] == [1, 1, 2, 2]
    for form in forms:
        assert form["params"]["mode"] == "form" and "ledger.guarded_write" in form["params"]["message"]
        schema = form["params"]["requestedSchema"]
        assert schema["required"] == ["decision"]
        assert schema["properties"]["decision"]["enum"] == ["approve", "decline"]
    run = ok(seen["steps"][1])
    assert run["status"] == "completed" and "not this one" in run["result"] and "was not sent" in run["result"]
    # A gathered batch: the approved write went out, the declined one did not, and the run says so.
    error = assert_tool_error(seen["steps"][2], "write_declined")
    assert "was not sent" in error["message"]
    assert sorted(t for t in served.tags() if t.startswith("ts-")) == ["ts-form-yes", "ts-gather-yes"]
    assert journal(served, run["run_id"]) == [("ledger.guarded_write", "sent"),
                                              ("ledger.guarded_write", "declined")]


def test_a_ts_client_without_elicitation_sees_the_pause_and_cannot_approve_its_own_write(served):
    tag = "ts-paused"
    first = ts_client(http(served), [{"op": "listTools"},
                                     execute(f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')")])
    assert first["elicitations"] == [] and not any(m["method"] == "elicitation/create" for m in first["received"])
    result = first["steps"][1]["result"]
    paused = ok(first["steps"][1])
    assert result["isError"] is False and paused["status"] == "paused"
    assert paused["pending"]["address"] == "ledger.guarded_write" and paused["pending"]["args"] == {"tag": tag}
    # Over HTTP the token that ran the program does not approve it (D-31): the model is told where a person does.
    assert f"/console/runs/{paused['run_id']}" in paused["instructions"]
    assert "approval_url" not in paused["pending"]  # D-32: the model's copy carries no link
    seq = paused["pending"]["seq"]
    decide = [{"op": "listTools"},
              {"op": "callTool", "name": "resume",
               "arguments": {"run_id": paused["run_id"], "seq": seq, "decision": "approve"}},
              {"op": "callTool", "name": "resume",
               "arguments": {"run_id": paused["run_id"], "seq": seq, "decision": "decline", "reason": "no"}}]
    later = ts_client(http(served), decide)  # a new connection, as after the host restarted
    assert_tool_error(later["steps"][1], "approval_elsewhere")
    declined = later["steps"][2]["result"]["structuredContent"]
    assert declined["status"] == "failed" and declined["error"]["code"] == "write_declined"
    assert tag not in served.tags()
    assert journal(served, paused["run_id"]) == [("ledger.guarded_write", "declined")]


def test_errors_reach_the_ts_client_as_is_error_with_code_and_next_action(served):
    seen = ts_client(http(served), [
        {"op": "listTools"},
        execute("import tools\nt = await tools.helpdesk.get_ticket(ticket_id='T1001')\n1 / 0"),
        execute("import tools\nfor i in range(60):\n    await tools.helpdesk.get_ticket(ticket_id='T1001')"),
        {"op": "callTool", "name": "execute", "arguments": {"code": 12}},
        {"op": "callTool", "name": "resume", "arguments": {"run_id": "run_0000000000000000", "decision": "cancel"}},
    ])
    raised = assert_tool_error(seen["steps"][1], "program_error")
    assert "ZeroDivisionError" in raised["message"] and raised["details"]["traceback"][0]["line"] == 3
    assert seen["steps"][1]["result"]["structuredContent"]["calls"] == 1
    limit = assert_tool_error(seen["steps"][2], "call_limit")
    assert "call 51 was not sent" in limit["message"]
    assert_tool_error(seen["steps"][3], "invalid_arguments")
    assert_tool_error(seen["steps"][4], "run_not_found")
    assert seen["transportErrors"] == []


def test_an_aborted_ts_call_cancels_its_run_and_nothing_further_is_sent(served):
    tag = "ts-after-abort"
    code = f"import tools\nawait tools.ledger.wait(seconds=1.5)\nawait tools.ledger.write(tag='{tag}')"
    started = time.monotonic()
    # The host's AbortSignal fires; it stays connected (a host keeps its session) and goes on working.
    seen = ts_client(http(served), [execute(code, abortAfterMs=400), {"op": "sleep", "ms": 300},
                                    execute("'still serving'")])
    error = seen["steps"][0]["error"]
    assert error["code"] == -32001 and "the user stopped it" in error["message"]
    cancelled = [m for m in seen["sent"] if m["method"] == "notifications/cancelled"]
    assert len(cancelled) == 1 and {"method": "POST", "rpc": "notifications/cancelled", "status": 202} in seen["http"]
    assert ok(seen["steps"][2])["result"] == "still serving"
    run = settled(served, tag)
    assert run.status == "cancelled"
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # past when the write would have gone out
    assert tag not in served.tags()
    assert "ledger.write" not in [address for address, _ in journal(served, run.run_id)]


def test_a_ts_host_that_times_out_while_its_user_reads_the_form_sends_nothing(served):
    # The TypeScript client times a request out (60 s by default) while a form it was sent is still open;
    # the cancel it then sends ends the run, and the approve that comes later decides nothing.
    tag = "ts-late-approve"
    seen = ts_client(http(served), [
        execute(f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')", timeoutMs=1000),
        {"op": "sleep", "ms": 2000},  # the user answers the form after 1.5 s, on the open session
    ], elicitation=[{"action": "accept", "content": {"decision": "approve"}, "delayMs": 1500}])
    assert seen["steps"][0]["error"]["code"] == -32001 and "timed out" in seen["steps"][0]["error"]["message"]
    assert len(seen["elicitations"]) == 1
    assert any(m["method"] is None for m in seen["sent"])  # the late answer went out
    run = settled(served, tag)
    assert run.status == "cancelled"
    assert tag not in served.tags()
    assert ("ledger.guarded_write", "sent") not in journal(served, run.run_id)


def test_d88_a_ts_host_that_quits_with_a_form_open_does_not_hold_the_run_or_its_slot(served):
    # The TypeScript client's close() (or a crash) ends no session: tether hears nothing more. Both run
    # slots get such a run; the form's bounded wait declines each write, and the server serves again.
    tags = ["ts-gone-1", "ts-gone-2"]
    started = time.monotonic()
    for tag in tags:
        gone = ts_client(http(served), [execute(f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')",
                                                quitAfterMs=800)], elicitation=[{"action": "accept", "delayMs": 60_000}])
        assert gone["quit"] == 0 and len(gone["elicitations"]) == 1
    # Queued behind the two (the line waits 30 s): it runs once the first form's wait ends.
    seen = ts_client(http(served), [execute("'served again'")], deadline_ms=(FORM_WAIT + 20) * 1000)
    assert ok(seen["steps"][0])["result"] == "served again"
    for tag in tags:
        run = settled(served, tag, within=FORM_WAIT + 15 - (time.monotonic() - started))
        assert run.status == "failed" and run.error["code"] == "write_declined", run
        assert "no answer within" in run.error["message"] and "it was not sent" in run.error["message"]
        assert journal(served, run.run_id) == [("ledger.guarded_write", "declined")]
    assert not set(tags) & set(served.tags())


# -- over standard input/output ------------------------------------------------------------------


def stdio(root: Path) -> dict:
    """``tether serve --stdio`` as a desktop app's config starts it (the client owns the process)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "ledger_tools.py").write_text(LEDGER_TOOLS)
    (root / "tether.toml").write_text(CONFIG)
    return {"stdio": {
        "command": sys.executable,
        "args": ["-m", "tether.cli", "--config", str(root / "tether.toml"), "serve", "--stdio",
                 "--tools", "tether.demo.helpdesk", "--tools", str(root / "ledger_tools.py")],
        "env": {"TETHER_HOME": str(root / "home"), "LEDGER": str(root / "ledger.txt")},
    }}


def runs(root: Path) -> dict[str, dict]:
    """``tether runs list --json`` on the stdio server's store, by run id."""
    env = {"TETHER_HOME": str(root / "home"), "PATH": "/usr/bin:/bin"}
    done = run_cli(["--config", str(root / "tether.toml"), "runs", "list", "--json"], env, root)
    assert done.returncode == 0, done.stderr
    return {r["run_id"]: r for r in json.loads(done.stdout)}


def tags(root: Path) -> list[str]:
    ledger = root / "ledger.txt"
    return ledger.read_text().splitlines() if ledger.exists() else []


def test_stdio_a_ts_host_runs_pauses_approves_through_resume_and_cancels(tmp_path):
    seen = ts_client(stdio(tmp_path), [
        {"op": "listTools"},
        execute(DISCOVER),
        execute("import tools\nawait tools.ledger.guarded_write(tag='stdio-resumed')"),
        execute("x = 0\nwhile True:\n    x += 1", abortAfterMs=500),  # the sandbox busy, not waiting on a tool
        execute("[1, 2][5]"),
    ], deadline_ms=40_000)
    assert seen["protocolVersion"] == "2025-11-25"
    assert ok(seen["steps"][1])["result"]["ticket"] == "T1001"
    paused = ok(seen["steps"][2])
    assert paused["status"] == "paused" and "resume" in paused["instructions"]
    assert seen["steps"][3]["error"]["code"] == -32001
    assert_tool_error(seen["steps"][4], "program_error")
    assert tags(tmp_path) == []

    # On stdio the caller is the local user, who may approve (D-31): a later connection resumes the run.
    resume = {"op": "callTool", "name": "resume",
              "arguments": {"run_id": paused["run_id"], "seq": paused["pending"]["seq"], "decision": "approve"}}
    again = ts_client(stdio(tmp_path), [{"op": "listTools"}, resume, resume])
    assert ok(again["steps"][1])["status"] == "completed" and ok(again["steps"][1])["result"] == "stdio-resumed"
    assert ok(again["steps"][2])["status"] == "completed"  # a repeated approve changes nothing
    assert tags(tmp_path) == ["stdio-resumed"]

    states = runs(tmp_path)
    assert states[paused["run_id"]]["status"] == "completed"
    looped = [r for r in states.values() if r["error"] == "cancelled"]
    assert len(looped) == 1 and looped[0]["status"] == "cancelled"


def test_stdio_a_ts_host_answers_forms_accept_once_decline_never(tmp_path):
    code = ("import tools\nawait tools.ledger.guarded_write(tag='stdio-yes')\n"
            "await tools.ledger.guarded_write(tag='stdio-no')")
    seen = ts_client(stdio(tmp_path), [{"op": "listTools"}, execute(code)], elicitation=[
        {"action": "accept", "content": {"decision": "approve"}},
        {"action": "decline"},
    ])
    assert len(seen["elicitations"]) == 2
    error = assert_tool_error(seen["steps"][1], "write_declined")
    assert "the user declined it" in error["message"]
    assert tags(tmp_path) == ["stdio-yes"]
