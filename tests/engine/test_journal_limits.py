"""A bounded journal (P-22): no program or tool can fill the store through the journal."""

from __future__ import annotations

from typing import Any

from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store
from tether._tools.model import Annotations, Tool

MB = 1_000_000
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SIZE = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class Tools:
    def __init__(self) -> None:
        self.received: list[tuple[str, int]] = []

    def tools(self) -> list[Tool]:
        async def echo(args: dict) -> Any:
            self.received.append(("echo", len(args["text"])))
            return args["text"]

        async def big(args: dict) -> Any:
            self.received.append(("big", args["n"]))
            return "y" * args["n"]

        async def post(args: dict) -> Any:
            self.received.append(("post", len(args["text"])))
            return {"posted": len(args["text"])}

        async def post_big(args: dict) -> Any:
            self.received.append(("post_big", args["n"]))
            return "z" * args["n"]

        return [
            Tool("t", "echo", "Echo text.", TEXT, echo, annotations=Annotations(read_only=True)),
            Tool("t", "big", "A result of n bytes.", SIZE, big, annotations=Annotations(read_only=True)),
            Tool("t", "post", "Post text.", TEXT, post),
            Tool("t", "post_big", "A write answering n bytes.", SIZE, post_big),
        ]


def runtime(store_url: str, tools: Tools, **limits: Any) -> Runtime:
    return Runtime(store=open_store(store_url), tools=tools.tools(), type_check=False,
                   policy=Policy(writes="allow"), limits=Limits(**limits))


async def test_p22_echoing_a_4mb_string_45_times_does_not_fill_the_store(store_url):
    # The reported attack: four lines that wrote 360 MB to tether.db in 3 s.
    tools = Tools()
    program = """
import tools
s = "x" * 4_000_000
for i in range(45):
    await tools.t.echo(text=s)
"""
    async with runtime(store_url, tools) as rt:
        r = await rt.execute(program)
        assert r.status == "failed" and r.error["code"] == "arguments_too_large", r.error
        assert "was not sent" in r.error["message"]
        assert tools.received == []
        assert rt.store.store_size_bytes() < 2 * MB
        [entry] = rt.store.get_calls(r.run_id)
        assert entry.state == "failed" and entry.args == {"_omitted_bytes": entry.args["_omitted_bytes"]}
        assert entry.args["_omitted_bytes"] > 4 * MB


async def test_p22_a_program_catching_the_error_still_writes_next_to_nothing(store_url):
    tools = Tools()
    program = """
import tools
s = "x" * 4_000_000
refused = 0
for i in range(45):
    try:
        await tools.t.echo(text=s)
    except ValueError as e:
        refused += 1
refused
"""
    async with runtime(store_url, tools) as rt:
        r = await rt.execute(program)
        assert r.status == "completed" and r.result == 45, r.error
        assert rt.store.store_size_bytes() < 2 * MB
        assert rt.store.journal_bytes(r.run_id) < 45 * 100


async def test_p22_a_read_result_over_the_cap_fails_its_call_before_the_sandbox_or_store(store_url):
    tools = Tools()
    program = """
import tools
try:
    await tools.t.big(n=2_000_000)
    out = "got it"
except ValueError as e:
    out = str(e)
small = await tools.t.big(n=10)
[out, small]
"""
    async with runtime(store_url, tools) as rt:
        r = await rt.execute(program)
        assert r.status == "completed", r.error
        message, small = r.result
        assert message.startswith("[result_too_large]") and "t.big" in message and "1048576-byte" in message
        assert small == "y" * 10
        first = rt.store.get_call(r.run_id, 1)
        assert first.state == "failed" and first.outcome is None
        assert rt.store.journal_bytes(r.run_id) < 1000


async def test_p22_a_result_larger_than_the_sandbox_can_hold_is_refused_at_the_boundary(store_url):
    # journal_value_bytes raised past the sandbox heap: the heap is the cap.
    tools = Tools()
    async with runtime(store_url, tools, memory_bytes=4 * MB, journal_value_bytes=64 * MB) as rt:
        r = await rt.execute("import tools\nawait tools.t.big(n=8_000_000)")
        assert r.status == "failed" and r.error["code"] == "result_too_large", r.error
        assert f"{4 * MB}-byte limit" in r.error["message"]
        assert rt.store.journal_bytes(r.run_id) < 1000
        assert rt.store.store_size_bytes() < 2 * MB


async def test_p22_write_arguments_over_the_cap_fail_before_sending(store_url):
    tools = Tools()
    program = """
import tools
try:
    await tools.t.post(text="p" * 1_500_000)
except ValueError as e:
    out = str(e)
out
"""
    async with runtime(store_url, tools) as rt:
        r = await rt.execute(program)
        assert r.status == "completed", r.error
        assert r.result.startswith("[arguments_too_large]") and "it was not sent" in r.result
        assert tools.received == []
        assert rt.store.get_call(r.run_id, 1).state == "failed"


async def test_p22_a_write_whose_result_is_too_large_is_sent_once_and_says_so(store_url):
    tools = Tools()
    program = """
import tools
try:
    await tools.t.post_big(n=2_000_000)
except ValueError as e:
    out = str(e)
out
"""
    async with runtime(store_url, tools) as rt:
        r = await rt.execute(program)
        assert r.status == "completed", r.error
        assert r.result.startswith("[result_too_large]") and "it was sent and happened" in r.result
        assert tools.received == [("post_big", 2_000_000)]
        entry = rt.store.get_call(r.run_id, 1)
        assert entry.state == "sent" and entry.outcome is None
        assert entry.error["message"] == r.result


async def test_p22_the_run_total_ends_the_run_with_journal_limit(store_url):
    tools = Tools()
    program = """
import tools
s = "x" * 400_000
n = 0
for i in range(20):
    try:
        await tools.t.echo(text=s)
        n += 1
    except ValueError:
        pass
n
"""
    async with runtime(store_url, tools, journal_bytes=2 * MB) as rt:
        r = await rt.execute(program)
        assert r.status == "failed" and r.error["code"] == "journal_limit", r.error
        assert "2000000-byte total" in r.error["message"]
        assert rt.store.journal_bytes(r.run_id) <= 2 * MB
        # Two calls fit (0.8 MB each); the third's arguments would not, so it was not sent.
        assert len(tools.received) == 2


async def test_p22_the_total_counts_what_earlier_attempts_journaled(store_url):
    tools = Tools()
    program = """
import tools
s = "x" * 500_000
await tools.t.echo(text=s)
await tools.t.post(text="once")
await tools.t.echo(text=s)
"""
    kw = dict(store=open_store(store_url), tools=tools.tools(), type_check=False, policy=Policy(writes="ask"),
              limits=Limits(journal_bytes=int(1.5 * MB)))
    async with Runtime(**kw) as rt:
        paused = await rt.execute(program)
        assert paused.status == "paused"
    kw["store"] = open_store(store_url)
    async with Runtime(**kw) as rt2:
        r = await rt2.resume(paused.run_id, "approve")
        assert r.status == "failed" and r.error["code"] == "journal_limit", r.error
        assert [name for name, _ in tools.received] == ["echo", "post"]


async def test_p22_a_result_that_would_pass_the_total_ends_the_run_and_is_not_kept(store_url):
    tools = Tools()
    program = """
import tools
for i in range(5):
    await tools.t.big(n=900_000)
"""
    async with runtime(store_url, tools, journal_bytes=2 * MB) as rt:
        r = await rt.execute(program)
        assert r.status == "failed" and r.error["code"] == "journal_limit", r.error
        assert len(tools.received) == 3  # the third was read, then neither kept nor handed over
        assert rt.store.journal_bytes(r.run_id) <= 2 * MB


def test_p22_the_limits_are_config_keys(tmp_path):
    from tether._config import load_config

    path = tmp_path / "tether.toml"
    path.write_text("[limits]\njournal_value_bytes = 4096\njournal_bytes = 65536\n")
    limits = load_config(path).limits  # the engine's own Limits, parsed
    assert (limits.journal_value_bytes, limits.journal_bytes) == (4096, 65536)
    assert (Limits().journal_value_bytes, Limits().journal_bytes) == (1024 * 1024, 64 * 1024 * 1024)
