"""P-46 for OpenAPI sources, against a local API served over HTTP: a POST that creates a resource is undone by
the DELETE of what it returned; `describe` says so; a source's `undo` table names another undo or none."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from helpers import served_in_thread
from tether import open_runtime
from tether._config import load_config

SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "Tickets", "version": "1"},
    "paths": {
        "/tickets": {"post": {
            "operationId": "create_ticket",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}}},
            "responses": {"201": {"description": "created"}}}},
        "/tickets/{ticket_id}": {"delete": {
            "operationId": "delete_ticket",
            "parameters": [{"name": "ticket_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"204": {"description": "deleted"}}}},
        "/notes": {"post": {
            "operationId": "add_note",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}},
            "responses": {"200": {"description": "added"}}}},
    },
}


@pytest.fixture
def api():
    requests: list[tuple[str, str, str | None]] = []
    tickets: dict[str, dict] = {}

    async def create(request: Request) -> Response:
        body = await request.json()
        ticket = {"id": f"T{len(tickets) + 1}", "title": body["title"]}
        tickets[ticket["id"]] = ticket
        requests.append(("POST", "/tickets", request.headers.get("idempotency-key")))
        return JSONResponse(ticket, status_code=201)

    async def delete(request: Request) -> Response:
        ticket_id = request.path_params["ticket_id"]
        requests.append(("DELETE", f"/tickets/{ticket_id}", request.headers.get("idempotency-key")))
        return Response(status_code=204 if tickets.pop(ticket_id, None) else 404)

    async def note(request: Request) -> Response:
        requests.append(("POST", "/notes", request.headers.get("idempotency-key")))
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/tickets", create, methods=["POST"]),
                            Route("/tickets/{ticket_id}", delete, methods=["DELETE"]),
                            Route("/notes", note, methods=["POST"])])
    with served_in_thread(app) as url:
        yield url, requests, tickets


def _config(tmp_path, url: str, extra: str = "") -> object:
    (tmp_path / "api.json").write_text(json.dumps(SPEC))
    (tmp_path / "tether.toml").write_text(
        f'[store]\nurl = "sqlite:///{tmp_path}/tether.db"\n\n[policy]\nwrites = "allow"\n\n'
        f'[[sources]]\ntype = "openapi"\nnamespace = "tickets"\nspec = "api.json"\nbase_url = "{url}"\n{extra}')
    return load_config(tmp_path / "tether.toml")


async def test_p46_an_openapi_create_is_undone_by_the_delete_of_what_it_returned(tmp_path, api):
    url, requests, tickets = api
    async with open_runtime(_config(tmp_path, url)) as rt:
        shown = rt.describe("tickets.create_ticket")[0]
        assert shown["undo"] == {"tool": "tickets.delete_ticket"}
        assert "undo" not in rt.describe("tickets.add_note")[0]
        done = await rt.execute("import tools\n"
                                "a = await tools.tickets.create_ticket(title='one')\n"
                                "await tools.tickets.add_note(text='made ' + a['id'])\n"
                                "b = await tools.tickets.create_ticket(title='two')\n"
                                "[a['id'], b['id']]\n")
        assert done.result == ["T1", "T2"] and set(tickets) == {"T1", "T2"}

        result = await rt.resume(done.run_id, "undo")

    assert result.status == "rolled_back"
    assert tickets == {}
    deletes = [r for r in requests if r[0] == "DELETE"]
    # Newest first, each once, each with the key derived from its create's (P-25).
    assert [r[1] for r in deletes] == ["/tickets/T2", "/tickets/T1"]
    assert [r[2] for r in deletes] == [f"tether-undo-tether-{done.run_id}-3", f"tether-undo-tether-{done.run_id}-1"]
    assert [(x["seq"], x["undone"]) for x in result.rollback] == [(3, True), (2, False), (1, True)]
    assert result.rollback[1]["why"] == "tickets.add_note declares no undo"


async def test_p46_a_source_undo_table_names_another_undo_or_none(tmp_path, api):
    url, requests, tickets = api
    extra = 'undo = { create_ticket = { tool = "tickets.add_note", args = { text = "result.id" } }, add_note = false }\n'
    async with open_runtime(_config(tmp_path, url, extra)) as rt:
        assert rt.describe("tickets.create_ticket")[0]["undo"] == {"tool": "tickets.add_note"}
        done = await rt.execute("import tools\n(await tools.tickets.create_ticket(title='one'))['id']\n")
        result = await rt.resume(done.run_id, "undo")
    assert result.status == "rolled_back" and result.rollback[0]["undone"]
    assert requests[-1][:2] == ("POST", "/notes") and set(tickets) == {"T1"}
