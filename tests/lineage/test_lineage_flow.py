"""The static data-flow pass: which earlier results may reach each argument of each tool call (D-63)."""

from __future__ import annotations

import ast
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._engine.lineage import flow as flow_module
from tether._engine.lineage.flow import UNKNOWN, DataFlow, analyse
from tether._engine.lineage.names import Scopes, ToolNames

READ = "mail.get_received_emails"
OTHER = "contacts.search"


def src(code: str, address: str = "mail.send_email", arg: str | int = "to") -> frozenset[str] | None:
    return analyse(code).sources_of(address, arg)


def test_direct_and_literal_arguments():
    code = (
        "import tools\n"
        "e = await tools.mail.get_received_emails()\n"
        "await tools.mail.send_email(to=e[0]['sender'], subject='hi', body=e[0]['body'])\n"
    )
    flow = analyse(code)
    assert flow.sources_of("mail.send_email", "to") == {READ}
    assert flow.sources_of("mail.send_email", "body") == {READ}
    assert flow.sources_of("mail.send_email", "subject") == frozenset()
    assert flow.sources_of("mail.send_email", "cc") == frozenset()  # not passed: no program data
    assert flow.sources_of(READ, "to") == frozenset()
    assert flow.addresses == {READ, "mail.send_email"}


@pytest.mark.parametrize("imports, call", [
    ("import tools", "tools.mail"),
    ("import tools as t", "t.mail"),
    ("from tools import mail", "mail"),
    ("from tools import mail as m", "m"),
    ("import tools.mail as m", "m"),
])
def test_every_way_a_program_names_a_tool(imports, call):
    code = f"{imports}\ne = await {call}.get_received_emails()\nawait {call}.send_email(to=e)\n"
    assert src(code) == {READ}


def test_tool_imported_by_name_and_alias_assigned_once():
    code = ("from tools.mail import get_received_emails as read, send_email\n"
            "m = tools_alias = None\n"
            "e = await read()\nawait send_email(e[0]['sender'])\n")
    assert src(code, arg=0) == {READ}
    code = "import tools\nmail = tools.mail\nsend = tools.mail.send_email\ne = await mail.get_received_emails()\n" \
           "await send(to=e)\n"
    assert src(code) == {READ}


def test_positional_arguments_and_sources_for():
    code = ("import tools\ne = await tools.mail.get_received_emails()\n"
            "await tools.mail.send_email('boss@x.io', e[0]['subject'])\n")
    flow = analyse(code)
    assert flow.sources_of("mail.send_email", 0) == frozenset()
    assert flow.sources_of("mail.send_email", 1) == {READ}
    assert flow.sources_for("mail.send_email", "subject", ["to", "subject"]) == {READ}
    assert flow.sources_for("mail.send_email", "to", ["to", "subject"]) == frozenset()


def test_star_arguments_reach_every_argument():
    code = ("import tools\ne = await tools.mail.get_received_emails()\n"
            "kw = {'to': e[0]['sender']}\nawait tools.mail.send_email(subject='s', **kw)\n")
    assert src(code, arg="subject") == {READ}
    code = "import tools\ne = await tools.mail.get_received_emails()\nawait tools.mail.send_email(*e)\n"
    assert src(code, arg=3) == {READ}


def test_unawaited_calls_gather_and_pairwise_unpacking():
    code = ("import asyncio\nimport tools\n"
            "e, c = await asyncio.gather(tools.mail.get_received_emails(), tools.contacts.search(q='bob'))\n"
            "await tools.mail.send_email(to=c[0]['email'], body=str(e))\n")
    assert src(code) == {OTHER}
    assert src(code, arg="body") == {READ}
    code = ("import asyncio\nimport tools\n"
            "tasks = [tools.mail.get_received_emails(), tools.contacts.search(q='bob')]\n"
            "results = await asyncio.gather(*tasks)\n"
            "await tools.mail.send_email(to=results[1][0]['email'])\n")
    assert src(code) == {READ, OTHER}  # one list: both (conservative)


def test_a_tool_result_depends_on_its_arguments():
    code = ("import tools\ne = await tools.mail.get_received_emails()\n"
            "c = await tools.contacts.search(q=e[0]['sender'])\n"
            "await tools.mail.send_email(to=c[0]['email'])\n")
    assert src(code) == {READ, OTHER}


def test_helpers_returns_globals_and_closures():
    code = (
        "import tools\n"
        "def pick(xs, n):\n    return xs[n]['sender']\n"
        "def constant(xs):\n    return 'boss@x.io'\n"
        "e = await tools.mail.get_received_emails()\n"
        "await tools.mail.send_email(to=pick(e, 0), subject=constant(e))\n"
    )
    assert src(code) == {READ}
    assert src(code, arg="subject") == frozenset()  # a helper's result is what it returns
    code = (
        "import tools\nLAST = None\n"
        "async def load():\n    global LAST\n    LAST = await tools.mail.get_received_emails()\n"
        "def outer():\n    def inner():\n        return LAST[0]['sender']\n    return inner()\n"
        "await load()\nawait tools.mail.send_email(to=outer())\n"
    )
    assert src(code) == {READ}
    code = (
        "import tools\n"
        "def make():\n    box = []\n    def put(v):\n        box.append(v)\n    return box, put\n"
        "box, put = make()\nput((await tools.mail.get_received_emails())[0])\n"
        "await tools.mail.send_email(to=box[0])\n"
    )
    assert src(code) == {READ}


def test_scopes_keep_a_helpers_local_apart():
    code = (
        "import tools\n"
        "def fmt(to):\n    return to.strip()\n"
        "e = await tools.mail.get_received_emails()\n"
        "to = 'boss@x.io'\n"
        "def other():\n    to = e[0]['sender']\n    return len(to)\n"
        "await tools.mail.send_email(to=fmt(to), body=str(other()))\n"
    )
    assert src(code) == frozenset()
    assert src(code, arg="body") == {READ}


def test_mutation_reaches_every_alias():
    code = ("import tools\na = []\nb = a\ne = await tools.mail.get_received_emails()\n"
            "b.append(e[0]['sender'])\nawait tools.mail.send_email(to=a[0])\n")
    assert src(code) == {READ}
    code = ("import tools\nd = {}\nalias = d\ne = await tools.mail.get_received_emails()\n"
            "alias['to'] = e[0]['sender']\nawait tools.mail.send_email(to=d['to'])\n")
    assert src(code) == {READ}
    code = ("import tools\nclass Box:\n    def __init__(self):\n        self.v = None\n"
            "    def put(self, v):\n        self.v = v\n"
            "b = Box()\nb.put((await tools.mail.get_received_emails())[0])\n"
            "await tools.mail.send_email(to=b.v)\n")
    assert src(code) == {READ}


def test_loops_augmented_assignment_walrus_with_and_match():
    code = ("import tools\nacc = ''\nfor m in (r := await tools.mail.get_received_emails()):\n"
            "    acc += m['sender']\nawait tools.mail.send_email(to=acc, body=str(r))\n")
    assert src(code) == {READ} and src(code, arg="body") == {READ}
    code = ("import tools\ne = await tools.mail.get_received_emails()\n"
            "match e[0]:\n    case {'sender': s}:\n        await tools.mail.send_email(to=s)\n")
    assert src(code) == {READ}


def test_callbacks_given_to_builtins_and_escaped_functions():
    code = ("import tools\ne = await tools.mail.get_received_emails()\n"
            "names = list(map(lambda m: m['sender'], e))\n"
            "await tools.mail.send_email(to=names[0])\n")
    assert src(code) == {READ}
    code = ("import tools\nc = await tools.contacts.search(q='bob')\ne = await tools.mail.get_received_emails()\n"
            "best = sorted(c, key=lambda x: x['name'])[0]\nprint(len(e))\n"
            "await tools.mail.send_email(to=best['email'])\n")
    assert src(code) == {OTHER}  # a sort key does not drag every other value in
    code = ("import tools\nhandlers = {'pick': lambda xs: xs[0]}\ne = await tools.mail.get_received_emails()\n"
            "await tools.mail.send_email(to=handlers['pick'](e))\n")
    assert src(code) == {READ}


def test_caught_exceptions_and_dynamic_tools_cannot_tell():
    code = ("import tools\ntry:\n    await tools.mail.get_received_emails()\nexcept Exception as err:\n"
            "    await tools.mail.send_email(to=str(err))\n")
    assert src(code) is None
    for dynamic in ("f = getattr(tools.mail, 'send_email')\nawait f(to='x')",
                    "await tools.mail.send_email(to=[tools.mail][0])",
                    "def call(ns):\n    return ns.send_email(to='x')\nawait call(tools.mail)"):
        flow = analyse("import tools\n" + dynamic + "\n")
        assert flow.dynamic and flow.sources_of("mail.send_email", "to") is None, dynamic
    # A name bound to tools and to something else is not followed either.
    assert analyse("import tools\ntools = 3\nawait tools.mail.send_email(to='x')\n").sources_of(
        "mail.send_email", "to") is None


def test_literals_are_the_programs_own_values_normalised():
    flow = analyse("import tools\nawait tools.mail.send_email(to='  Bob@Example.com ', body=f'see https://Docs.io/a "
                   "{1}', n=12345)\n")
    assert {"bob@example.com", "docs.io/a", "docs.io", "12345"} <= flow.literals


def test_unparsable_and_capped_programs_give_the_all_none_flow():
    for code in ("def (", "x = " + "(" * 1000 + ")" * 1000, "x = " + "f(" * 400 + ")" * 400, "\x00", ""):
        flow = analyse(code)
        assert flow.sources_of("mail.send_email", "to") is None
    assert analyse("x" * (flow_module.MAX_CODE_CHARS + 1)) is UNKNOWN
    many = "import tools\n" + "\n".join(f"await tools.ns{i}.t()" for i in range(flow_module.MAX_TOOLS + 1))
    assert analyse(many).sources_of("ns1.t", "x") is None
    assert analyse(123) is UNKNOWN  # type: ignore[arg-type]


def test_long_operator_chains_are_not_nesting():
    code = "import tools\ne = await tools.mail.get_received_emails()\nto = " + " + ".join(["'a'"] * 600) + \
           " + e[0]\nawait tools.mail.send_email(to=to)\n"
    assert src(code) == {READ}


def test_huge_programs_end_within_the_caps():
    body = "\n".join(f"x{i} = await tools.ns{i % 40}.t(a=x{i - 1} if {i} else 0, b='u{i}@x.io')"
                     for i in range(1, 3000))
    code = "import tools\nx0 = 0\n" + body + "\n"
    start = time.process_time()
    flow = analyse(code)
    assert flow.parsed and flow.sources_of("ns1.t", "a") is not None
    assert time.process_time() - start < 60  # a hang guard; bench/ measures speed


IDENT = st.sampled_from(["a", "b", "e", "tools", "x", "f", "m", "asyncio"])
EXPR = st.recursive(
    st.one_of(IDENT, st.sampled_from(["'s'", "1", "tools.mail.read()", "await tools.mail.read()", "[]", "{}"])),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: f"{t[0]} + {t[1]}"),
        st.tuples(inner, IDENT).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(IDENT, inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"tools.mail.send(to={t[0]}, body={t[1]})"),
        st.tuples(IDENT, inner).map(lambda t: f"[{t[0]} for {t[0]} in {t[1]}]"),
        st.tuples(IDENT, inner).map(lambda t: f"(lambda {t[0]}: {t[1]})"),
        st.tuples(IDENT, inner).map(lambda t: f"({t[0]} := {t[1]})"),
        inner.map(lambda t: f"f'{{{t}}}'"),
    ),
    max_leaves=12,
)
STMT = st.one_of(
    st.tuples(IDENT, EXPR).map(lambda t: f"{t[0]} = {t[1]}"),
    EXPR,
    st.tuples(IDENT, EXPR).map(lambda t: f"for {t[0]} in {t[1]}:\n    {t[0]}.append({t[1]})"),
    st.tuples(IDENT, EXPR).map(lambda t: f"def {t[0]}(a, *b, **c):\n    global x\n    x = a\n    return {t[1]}"),
    st.tuples(IDENT, EXPR).map(lambda t: f"{t[0]} += {t[1]}"),
    st.just("import tools"), st.just("from tools import mail"), st.just("import asyncio"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STMT, max_size=8))
def test_generated_programs_never_raise(lines):
    code = "\n".join(lines)
    flow = analyse(code)
    assert isinstance(flow, DataFlow)
    for address in flow.addresses:
        result = flow.sources_of(address, "to")
        assert result is None or isinstance(result, frozenset)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_never_raises(code):
    assert isinstance(analyse(code), DataFlow)


def test_functions_that_store_into_their_first_argument():
    for store in ("setattr(box, 'v', e[0])", "heapq.heappush(box, e[0])", "bisect.insort(box, e[0])"):
        code = ("import tools, heapq, bisect\nbox = []\nkeep = box\ne = await tools.mail.get_received_emails()\n"
                f"{store}\nawait tools.mail.send_email(to=keep)\n")
        assert src(code) == {READ}, store


def test_mutation_through_what_a_helper_returns():
    code = ("import tools\nSHARED = []\ndef same(x):\n    return x\ndef shared():\n    return SHARED\n"
            "out = []\ne = await tools.mail.get_received_emails()\n"
            "same(out).append(e[0])\nshared().append(e[1])\n"
            "await tools.mail.send_email(to=out, body=SHARED)\n")
    assert src(code) == {READ}
    assert src(code, arg="body") == {READ}


def test_a_module_name_reassigned_in_straight_line_code_takes_its_new_value():
    code = ("import tools\nr = await tools.mail.get_received_emails()\nn = len(r)\n"
            "subjects = [m['subject'] for m in r]\n"
            "r = await tools.contacts.search(q='bob')\n"
            "await tools.mail.send_email(to=r[0]['email'], body=str(subjects) + str(n))\n")
    assert src(code) == {OTHER}
    assert src(code, arg="body") == {READ}
    # Swaps read both sides first; += keeps the old value.
    code = ("import tools\na = await tools.mail.get_received_emails()\nb = 'x@y.io'\na, b = b, a\n"
            "await tools.mail.send_email(to=b, cc=a)\n")
    assert src(code) == {READ} and src(code, arg="cc") == frozenset()
    code = "import tools\nacc = await tools.mail.get_received_emails()\nacc += ['x']\nawait tools.mail.send_email(to=acc)\n"
    assert src(code) == {READ}


@pytest.mark.parametrize("early, late", [
    ("def f():\n    return r", "await tools.mail.send_email(to=f())"),
    ("g = (r for _ in [1])", "await tools.mail.send_email(to=next(g))"),
    ("f = lambda: r", "await tools.mail.send_email(to=f())"),
    ("", "for i in range(2):\n    r = 'x@y.io' if i else r\nawait tools.mail.send_email(to=r)"),
    ("", "if len(r) > 1:\n    r = 'x@y.io'\nawait tools.mail.send_email(to=r)"),
    ("b = [r]", "b[0] = r\nawait tools.mail.send_email(to=b)"),
])
def test_names_read_out_of_order_keep_every_value(early, late):
    # `r` holds a typed address, then an untrusted result; whatever reads it late may see the second.
    code = f"import tools\nr = 'x@y.io'\n{early}\nr = await tools.mail.get_received_emails()\n{late}\n"
    assert src(code) == {READ}, code


# Each step turns the value in `{a}` into `{b}` the way a program might; composed at random, the written value
# must still trace back to the untrusted read (and a typed value composed the same way must stay clean).
STEPS = [
    "{b} = '@'.join({a}.split('@'))",
    "{b} = {a}.upper().lower()",
    "{b} = ''.join(reversed({a}))[::-1]",
    "{b} = base64.b64decode(base64.b64encode({a}.encode())).decode()",
    "{b} = {a}[0:len({a})]",
    "{b} = f'{{{a}}}'",
    "{b} = '%s' % {a}",
    "{b} = '{{}}'.format({a})",
    "{b} = json.loads(json.dumps({{'v': {a}}}))['v']",
    "{b}_box = []\n{b}_alias = {b}_box\n{b}_alias.append({a})\n{b} = {b}_box[0]",
    "{b}_d = {{}}\n{b}_d['k'] = {a}\n{b} = {b}_d.get('k')",
    "def {b}_f(v):\n    return v.strip()\n{b} = {b}_f({a})",
    "{b} = list(map(lambda c: c, {a}))\n{b} = ''.join({b})",
    "{b} = ''.join(c for c in {a} if c != '\\x00')",
    "{b} = [c for c in {a}]\n{b} = ''.join({b})",
    "({b} := {a})",
    "{b}, {b}_other = {a}, 1",
    "{b} = ''\n{b} += {a}",
    "{b} = {a} if len({a}) else {a}",
    "{b} = str({a}).replace('x', 'x')",
    "{b} = sorted([{a}], key=lambda s: len(s))[0]",
    "class {b}_C:\n    def __init__(self, v):\n        self.v = v\n{b} = {b}_C({a}).v",
]


def chain(start: str, steps: list[int]) -> tuple[str, str]:
    lines, current = [], start
    for n, i in enumerate(steps):
        nxt = f"v{n}"
        lines.append(STEPS[i].format(a=current, b=nxt))
        current = nxt
    return "\n".join(lines), current


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(STEPS) - 1), min_size=1, max_size=6))
def test_composed_transformations_keep_the_trace(steps):
    body, last = chain("seed", steps)
    head = "import tools, base64, json\nseed = (await tools.mail.get_received_emails())[0]['body']\n"
    assert src(head + body + f"\nawait tools.mail.send_email(to={last})\n") == {READ}
    # The same chain over a typed value, beside an untrusted read that goes elsewhere, stays clean.
    typed = ("import tools, base64, json\nseed = 'bob@corp.example'\n"
             "mail = (await tools.mail.get_received_emails())[0]['body']\n")
    assert src(typed + body + f"\nawait tools.mail.send_email(to={last}, body=mail)\n") == frozenset()


def test_reflection_cannot_tell():
    for read in ("globals()['secret']", "vars()['secret']", "eval('secret')"):
        code = (f"import tools\nsecret = await tools.mail.get_received_emails()\n"
                f"await tools.mail.send_email(to={read})\n")
        assert src(code) is None, read


def test_a_program_shaped_to_make_every_bit_walk_the_same_tail_stops_at_the_cap():
    lines = ["import tools"] + [f"a{i} = await tools.n{i}.t()" for i in range(250)] + ["z0 = 0"]
    lines += [f"z{i} = z{i - 1}" + (f" + a{i - 1}" if i <= 250 else "") for i in range(1, 14_000)]
    lines.append("await tools.out.send(to=z13999)")
    code = "\n".join(lines)
    assert len(code) <= flow_module.MAX_CODE_CHARS
    start = time.process_time()
    assert analyse(code).sources_of("out.send", "to") is None
    assert time.process_time() - start < 60  # a hang guard; the cap is what ends it


@pytest.mark.parametrize("shape", [
    # one lambda of many parameters handed to map with many arguments
    "f = map(lambda {params}: 0, {args})",
    # a function of many parameters called with many starred arguments
    "def g({params}):\n    return a0\nv = g({stars})",
    # a name defined over and over, called as often
    "{defs}\n{calls}",
])
def test_shapes_that_would_be_quadratic_stay_linear(shape):
    n = 4000
    code = "import tools\n" + shape.format(
        params=", ".join(f"a{i}" for i in range(n)), args=", ".join(f"x{i}" for i in range(n)),
        stars=", ".join(f"*x{i}" for i in range(n)),
        defs="\n".join(f"def h(p):\n    return p + {i}" for i in range(n // 4)),
        calls="\n".join(f"y{i} = h({i})" for i in range(n // 4)),
    ) + "\nawait tools.out.send(to=1)\n"
    assert analyse(code).parsed
    # The graph the pass builds grows with the program, not with its square (16 million edges here if it did).
    tree = ast.parse(code)
    tools = ToolNames()
    scopes = Scopes(tree, tools, flow_module.MAX_NODES)
    tools.aliases()
    graph = flow_module._Graph(scopes, tools)
    graph.module(tree)
    nodes = sum(1 for _ in ast.walk(tree))
    assert sum(len(edges) for edges in graph.succ) < 10 * nodes
