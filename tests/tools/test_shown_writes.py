"""Approval surfaces show the truth (P-38).

One pure function (_tools/shown.py) shows a write on every surface; these
tests put known attacks on approval pages through each surface a person reads — the
console and link pages, the MCP approval form, the CLI, the paused
envelope's instructions, a webhook's body — and check what reaches them.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from helpers import run_cli
from tether import Runtime, tool
from tether._engine.attempt.envelopes import pause_instructions
from tether._engine.attempt.result import RunResult
from tether._server.approvals import link_token
from tether._server.results import approval_message, resume_instructions
from tether._tools.shown import MAX_NAMED_ARGS, show_call

sent: list[dict] = []
REVERSED = "\u202e666-REKCATTA\u202c"  # renders as ATTACKER-666
AMOUNT = "refund to \u202e00001\u202c USD"  # renders as 10000
LONG_DOC = "Create or update a file. " * 90  # GitHub's operations run to 2 KB


@tool(namespace="bank")
def transfer(memo: str, amount: str, to_account: str) -> dict:
    sent.append({"memo": memo, "amount": amount, "to_account": to_account})
    return {"ok": True}


transfer.__doc__ = LONG_DOC  # the tool's description, as long as GitHub's

PROGRAM = f"""import tools
await tools.bank.transfer(memo={"m" * 5000!r}, amount={AMOUNT!r}, to_account={REVERSED!r})
"""


def _no_raw_controls(text: str) -> None:
    assert "\u202e" not in text and "\u202c" not in text and "\x1b" not in text, text[:200]


def test_every_argument_is_named_and_long_values_share_the_room_evenly():
    shown = show_call("bank.transfer", {"memo": "m" * 5000, "amount": 10000, "to_account": "DE00 1234"})
    line = shown.line()
    # The long memo first no longer hides what follows it.
    assert "amount=10000" in line and 'to_account="DE00 1234"' in line
    assert re.search(r'memo="m+… \[(\d+) more characters\]', line)
    assert len(line) < 800
    two = show_call("a.b", {"x": "x" * 3000, "y": "y" * 3000}).args
    assert abs(len(two[0].text) - len(two[1].text)) <= 1 and two[0].more == two[1].more > 0
    many = show_call("a.b", {f"k{i}": i for i in range(MAX_NAMED_ARGS + 7)})
    assert many.not_shown == 7 and "[7 arguments not shown]" in many.line()


def test_bidi_and_control_characters_are_escaped_and_flagged():
    shown = show_call("bank.transfer", {"to_account": REVERSED, "note": "ok\x1b[8mhidden\x1b]52;c;Zm9v\x07"})
    line = shown.line()
    _no_raw_controls(line)
    assert "\\u202e666-REKCATTA\\u202c" in line and "\\u001b" in line
    assert shown.flagged and "control characters" in line
    plain = show_call("a.b", {"text": "line one\nline two\tend"})
    assert not plain.flagged  # newlines and tabs are ordinary text


def test_the_mcp_form_instructions_and_envelope_name_every_argument_escaped():
    pending = {"seq": 1, "address": "bank.transfer",
               "args": {"memo": "m" * 5000, "amount": AMOUNT, "to_account": REVERSED}, "annotations": {}}
    message = approval_message(pending, LONG_DOC)
    _no_raw_controls(message)
    assert "amount=" in message and "to_account=" in message and "more characters" in message
    # The description comes after the question, shortened: the arguments are read first.
    assert message.index("to_account=") < message.index("Allow this write?") < message.index("About bank.transfer")
    assert message.startswith("A program wants to call bank.transfer(memo=")
    assert len(message) < 1600
    for text in (pause_instructions("run_x", pending),
                 resume_instructions(RunResult(status="paused", run_id="run_x", pending=pending))):
        _no_raw_controls(text)
        assert "amount=" in text and "to_account=" in text and "\\u202e" in text


@pytest.fixture
async def rt():
    sent.clear()
    async with Runtime(tools=[transfer]) as runtime:
        yield runtime


async def test_the_console_and_link_pages_show_the_escapes_and_fold_the_description(rt):
    from tether._server.console import Console

    paused = await rt.execute(PROGRAM)
    assert paused.status == "paused"
    console = Console(rt, tokens=[])
    token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                 base_url="http://127.0.0.1:8000") as c:
        page = (await c.get(f"/approve/{token}")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await c.get("/console/login")).text).group(1)
        await c.post("/console/login", data={"csrf": csrf, "token": ""})
        run_page = (await c.get(f"/console/runs/{paused.run_id}")).text
    for html in (page, run_page):
        _no_raw_controls(html)
        assert "\\u202e666-REKCATTA\\u202c" in html and "control characters" in html
        assert "more characters" in html
        # The arguments come before the tool's 2 KB description, which is folded.
        assert html.index("to_account") < html.index("What <code>bank.transfer</code> does")
        assert re.search(r"<details class=\"tool-doc\">", html)
    assert sent == []


async def test_a_webhook_body_names_every_argument_escaped(rt):
    from tether._server.notify import Notifier, Webhook

    notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", b"s" * 16, frozenset({"paused"}))])
    rt.engine.events.listeners.append(notifier)
    paused = await rt.execute(PROGRAM)
    assert await notifier.queue_hinted() == 1
    [row] = rt.store.list_outbox()
    _no_raw_controls(row.body)
    [write] = json.loads(row.body)["pending"]
    args = {a["name"]: a for a in write["args"]}
    assert sorted(args) == ["amount", "memo", "to_account"]
    assert write["flagged"] and args["memo"]["more_characters"] > 4000
    assert args["to_account"]["value"] == '"\\u202e666-REKCATTA\\u202c"'
    assert paused.status == "paused" and sent == []


def test_the_cli_escapes_what_a_program_prints_and_returns_but_json_stays_exact(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_HOME"] = str(tmp_path / "home")
    # ANSI conceal would hide text after it; OSC 52 writes the terminal's clipboard.
    (tmp_path / "p.py").write_text('print("before\\x1b[8m hidden")\n'
                                   '"\\x1b]52;c;ZWNobyBwd25lZA==\\x07" + "\\u202eevil"\n')
    shown = run_cli(["run", "p.py"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    _no_raw_controls(shown.stdout)
    assert "\\u001b[8m hidden" in shown.stdout and "\\u001b]52;c;" in shown.stdout and "\\u202eevil" in shown.stdout
    exact = run_cli(["run", "p.py", "--json"], env, tmp_path)
    data = json.loads(exact.stdout)
    assert data["logs"] == ["before\x1b[8m hidden"] and data["result"] == "\x1b]52;c;ZWNobyBwd25lZA==\x07\u202eevil"


def test_the_cli_pause_names_every_argument_escaped(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_HOME"] = str(tmp_path / "home")
    (tmp_path / "bank_tools.py").write_text(
        "from tether import tool\n\n@tool(namespace='bank')\n"
        "def transfer(memo: str, amount: str, to_account: str) -> dict:\n    return {'ok': True}\n")
    (tmp_path / "tether.toml").write_text('[[sources]]\ntype = "python"\nmodule = "bank_tools.py"\n')
    (tmp_path / "p.py").write_text(PROGRAM)
    paused = run_cli(["run", "p.py", "--no-prompt"], env, tmp_path)
    out = paused.stdout
    _no_raw_controls(out)
    assert "paused:" in out and "amount=" in out and "to_account=" in out and "more characters]" in out, out
    assert "\\u202e666-REKCATTA\\u202c" in out
