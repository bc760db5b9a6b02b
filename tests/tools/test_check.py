"""The pre-run check: no false rejections, real rejections before any call, and writes held to it."""

from __future__ import annotations

import pytest

from check_corpus import INVALID, VALID, corpus_tools
from helpers import Recorder
from tether._engine import launcher
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._sandbox.monty import probe_names


async def _decline_13(pending):
    return ("decline", "not that one") if pending["args"].get("id") == 13 else ("approve", None)


@pytest.fixture
async def corpus_rt():
    policy = Policy(writes="allow", rules=(Rule("tracker.close_ticket", "ask"),))
    async with Runtime(tools=corpus_tools(), policy=policy) as rt:
        yield rt


# --- the valid corpus: every program passes and gives its result ----------------------------


@pytest.mark.parametrize("mode", ["calls", "off"])
@pytest.mark.parametrize("code, expected", VALID, ids=[f"valid{i}" for i in range(len(VALID))])
async def test_valid_programs_pass_and_give_their_result(corpus_rt, mode, code, expected):
    r = await corpus_rt.execute(code, check=mode, on_approval=_decline_13)
    assert r.status == "completed", (r.error, code)
    assert r.result == expected


def test_the_corpus_is_large_enough():
    assert len(VALID) >= 50 and len(INVALID) >= 10


# The bundled checker is stricter than the run, by design or by its limits;
# "full" is opt-in for that reason (README, "The pre-run check").
FULL_REFUSES = {
    "await tools.fs.sort(*pos)": "a list of unknown length could fill `reverse: bool` with a str",
    "get_ticket(**x)": "a dict[str, str] spread into `id: int` (the program expects the TypeError)",
    "async def titles(ids):": "the checker cannot resolve `import tools` inside a function",
}


@pytest.mark.slow
@pytest.mark.parametrize("code, expected", VALID, ids=[f"valid{i}" for i in range(len(VALID))])
async def test_valid_programs_pass_the_full_check(corpus_rt, code, expected):
    r = await corpus_rt.execute(code, check="full", on_approval=_decline_13)
    if any(k in code for k in FULL_REFUSES):
        assert r.error["code"] == "type_check_failed" and r.calls == 0
        return
    assert r.status == "completed", (r.error, code)
    assert r.result == expected


# --- the invalid corpus: refused before any call ----------------------------------------------


@pytest.mark.parametrize("mode", ["calls", "full"])
@pytest.mark.parametrize("code, error, words", INVALID, ids=[f"invalid{i}" for i in range(len(INVALID))])
async def test_invalid_programs_are_refused_before_any_call(corpus_rt, mode, code, error, words):
    r = await corpus_rt.execute(code, check=mode)
    assert r.status == "failed"
    assert r.error["code"] == error, r.error
    assert words in r.error["message"] + r.error["next_action"], r.error
    assert r.calls == 0 and corpus_rt.store.get_calls(r.run_id) == []
    if error != "syntax_error" or mode == "calls":
        assert r.error["details"]["line"] >= 1


async def test_syntax_errors_carry_line_and_column(corpus_rt):
    for mode in ("calls", "full", "off"):
        r = await corpus_rt.execute("x = 1\ny = (2,\n", check=mode)
        assert r.error["code"] == "syntax_error", (mode, r.error)
        assert r.error["details"]["line"] in (2, 3) and r.error["details"]["column"], (mode, r.error)


async def test_newer_syntax_than_the_hosts_python_is_left_to_the_sandbox(corpus_rt):
    # Nested quotes in an f-string: Python 3.12 syntax, which Monty parses.
    r = await corpus_rt.execute('d = {"a": 1}\nf"{d["a"]}"')
    assert r.status == "completed" and r.result == "1"


# --- no false rejections: every name and module the sandbox has ----------------------------------


@pytest.mark.slow
async def test_every_name_and_module_the_sandbox_accepts_passes_every_check(corpus_rt):
    names, modules = await probe_names(corpus_rt.engine.pool)
    assert "PermissionError" in names and "getattr" in names and "json" in modules
    exceptions = [n for n in names if n[0].isupper() and n.endswith(("Error", "Exception", "Exit", "Interrupt",
                                                                     "Iteration"))]
    others = [n for n in names if n not in exceptions and n not in ("print",)]
    program = (
        "seen = []\n"
        + "".join(f"try:\n    seen.append(1)\nexcept {n}:\n    pass\n" for n in exceptions)
        + "refs = [" + ", ".join(others) + "]\n"
        + "".join(f"import {m}\n" for m in modules)
        + "len(seen)"
    )
    for mode in ("calls", "full"):
        r = await corpus_rt.execute(program, check=mode)
        assert r.status == "completed", (mode, r.error)
        assert r.result == len(exceptions)


# --- the invariant: no write is sent before the program passed the check ---------------------------


async def test_p32_no_write_is_sent_before_the_program_passed_the_check():
    rec = Recorder()
    async with Runtime(tools=rec.tools(), policy=Policy(writes="allow")) as rt:
        # The write comes first; the problem the check finds comes after it.
        calls_bad = "import tools\nawait tools.helpdesk.add_comment(1, 'hi')\nawait tools.helpdesk.get_ticket(idd=1)"
        r = await rt.execute(calls_bad)
        assert r.error["code"] == "invalid_arguments" and r.error["details"]["line"] == 3
        assert rec.deliveries == [] and r.calls == 0
        # Only the bundled checker sees this one (a str where an int is declared).
        typed_bad = "import tools\nawait tools.helpdesk.add_comment(1, 'hi')\nn: int = 'x'\nn"
        r = await rt.execute(typed_bad, check="full")
        assert r.error["code"] == "type_check_failed", r.error
        assert rec.deliveries == [] and r.calls == 0
        # A second time (its verdict is remembered) it is refused just the same.
        r = await rt.execute(typed_bad, check="full")
        assert r.error["code"] == "type_check_failed" and rec.deliveries == []
        # With the check off, the same program sends the write: the test can fail.
        r = await rt.execute(typed_bad, check="off")
        assert r.status == "completed" and rec.deliveries == [("add_comment", {"id": 1, "body": "hi"})]


async def test_a_remembered_pass_skips_the_checker_but_not_the_call_check():
    rec = Recorder()
    async with Runtime(tools=rec.tools(), policy=Policy(writes="allow"), check="full") as rt:
        code = "import tools\n(await tools.helpdesk.get_ticket(2))['id']"
        first = await rt.execute(code)
        second = await rt.execute(code)
        assert first.result == second.result == 2
        assert len(rt.engine.verdicts) == 1 and list(rt.engine.verdicts.values()) == [True]


async def test_full_check_stubs_only_what_the_program_reaches():
    from tether._engine.attempt.spec import build_spec, precheck
    from tether._engine.rules.limits import Limits

    rec = Recorder()
    async with Runtime(tools=rec.tools(), check="full") as rt:
        run = launcher.new_run(rt.engine, "import tools\nawait tools.helpdesk.get_ticket(1)", principal=None, meta=None,
                          check="full", status="running")
        spec = build_spec(rt.engine, run, Limits(), reach=precheck(rt.engine, run))
        assert list(spec.namespace_stubs) == ["helpdesk"]
        assert "get_ticket" in spec.namespace_stubs["helpdesk"] and "add_comment" not in spec.namespace_stubs["helpdesk"]
        # An alias assigned once is followed like an import...
        run = launcher.new_run(rt.engine, "import tools\nns = tools.slowpoke\nawait ns.wait()", principal=None, meta=None,
                          check="full", status="running")
        spec = build_spec(rt.engine, run, Limits(), reach=precheck(rt.engine, run))
        assert list(spec.namespace_stubs) == ["slowpoke"] and "def write(" not in spec.namespace_stubs["slowpoke"]
        # ...a namespace reached dynamically gets all its tools.
        run = launcher.new_run(rt.engine, "import tools\nawait getattr(tools.slowpoke, 'wait')()", principal=None, meta=None,
                          check="full", status="running")
        spec = build_spec(rt.engine, run, Limits(), reach=precheck(rt.engine, run))
        assert list(spec.namespace_stubs) == ["slowpoke"] and "def write(" in spec.namespace_stubs["slowpoke"]


async def test_a_declined_write_that_ends_the_program_is_reported_as_that_call():
    rec = Recorder()
    async with Runtime(tools=rec.tools()) as rt:
        paused = await rt.execute("import tools\nawait tools.helpdesk.get_ticket(1)\nawait tools.helpdesk.close_ticket(3)")
        r = await rt.resume(paused.run_id, "decline", "no")
    assert r.error["code"] == "write_declined"
    assert r.error["details"]["call"] == {"seq": 2, "address": "helpdesk.close_ticket"}
    assert "declined: no" in r.error["message"] and rec.deliveries == []


async def test_a_program_run_with_no_tools_loaded_is_told_to_load_some():
    """The first mistake of a new user: the README's program run without --tools. search() would find nothing,
    so the next action names the ways to load tools, not sources()."""
    async with Runtime() as rt:
        r = await rt.execute("import tools\nawait tools.helpdesk.search_customers(query='')")
    assert r.status == "failed" and r.error["code"] == "unknown_tool"
    assert "no tools are loaded" in r.error["message"] and "--tools" in r.error["next_action"]
