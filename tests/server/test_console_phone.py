"""The console for an approver, on a desktop and on a 375 px phone, in a real browser (P-38, D-42).

One ``tether serve --http`` subprocess serves an OpenAPI source (a trimmed
members API whose operation carries GitHub-sized boilerplate and a
``format: password`` field), the fixture MCP server and a Python ledger tool.
An agent starts its programs over ``/mcp`` as ``alpha`` through an MCP client
that names itself; ``pat`` approves alpha's writes in Chromium. Every page is
checked at 1100 and 375 px: nothing wider than the screen, "Sign out" in view,
Approve on the first screen, where the write goes, who asked, and no secret.

Skipped when chromium or Playwright is missing (a failure under CI=true), as
tests/server/test_console_browser.py; screenshots go to ``$TETHER_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from test_console_browser import ALPHA, CHROMIUM, CHROMIUM_FLAGS, PAT, Server, _missing, signed_in

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent.parent / "fixtures"
WIDTHS = [pytest.param(1100, id="desktop"), pytest.param(375, id="phone")]
PASSWORD = "hunter2-correct-horse"
# GitHub's descriptions open with this kind of text, fifteen lines of it, before anything about the write.
BOILERPLATE = "\n".join(f"This endpoint supports the following custom media types (line {i}): "
                        "application/vnd.example.raw+json, application/vnd.example.text+json." for i in range(15))

SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "Members", "version": "1"},
    "servers": [{"url": "https://members.example.test/v1"}],
    "paths": {"/orgs/{org}/members": {"post": {
        "operationId": "addMember",
        "summary": "Add a member to an organisation",
        "description": BOILERPLATE,
        "parameters": [{"in": "path", "name": "org", "required": True, "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["email", "pin"],
            "properties": {"email": {"type": "string"}, "role": {"type": "string"},
                           "pin": {"type": "string", "format": "password"}}}}}},
        "responses": {"201": {"description": "added"}}}}},
}

SOURCES = """
[[sources]]
type = "openapi"
namespace = "members"
spec = "{spec}"

[[sources]]
type = "mcp"
namespace = "fixture"
command = {command}
"""

OPENAPI_PROGRAM = f"""# Invite Dana to the acme organisation as a maintainer
import tools
await tools.members.add_member(org="acme", email="dana@example.com", role="maintainer",
                               pin={PASSWORD!r})
"""

MCP_PROGRAM = """# Note the refund in the fixture log
import tools
await tools.fixture.record(log="/dev/null", text="refund 4417 noted")
"""

LEDGER_PROGRAM = """# Record the refund for order 4417, twice checked
import tools
await tools.ledger.guarded_write(tag="first-write", note="the first of two writes")
await tools.ledger.guarded_write(tag="second-write", note="the second")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = _missing()
    if reason:
        import os

        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests must run in CI: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("phone")
    spec = root / "members.json"
    spec.write_text(json.dumps(SPEC))
    command = json.dumps([sys.executable, str(FIXTURES / "mcp_fixture_server.py")])
    s = Server(root, extra=SOURCES.format(spec=spec, command=command))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    import os

    root = os.environ.get("TETHER_TEST_ARTIFACTS")
    where = Path(root) if root else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)

    def shot(page, name: str) -> None:
        path = where / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")

    return shot


def start_as_agent(server, code: str, mode: str = "legacy") -> str:
    """Start ``code`` over /mcp as alpha through a client that names itself; return the paused run's id.

    ``mode`` "legacy" names the client in its initialize request, "auto" (2026-07-28) in every request's _meta.
    """
    from mcp_types import Implementation

    from test_server_http import connect

    async def go() -> str:
        async with connect(f"{server.base}/mcp", ALPHA, mode,
                           client_info=Implementation(name="phone-test-agent", version="1.2.3")) as agent:
            result = await agent.call_tool("execute", {"code": code})
            out = result.structured_content
            assert out["status"] == "paused", out
            return out["run_id"]

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API owns this thread's event loop
        return pool.submit(asyncio.run, go()).result(timeout=120)


def at_width(browser, server, width: int):
    context, page = signed_in(browser, server, PAT)
    # 375 x 667: an iPhone SE's screen, the smallest phone still sold in numbers.
    page.set_viewport_size({"width": width, "height": 667 if width < 500 else 760})
    return context, page


def fits(page) -> None:
    """Nothing is wider than the screen: the page never scrolls sideways."""
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    print(f"{page.url.split('/')[3]}: {width[0]} px wide in a {width[1]} px window")
    assert width[0] <= width[1], f"the page is {width[0]} px wide in a {width[1]} px window"


def in_first_screen(page, locator) -> None:
    box = locator.bounding_box()
    height = page.evaluate("window.innerHeight")
    width = page.evaluate("window.innerWidth")
    assert box is not None, "not on the page"
    assert box["y"] >= 0 and box["y"] + box["height"] <= height, f"at y={box['y']:.0f}, below the first {height} px"
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"at x={box['x']:.0f}, outside the {width} px width"


@pytest.fixture(scope="module")
def runs(server):
    """The three paused runs, started once for every width."""
    return {"openapi": start_as_agent(server, OPENAPI_PROGRAM), "mcp": start_as_agent(server, MCP_PROGRAM, "auto"),
            "ledger": start_as_agent(server, LEDGER_PROGRAM)}


@pytest.mark.parametrize("width", WIDTHS)
def test_an_openapi_write_shows_where_it_goes_who_asked_and_no_secret(browser, server, runs, shots, width):
    context, page = at_width(browser, server, width)
    try:
        page.goto(f"{server.base}/console/runs/{runs['openapi']}")
        shots(page, f"phone-openapi-run-{width}")
        fits(page)
        in_first_screen(page, page.locator("button.link", has_text="Sign out"))
        write = page.locator("article.write")
        in_first_screen(page, write.locator("button[value=approve]"))
        text = write.inner_text()
        # Where it goes: the method and the URL, its path parameter filled in.
        assert "POST" in text and "https://members.example.test/v1/orgs/acme/members" in text
        # Arguments first; the boilerplate folded under them.
        assert "dana@example.com" in text and "custom media types" not in text
        # The format: password field is redacted, in the card and in the journal below it.
        assert "secret, not shown" in text
        assert PASSWORD not in page.content()
        asked = page.locator("p.asker").inner_text()
        assert "TETHER_TOKEN" in asked and "phone-test-agent 1.2.3" in asked
        assert "Invite Dana to the acme organisation" in asked
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_an_mcp_write_names_its_server_and_the_link_page_names_who_asked(browser, server, runs, shots, width):
    from test_console_browser import _link_from_cli

    context, page = at_width(browser, server, width)
    try:
        page.goto(f"{server.base}/console/runs/{runs['mcp']}")
        fits(page)
        target = page.locator("article.write .target").inner_text()
        assert "MCP server run as python" in target and "mcp_fixture_server.py" in target and "/work" not in target
        in_first_screen(page, page.locator("article.write button[value=approve]"))
        link = _link_from_cli(server, runs["mcp"])
        page.goto(link)
        fits(page)
        in_first_screen(page, page.locator("article.write button[value=approve]"))
        asked = page.locator("p.asker").inner_text()
        assert "TETHER_TOKEN" in asked and "phone-test-agent" in asked and "Note the refund" in asked
        assert "mcp_fixture_server.py" in page.locator("article.write .target").inner_text()
        shots(page, f"phone-link-{width}")
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_runs_list_fits_and_says_what_each_run_does(browser, server, runs, shots, width):
    context, page = at_width(browser, server, width)
    try:
        page.goto(f"{server.base}/console/")
        fits(page)
        in_first_screen(page, page.locator("button.link", has_text="Sign out"))
        row = page.locator(f"tr[data-run='{runs['openapi']}']")
        assert "Invite Dana to the acme organisation" in row.inner_text()
        assert "Note the refund" in page.locator(f"tr[data-run='{runs['mcp']}']").inner_text()
        shots(page, f"phone-runs-{width}")
    finally:
        context.close()


def test_after_approving_the_page_says_the_run_went_on_and_paused_again(browser, server, runs, shots):
    run_id = runs["ledger"]
    context, page = at_width(browser, server, 375)
    try:
        page.goto(f"{server.base}/console/runs/{run_id}")
        write = page.locator("article.write")
        assert "first-write" in write.inner_text()
        assert "a Python tool" in write.locator(".target").inner_text()
        write.locator("button[value=approve]").click()
        page.wait_for_load_state()
        notice = page.locator("p.notice").inner_text()
        # The first write was sent, the run went on and paused at the second: the page says that.
        assert "Approved call 1: sent." in notice and "paused again" in notice and "call 2" in notice, notice
        assert "once the rest of its writes are decided" not in notice
        assert server.tags() == ["first-write"]
        assert "second-write" in page.locator("article.write").inner_text()
        fits(page)
        shots(page, "phone-after-approve")
    finally:
        context.close()
