"""The core loop: programs run in the sandbox and call tools through the boundary.

Each bad input ends with its named error and the runtime still serves the
next program (a live host after).
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers import Recorder
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether.errors import CodeTooLarge


@pytest.fixture
async def rec():
    return Recorder()


@pytest.fixture
async def rt(rec):
    async with Runtime(tools=rec.tools(), type_check=False, policy=Policy(writes="allow"),
                       limits=Limits(run_seconds=2, call_timeout_seconds=1)) as runtime:
        yield runtime


async def assert_alive(rt: Runtime) -> None:
    r = await rt.execute("import tools\n(await tools.helpdesk.get_ticket(id=7))['title']")
    assert r.status == "completed", r.error
    assert r.result == "ticket 7"


async def test_a_program_calls_tools_and_returns_its_last_expression(rt):
    code = """
import tools
t = await tools.helpdesk.get_ticket(id=3)
print("fetched", t["id"])
{"title": t["title"], "n": len(t)}
"""
    r = await rt.execute(code)
    assert r.status == "completed"
    assert r.result == {"title": "ticket 3", "n": 3}
    assert r.logs == ["fetched 3"]
    assert r.calls == 1
    assert r.diagnostics["calls"] == 1 and r.diagnostics["per_call"][0]["address"] == "helpdesk.get_ticket"


async def test_gathered_calls_overlap(rt, rec):
    rec.delay = 0.05
    code = """
import asyncio
import tools
a, b, c = await asyncio.gather(tools.helpdesk.get_ticket(id=1), tools.helpdesk.get_ticket(id=2),
                               tools.helpdesk.get_ticket(id=3))
[a["id"], b["id"], c["id"]]
"""
    r = await rt.execute(code)
    assert r.result == [1, 2, 3]
    kinds = [e[0] for e in rec.events]
    # All three started before any finished: they ran concurrently.
    assert kinds == ["start", "start", "start", "end", "end", "end"]


async def test_code_over_the_cap_is_rejected_without_running(rt):
    with pytest.raises(CodeTooLarge) as info:
        await rt.execute("x = 1\n" * 20_000)
    assert info.value.code == "code_too_large"
    # A huge string is measured without encoding it whole.
    with pytest.raises(CodeTooLarge):
        await rt.execute("é" * 70_000)
    await assert_alive(rt)


async def test_syntax_error_names_line_and_column(rt):
    r = await rt.execute("x = 1\ndef f(:\n    pass\n")
    assert r.status == "failed"
    assert r.error["code"] == "syntax_error"
    assert r.error["details"]["line"] == 2 and r.error["details"]["column"] == 7
    await assert_alive(rt)


async def test_unknown_tool_is_named_with_suggestions(rt):
    r = await rt.execute("import tools\nawait tools.helpdesk.get_tiket(id=1)")
    assert r.error["code"] == "unknown_tool"
    assert "helpdesk.get_ticket" in r.error["next_action"]
    await assert_alive(rt)


async def test_invalid_arguments_raise_in_the_program_and_name_the_field(rt, rec):
    r = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(idd=1)")
    assert r.error["code"] == "invalid_arguments"
    assert "idd" in r.error["message"]
    caught = await rt.execute("""
import tools
try:
    await tools.helpdesk.get_ticket(id="seven")
    out = "no error"
except TypeError as e:
    out = str(e)
out
""")
    assert caught.status == "completed"
    assert caught.result.startswith("[invalid_arguments]")
    r = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(1, 2)")
    assert r.error["code"] == "invalid_arguments"
    assert "takes 1 positional argument but 2 were given" in r.error["message"]
    assert "signature: tools.helpdesk.get_ticket(id: int)" in r.error["message"]
    r = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(1, id=1)")
    assert r.error["code"] == "invalid_arguments" and "multiple values for argument 'id'" in r.error["message"]
    assert rec.events == []  # nothing was dispatched
    await assert_alive(rt)


async def test_positional_calls_bind_in_signature_order_and_journal_as_keywords(rt, rec):
    # Positional, keyword and mixed: the same call for the tool and the journal.
    r = await rt.execute("""
import tools
a = await tools.helpdesk.get_ticket(3)
get = tools.helpdesk.get_ticket
b = await get(4)
[a["id"], b["id"]]
""")
    assert r.status == "completed", r.error
    assert r.result == [3, 4]
    calls = rt.store.get_calls(r.run_id)
    assert [c.args for c in calls] == [{"id": 3}, {"id": 4}]
    same = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(id=3)")
    assert rt.store.get_calls(same.run_id)[0].key == calls[0].key


async def test_a_tuple_is_an_array_to_every_tool():
    # Models pass tuples where a tool takes a list ((lat, lon), tuple(ids)); the
    # JSON Schema check alone refused them ("must be array, got array").
    from tether._sources import tool
    from tether._tools.model import Annotations, Tool

    got: list = []

    async def tag(args: dict) -> Any:
        got.append(args)
        return args["ids"]

    @tool(namespace="py")
    async def place(names: list[str], at: tuple[int, int] | None = None) -> dict:
        """Place names at a point."""
        return {"names": names, "at": at}

    schema = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
              "required": ["ids"]}
    tools = [Tool("api", "tag", "Tag ids.", schema, tag, annotations=Annotations(read_only=True)), place]
    async with Runtime(tools=tools, policy=Policy(writes="allow")) as rt:
        for check in ("calls", "off"):
            r = await rt.execute("import tools\nids = tuple(range(3))\n"
                                 "[await tools.api.tag(ids), await tools.py.place(('a', 'b'), at=(1, 2))]", check=check)
            assert r.status == "completed", r.error
            assert r.result == [[0, 1, 2], {"names": ["a", "b"], "at": [1, 2]}]
            assert got[-1] == {"ids": [0, 1, 2]} and type(got[-1]["ids"]) is list  # sent as JSON has it
            assert [c.args for c in rt.store.get_calls(r.run_id)] == [{"ids": [0, 1, 2]},
                                                                       {"names": ["a", "b"], "at": [1, 2]}]
        # A wrong item type inside a tuple is still refused.
        r = await rt.execute("import tools\nawait tools.api.tag(('x',))", check="off")
        assert r.error["code"] == "invalid_arguments" and "must be integer" in r.error["message"], r.error


async def test_a_tool_mapped_by_a_builtin_fails_with_the_idiom_that_works(rt, rec):
    # map(tools.x.f, ids) is how models often write a fan-out; Monty 1.4.0 cannot
    # wait inside a native built-in, so the run must say what to write instead.
    r = await rt.execute("import asyncio\nimport tools\n"
                         "coros = list(map(tools.helpdesk.get_ticket, [1, 2]))\nawait asyncio.gather(*coros)")
    assert r.status == "failed" and r.error["code"] == "program_error", r.error
    assert "comprehension" in r.error["next_action"] and "gather(*[f(x) for x in xs])" in r.error["next_action"]
    assert rec.events == []
    r = await rt.execute("import asyncio\nimport tools\n"
                         "rs = await asyncio.gather(*[tools.helpdesk.get_ticket(i) for i in [1, 2]])\n[t['id'] for t in rs]")
    assert r.result == [1, 2], r.error


async def test_a_tool_that_raises_is_a_catchable_tool_error(rt):
    r = await rt.execute("""
import tools
try:
    await tools.helpdesk.get_ticket(id=-1)
except LookupError as e:
    msg = str(e)
msg
""")
    assert r.status == "completed"
    assert r.result.startswith("[tool_error] helpdesk.get_ticket: ticket -1 does not exist")
    r = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(id=2)\nawait tools.helpdesk.get_ticket(id=-1)")
    assert r.error["code"] == "tool_error"
    # The run names the call that failed, from the host's record, with the tool's message.
    assert r.error["details"]["call"] == {"seq": 2, "address": "helpdesk.get_ticket"}
    assert "ticket -1 does not exist" in r.error["message"]
    await assert_alive(rt)


async def test_an_uncaught_call_failure_reports_its_code_and_call(rt):
    # invalid_arguments raised at run time, and call_timeout, each with its call.
    r = await rt.execute("import tools\nt = await tools.helpdesk.get_ticket(id=1)\nawait tools.helpdesk.get_ticket(id='x')")
    assert r.error["code"] == "invalid_arguments"
    assert r.error["details"]["call"] == {"seq": 2, "address": "helpdesk.get_ticket"}
    r = await rt.execute("import tools\nawait tools.slowpoke.wait()")
    assert r.error["code"] == "call_timeout"
    assert r.error["details"]["call"] == {"seq": 1, "address": "slowpoke.wait"}
    # The program's own exception, even after a caught tool failure, stays program_error.
    r = await rt.execute("""
import tools
try:
    await tools.helpdesk.get_ticket(id=-1)
except LookupError as e:
    raise ValueError("giving up: " + str(e))
""")
    assert r.error["code"] == "program_error" and "call" not in r.error["details"]


async def test_p14_error_code_comes_from_the_host_record_not_program_text(rt):
    r = await rt.execute("raise RuntimeError('[tool_error] helpdesk.get_ticket: made up')")
    assert r.error["code"] == "program_error"


@pytest.mark.parametrize("raised", [
    "MemoryError('memory limit exceeded: 1 bytes > 67108864 bytes')",
    "TimeoutError('feed time limit exceeded: 60.1s > 60s')",
    "RuntimeError('suspension limit 1000 exceeded')",
    "RecursionError('maximum recursion depth exceeded')",
    "ModuleNotFoundError(\"No module named 'os'\")",
])
@pytest.mark.parametrize("how", ["raise {}", "def f():\n    x = 1; raise   {} from None\nf()",
                                 "e = {}\ntry:\n    raise e\nexcept Exception as again:\n    raise again"])
async def test_p14_a_program_raising_a_limits_own_exception_does_not_choose_the_limits_code(rt, raised, how):
    """The limit codes (memory_limit, time_limit, call_limit, recursion_limit) say the host stopped the run; a
    program that raises the very exception, message and all, failed on its own: program_error (P-14)."""
    r = await rt.execute(how.format(raised))
    assert r.error["code"] == "program_error", r.error
    assert r.error["details"]["type"] == raised.split("(")[0]


async def test_p14_a_limit_hit_inside_a_raise_statement_is_still_the_limit(rt):
    r = await rt.execute("raise ValueError('x' * 10**9)")
    assert r.error["code"] == "memory_limit", r.error
    r = await rt.execute("def f(n):\n    raise ValueError(f(n + 1))\nf(0)")
    assert r.error["code"] == "recursion_limit", r.error
    # Inside the cause of `raise X from Y`, whose own expression marks the raise on pydantic-monty 1.6.
    r = await rt.execute("raise ValueError('a') from MemoryError('x' * 10**9)")
    assert r.error["code"] == "memory_limit", r.error


async def test_memory_bomb_is_stopped(rt):
    r = await rt.execute("x = 'a' * (10 ** 9)")
    assert r.error["code"] == "memory_limit"
    await assert_alive(rt)


async def test_infinite_loop_is_stopped(rt):
    r = await rt.execute("while True:\n    pass\n")
    assert r.error["code"] == "time_limit"
    await assert_alive(rt)


async def test_uninterruptible_step_is_stopped():
    rec = Recorder()
    async with Runtime(tools=rec.tools(), type_check=False,
                       limits=Limits(run_seconds=0.5, memory_bytes=2**40)) as rt:
        r = await rt.execute("10 ** (10 ** 8)")
        assert r.status == "failed"
        assert r.error["code"] in ("time_limit", "memory_limit")
        await assert_alive(rt)


async def test_host_call_limit(rt, rec):
    code = "import tools\nfor i in range(60):\n    await tools.helpdesk.get_ticket(id=i)\n"
    r = await rt.execute(code)
    assert r.error["code"] == "call_limit"
    assert len([e for e in rec.events if e[0] == "start"]) == 50  # call 51 was never sent
    await assert_alive(rt)


async def test_p17_call_limit_cannot_be_caught_by_the_program(rt, rec):
    code = """
import tools
n = 0
for i in range(80):
    try:
        await tools.helpdesk.get_ticket(id=i)
        n += 1
    except Exception:
        pass
n
"""
    r = await rt.execute(code)
    assert r.error["code"] == "call_limit"


async def test_per_call_timeout(rt):
    r = await rt.execute("import tools\nawait tools.slowpoke.wait(seconds=5)")
    assert r.error["code"] == "call_timeout"
    await assert_alive(rt)


async def test_a_call_timeout_holds_for_a_tool_that_waits_after_answering_steps_at_once():
    """A tool that steps several times before it waits is still cut off at its timeout, one that suspends
    and then answers gets its value to the program, and one that answers without suspending too."""
    import asyncio

    import tether

    @tether.tool(namespace="t", read_only=True)
    async def steps(n: int) -> int:
        """Answer after n turns of the event loop."""
        for _ in range(n):
            await asyncio.sleep(0)
        return n

    @tether.tool(namespace="t", read_only=True)
    async def stalls() -> int:
        """Step twice, then wait far past the timeout."""
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.sleep(30)
        return 0

    async with Runtime(tools=[steps, stalls], type_check=False,
                       limits=Limits(run_seconds=5, call_timeout_seconds=0.3)) as rt:
        r = await rt.execute("import tools\n[await tools.t.steps(n=0), await tools.t.steps(n=3)]")
        assert r.status == "completed" and r.result == [0, 3], r.error
        r = await rt.execute("import tools\nawait tools.t.stalls()")
        assert r.error["code"] == "call_timeout"
        assert (await rt.execute("import tools\nawait tools.t.steps(n=2)")).result == 2


async def test_p8_a_write_that_times_out_is_unknown_and_not_resent(rt, rec):
    r = await rt.execute("""
import tools
try:
    await tools.slowpoke.write(seconds=5)
except TimeoutError as e:
    msg = str(e)
msg
""")
    assert r.status == "completed"
    assert r.result.startswith("[write_outcome_unknown]")
    assert any("unknown outcome" in n for n in r.notes)
    assert [d[0] for d in rec.deliveries] == ["slow_write"]


async def test_non_json_results_are_converted_and_noted(rt):
    r = await rt.execute("x = [1]\nx.append(x)\n({3, 1, 2}, b'ok', (1, 2), x)")
    assert r.status == "completed"
    assert r.result[0] == [1, 2, 3] and r.result[1] == "ok" and r.result[2] == [1, 2]
    assert "a set became a sorted list" in r.notes


async def test_large_result_is_truncated_with_a_note_on_calls_made(rt):
    r = await rt.execute("import tools\nt = await tools.helpdesk.get_ticket(id=1)\n'x' * 100000")
    assert r.status == "completed"
    assert len(r.result.encode()) <= 30_000
    assert any("truncated" in n and "1 calls this run made were made" in n for n in r.notes)


async def test_logs_are_capped(rt):
    r = await rt.execute("for i in range(10000):\n    print('line', i)\n")
    assert r.status == "completed"
    assert sum(len(x) for x in r.logs) < 31_000
    assert r.logs[-1].startswith("[logs truncated")


@pytest.mark.parametrize(
    "code, expected",
    [
        ("open('/etc/passwd').read()", "sandbox_denied"),
        ("import os\nos.environ['HOME']", "sandbox_denied"),
        ("import os\nos.getenv('HOME')", "sandbox_denied"),
        ("import socket", "module_unavailable"),
        ("import subprocess", "module_unavailable"),
    ],
)
async def test_no_files_env_network_or_processes(rt, code, expected):
    r = await rt.execute(code)
    assert r.status == "failed"
    assert r.error["code"] == expected
    await assert_alive(rt)


async def test_pinned_clock_and_seed_are_recorded(rt):
    code = "import random\nimport time\n[time.time(), random.random()]"
    r = await rt.execute(code)
    run = rt.engine.get_run(r.run_id)
    assert run.environment["seed"] and run.environment["clock"]
    t, _ = r.result
    assert abs(t - rt.engine.clock()) < 60


async def test_builtins_search_describe_sources(rt):
    code = """
found = await search("close ticket")
desc = await describe("helpdesk.close_ticket")
srcs = await sources()
[found["results"][0]["address"], desc[0]["address"], sorted(s["namespace"] for s in srcs)]
"""
    r = await rt.execute(code)
    assert r.status == "completed", r.error
    assert r.result == ["helpdesk.close_ticket", "helpdesk.close_ticket", ["helpdesk", "slowpoke"]]


async def test_describe_full_detail_from_a_program(rt):
    code = """
short = await describe("helpdesk.close_ticket")
full = await describe(["helpdesk.close_ticket"], detail="full")
["input_schema" in short[0], full[0]["input_schema"]["type"]]
"""
    r = await rt.execute(code)
    assert r.status == "completed", r.error
    assert r.result == [False, "object"]


async def test_concurrent_runs_keep_their_own_calls(rt):
    import asyncio

    code = "import tools\n[(await tools.helpdesk.get_ticket(id={i}))['id'] for _ in range(3)]"
    results = await asyncio.gather(*(rt.execute(code.replace("{i}", str(i))) for i in range(2)))
    assert [r.result for r in results] == [[0, 0, 0], [1, 1, 1]]
    for i, r in enumerate(results):
        assert [c.args["id"] for c in rt.store.get_calls(r.run_id)] == [i, i, i]
