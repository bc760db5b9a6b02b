"""People sign in to the console through the identity provider's own login page (headless Chromium).

An agent's run (alice's access token, from the MCP SDK client's OAuth flow)
pauses at a write. alice signs in to the console through the IdP: she sees the
write and cannot approve it (she has no approve right, and she ran it). bob, in
the IdP's "approvers" group, signs in the same way and approves it: the write
is sent once and the timeline names him. A sign-in begun on one replica
finishes on another, and its session works on both.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from tests.server.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, _missing
from tests.server.test_oauth import Memory, Served, connect, execute, oauth_for, serving, stop_server

from helpers import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("oauth-browser")) as s:
        yield s


@pytest.fixture(scope="module")
def browser(served):
    reason = _missing()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests must run in CI: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def sign_in_through_the_idp(browser, served, user: str):
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    page.goto(f"{served.base}/console/")
    assert page.url.endswith("/console/login")
    page.click("#oidc")
    # The IdP's own pages: its login form, then its consent form.
    page.wait_for_url(re.compile(re.escape(served.idp.issuer) + r"/interaction/.*"))
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", "correct horse")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(served.idp.issuer) + r"/interaction/.*"))
    page.click("button[type=submit]")
    page.wait_for_url(f"{served.base}/console/")
    return context, page


def ledger(served) -> list[str]:
    path = served.root / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


async def agent_run(served, tag: str) -> str:
    async with connect(served.mcp, auth=oauth_for(served.mcp, "alice", Memory())) as client:
        out = await execute(client, f"import tools\nawait tools.ledger.guarded_write(tag={tag!r})\n'sent'")
    assert out["status"] == "paused", out
    return out["run_id"]


def test_an_approver_signed_in_through_the_idp_approves_an_agents_write(browser, served):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    # Playwright's sync API holds this thread's event loop: the agent runs on another thread.
    with ThreadPoolExecutor(1) as pool:
        run_id = pool.submit(asyncio.run, agent_run(served, "oidc-approve")).result(timeout=120)
    run_page = f"{served.base}/console/runs/{run_id}"

    # alice (no approve right; she ran it) sees the write and cannot decide it.
    context, page = sign_in_through_the_idp(browser, served, "alice")
    try:
        assert "Alice Agent-Owner" in page.locator("header").inner_text()
        page.goto(run_page)
        assert page.locator("article.write").count() == 1
        assert "guarded_write" in page.locator("article.write").inner_text()
        assert page.locator("button[value=approve]").count() == 0
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        refused = context.request.post(run_page + "/decide", form={"csrf": csrf, "decision": "approve", "seq": "1"},
                                       max_redirects=0)
        assert refused.status == 403, refused.text()
        assert "nothing was sent" in refused.text().lower()
        assert "oidc-approve" not in ledger(served)
    finally:
        context.close()

    # bob is in the IdP's "approvers" group: [auth.rights.approve] makes him an approver.
    context, page = sign_in_through_the_idp(browser, served, "bob")
    try:
        assert "Bob Approver" in page.locator("header").inner_text()
        # An approver sees everyone's runs; the list names whose each is.
        assert "Alice Agent-Owner" in page.locator("table").inner_text()
        page.goto(run_page)
        assert "Alice Agent-Owner" in page.locator(".meta").first.inner_text()
        page.locator("article.write button[value=approve]").click()
        page.wait_for_url(re.compile(r".*flash=approved.*"))
        page.wait_for_selector("#result", timeout=30_000)
        timeline = page.locator(".timeline").inner_text()
        assert re.search("call 1: approve by IdP user “Bob Approver", timeline), timeline
        assert "via console" in timeline
    finally:
        context.close()
    assert ledger(served).count("oidc-approve") == 1
    shown = served.show(run_id)
    assert [(d["decision"], d["actor"]) for d in shown["decisions"]] == \
        [("approve", "IdP user “Bob Approver <bob@example.test>”")]


def test_a_sign_in_begun_on_one_replica_finishes_on_another_and_its_session_works_on_both(
        browser, served, tmp_path):
    """Two replicas on one store (one secret): the IdP's redirect lands on the first, the sign-in began on the second."""
    port = free_port()
    other = Served(None, f"http://127.0.0.1:{port}", served.idp, served.root)
    with open(tmp_path / "replica.log", "wb") as err:
        other.proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "--config", str(served.root / "tether.toml"), "serve",
             "--http", f"127.0.0.1:{port}", "--tools", str(served.root / "ledger_tools.py")],
            env=served.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(other.base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert other.proc.poll() is None and time.monotonic() < deadline, (tmp_path / "replica.log").read_text()
            time.sleep(0.1)
        context = browser.new_context()
        page = context.new_page()
        # Begin on the second replica; the IdP sends the browser back to the public URL (the first).
        page.goto(f"{other.base}/console/oidc/start")
        page.wait_for_url(re.compile(re.escape(served.idp.issuer) + r"/interaction/.*"))
        page.fill("input[name=login]", "bob")
        page.fill("input[name=password]", "correct horse")
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(re.escape(served.idp.issuer) + r"/interaction/.*"))
        page.click("button[type=submit]")
        page.wait_for_url(f"{served.base}/console/")
        assert "Bob Approver" in page.locator("header").inner_text()
        # The session the first replica made is good on the second (cookies are per host, not per port).
        page.goto(f"{other.base}/console/")
        assert page.url == f"{other.base}/console/"
        assert "Bob Approver" in page.locator("header").inner_text()
        context.close()
    finally:
        stop_server(other.proc)
