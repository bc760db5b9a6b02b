"""Nothing a program or a tool hands back crashes the host (P-26).

Every conversion of program or tool output — the result, a tool's return
value, print() output, emit(), an exception's message — is total: each run
below ends in a terminal state with an envelope that is strict JSON and
valid UTF-8, recorded in the store the same way, and renders as MCP text.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tether._engine.attempt.result import to_json_value
from tether._runtime import Runtime
from tether._server.results import run_result
from tether._tools.model import Annotations, Tool

# The value the next tool call returns or raises with; the tools read it here.
CURRENT: dict[str, object] = {}


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr refused")

    __str__ = __repr__


class Boom(Exception):
    """An exception whose message is whatever the test hands it (str() may itself fail)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _tools() -> list[Tool]:
    async def give(args: dict) -> object:
        return CURRENT["value"]

    async def fail(args: dict) -> object:
        raise Boom(CURRENT["value"])

    async def give_bytes(args: dict) -> object:
        return b"\x00\xff raw"

    async def echo(args: dict) -> object:
        return args

    read = Annotations(read_only=True)
    anything = {"type": "object", "additionalProperties": True}
    return [Tool(namespace="t", name=name, description=name, input_schema=anything, handler=fn,
                 annotations=read) for name, fn in (("give", give), ("fail", fail), ("give_bytes", give_bytes),
                                                    ("echo", echo))] + [
        Tool(namespace="t", name="send", description="a write", input_schema=anything, handler=echo)]


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def rt(loop):
    runtime = Runtime(tools=_tools(), type_check=False, max_workers=1)
    loop.run_until_complete(runtime.__aenter__())
    yield runtime
    loop.run_until_complete(runtime.close())


def check_envelope(rt: Runtime, result, *, paused: bool = False) -> None:
    """The run ended (or paused, when asked), and what it reports can be sent anywhere."""
    assert result.status in (("completed", "failed") + (("paused",) if paused else ())), result
    data = result.to_dict()
    text = json.dumps(data, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogates
    if result.status == "failed":
        assert result.error["code"] and result.error["message"] and result.error["next_action"]
        assert result.error["code"] != "internal_error", result.error
        assert len(json.dumps(result.error)) < 30_000
    stored = rt.store.get_run(result.run_id)
    assert stored.status == result.status and stored.owner is None
    mcp = run_result(result, diagnostics=False)
    mcp.content[0].text.encode("utf-8")
    assert len(result.instructions or "") < 5_000


def nested(depth: int) -> list:
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


def cyclic() -> list:
    v: list = [1]
    v.append(v)
    return v


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(),
    st.sampled_from([5000, -5000, 30000, 4299]).map(lambda e: (7 if e == 4299 else 1) * 10**abs(e) * (-1 if e < 0 else 1)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["\udcff", "a\ud800b", "\x00", "é\u2028"]),
    st.binary(max_size=20), st.builds(object), st.builds(BadRepr),
    st.just(decimal.Decimal("1.5")), st.datetimes(), st.just(datetime.timedelta(seconds=3)),
    st.just(ValueError("an exception as a value")), st.just(math.pi),
)
HOST_VALUES = st.one_of(
    st.recursive(
        LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.tuples(inner, inner), st.frozensets(st.integers(), max_size=4),
            st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), st.just(5000).map(lambda e: 10**e), st.none(),
                                      st.tuples(st.integers())), inner, max_size=4)),
        max_leaves=15),
    st.integers(60, 3000).map(nested),
    st.builds(cyclic),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(value=HOST_VALUES, shape=st.sampled_from(["result", "print", "emit", "raise", "key"]))
def test_p26_any_value_a_tool_returns_or_raises_ends_the_run_with_an_envelope(rt, loop, value, shape):
    CURRENT["value"] = value
    code = {
        "result": "import tools\nawait tools.t.give()",
        "print": "import tools\nx = await tools.t.give()\nprint(x)\nprint(repr(x))\nlen(str(x))",
        "emit": "import tools\nemit(await tools.t.give())\n'ok'",
        "raise": "import tools\nawait tools.t.fail()",
        "key": "import tools\nx = await tools.t.give()\n{str(type(x)): x, 'n': [x, x]}",
    }[shape]
    result = loop.run_until_complete(rt.execute(code))
    check_envelope(rt, result)
    if shape == "raise":
        assert result.status == "failed" and result.error["code"] == "tool_error"


EXPRESSIONS = st.recursive(
    st.one_of(
        st.sampled_from(["10**5000", "-10**5000", "10**20000", "2**100000", "float('nan')", "float('-inf')",
                         "b'\\xff\\xfe'", "b'ok'", "None", "True", "'\\u2028'", "1.5", "{1, 2, 3}",
                         "frozenset({'a'})", "(1, 2)", "range(3)", "print", "len"]),
        st.integers().map(str), st.text(max_size=10).map(repr)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.tuples(inner, inner).map(lambda kv: "{" + f"str({kv[0]}): {kv[1]}" + "}"),
        st.tuples(st.integers(1, 200), inner).map(lambda d: "[" * d[0] + d[1] + "]" * d[0]),
    ),
    max_leaves=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(expr=EXPRESSIONS, shape=st.sampled_from(["result", "print", "emit", "raise", "argument", "write"]))
@example(expr="[(1, 2)]", shape="write")  # a tuple inside a write's arguments: shown as journaled
@example(expr="[10**5000, 10**5000, 10**5000]", shape="write")  # echoed back past result_bytes: cut
def test_p26_any_value_a_program_makes_ends_the_run_with_an_envelope(rt, loop, expr, shape):
    code = {
        "result": f"x = {expr}\nx",
        "print": f"x = {expr}\nprint(x)\n1",
        "emit": f"emit({expr})\n1",
        "raise": f"raise ValueError({expr})",
        "argument": f"import tools\nawait tools.t.echo(x={expr})",
        "write": f"import tools\nawait tools.t.send(x={expr}, y=[{expr}])",
    }[shape]
    result = loop.run_until_complete(rt.execute(code))
    check_envelope(rt, result, paused=shape == "write")
    if result.status == "paused":
        # What was shown for approval is what is journaled and sent.
        shown = result.pending["args"]
        done = loop.run_until_complete(rt.resume(result.run_id, "approve", seq=result.pending["seq"]))
        check_envelope(rt, done)
        assert done.status == "completed" and rt.store.get_calls(result.run_id)[-1].args == shown
        truncated = any(n.startswith("result truncated") for n in done.notes)  # past [limits] result_bytes
        if "<too deep>" not in json.dumps(done.result) and not truncated:  # or cut past 64 levels
            assert done.result == shown


# -- the reproduced cases ---------------------------------------------------


def test_p26_a_huge_int_result_completes_as_a_string_with_a_note(rt, loop):
    r = loop.run_until_complete(rt.execute("10**5000"))
    check_envelope(rt, r)
    assert r.status == "completed" and r.result == "1" + "0" * 5000
    assert any("5001 digits" in n for n in r.notes)


def test_a_tool_returning_a_huge_int_bytes_or_nan_is_converted_with_a_note(rt, loop):
    for value, note in ((10**5000, "5001 digits"), (float("nan"), "non-finite"), (b"\xff", "base64")):
        CURRENT["value"] = value
        r = loop.run_until_complete(rt.execute("import tools\nawait tools.t.give()"))
        check_envelope(rt, r)
        assert r.status == "completed" and any(note in n and "t.give" in n for n in r.notes), r.notes


def test_a_record_or_page_with_one_hostile_entry_is_converted_with_a_note_and_journaled_as_returned(rt, loop):
    """A tool's result that is a record or a page of them — most are — converts like any value: one entry
    that is not plain JSON, however deep, is changed and noted; a page repeated by reference is refused; and the
    journal keeps the value as returned, whatever the tool does to its dict afterwards."""
    for value, note in ((10**5000, "5001 digits"), (float("inf"), "non-finite"), ("a\ud800b", "surrogate"),
                        (b"\xff", "base64")):
        for shape, read in (({"id": 1, "x": value, "ok": True}, "['x']"),
                            ({"id": 1, "page": [{"n": 2, "x": value}], "more": None}, "['page'][0]['x']")):
            CURRENT["value"] = shape
            r = loop.run_until_complete(rt.execute(f"import tools\n(await tools.t.give()){read}"))
            check_envelope(rt, r)
            assert r.status == "completed" and any(note in n and "t.give" in n for n in r.notes), (value, r.notes)
    record = {"id": 1, "name": "x" * 100}
    repeated: object = [record, record]
    for _ in range(40):  # a page repeated by reference: 2**40 records once expanded, cut, and still too large
        repeated = [repeated, repeated]
    CURRENT["value"] = {"page": repeated}
    r = loop.run_until_complete(rt.execute("import tools\nx = await tools.t.give()\n1"))
    check_envelope(rt, r)
    assert r.error["code"] == "result_too_large", r.error
    kept = {"id": 1, "name": "ticket", "score": 0.5, "gone": None}
    CURRENT["value"] = kept
    r = loop.run_until_complete(rt.execute("import tools\nawait tools.t.give()"))
    kept["name"] = "changed by the tool later"
    assert r.status == "completed" and r.result["name"] == "ticket" and not r.notes
    assert rt.store.get_calls(r.run_id)[0].outcome == {"id": 1, "name": "ticket", "score": 0.5, "gone": None}


def test_a_tool_returning_bytes_reaches_the_program_as_text(rt, loop):
    r = loop.run_until_complete(rt.execute("import tools\nx = await tools.t.give_bytes()\n[type(x).__name__, x]"))
    check_envelope(rt, r)
    assert r.result[0] == "str" and any("base64" in n for n in r.notes)


def test_p26_a_recursion_error_keeps_the_first_and_last_frames(rt, loop):
    r = loop.run_until_complete(rt.execute("def f(n):\n    return f(n + 1)\nf(0)"))
    check_envelope(rt, r)
    assert r.error["code"] == "recursion_limit"
    frames = r.error["details"]["traceback"]
    assert len(frames) == 11 and frames[5]["omitted"] > 900
    assert frames[0]["function"] == "<module>" and frames[-1]["function"] == "f"
    assert len(run_result(r, diagnostics=False).content[0].text) < 10_000


def test_a_huge_exception_message_is_cut(rt, loop):
    r = loop.run_until_complete(rt.execute("raise ValueError('x' * 1_000_000)"))
    check_envelope(rt, r)
    assert r.error["code"] == "program_error" and "characters cut" in r.error["message"]
    assert len(r.error["message"]) < 3000


def test_p26_emit_past_the_suspension_limit_is_a_limit(rt, loop):
    r = loop.run_until_complete(rt.execute("for i in range(5000):\n    emit(i)\n1"))
    check_envelope(rt, r)
    assert r.error["code"] == "call_limit" and "emit()" in r.error["message"]


def test_p26_a_memory_error_is_the_memory_limit(rt, loop):
    for code in ("x = [0] * 10**9\n1", "x = 'ab' * 2**40\n1", "try:\n    x = [0] * 10**9\nexcept MemoryError:\n    1"):
        r = loop.run_until_complete(rt.execute(code))
        check_envelope(rt, r)
        assert r.error["code"] == "memory_limit", r.error


def test_to_json_value_is_strict_json_for_hostile_values():
    for value in (10**5000, 10**100000, -(2**70000), "\udcff", {10**5000: 1}, BadRepr(), [BadRepr()],
                  nested(10_000), cyclic(), {(1, 2): "tuple key"}, float("inf")):
        out, notes = to_json_value(value)
        json.dumps(out, allow_nan=False, ensure_ascii=False).encode("utf-8")
        assert notes


def test_p26_a_write_with_non_json_arguments_is_approved_and_sent_as_journaled(rt, loop):
    r = loop.run_until_complete(rt.execute("import tools\nawait tools.t.send(n=10**5000, s={3, 1, 2}, b=b'\\xff')"))
    check_envelope(rt, r, paused=True)
    assert r.status == "paused" and r.pending["args"]["s"] == [1, 2, 3] and r.pending["args"]["n"][:2] == "10"
    assert len(r.instructions) < 2000
    done = loop.run_until_complete(rt.resume(r.run_id, "approve", seq=r.pending["seq"]))
    check_envelope(rt, done)
    assert done.result == r.pending["args"] == rt.store.get_calls(r.run_id)[-1].args


def test_p26_gathered_writes_with_non_json_arguments_pause_together(rt, loop):
    code = ("import asyncio\nimport tools\n"
            "await asyncio.gather(tools.t.send(n=1), tools.t.send(n=10**5000), tools.t.send(s={2, 1}))")
    r = loop.run_until_complete(rt.execute(code))
    check_envelope(rt, r, paused=True)
    for _ in range(5):
        if r.status != "paused":
            break
        writes = r.pending.get("writes") or [r.pending]
        for w in writes:
            r = loop.run_until_complete(rt.resume(r.run_id, "approve", seq=w["seq"]))
        check_envelope(rt, r, paused=True)
    assert r.status == "completed"
    sent = [c.args for c in rt.store.get_calls(r.run_id)]
    assert {"s": [1, 2]} in sent and any(str(a.get("n", "")).startswith("1000") for a in sent)
