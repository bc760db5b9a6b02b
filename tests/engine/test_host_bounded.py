"""Host work done for a program is bounded: a slow describe() fails its call by name within the run's
time limit, off the event loop, while other runs go on (D-34)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tether._engine.rules.limits import Limits
from tether._hostwork import LoopWatchdog, off_loop
from tether._runtime import Runtime
from tether._tools import Tool
from tether._tools.model import Annotations
from tether.errors import HostWorkTimeout


async def _noop(args: dict[str, Any]) -> dict[str, Any]:
    return args


# A catalog of 2,000 tools and a program that asks describe() about 300 addresses
# it misspelled: each unknown address is compared with every address for
# suggestions, seconds of honest work in all (about 0.1 s each here).
MISSPELLED = "[f'big.report_{i}_itemz' for i in range(300)]"


def _tools() -> list[Tool]:
    return [
        *(Tool("big", f"report_{i}_items", "A report.", {"type": "object", "properties": {"a": {"type": "string"}}},
               _noop, annotations=Annotations(read_only=True)) for i in range(2000)),
        Tool("small", "echo", "Echo.", {"type": "object", "properties": {"x": {"type": "integer"}}}, _noop,
             annotations=Annotations(read_only=True)),
    ]


class _LagMeter:
    """The longest the event loop went without running a 10 ms ticker."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> _LagMeter:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_slow_describe_fails_its_call_by_name_within_the_run_limit_while_another_run_completes() -> None:
    async with Runtime(tools=_tools(), limits=Limits(run_seconds=1.0)) as rt:
        with _LagMeter() as lag:
            t = time.monotonic()
            slow = asyncio.ensure_future(rt.execute(f"await describe({MISSPELLED})"))
            await asyncio.sleep(0.05)
            other = await rt.execute("import tools\nawait tools.small.echo(x=1)")
            result = await slow
            took = time.monotonic() - t
    assert other.status == "completed" and other.result == {"x": 1}
    assert result.status == "failed" and result.error is not None
    assert result.error["code"] == "host_work_timeout", result.error
    assert "describe()" in result.error["message"] and "nothing was sent" in result.error["message"]
    # Ended by the 1 s limit, not by describe finishing (30 s here); generous for a loaded machine.
    assert took < 10, took
    # The loop was never held: on it, the describe would show as one gap of 30 s.
    assert lag.worst < 2.0, lag.worst


async def test_the_program_can_catch_the_named_timeout_and_go_on() -> None:
    code = (
        f"try:\n    await describe({MISSPELLED})\n    got = 'described'\n"
        "except TimeoutError as e:\n    got = str(e)[:19]\n"
        "import tools\n[got, await tools.small.echo(x=2)]"
    )
    async with Runtime(tools=_tools(), limits=Limits(run_seconds=1.0)) as rt:
        r = await rt.execute(code)
    assert r.status == "completed", r.error
    assert r.result == ["[host_work_timeout]", {"x": 2}]


async def test_off_loop_names_what_overran_and_leaves_the_loop_free() -> None:
    from tether._hostwork import checkpoint

    def spin() -> int:
        end = time.monotonic() + 5
        n = 0
        while time.monotonic() < end:
            n += 1
            if n % 10_000 == 0:
                checkpoint()
        return n

    with _LagMeter() as lag:
        try:
            await off_loop(spin, seconds=0.2, what="spinning")
        except HostWorkTimeout as exc:
            assert exc.code == "host_work_timeout" and "spinning" in exc.message
        else:
            raise AssertionError("no timeout")
    assert lag.worst < 2.0  # on the loop: one gap of 5 s


async def test_abandoned_work_stops_at_its_next_checkpoint() -> None:
    from tether._hostwork import checkpoint

    rounds: list[int] = []

    def long_loop() -> None:
        for i in range(10_000):
            checkpoint()
            rounds.append(i)
            time.sleep(0.01)

    try:
        await off_loop(long_loop, seconds=0.2, what="a long loop")
    except HostWorkTimeout:
        pass
    await asyncio.sleep(0.5)
    stopped_at = len(rounds)
    await asyncio.sleep(0.5)
    assert len(rounds) == stopped_at < 1000, (stopped_at, len(rounds))


async def test_the_watchdog_names_the_run_and_call_holding_the_loop() -> None:
    lines: list[str] = []
    dog = LoopWatchdog(asyncio.get_running_loop(), threshold=0.3, interval=0.05, report=lines.append).start()
    try:
        def hold(run_id: str, seq: int, op: str) -> None:
            time.sleep(0.8)  # the loop thread itself, as a runaway step on the loop would

        hold("run_culprit", 7, "describe")
        assert dog.stuck
        await asyncio.sleep(0.4)
        assert not dog.stuck
    finally:
        dog.stop()
    assert any("run run_culprit call 7 (describe)" in line for line in lines), lines


async def test_a_value_repeated_by_reference_is_cut_instead_of_expanding_on_the_host() -> None:
    # Five levels of [x] * 100: 10**10 elements once every reference is a copy, a few KB in the sandbox.
    code = "v = [0] * 100\nfor _ in range(4):\n    v = [v] * 100\nv"
    async with Runtime() as rt:
        with _LagMeter() as lag:
            r = await rt.execute(code)
    assert r.status == "completed", r.error
    assert any("expands past" in n and "the rest was cut" in n for n in r.notes), r.notes
    assert lag.worst < 5.0, lag.worst  # about a second of capped conversion; unbounded it never ends


def _ref_chain(levels: int) -> dict[str, Any]:
    # Each component names the one before three times: 3**levels nodes once inlined, 25 components on disk.
    comps: dict[str, Any] = {"a0": {"type": "string"}}
    for i in range(1, levels + 1):
        comps[f"a{i}"] = {"type": "object", "properties": {k: {"$ref": f"#/components/schemas/a{i - 1}"}
                                                             for k in "pqr"}}
    top = {"$ref": f"#/components/schemas/a{levels}"}
    return {"openapi": "3.0.3", "info": {"title": "refs", "version": "1"},
            "servers": [{"url": "http://127.0.0.1:9"}], "components": {"schemas": comps},
            "paths": {"/x": {"get": {"operationId": "fetch", "responses": {"200": {
                "description": "ok", "content": {"application/json": {"schema": top}}}}},
                "post": {"operationId": "send", "requestBody": {"content": {"application/json": {"schema": top}}},
                         "responses": {"200": {"description": "ok"}}}}}}


async def test_a_description_whose_refs_expand_exponentially_loads_within_bounds(tmp_path) -> None:
    from tether._sources.openapi import OpenAPISource

    with _LagMeter() as lag:
        async with OpenAPISource("refs", _ref_chain(24)) as source:
            tools = {t.name: t for t in source.tools()}
    # The response shape is left out and the operation whose body cannot be inlined is skipped, said why.
    assert list(tools) == ["fetch"] and tools["fetch"].output_schema is None
    assert any("expands past" in str(p) for p in source.problems), source.problems
    assert lag.worst < 5.0, lag.worst  # 3**24 nodes: unbounded, it never loads


async def test_yaml_aliases_nested_in_a_spec_are_read_once_off_the_loop(tmp_path) -> None:
    from tether._sources.openapi import OpenAPISource

    lines = ["openapi: 3.0.3", "info: {title: lol, version: '1'}", "servers: [{url: 'http://127.0.0.1:9'}]",
             "x-a0: &a0 {type: string, description: lol}"]
    lines += [f"x-a{i}: &a{i} {{type: object, properties: {{p: *a{i - 1}, q: *a{i - 1}, r: *a{i - 1}}}}}"
              for i in range(1, 25)]
    lines += ["paths:", "  /x:", "    get:", "      operationId: x", "      responses:", "        '200':",
              "          description: ok", "          content:", "            application/json:",
              "              schema: *a24"]
    spec = tmp_path / "laughs.yaml"
    spec.write_text("\n".join(lines) + "\n")
    with _LagMeter() as lag:
        async with OpenAPISource("lol", spec) as source:
            assert [t.name for t in source.tools()] == ["x"]
    assert lag.worst < 5.0, lag.worst  # copied at each alias: unbounded, it never loads


async def test_a_pattern_that_backtracks_is_not_run_against_the_programs_string() -> None:
    # ^(a+)+$ against 40 a's and a "!" would hold the loop (and the GIL) for hours in Python's engine.
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"},
                                               "n": {"type": "string", "pattern": "^[0-9]+$"}}}
    tool = Tool("rx", "take", "Take s.", schema, _noop, annotations=Annotations(read_only=True))
    async with Runtime(tools=[tool]) as rt:
        with _LagMeter() as lag:
            r = await rt.execute("import tools\nawait tools.rx.take(s='" + "a" * 40 + "!')")
            checked = await rt.execute("import tools\nawait tools.rx.take(n='12x')")
    assert r.status == "completed", r.error  # left to the tool, which validates its own input
    assert lag.worst < 2.0, lag.worst  # matched here, it takes hours
    # A pattern that cannot backtrack is still checked before the call.
    assert checked.status == "failed" and checked.error["code"] == "invalid_arguments", checked.error


async def test_a_key_regex_that_backtracks_is_not_run_against_the_programs_keys() -> None:
    # patternProperties regexes are matched against the names of the keys the program passes, and
    # additionalProperties runs them all again: ^(a+)+$ against 30 a's and a "!" takes seconds per match
    # in Python's engine (40 a's: hours), holding the loop and the GIL.
    hostile = "^(a+)+$"
    schema = {"type": "object", "properties": {
        "m": {"type": "object", "patternProperties": {hostile: {"type": "integer"}, "^n_[0-9]+$": {"type": "integer"}},
              "additionalProperties": False},
        "u": {"type": "object", "patternProperties": {hostile: {"type": "integer"}},
              "unevaluatedProperties": False}}}
    tool = Tool("rx", "take", "Take m.", schema, _noop, annotations=Annotations(read_only=True))
    key = "a" * 30 + "!"
    async with Runtime(tools=[tool]) as rt:
        with _LagMeter() as lag:
            r = await rt.execute("import tools\nawait tools.rx.take(m={'" + key + "': 1, 'n_1': 2})")
            u = await rt.execute("import tools\nawait tools.rx.take(u={'" + key + "': 1})")
            checked = await rt.execute("import tools\nawait tools.rx.take(m={'n_1': 'two'})")
            unknown = await rt.execute("import tools\nawait tools.rx.take(m={'zz': 1})")
    assert r.status == "completed", r.error  # left to the tool, which validates its own input
    assert u.status == "completed", u.error
    assert lag.worst < 2.0, lag.worst  # matched here, the three matches take tens of seconds
    # A key regex that cannot backtrack is still checked before the call.
    assert checked.status == "failed" and checked.error["code"] == "invalid_arguments", checked.error
    assert "n_1" in checked.error["message"], checked.error
    # With a regex left unmatched, additionalProperties cannot tell an unknown key: the tool decides.
    assert unknown.status == "completed", unknown.error


async def test_a_misspelled_tool_gets_suggestions_found_off_the_loop() -> None:
    async with Runtime(tools=_tools()) as rt:
        r = await rt.execute("import tools\nawait tools.big.report_7_itemz()", check="off")
    assert r.status == "failed" and r.error["code"] == "unknown_tool", r.error
    assert "big.report_7_items" in r.error["next_action"], r.error
