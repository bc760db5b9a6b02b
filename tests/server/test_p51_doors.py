"""A decision that comes late, twice or against another means the same at every door (P-51).

Doors: the Python ``Runtime``, the CLI (``tether resume``, in process), the MCP
``resume`` tool (the real MCP client and server), the console's decision form
and an approval link (httpx over the console's ASGI app), on one SQLite store.
For each door: an approval on a run another person cancelled is refused
``not_paused`` saying it was cancelled and not sent; the same decision again on
a decided write is accepted and sends nothing more; another decision on it is
refused ``already_decided`` saying what was sent. A repeat through the console
and a link also completes a decision record the store lost (P-29).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from mcp import Client

from tether._app import open_runtime
from tether._engine.approvals import APPROVE, Access, Grant
from tether._engine.inspect import run_timeline
from tether._server.approvals import link_token
from tether._server.auth import principal_for_token
from tether._server.console import Console
from tether._server.mcp import TetherServer
from tether.cli import main
from tether.errors import StoreError, TetherError

TOOLS = str(Path(__file__).parent.parent / "fixtures" / "notes_tools.py")
ONE = "import tools\nawait tools.notes.add_note(text='hello')\n'sent'"
PAT = "pat-token-0123456789abc"  # a person who approves every principal's writes
OWNER = principal_for_token("alice-token-0123456789")  # whose agent started the runs
DOORS = ("python", "cli", "mcp", "console", "link")


def notes(root: Path) -> list[str]:
    path = root / "notes.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


def console_for(rt) -> Console:
    return Console(rt, tokens=[PAT], access=Access.of(
        [Grant(principal_for_token(PAT), "pat", frozenset({APPROVE}), frozenset({"*"}))]))


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


class Doors:
    """One decision through one door: (ok, error code, text the decider is shown)."""

    def __init__(self, rt, http: httpx.AsyncClient, csrf: str, capsys) -> None:
        self.rt, self.http, self.csrf, self.capsys = rt, http, csrf, capsys

    async def decide(self, door: str, run, seq: int, decision: str) -> tuple[bool, str | None, str]:
        if door == "python":
            try:
                await self.rt.decide(run.run_id, {seq: decision}, principal=OWNER, actor="ann")
            except TetherError as exc:
                return False, exc.code, exc.message
            return True, None, ""
        if door == "cli":
            code = await asyncio.to_thread(main, ["resume", run.run_id, f"--{decision}", "--seq", str(seq), "--as", OWNER,
                                                      "--json"])
            out = json.loads(self.capsys.readouterr().out)
            error = out.get("error") if out.get("status") != "completed" or code != 0 else None
            return error is None, (error or {}).get("code"), (error or {}).get("message", "")
        if door == "mcp":
            async with Client(TetherServer(self.rt, principal_of=lambda ctx: OWNER).mcp) as c:
                r = await c.call_tool("resume", {"run_id": run.run_id, "decision": decision, "seq": seq})
            error = r.structured_content.get("error") if r.is_error else None
            return error is None, (error or {}).get("code"), (error or {}).get("message", "")
        if door == "console":
            r = await self.http.post(f"/console/runs/{run.run_id}/decide",
                                     data={"csrf": self.csrf, "seq": str(seq), "decision": decision})
            return self._page(r, 303)
        token = link_token(self.rt.store.secret(), run.run_id, seq, run.expires_at)
        r = await self.http.post(f"/approve/{token}", data={"csrf": self.csrf, "seq": str(seq), "decision": decision})
        return self._page(r, 200)

    @staticmethod
    def _page(r: httpx.Response, ok: int) -> tuple[bool, str | None, str]:
        if r.status_code == ok:
            return True, None, ""
        code = re.search(r'class="hint">\((\w+)\)<', r.text)
        message = re.search(r'<p id="message">([^<]*)</p>', r.text)
        return False, code.group(1) if code else f"http {r.status_code}", message.group(1) if message else r.text


async def test_p51_every_door_refuses_a_late_and_a_conflicting_decision_alike_and_accepts_a_repeat(store_env,
                                                                                                  capsys):
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console_for(rt).app),
                                     base_url="http://127.0.0.1:8000") as http:
            page = await http.get("/console/login")
            await http.post("/console/login", data={"csrf": csrf_of(page.text), "token": PAT})
            doors = Doors(rt, http, csrf_of((await http.get("/console/")).text), capsys)
            seen: dict[str, dict[str, tuple[bool, str | None, str]]] = {}
            for door in DOORS:
                cancelled = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
                await rt.cancel(cancelled.run_id, "wrong customer", principal=OWNER)
                done = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
                assert (await rt.decide(done.run_id, {1: "approve"}, principal=OWNER, actor="ann")).status == "completed"
                seen[door] = {"late": await doors.decide(door, cancelled, 1, "approve"),
                              "repeat": await doors.decide(door, done, 1, "approve"),
                              "conflict": await doors.decide(door, done, 1, "decline")}
                assert rt.store.get_call(cancelled.run_id, 1).state == "declined"
                assert rt.store.get_call(done.run_id, 1).state == "sent"
    assert notes(store_env) == ["hello"] * len(DOORS)  # one per approved run; nothing sent twice or late
    for door, got in seen.items():
        ok, code, text = got["late"]
        assert (ok, code) == (False, "not_paused"), (door, got)
        assert f"was cancelled by {OWNER} via python (wrong customer)" in text and "call 1 notes.add_note was not sent" in text, (door, text)
        assert got["repeat"][0], (door, got)
        ok, code, text = got["conflict"]
        assert (ok, code) == (False, "already_decided"), (door, got)
        assert "already decided: approve; it was sent; the run has completed" in text, (door, text)


@pytest.mark.parametrize("door", ["console", "link"])
async def test_p51_p29_a_repeat_through_the_console_or_a_link_completes_a_lost_decision_record(store_env, capsys,
                                                                                              door):
    """The store fails after the journal took an approval and before its record was written; the approver
    repeats it from the console or the link page, as they would from the Python API, CLI or MCP: the repeat is
    accepted, records who decided, and the run goes on; the write is sent once."""
    path = str(store_env / "tether.db")
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        paused = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TRIGGER gone BEFORE UPDATE ON waits BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
        with pytest.raises(StoreError):
            await rt.decide(paused.run_id, {1: "approve"}, principal=OWNER, actor="ann")
        assert rt.store.get_call(paused.run_id, 1).state == "approved" and notes(store_env) == []
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER gone")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console_for(rt).app),
                                     base_url="http://127.0.0.1:8000") as http:
            page = await http.get("/console/login")
            await http.post("/console/login", data={"csrf": csrf_of(page.text), "token": PAT})
            doors = Doors(rt, http, csrf_of((await http.get("/console/")).text), capsys)
            assert (await doors.decide(door, paused, 1, "approve"))[0]
        final = await rt.engine.wait_for_run(paused.run_id)
        assert final.status == "completed", final.error
        decided = [(d["seq"], d["decision"], d["actor"], d["via"])
                   for d in run_timeline(rt.store, paused.run_id)["decisions"]]
    assert decided == [(1, "approve", "token “pat”", door)]
    assert notes(store_env) == ["hello"]


async def test_p51_a_console_approval_queued_for_a_slot_while_the_run_is_cancelled_records_nothing(store_env):
    """The console answered "queued" (the approval waits for a run slot, D-74) and meanwhile another person
    cancels the run: when the slot frees, the approval is refused `not_paused`; the journal says declined, the
    timeline has no approval, nothing is sent."""
    from tether._server.admission import Admission
    from tether._server.approvals import Decider
    from tether.errors import NotPaused

    admission = Admission(1, 5, 30.0)
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        paused = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        decider = Decider(rt, admission=admission, settle_seconds=0.2)
        held = await admission.acquire(OWNER)
        try:
            outcome = await decider.decide(paused.run_id, [1], "approve", None, principal=OWNER, who="pat",
                                           via="console")
            assert (outcome.ok, outcome.status) == (True, "queued")
            await rt.cancel(paused.run_id, "wrong customer", principal=OWNER)
        finally:
            held.release()
        (task,) = list(decider._tasks)
        with pytest.raises(NotPaused, match="was cancelled by .* call 1 notes.add_note was not sent"):
            await task
        await decider.close()
        assert rt.store.get_call(paused.run_id, 1).state == "declined"
        decided = [(d["decision"], d["actor"]) for d in run_timeline(rt.store, paused.run_id)["decisions"]]
    assert decided == [("cancel", OWNER)] and notes(store_env) == []


@pytest.mark.slow
async def test_p51_mcp_over_http_refuses_a_late_decision_and_accepts_a_repeat(tmp_path):
    """The MCP door over streamable HTTP, as a served `tether serve --http` answers it (the agent's token may
    decline its own run's writes but not approve them, D-31): a decline after the run was cancelled is
    `not_paused`, saying so; the same decline again on a declined write gives the run's outcome again."""
    from tests.server.test_server_http import ALPHA, connect, start_server, stop_server

    served = start_server(tmp_path / "http", token=ALPHA)
    try:
        async with connect(served.url, ALPHA, "auto") as c:
            code = "import tools\nawait tools.ledger.guarded_write(tag='p51')"
            cancelled = (await c.call_tool("execute", {"code": code})).structured_content
            seq = cancelled["pending"]["seq"]
            r = await c.call_tool("resume", {"run_id": cancelled["run_id"], "decision": "cancel", "seq": seq})
            assert r.structured_content["status"] == "cancelled", r.content[0].text
            r = await c.call_tool("resume", {"run_id": cancelled["run_id"], "decision": "decline", "seq": seq})
            error = r.structured_content["error"]
            assert r.is_error and error["code"] == "not_paused", error
            assert "was cancelled" in error["message"] and "ledger.guarded_write was not sent" in error["message"]
            declined = (await c.call_tool("execute", {"code": code})).structured_content
            first = await c.call_tool("resume", {"run_id": declined["run_id"], "decision": "decline", "seq": seq})
            again = await c.call_tool("resume", {"run_id": declined["run_id"], "decision": "decline", "seq": seq})
            assert again.structured_content == first.structured_content
            assert first.structured_content["error"]["code"] == "write_declined"
    finally:
        stop_server(served.proc)
    assert "p51" not in served.tags()
