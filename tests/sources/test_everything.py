"""tether as a gateway to the MCP project's own reference server, `@modelcontextprotocol/server-everything`
(npm, pinned by tests/everything/package-lock.json): every tool it offers, driven from programs as a user would.

One server over stdio serves the whole module (and one over streamable HTTP its own test); hostile.mjs, on the
same SDK, does what the reference server won't (sampling and roots requests a client never offered, floods).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import time
from pathlib import Path

import pytest
import pytest_asyncio
from mcp import Client
from mcp_types import ElicitResult
from tests.everything.run import hostile_command, start_http, stdio_command, stop

from tether._app import open_runtime
from tether._config import Config
from tether._server.mcp import TetherServer
from tether._sources import mcp as mcp_source
from tether._sources._mcp_links import url_required
from tether._sources._mcp_progress import ProgressGate

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# What the pinned server lists for a client that declares elicitation (form and URL) but neither sampling nor
# roots, by its annotations (tools/*.js of server-everything 2026.8.31): readOnlyHint true, else a write.
READS = {"echo", "get_annotated_message", "get_env", "get_resource_links", "get_resource_reference",
         "get_structured_content", "get_sum", "get_tiny_image", "trigger_long_running_operation"}
WRITES = {"gzip_file_as_resource", "toggle_simulated_logging", "toggle_subscriber_updates",
          "trigger_elicitation_request", "trigger_url_elicitation"}
# In the process's environment, never given to the upstream: a stdio server gets only its own `env`.
SECRET_VAR = "TETHER_EVERYTHING_TEST_SECRET"


def _config(tmp: Path, sources: list[dict], **extra) -> Config:
    return Config.from_dict({"sources": sources, "store": {"url": f"sqlite:///{tmp}/t.db"}, **extra})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rt(tmp_path_factory):
    os.environ[SECRET_VAR] = "hunter2"
    ev = {"type": "mcp", "namespace": "ev", "command": stdio_command(),
          # The gzip tool's own limits, so its refusals need no network.
          "env": {"GZIP_MAX_FETCH_SIZE": "64", "GZIP_ALLOWED_DOMAINS": "allowed.example"},
          "call_timeout": 1.5, "max_call_seconds": 3}
    bad = {"type": "mcp", "namespace": "bad", "command": hostile_command(), "call_timeout": 10}
    pushy = {"type": "mcp", "namespace": "pushy", "command": hostile_command(), "call_timeout": 1}
    try:
        # Writes ask, except the two that only put questions to the user (so a client's form shows them alone).
        policy = {"rules": [{"match": "ev.trigger_*elicitation*", "action": "allow"}]}
        async with open_runtime(_config(tmp_path_factory.mktemp("everything"), [ev, bad, pushy], policy=policy)) as runtime:
            yield runtime
    finally:
        del os.environ[SECRET_VAR]


async def run(runtime, program: str, **options):
    """``program`` as a model writes it: it imports the namespace of tools it calls."""
    return await runtime.execute("import tools\n" + program, **options)


def approve(pending):
    return "approve"


async def test_search_and_describe_show_the_servers_tools_with_reads_and_writes_from_its_annotations(rt):
    r = await run(rt, """
found = await search("sum of two numbers")
listed = await search("", namespace="ev", limit=50)
shown = await describe([t["address"] for t in listed["results"]])
full = await describe([t["address"] for t in listed["results"]], detail="full")
{"top": found["results"][0]["address"], "tools": {d["address"]: d for d in shown},
 "schemas": {d["address"]: d["input_schema"] for d in full}, "sources": await sources()}
""")
    assert r.status == "completed", r.error
    out = r.result
    assert out["top"] == "ev.get_sum"
    tools = out["tools"]
    assert set(tools) == {f"ev.{n}" for n in READS | WRITES}
    for name in READS | WRITES:
        assert tools[f"ev.{name}"]["annotations"]["read_only"] is (name in READS), name
    # Sampling and roots are not offered, so the server keeps its tools that need them; the task-only tool
    # is listed and left out with its reason (statuses below).
    assert not any("sampling" in a or "roots" in a for a in tools)
    structured = tools["ev.get_structured_content"]
    assert structured["signature"] == ('async def tools.ev.get_structured_content(location: Literal["New York", '
                                       '"Chicago", "Los Angeles"]) -> GetStructuredContentResult')
    assert "temperature: float" in structured["types"] and "conditions: str" in structured["types"]
    assert tools["ev.get_resource_links"]["signature"].endswith("(count: float = 3) -> Any")
    gz = tools["ev.gzip_file_as_resource"]
    assert gz["annotations"] == {"read_only": False, "destructive": False, "idempotent": True, "open_world": True}
    (ev,) = [s for s in out["sources"] if s["namespace"] == "ev"]
    assert ev["tools"] == len(READS | WRITES) and ev["summary"].startswith("Everything Reference Server")
    (status,) = [s for s in rt.engine.sources.statuses() if s.namespace == "ev"]
    # Each input schema as the server listed it, byte for byte ($schema, enums, defaults, formats).
    wire = {f"ev.{e['name'].replace('-', '_')}": e["inputSchema"] for e in status.impl.listing}
    assert out["schemas"] == {a: wire[a] for a in out["schemas"]}
    assert [p["operation"] for p in status.problems] == ["simulate-research-query"]
    assert "task augmentation" in status.problems[0]["problem"]


async def test_every_tool_answers_a_program_with_values_it_can_use(rt):
    r = await run(rt, """
import asyncio
ev = tools.ev
got = {}
got["echo"] = await ev.echo(message="hi")
got["get_sum"] = await ev.get_sum(a=2, b=3.5)
weather = await ev.get_structured_content(location="Chicago")
got["get_structured_content"] = weather
got["warmer"] = weather["temperature"] + 1
got["get_tiny_image"] = await ev.get_tiny_image()
got["get_annotated_message"] = await ev.get_annotated_message(messageType="success", includeImage=True)
got["get_resource_links"] = await ev.get_resource_links(count=2)
got["text_ref"], got["blob_ref"] = await asyncio.gather(
    ev.get_resource_reference(resourceType="Text", resourceId=1),
    ev.get_resource_reference(resourceType="Blob", resourceId=2))
got["get_env"] = await ev.get_env()
got["gzip_file_as_resource"] = await ev.gzip_file_as_resource(name="a.gz", data="data:text/plain;base64,aGVsbG8=",
                                             outputType="resource")
got["gzip_link"] = await ev.gzip_file_as_resource(name="b.gz", data="data:text/plain;base64,aGVsbG8=")
got["toggle_simulated_logging"] = await ev.toggle_simulated_logging()
got["toggle_subscriber_updates"] = await ev.toggle_subscriber_updates()
got["trigger_long_running_operation"] = await ev.trigger_long_running_operation(duration=0.4, steps=2)
got["trigger_elicitation_request"] = await ev.trigger_elicitation_request()
got["trigger_url_elicitation"] = await ev.trigger_url_elicitation(url="https://example.com/consent")
# Twice, so the simulated logging the first call started is stopped again.
await ev.toggle_simulated_logging()
await ev.toggle_subscriber_updates()
got
""", on_approval=approve)
    assert r.status == "completed", r.error
    got = r.result
    called = {k for k in got if k in READS | WRITES} | {"get_resource_reference"}
    assert called == READS | WRITES
    assert got["echo"] == "Echo: hi"  # text stays text
    assert got["get_sum"] == "The sum of 2 and 3.5 is 5.5."
    # structuredContent arrives as data the program computes with.
    assert set(got["get_structured_content"]) == {"temperature", "conditions", "humidity"}
    assert got["warmer"] == got["get_structured_content"]["temperature"] + 1
    # Several content blocks are a list; an image is {type, mime_type, data} with base64 data.
    caption, image, note = got["get_tiny_image"]
    assert isinstance(caption, str) and isinstance(note, str)
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert base64.b64decode(image["data"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert [b if isinstance(b, str) else b["type"] for b in got["get_annotated_message"]] == [
        "Operation completed successfully", "image"]
    intro, *links = got["get_resource_links"]
    assert len(links) == 2 and all(link["type"] == "resource_link" and link["uri"].startswith("demo://")
                                   and link["name"] for link in links)
    text = next(b for b in got["text_ref"] if isinstance(b, dict))
    assert text["type"] == "resource" and text["text"].startswith("Resource 1: This is a plaintext resource")
    blob = next(b for b in got["blob_ref"] if isinstance(b, dict))
    assert base64.b64decode(blob["blob"]).startswith(b"Resource 2: This is a base64 blob")
    assert gzip.decompress(base64.b64decode(got["gzip_file_as_resource"]["blob"])) == b"hello"
    assert got["gzip_file_as_resource"]["mime_type"] == "application/gzip"
    assert got["gzip_link"]["type"] == "resource_link" and got["gzip_link"]["uri"].endswith("/b.gz")
    assert got["trigger_long_running_operation"].startswith("Long running operation completed")
    # No one to ask in this run: the upstream's questions are declined and its tools carry on (D-13).
    assert got["trigger_elicitation_request"][0].startswith("❌ User declined")
    assert got["trigger_url_elicitation"][0].startswith("❌ User declined to open the URL")
    # The upstream's environment is its own `env` and a safe default, never tether's.
    env = json.loads(got["get_env"])
    assert env["GZIP_ALLOWED_DOMAINS"] == "allowed.example" and SECRET_VAR not in env


async def test_a_read_only_tool_runs_freely_and_a_write_pauses_until_a_person_approves(rt):
    r = await run(rt, """
said = await tools.ev.echo(message="before")
toggled = await tools.ev.toggle_subscriber_updates()
stopped = await tools.ev.toggle_subscriber_updates()
[said, toggled, stopped]
""")
    assert r.status == "paused", r.error
    assert r.pending["address"] == "ev.toggle_subscriber_updates" and r.pending["seq"] == 2
    r = await rt.resume(r.run_id, "approve", seq=2)
    assert r.status == "paused" and r.pending["seq"] == 3
    r = await rt.resume(r.run_id, "approve", seq=3)
    assert r.status == "completed", r.error
    said, toggled, stopped = r.result
    assert said == "Echo: before" and toggled.startswith("Started") and stopped.startswith("Stopped")


async def test_progress_reaches_the_caller_and_a_flood_of_it_breaks_nothing(rt):
    seen: list[tuple[float, str]] = []
    r = await run(rt, "await tools.ev.trigger_long_running_operation(duration=1, steps=4)",
                         on_progress=lambda done, text: seen.append((done, text)))
    assert r.status == "completed", r.error
    assert r.result == "Long running operation completed. Duration: 1 seconds, Steps: 4."
    assert len(seen) >= 4 and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert all(text == "ev.trigger_long_running_operation" for _, text in seen)
    # 2,000 notifications in one second: the call still ends with the server's answer, and a cell's timeline
    # gets a burst and then ten a second of them, not 2,000 rows (D-89).
    obs = await rt.start_cell("import tools\nawait tools.ev.trigger_long_running_operation(duration=1, steps=2000)",
                              yield_after_ms=30_000)
    while obs["status"] == "running":
        obs = await rt.wait_cell(obs["cell_id"], after=obs["cursor"], timeout_ms=30_000)
    assert obs["status"] == "completed" and obs["result"].endswith("Steps: 2000."), obs
    stored = [e for e in rt.store.get_events(obs["cell_id"], limit=100_000) if e.type == "progress"]
    assert 10 <= len(stored) <= 60, len(stored)


async def test_a_long_running_call_ends_at_its_deadline_with_call_timeout_and_the_source_goes_on(rt):
    # Progress every 0.5 s keeps it past the 1.5 s no-progress limit, up to max_call_seconds (3).
    started = time.monotonic()
    r = await run(rt, "await tools.ev.trigger_long_running_operation(duration=20, steps=40)")
    assert r.status == "failed" and r.error["code"] == "call_timeout", r.error
    assert "no answer within 3 s; the server may still be working on it" in r.error["message"]
    assert time.monotonic() - started < 15
    # Without progress, the no-progress limit ends it.
    r = await run(rt, "await tools.ev.trigger_long_running_operation(duration=20, steps=1)")
    assert r.error["code"] == "call_timeout" and "no answer or progress for 1.5 s" in r.error["message"], r.error
    r = await run(rt, "await tools.ev.echo(message='still here')")
    assert r.result == "Echo: still here"


async def test_d13_an_upstream_question_mid_call_is_asked_inline_and_never_parked(rt):
    asked = []

    async def asker(question):
        asked.append(question)
        if question["mode"] == "url":
            return {"action": "accept"}
        return {"action": "accept", "content": {"name": "Ada", "check": True, "integer": 7}}

    r = await run(rt, """
form = await tools.ev.trigger_elicitation_request()
link = await tools.ev.trigger_url_elicitation(url="https://example.com/consent", message="Consent, please")
[form, link]
""", on_approval=approve, on_question=asker)
    assert r.status == "completed", r.error
    form, link = r.result
    assert "- Name: Ada" in form[1] and "- Agreed to terms: true" in form[1] and "- Favorite Integer: 7" in form[1]
    assert link[0].startswith("✅ User completed the URL elicitation flow")
    first, second = asked
    assert first["address"] == "ev.trigger_elicitation_request" and first["run_id"] == r.run_id
    assert first["mode"] == "form" and first["schema"]["required"] == ["name"]
    assert len(first["schema"]["properties"]) == 13  # enums, titled enums, multi-selects: passed as they came
    assert second["mode"] == "url" and second["url"] == "https://example.com/consent"
    assert second["message"] == "Consent, please"
    events = [e.type for e in rt.store.get_events(r.run_id, limit=1000)]
    assert events.count("question") == 2 and "paused" not in events


async def test_d13_over_mcp_the_servers_whole_form_reaches_tethers_client_and_its_url_question_does_not(rt):
    shown = []

    async def callback(context, params):
        shown.append(params)
        return ElicitResult(action="accept", content={"name": "Grace", "untitledMultipleSelectEnum": ["Piano"]})

    program = ("import tools\nform = await tools.ev.trigger_elicitation_request()\n"
               "link = await tools.ev.trigger_url_elicitation(url='https://example.com/consent')\n[form, link]")
    async with Client(TetherServer(rt).mcp, mode="legacy", elicitation_callback=callback) as client:
        r = await client.call_tool("execute", {"code": program})
    assert r.structured_content["status"] == "completed", r.structured_content
    form, link = r.structured_content["result"]
    assert "- Name: Grace" in form[1] and '"Piano"' in form[2]
    (params,) = shown  # the URL question is declined, never shown: this client gets only tether's own links
    assert params.message == "ev.trigger_elicitation_request asks: Please provide inputs for the following fields:"
    props = params.requested_schema["properties"]
    assert props["titledSingleSelectEnum"]["oneOf"][0] == {"const": "hero-1", "title": "Superman"}
    assert props["legacyTitledEnum"]["enumNames"][0] == "Cats" and props["untitledMultipleSelectEnum"]["maxItems"] == 3
    assert link[0].startswith("❌ User declined to open the URL")


async def test_d89_a_person_answering_an_upstream_question_is_not_the_calls_time(rt):
    # The source's no-progress limit is 1.5 s, its ceiling 3 s and the boundary's 4 s: the person takes longer
    # than all three, and the write neither times out nor becomes write_outcome_unknown.
    async def slow_person(question):
        await asyncio.sleep(4.5)
        return {"action": "accept", "content": {"name": "Slow"}}

    # A read in flight beside it: over stdio (the 2025 era) the question cannot name its call, so both wait.
    r = await run(rt, """import asyncio
form, done = await asyncio.gather(tools.ev.trigger_elicitation_request(),
                                  tools.ev.trigger_long_running_operation(duration=1, steps=2))
[form, done]""", on_question=slow_person)
    assert r.status == "completed", r.error
    form, done = r.result
    assert "- Name: Slow" in form[1] and done.endswith("Steps: 2.")


async def test_d89_a_question_nobody_answers_is_cancelled_and_the_call_ends(rt, monkeypatch):
    monkeypatch.setattr(mcp_source, "QUESTION_SECONDS", 0.5)
    gone = asyncio.Event()

    async def away(question):
        try:
            await asyncio.sleep(3600)
        finally:
            gone.set()

    r = await run(rt, "await tools.ev.trigger_elicitation_request()", on_approval=approve, on_question=away)
    assert r.status == "completed", r.error
    assert r.result[0].startswith("⚠️ User cancelled the elicitation dialog")
    assert gone.is_set()  # the question was withdrawn from the person, not left waiting


async def test_d89_a_call_asking_again_and_again_holds_its_deadlines_only_so_long(rt, monkeypatch):
    monkeypatch.setattr(mcp_source, "QUESTION_SECONDS", 0.6)
    asked = []

    async def patient(question):  # a person (or a program) who answers every question
        asked.append(question)
        await asyncio.sleep(0.25)
        return {"action": "accept", "content": {"ok": True}}

    # Without one budget for the call's questions this never ends: time between questions is all that counts.
    r = await asyncio.wait_for(run(rt, "await tools.pushy.ask_forever()", on_question=patient), 30)
    assert r.status == "failed" and r.error["code"] == "call_timeout", r.error
    assert 2 <= len(asked) <= 4  # 0.6 s of answers, then the server's questions are cancelled unasked


async def test_d91_a_server_asking_after_its_question_budget_ends_its_call_at_once_by_name(rt, monkeypatch):
    monkeypatch.setattr(mcp_source, "QUESTION_SECONDS", 0.3)
    asked = []

    async def patient(question):
        asked.append(question)
        await asyncio.sleep(0.2)
        return {"action": "accept", "content": {"ok": True}}

    # `bad` allows 10 s without progress: told "cancel" after the budget, ask_forever asks again at once, and
    # without an end the call would spin thousands of round trips a second for those 10 s.
    r = await asyncio.wait_for(run(rt, "await tools.bad.ask_forever()", on_question=patient), 5)
    assert r.status == "failed" and r.error["code"] == "call_timeout", r.error
    assert "asked the user again after the call's 0.3 s for questions were spent" in r.error["message"]
    assert 1 <= len(asked) <= 3
    # The source goes on: the next call on the same connection is served.
    r = await run(rt, "await tools.bad.flood(megabytes=0.001, blocks=1)")
    assert r.status == "completed" and r.result.startswith("xxx"), r.error


async def test_d91_a_server_asking_again_after_every_refusal_ends_its_call_after_so_many_questions(rt, monkeypatch):
    monkeypatch.setattr(mcp_source, "QUESTIONS_PER_CALL", 20)
    asked = []

    async def refuses(question):  # a program's handler (or a client) that declines at once: nothing is held
        asked.append(question)
        return {"action": "decline"}

    # Without a count the loop spins (thousands of round trips a second) until `bad`'s 10 s no-progress limit.
    r = await asyncio.wait_for(run(rt, "await tools.bad.ask_forever()", on_question=refuses), 5)
    assert r.status == "failed" and r.error["code"] == "call_timeout", r.error
    assert "the server asked more than 20 questions in one call, so the call was ended" in r.error["message"]
    assert len(asked) == 20
    r = await asyncio.wait_for(run(rt, "await tools.bad.ask_forever()"), 5)  # nobody to ask: declined unasked
    assert r.status == "failed" and "more than 20 questions" in r.error["message"], r.error


async def test_d91_questions_kept_open_one_over_another_hold_a_calls_deadlines_only_for_its_budget(rt, monkeypatch):
    monkeypatch.setattr(mcp_source, "QUESTION_SECONDS", 0.5)
    asked = []

    async def away(question):  # nobody answers
        asked.append(question)
        await asyncio.sleep(3600)

    # A new question every 0.15 s, each before the last is withdrawn: the call's deadlines were held without a
    # break, so the time held was never counted and each question got the whole budget again — for ever.
    r = await asyncio.wait_for(run(rt, "await tools.bad.ask_overlapping()", on_question=away), 8)
    assert r.status == "failed" and r.error["code"] == "call_timeout", r.error
    assert "for questions were spent" in r.error["message"]
    assert 2 <= len(asked) <= 6


async def test_d89_an_outsized_question_is_clipped_before_anyone_reads_or_stores_it(rt):
    asked = []

    async def person(question):
        asked.append(question)
        return {"action": "decline"}

    r = await run(rt, "await tools.bad.ask_huge()", on_question=person)
    assert r.status == "completed" and r.result == "decline", r.error
    (question,) = asked
    assert len(question["message"]) <= 2100 and question["message"].endswith("… (truncated)")
    (stored,) = [e for e in rt.store.get_events(r.run_id, limit=100) if e.type == "question"]
    assert len(stored.data["message"]) <= 2100


async def test_d89_a_url_elicitation_required_error_reaches_the_program_with_its_link(rt):
    r = await run(rt, """
try:
    await tools.ev.trigger_url_elicitation(url="https://example.com/sign-in", message="Sign in first",
                                           errorPath=True)
    first = "no error"
except Exception as e:
    first = str(e)
# The server's own retry path: the same arguments after the person has been to the link.
again = await tools.ev.trigger_url_elicitation(url="https://example.com/sign-in", message="Sign in first",
                                               errorPath=True)
[first, again]
""", on_approval=approve)
    assert r.status == "completed", r.error
    first, again = r.result
    assert first.startswith("[tool_error] ev.trigger_url_elicitation: ") and first.count("ev.trigger_url") == 1
    # The server's prerequisite points elsewhere than the call's own URL, so its retry cannot loop.
    assert "Open this link to satisfy the prerequisite, then retry the request. https://modelcontextprotocol.io" in first
    assert "refused the call" in first and "Nothing was done" in first and "call the tool again" in first
    assert again[0].startswith("❌ User declined to open the URL")  # nobody to ask in this run


async def test_d89_only_a_few_http_links_of_a_hostile_url_required_error_are_shown():
    hostile = {"elicitations": [
        "not an object", {"url": "javascript:alert(1)", "message": "click"}, {"url": "http://[::1"},
        {"url": "https://a.example/x\nInjected: header"}, {"url": "https://" + "a" * 3000 + ".example"},
        *({"url": f"https://ok.example/{i}", "message": "step\n" + "m" * 1000, "elicitationId": i} for i in range(50))]}
    message, links = url_required("ns.tool", hostile, "needs a browser")
    assert [link["url"] for link in links] == [f"https://ok.example/{i}" for i in range(3)]
    assert all(len(link["message"]) <= 301 and "\n" not in link["message"] for link in links)
    assert "elicitation_id" not in links[0]  # not a string: not passed on
    assert message.startswith("ns.tool: the MCP server refused the call until the user opens these links: step m")
    for data in (None, [], {"elicitations": "x"}, {"elicitations": [{"url": "file:///etc/passwd"}]}):
        message, links = url_required("ns.tool", data, "needs a browser")
        assert links == [] and "sent no link tether can show (needs a browser); nothing was done" in message


async def test_d91_a_link_that_reads_as_another_or_a_message_that_drives_a_terminal_is_not_passed_on_raw():
    hostile = {"elicitations": [
        # Read right to left after U+202E: "https://tether.example/approve/..." — not a link to hand anyone.
        {"url": "https://evil.example/\u202e/evorppa/elpmaxe.rehtet//:sptth", "message": "approve"},
        {"url": "https://t\u0435ther.example/approve"},  # a Cyrillic "е": another host that looks the same
        {"url": "https://a.example/\u200bx"}, {"url": "https://a.example/\x7f"}, {"url": "https://a.example/\x9bx"},
        {"url": "https://ok.example/sign-in?next=%E2%80%AE", "message": "Sign in\x1b]52;c;cGF5bG9hZA==\x07 \u202edone",
         "elicitationId": "e\x1b[2J"}]}
    message, links = url_required("ns.tool", hostile, "needs a browser")
    (link,) = links
    assert link["url"] == "https://ok.example/sign-in?next=%E2%80%AE"  # percent-encoded: shown as written
    assert link["message"] == "Sign in\\u001b]52;c;cGF5bG9hZA==\\u0007 \\u202edone"
    assert link["elicitation_id"] == "e\\u001b[2J"
    assert "\x1b" not in message and "\u202e" not in message and "\x07" not in message
    message, links = url_required("ns.tool", {}, "go to \x1b[8mhidden\x1b[0m")
    assert links == [] and "\x1b" not in message and "\\u001b[8mhidden" in message


async def test_d91_an_upstream_question_with_a_hostile_link_or_terminal_escapes_never_reaches_a_person_raw(rt):
    asked = []

    async def person(question):
        asked.append(question)
        return {"action": "accept", "content": {"ok": True}} if question["mode"] == "form" else {"action": "accept"}

    r = await run(rt, """[await tools.bad.ask_with(message="Open this", url="javascript:alert(document.cookie)"),
 await tools.bad.ask_with(message="Open this", url="https://a.example/\u202egnp.exe"),
 await tools.bad.ask_with(message="Sure?\x1b]52;c;cGF5bG9hZA==\x07\x1b[8m hidden")]""", on_question=person)
    assert r.status == "completed", r.error
    assert r.result == ["decline", "decline", "accept"]  # the two links declined without asking anyone
    (question,) = asked
    assert question["message"] == "Sure?\\u001b]52;c;cGF5bG9hZA==\\u0007\\u001b[8m hidden"
    (stored,) = [e for e in rt.store.get_events(r.run_id, limit=100) if e.type == "question"]
    assert stored.data["message"] == question["message"]


async def test_d89_the_progress_gate_passes_a_burst_then_ten_a_second():
    now = [0.0]
    gate = ProgressGate(lambda: now[0])
    assert sum(gate.allow() for _ in range(1000)) == 10
    now[0] = 1.0
    assert sum(gate.allow() for _ in range(1000)) == 10
    for _ in range(50):  # a server stepping every 0.1 s loses nothing
        now[0] += 0.1
        assert gate.allow()


async def test_sampling_and_roots_requests_are_refused_by_name_and_never_hang(rt):
    # tether offers neither (the reference server therefore lists no tool that needs them); an upstream that
    # asks anyway is answered at once with an error, and its tool fails with that message.
    started = time.monotonic()
    r = await run(rt, """
out = []
for call in (tools.bad.sample, tools.bad.roots):
    try:
        out.append(await call())
    except Exception as e:
        out.append(str(e))
out
""")
    assert r.status == "completed", r.error
    assert r.result == ["[tool_error] bad.sample: MCP error -32600: Sampling not supported",
                        "[tool_error] bad.roots: MCP error -32600: List roots not supported"]
    assert time.monotonic() - started < 8  # well inside the source's 10 s call timeout


async def test_upstream_errors_reach_the_program_as_stable_codes(rt):
    r = await run(rt, """
out = []
for data in ("https://elsewhere.example/file.txt", "data:text/plain;base64," + "QUFB" * 40):
    try:
        await tools.ev.gzip_file_as_resource(name="x.gz", data=data)
    except Exception as e:
        out.append(str(e))
out
""", on_approval=approve)
    assert r.status == "completed", r.error
    domain, size = r.result
    assert domain.startswith("[tool_error] ev.gzip_file_as_resource: ") and "elsewhere.example" in domain
    assert size.startswith("[tool_error] ev.gzip_file_as_resource: ") and "64" in size
    # Arguments the schema refuses never reach the server.
    r = await run(rt, "city = 'Pa' + 'ris'\nawait tools.ev.get_structured_content(location=city)")
    assert r.error["code"] == "invalid_arguments" and "Paris" in r.error["message"], r.error
    r = await run(rt, "await tools.ev.trigger_sampling_request(prompt='hi')")
    assert r.error["code"] == "unknown_tool", r.error


async def test_huge_answers_are_refused_by_name_and_the_host_goes_on(rt):
    for megabytes, blocks in ((20, 1), (2, 20_000)):
        r = await run(rt, f"await tools.bad.flood(megabytes={megabytes}, blocks={blocks})")
        assert r.status == "failed" and r.error["code"] == "result_too_large", r.error
        assert "it was not kept or given to the program" in r.error["message"]
    r = await run(rt, "len(await tools.bad.flood(megabytes=0.01, blocks=2))")
    assert r.result == 2


async def test_the_full_check_types_results_from_the_servers_output_schema(rt):
    ok = await run(rt, "w = await tools.ev.get_structured_content(location='Chicago')\nw['humidity'] / 100",
                          check="full")
    assert ok.status == "completed", ok.error
    bad = await run(rt, "w = await tools.ev.get_structured_content(location='Chicago')\nw['wind']",
                           check="full")
    assert bad.status == "failed" and bad.error["code"] == "type_check_failed"
    assert 'Unknown key "wind" for TypedDict `GetStructuredContentResult`' in bad.error["details"]["diagnostics"]


async def test_over_streamable_http_the_same_server_answers_the_same(tmp_path):
    proc, url = start_http(tmp_path / "http.log")
    try:
        source = {"type": "mcp", "namespace": "evh", "url": url}
        async with open_runtime(_config(tmp_path, [source], policy={"writes": "allow"})) as rt:
            seen = []

            async def asker(question):
                return {"action": "accept", "content": {"name": "Grace"}}

            r = await run(rt, """
weather = await tools.evh.get_structured_content(location="New York")
done = await tools.evh.trigger_long_running_operation(duration=0.6, steps=3)
form = await tools.evh.trigger_elicitation_request()
[weather["conditions"], done, form[1]]
""", on_progress=lambda d, text: seen.append(d), on_question=asker)
            assert r.status == "completed", r.error
            conditions, done, form = r.result
            assert isinstance(conditions, str) and done.endswith("Steps: 3.") and "- Name: Grace" in form
            assert len(seen) >= 3
    finally:
        stop(proc)
