"""OpenAPISource against a real Starlette app served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from helpers import served_in_thread
from tether._sources.openapi import OpenAPISource
from tether.errors import ConfigError, InvalidArguments, ToolError

FIXTURES = Path(__file__).parent.parent / "fixtures"
USERS_SPEC = FIXTURES / "openapi_users.json"
PROBLEMS_SPEC = FIXTURES / "openapi_problems.json"
API_KEY = "k3y-" + "s" * 20


def _load_app_module():
    spec = importlib.util.spec_from_file_location("tether_test_openapi_app", FIXTURES / "openapi_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def api():
    """The users API on a free port, in a uvicorn thread stopped after the test."""
    app = _load_app_module().build_app(API_KEY)
    with served_in_thread(app) as url:
        yield f"{url}/v1", app


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("TETHER_TEST_API_KEY", API_KEY)


AUTH = [
    {"type": "header", "name": "X-API-Key", "value_env": "TETHER_TEST_API_KEY"},
    {"type": "query", "name": "api_key", "value_env": "TETHER_TEST_API_KEY"},
]


@pytest.fixture
async def users(api, key_env):
    base_url, app = api
    source = OpenAPISource("users", USERS_SPEC, base_url=base_url, auth=AUTH)
    await source.start()
    yield {t.name: t for t in source.tools()}, app, source
    await source.close()


async def test_operations_become_tools(users):
    tools, _, source = users
    assert source.problems == []
    assert source.summary == "Users"  # info.title: the namespace's one line
    assert sorted(tools) == [
        "boom",
        "create_user",
        "delete_user",
        "get_motd",
        "get_secret",
        "get_user",
        "list_users",
        "measure_tree",
        "put_users_user_id",  # no operationId: method_path
        "search",
    ]
    create = tools["create_user"]
    assert create.source == "openapi"
    assert create.description == "Create a user\n\nThe server assigns the id."
    schema = create.input_schema
    # Body properties at top level, header parameter beside them, readOnly id dropped.
    assert set(schema["properties"]) == {"x_request_id", "name", "email", "tags"}
    assert schema["required"] == ["name", "email"]
    assert schema["properties"]["email"]["type"] == ["string", "null"]  # 3.0 nullable
    assert tools["get_user"].input_schema["required"] == ["user_id"]  # path-level $ref parameter
    assert tools["list_users"].output_schema["items"]["properties"]["id"]["type"] == "integer"
    # The recursive schema is cut off where it refers back to itself.
    assert tools["measure_tree"].input_schema["properties"]["children"] == {"type": "array", "items": {}}


async def test_annotations_follow_http_methods(users):
    tools, _, _ = users
    names = ("get_user", "create_user", "put_users_user_id", "delete_user")
    get, create, put, delete = (tools[n].annotations for n in names)
    assert get.read_only and not get.destructive
    assert not create.read_only and not create.destructive and not create.idempotent
    assert not put.read_only and put.idempotent and not put.destructive
    assert not delete.read_only and delete.destructive and delete.idempotent


async def test_list_get_create_put_delete(users):
    tools, app, _ = users
    assert await tools["list_users"].handler({"limit": 10, "tag": ["admin"]}) == [
        {"id": 1, "name": "ada", "email": "ada@example.com", "tags": ["admin"]}
    ]
    method, path, query, _ = app.state.seen["requests"][-1]
    assert (method, path) == ("GET", "/v1/users")
    assert "tag=admin" in query and "limit=10" in query

    created = await tools["create_user"].handler({"name": "bob", "email": None, "x_request_id": "req-1"})
    assert created == {"id": 2, "tags": [], "name": "bob", "email": None}
    headers = app.state.seen["requests"][-1][3]
    assert headers["x-request-id"] == "req-1" and headers["content-type"] == "application/json"

    assert await tools["get_user"].handler({"user_id": 2}) == created
    replaced = await tools["put_users_user_id"].handler({"user_id": 2, "name": "bobby", "email": "b@example.com"})
    assert replaced["name"] == "bobby"
    assert await tools["delete_user"].handler({"user_id": 2}) is None
    assert 2 not in app.state.users
    assert await tools["list_users"].handler({"name_prefix": "bob"}) == []


async def test_api_key_from_env_reaches_server_but_not_the_schema(users):
    tools, app, _ = users
    assert await tools["get_secret"].handler({}) == {"secret": 42}
    assert await tools["search"].handler({"q": "ada"}) == {"q": "ada"}
    assert app.state.seen["keys"] == [API_KEY, API_KEY]
    # The spec declares X-API-Key and api_key as parameters; auth owns them.
    assert tools["get_secret"].input_schema["properties"] == {}
    assert set(tools["search"].input_schema["properties"]) == {"q"}
    for tool in tools.values():
        assert API_KEY not in json.dumps(tool.input_schema)
        assert "api_key" not in tool.input_schema["properties"]


async def test_key_is_read_at_call_time(users, monkeypatch):
    tools, app, _ = users
    monkeypatch.setenv("TETHER_TEST_API_KEY", "rotated")
    with pytest.raises(ToolError) as info:
        await tools["get_secret"].handler({})
    assert info.value.details["status"] == 401
    assert app.state.seen["keys"] == ["rotated"]


async def test_http_errors_become_tool_errors(users):
    tools, _, _ = users
    with pytest.raises(ToolError) as info:
        await tools["get_user"].handler({"user_id": 999})
    assert info.value.details["status"] == 404
    assert "404" in info.value.message and "no such user" in info.value.message

    with pytest.raises(ToolError) as info:
        await tools["boom"].handler({})
    assert info.value.details["status"] == 500
    assert "internal failure" in info.value.message
    assert len(info.value.message) < 1200  # body excerpt capped at 1,000 characters, plus the http_error line


async def test_text_and_recursive_bodies(users):
    tools, _, _ = users
    assert await tools["get_motd"].handler({}) == "hello, plain text"
    tree = {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}
    assert await tools["measure_tree"].handler(tree) == {"depth": 3}


async def test_dot_segments_are_refused(users):
    tools, app, _ = users
    with pytest.raises(InvalidArguments):
        await tools["delete_user"].handler({"user_id": ".."})
    assert app.state.seen["requests"] == []


async def test_unsupported_operations_are_listed_and_skipped():
    source = OpenAPISource("awkward", PROBLEMS_SPEC)
    await source.start()
    try:
        # multipart and text bodies are called now (tests/sources/test_openapi_real.py sends them).
        assert [t.name for t in source.tools()] == ["fine", "upload", "put_raw"]
        assert source.tools()[0].input_schema["properties"]["x"]["type"] == ["string", "null"]  # 3.1 passes through
        problems = {p["operation"]: p["problem"] for p in source.problems}
        assert set(problems) == {
            "GET /cookie",
            "POST /subscribe",
            "GET /external",
            "GET /dangling",
            "GET /matrix/{id}",
            "GET /things/{thing_id}/parts",
            "GET /malformed",
        }
        assert "cookie" in problems["GET /cookie"]
        assert "callbacks" in problems["POST /subscribe"]
        assert "external $ref" in problems["GET /external"]
        assert "malformed" in problems["GET /malformed"]
    finally:
        await source.close()


async def test_base_url_defaults_to_first_server(api, key_env):
    base_url, _ = api
    spec = json.loads(USERS_SPEC.read_text())
    spec["servers"] = [{"url": base_url}, {"url": "http://127.0.0.1:9/unused"}]
    async with OpenAPISource("users", spec, auth=AUTH) as source:
        tools = {t.name: t for t in source.tools()}
        assert (await tools["get_user"].handler({"user_id": 1}))["name"] == "ada"


async def test_spec_loaded_from_url(api, key_env):
    base_url, app = api
    # Serve the spec from the API itself through a one-off route.
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    spec = json.loads(USERS_SPEC.read_text())
    spec["servers"] = [{"url": "/v1"}]  # relative: resolved against the spec's URL
    app.router.routes.append(Route("/openapi.json", lambda request: JSONResponse(spec)))
    root = base_url.rsplit("/v1", 1)[0]
    async with OpenAPISource("users", f"{root}/openapi.json", auth=AUTH) as source:
        tools = {t.name: t for t in source.tools()}
        assert (await tools["get_user"].handler({"user_id": 1}))["name"] == "ada"


async def test_missing_auth_env_is_a_load_error(monkeypatch):
    monkeypatch.delenv("TETHER_TEST_API_KEY", raising=False)
    source = OpenAPISource("users", USERS_SPEC, auth={"type": "bearer", "token_env": "TETHER_TEST_API_KEY"})
    with pytest.raises(ConfigError) as info:
        await source.start()
    assert "TETHER_TEST_API_KEY" in info.value.message


def test_bad_auth_config_is_rejected():
    with pytest.raises(ConfigError):
        OpenAPISource("users", USERS_SPEC, auth={"type": "basic", "user": "x"})


async def test_unreachable_api_is_a_tool_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with OpenAPISource("users", USERS_SPEC, base_url=f"http://127.0.0.1:{port}/v1") as source:
            tools = {t.name: t for t in source.tools()}
            with pytest.raises(ToolError) as info:
                await tools["get_user"].handler({"user_id": 1})
    assert info.value.details == {"source": "users", "tool": "get_user", "code": "transport_error", "sent": False,
                                  "outcome": "not_sent"}


async def test_yaml_and_version_checks(tmp_path):
    yaml_spec = tmp_path / "spec.yaml"
    yaml_spec.write_text(
        "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'http://127.0.0.1:9'}]\npaths: {}\n"
    )
    source = OpenAPISource("y", yaml_spec)
    if importlib.util.find_spec("yaml") is None:
        with pytest.raises(ConfigError) as info:
            await source.start()
        assert "PyYAML" in info.value.message
    else:
        await source.start()
        assert source.tools() == []
        await source.close()

    swagger = tmp_path / "swagger.json"
    swagger.write_text(json.dumps({"swagger": "2.0", "paths": {}}))
    with pytest.raises(ConfigError) as info:
        await OpenAPISource("s", swagger).start()
    assert "swagger 2.0" in info.value.message
