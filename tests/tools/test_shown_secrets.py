"""Secrets a write carries are not shown to the people who decide it (P-38).

One rule (_tools/shown.py: ``secret_paths``): an argument, or a key inside an
object argument, named like a secret, or marked ``format: password`` or
``writeOnly`` in the tool's schema. These tests put a real OpenAPI operation
and a Python tool through every surface that shows a paused write — the
console's run page (card, journal, program), an approval link's page, the MCP
approval form, the paused envelope's instructions, a webhook's body — and
look for the secret's text in what each shows.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tether import Runtime, tool
from tether._server.approvals import input_schema, link_token
from tether._server.results import approval_message
from tether._sources.openapi import OpenAPISource
from tether._tools.shown import REDACTED, secret_name, show_call

PIN = "4417-2209-pin"
KEY = "sk_live_abcdef0123456789"
SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "Cards", "version": "1"},
    "paths": {"/cards/{card_id}/pin": {"put": {
        "operationId": "setPin",
        "parameters": [{"in": "path", "name": "card_id", "required": True, "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["new_code"],
            "properties": {"new_code": {"type": "string", "format": "password"},
                           "audit": {"type": "object", "properties": {"note": {"type": "string"},
                                                                      "signature": {"type": "string",
                                                                                    "writeOnly": True}}}}}}}},
        "responses": {"204": {"description": "set"}}}}},
}


@tool(namespace="vendor")
def connect_account(account: str, api_key: str, settings: dict) -> dict:
    """Connect the vendor account."""
    return {"ok": True}


@pytest.mark.parametrize("name", ["password", "new_password", "password_confirmation", "api_key", "apiKey",
                                  "x-api-key", "access_token", "refreshToken", "token", "client_secret",
                                  "clientSecret", "Authorization", "private_key", "passphrase", "cookie"])
def test_names_that_hold_secrets(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "page_token", "next_token", "tokens", "key", "secret_name",
                                  "token_expires_at", "password_policy", "author", "keyword", "monkey",
                                  "passenger", "idempotency_key", "encrypted_value"])
def test_names_that_do_not(name):
    # OpenAI's max_tokens and a pagination cursor are what an approver needs to read.
    assert not secret_name(name)


def test_a_nested_secret_and_a_schema_marked_field_are_redacted_and_the_rest_is_not():
    schema = SPEC["paths"]["/cards/{card_id}/pin"]["put"]["requestBody"]["content"]["application/json"]["schema"]
    shown = show_call("cards.set_pin", {"card_id": "c_1", "new_code": PIN,
                                        "audit": {"note": "asked by phone", "signature": "sig-xyz",
                                                  "password": "p"}},
                      schema={"type": "object", "properties": {"card_id": {"type": "string"}, **schema["properties"]}})
    line = shown.line()
    assert PIN not in line and "sig-xyz" not in line and '"password": "p"' not in line
    assert "asked by phone" in line and "c_1" in line and line.count(REDACTED) == 3
    assert [a.name for a in shown.args if a.secret] == ["new_code"]
    # Without the schema the name rule still holds; a field the schema alone marks is then shown.
    assert PIN in show_call("cards.set_pin", {"new_code": PIN}).line()


@pytest.fixture
async def rt():
    async with OpenAPISource("cards", SPEC, base_url="https://cards.example.test/v2") as cards:
        async with Runtime(tools=[connect_account, *cards.tools()]) as runtime:
            yield runtime


OPENAPI_PROGRAM = f"""# Reset the PIN of card c_9
import tools
await tools.cards.set_pin(card_id="c_9", new_code={PIN!r}, audit={{"note": "reset at the branch"}})
"""
PYTHON_PROGRAM = f"""import tools
await tools.vendor.connect_account(account="acme", api_key={KEY!r}, settings={{"client_secret": {KEY!r}}})
"""


async def test_every_surface_shows_a_paused_write_without_its_secrets(rt):
    from tether._server.console import Console
    from tether._server.notify import Notifier, Webhook

    notifier = Notifier(rt, [Webhook("http://127.0.0.1:9/hook", b"s" * 16, frozenset({"paused"}))])
    rt.engine.events.listeners.append(notifier)
    card = await rt.execute(OPENAPI_PROGRAM)
    vendor = await rt.execute(PYTHON_PROGRAM)
    assert card.status == vendor.status == "paused"
    assert await notifier.queue_hinted() == 2
    console = Console(rt, tokens=[])
    shown: dict[str, str] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                 base_url="http://127.0.0.1:8000") as c:
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await c.get("/console/login")).text).group(1)
        await c.post("/console/login", data={"csrf": csrf, "token": ""})
        for name, run in (("card", card), ("vendor", vendor)):
            shown[f"{name} run page"] = (await c.get(f"/console/runs/{run.run_id}")).text
            token = link_token(rt.store.secret(), run.run_id, 1, run.expires_at)
            shown[f"{name} link page"] = (await c.get(f"/approve/{token}")).text
            shown[f"{name} instructions"] = run.instructions
            write = run.pending
            shown[f"{name} MCP form"] = approval_message(write, None, input_schema(rt, write["address"]))
        shown["console runs list"] = (await c.get("/console/")).text
    shown["webhook bodies"] = " ".join(row.body for row in rt.store.list_outbox())
    for where, text in shown.items():
        assert PIN not in text and KEY not in text, where
    for where in ("card run page", "card link page"):
        # Where it goes, with the path filled in; the rest of the write readable.
        assert "PUT" in shown[where] and "https://cards.example.test/v2/cards/c_9/pin" in shown[where], where
        assert "reset at the branch" in shown[where] and "secret, not shown" in shown[where], where
    assert "Reset the PIN of card c_9" in shown["console runs list"]
    assert "acme" in shown["vendor MCP form"] and REDACTED in shown["vendor MCP form"]
    assert len(json.loads(rt.store.list_outbox()[0].body)["pending"][0]["args"]) == 3
    await console.close()
