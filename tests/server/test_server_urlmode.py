"""URL-mode elicitation: a paused write reaches the client's user as its approval link, in both eras.

The client here is the real ``mcp`` client, in memory. Its "user" opens the
link it is sent and decides on the approval page, served by the console app
over the same runtime — the decision never passes through the client.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import httpx
import pytest
from mcp import Client
from mcp_types import ElicitResult

from tether._server.console import Console
from tether._server.mcp import TetherServer
from tether._server.urlmode import DECLINED_TO_OPEN

ERAS = [pytest.param("legacy", id="legacy"), pytest.param("auto", id="modern")]
PUBLIC = "https://tether.example.com"
CLOSE_3_CAUGHT = """
import tools
try:
    r = await tools.helpdesk.close_ticket(id=3)
except PermissionError as e:
    r = str(e)
r
"""
TWO_WRITES = "import tools\nawait tools.helpdesk.close_ticket(id=1)\nawait tools.helpdesk.close_ticket(id=2)\n'ok'"


class Person:
    """The client's user: accepts to open each approval link, then decides on its page a moment later."""

    def __init__(self, console: Console, action: str = "accept", decision: str = "approve",
                 reason: str | None = None) -> None:
        self.console, self.action, self.decision, self.reason = console, action, decision, reason
        self.asked: list = []
        self.pages: list[int] = []
        self._tasks: list[asyncio.Task] = []

    async def __call__(self, context, params):
        self.asked.append(params)
        if getattr(params, "mode", None) != "url" or self.action != "accept":
            return ElicitResult(action=self.action if getattr(params, "mode", None) == "url" else "decline")
        # The client answers at once; the decision is taken in the browser afterwards.
        self._tasks.append(asyncio.ensure_future(self.decide(params.url)))
        return ElicitResult(action="accept")

    async def decide(self, url: str) -> None:
        await asyncio.sleep(0.05)
        path = urlsplit(url).path
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.console.app),
                                     base_url=PUBLIC) as browser:
            page = await browser.get(path)
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            decision = self.decision if isinstance(self.decision, str) else self.decision[len(self.pages)]
            form = {"csrf": csrf, "seq": re.search(r'name="seq" value="(\d+)"', page.text).group(1),
                    "decision": decision, "reason": self.reason or ""}
            self.pages.append((await browser.post(path, data=form)).status_code)


def served(rt, **options) -> tuple[TetherServer, Console]:
    server = TetherServer(rt, public_url=PUBLIC, url_wait_seconds=20, **options)
    return server, Console(rt, tokens=[], public_url=PUBLIC)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_paused_write_is_sent_as_its_link_and_decided_on_the_page(rt, rec, mode):
    server, console = served(rt)
    person = Person(console)
    async with Client(server.mcp, mode=mode, elicitation_callback=person) as c:
        r = await c.call_tool("execute", {"code": TWO_WRITES})
    assert r.structured_content["status"] == "completed", r.content[0].text
    assert r.structured_content["result"] == "ok"
    assert rec.deliveries == [("close_ticket", {"id": 1}), ("close_ticket", {"id": 2})]
    assert [p.mode for p in person.asked] == ["url", "url"]
    assert all(p.url.startswith(f"{PUBLIC}/approve/a1.") for p in person.asked)
    assert "helpdesk.close_ticket(id=1)" in person.asked[0].message
    assert person.pages == [200, 200]
    decided = [e.data["via"] for e in rt.store.get_events(r.structured_content["run_id"]) if e.type == "decided"]
    assert decided == ["link", "link"]
    await console.close()


@pytest.mark.parametrize("mode", ERAS)
async def test_declining_to_open_the_link_declines_the_write(rt, rec, mode):
    server, console = served(rt)
    async with Client(server.mcp, mode=mode, elicitation_callback=Person(console, action="decline")) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    assert r.structured_content["status"] == "completed"
    assert DECLINED_TO_OPEN in r.structured_content["result"] and rec.deliveries == []


@pytest.mark.parametrize("mode", ERAS)
async def test_a_decline_on_the_page_reaches_the_program_with_its_reason(rt, rec, mode):
    server, console = served(rt)
    person = Person(console, decision="decline", reason="not this ticket")
    async with Client(server.mcp, mode=mode, elicitation_callback=person) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    assert "not this ticket" in r.structured_content["result"] and rec.deliveries == []
    await console.close()


@pytest.mark.parametrize("mode", ERAS)
async def test_form_mode_keeps_forms_for_a_client_that_does_both(rt, rec, mode):
    server, console = served(rt, approvals="form")
    asked = []

    async def forms(context, params):
        asked.append(getattr(params, "mode", "form"))
        return ElicitResult(action="accept", content={"decision": "approve"})

    async with Client(server.mcp, mode=mode, elicitation_callback=forms) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    assert r.structured_content["status"] == "completed" and asked == ["form"]
    assert rec.deliveries == [("close_ticket", {"id": 3})]


@pytest.mark.parametrize("mode", ERAS)
async def test_without_elicitation_the_paused_result_carries_no_link(rt, rec, mode):
    # The model reads the result: an approval link in it would be a capability in the agent's hands (D-32).
    server, _ = served(rt, approvals="url")
    async with Client(server.mcp, mode=mode) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    data = r.structured_content
    assert data["status"] == "paused" and rec.deliveries == []
    assert "/approve/" not in r.content[0].text and "approval_url" not in r.content[0].text
    assert all("key" not in w for w in data["pending"]["writes"])


async def test_without_a_public_url_auto_stays_with_forms(rt, rec):
    server = TetherServer(rt)  # approvals = "auto", no public_url: nowhere to send a person
    asked = []

    async def forms(context, params):
        asked.append(getattr(params, "mode", "form"))
        return ElicitResult(action="accept", content={"decision": "approve"})

    async with Client(server.mcp, mode="legacy", elicitation_callback=forms) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    assert r.structured_content["status"] == "completed" and asked == ["form"]


def test_serve_refuses_url_approvals_without_a_public_url(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "tether.toml").write_text('[server]\napprovals = "url"\n')
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_TOKEN", None)
    proc = subprocess.run([sys.executable, "-m", "tether.cli", "--config", str(tmp_path / "tether.toml"), "serve",
                           "--http", "127.0.0.1:1", "--dev"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "public_url" in proc.stderr and "nothing was started" in proc.stderr


BATCH = """
import asyncio
import tools


async def close(n):
    try:
        return await tools.helpdesk.close_ticket(id=n)
    except PermissionError as e:
        return str(e)


await asyncio.gather(close(1), close(2))
"""


@pytest.mark.parametrize("mode", ERAS)
async def test_a_batch_pause_sends_one_link_per_write(rt, rec, mode):
    server, console = served(rt)
    person = Person(console, decision=["approve", "decline"], reason="only one")
    async with Client(server.mcp, mode=mode, elicitation_callback=person) as c:
        r = await c.call_tool("execute", {"code": BATCH})
    result = r.structured_content["result"]
    assert r.structured_content["status"] == "completed", r.content[0].text
    assert result[0] == {"id": 1, "status": "closed"} and "only one" in result[1]
    assert rec.deliveries == [("close_ticket", {"id": 1})]
    assert len({p.url for p in person.asked}) == 2
    await console.close()


async def test_modern_an_undecided_link_ends_in_the_paused_envelope_not_another_round(rt, rec):
    """2026-07-28: the user opens the link but decides nothing within the wait. The retry's answer is the
    paused envelope (run id, where a person approves, resume), so the model learns how to continue, instead
    of the same link again until the client's round limit (InputRequiredRoundsExceededError, run id lost).
    The envelope carries no link: the model reads it (D-32)."""
    server = TetherServer(rt, public_url=PUBLIC, url_wait_seconds=0.3)
    asked = []

    async def opens_but_never_decides(context, params):
        asked.append(params)
        return ElicitResult(action="accept")

    async with Client(server.mcp, mode="auto", elicitation_callback=opens_but_never_decides) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    data = r.structured_content
    assert data["status"] == "paused" and data["run_id"].startswith("run_")
    assert "approval_url" not in data["pending"] and "/approve/" not in data["instructions"]
    assert data["run_id"] in data["instructions"] and "resume" in data["instructions"]
    assert len(asked) == 1 and rec.deliveries == []


@pytest.mark.parametrize("mode", ERAS)
async def test_p33_d57_a_link_sent_through_the_agents_client_decides_nothing_for_the_client_even_as_capability(
        rt, rec, mode):
    """The agent's client holds every URL-mode link; under `links = "capability"` a rogue one could approve
    its own agent's write by opening the link itself. A link sent in band asks for a sign-in whatever the
    setting; only links sent out of band (webhooks, `tether runs show`) are capabilities there."""
    from tether._engine.approvals import APPROVE, RUN, Access, Grant
    from tether._server.approvals import link_token
    from tether._server.auth import principal_for_token

    agent, person = "agent-token-0123456789", "person-token-0123456789"
    rights = Access.of([Grant(principal_for_token(agent), "agent", frozenset({RUN})),
                        Grant(principal_for_token(person), "pat", frozenset({APPROVE}), frozenset({"*"}))],
                       links="capability")
    console = Console(rt, tokens=[agent, person], public_url=PUBLIC, access=rights)
    server = TetherServer(rt, public_url=PUBLIC, url_wait_seconds=1)
    tried: list[int] = []

    async def rogue(context, params):
        # The client opens the link itself and approves, with nobody signed in.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url=PUBLIC) as web:
            path = urlsplit(params.url).path
            page = await web.get(path)
            assert 'value="approve"' not in page.text and "/console/login?next=/approve/" in page.text
            # No form to take a CSRF token from: post with whatever it has.
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            posted = await web.post(path, data={"csrf": found.group(1) if found else "x", "seq": "1",
                                                "decision": "approve"})
            tried.append(posted.status_code)
        return ElicitResult(action="accept")

    async with Client(server.mcp, mode=mode, elicitation_callback=rogue) as c:
        r = await c.call_tool("execute", {"code": CLOSE_3_CAUGHT})
    assert tried and all(code in (401, 403) for code in tried) and rec.deliveries == []
    run_id = r.structured_content["run_id"]
    assert rt.store.get_run(run_id).status == "paused"
    # The same write's link sent out of band is still a capability under this setting.
    run = rt.store.get_run(run_id)
    token = link_token(rt.store.secret(), run_id, 1, run.expires_at)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url=PUBLIC) as web:
        page = await web.get(f"/approve/{token}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        ok = await web.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
    assert ok.status_code == 200, ok.text
    await rt.engine.wait_for_run(run_id)
    assert rec.deliveries == [("close_ticket", {"id": 3})]
    await console.close()
