"""Stub generation: JSON Schema → Python declarations, and the contract with Monty's checker.

The ``test_checker_*`` tests run the real ``ty`` checker bundled with
pydantic-monty: they are the proof that the stub *shape* documented in
``tether._tools.stubs`` makes a wrong call fail before it runs. They are the
only place outside ``tether._sandbox.monty`` that imports ``pydantic_monty``.
"""

from __future__ import annotations

import pytest

from tether._tools import Catalog, Tool, build_stubs, render_signature


async def _noop(args):
    return args


def _tool(address: str, props: dict, required=(), output=None, **schema_extra) -> Tool:
    ns, name = address.split(".")
    schema = {"type": "object", "properties": props, "required": list(required), **schema_extra}
    return Tool(ns, name, f"{name} tool", schema, _noop, output_schema=output)


def _sig(tool: Tool) -> str:
    return render_signature(tool).split("(", 1)[1]


# --- JSON Schema → Python ------------------------------------------------------------


def test_scalars_required_and_optional() -> None:
    tool = _tool(
        "t.f",
        {
            "s": {"type": "string"},
            "i": {"type": "integer", "default": 3},
            "n": {"type": "number"},
            "b": {"type": "boolean", "default": False},
            "z": {"type": "null"},
        },
        required=["s", "n"],
    )
    assert _sig(tool) == "s: str, n: float, i: int = 3, b: bool = False, z: None = ...) -> Any"


def test_enum_const_and_nullable_unions() -> None:
    tool = _tool(
        "t.f",
        {
            "status": {"enum": ["open", "closed"], "default": "open"},
            "level": {"enum": [1, 2, None]},
            "kind": {"const": "bug"},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "either": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
            "multi": {"type": ["string", "null"]},
            "ratio": {"enum": [0.5, 1.5], "type": "number"},
        },
        required=["either"],
    )
    sig = _sig(tool)
    assert 'status: Literal["open", "closed"] = "open"' in sig
    assert "level: Literal[1, 2] | None = ..." in sig
    assert 'kind: Literal["bug"] = ...' in sig
    assert "maybe: str | None = None" in sig
    assert "either: int | str," in sig
    assert "multi: str | None = ..." in sig
    assert "ratio: float = ..." in sig  # floats cannot be Literal members


def test_arrays_are_sequences_in_and_lists_out() -> None:
    tool = _tool(
        "t.f",
        {"tags": {"type": "array", "items": {"type": "string"}}, "any": {"type": "array"}},
        required=["tags"],
        output={"type": "array", "items": {"type": "integer"}},
    )
    assert _sig(tool) == "tags: Sequence[str], any: Sequence[Any] = ...) -> list[int]"


def test_nested_objects_become_typed_dicts() -> None:
    owner = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
        "required": ["name"],
    }
    tool = _tool(
        "crm.add_contact",
        {"owner": owner, "meta": {"type": "object", "additionalProperties": {"type": "integer"}}},
        required=["owner"],
        output={"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    )
    stubs = build_stubs(Catalog([tool]))
    entry = stubs.tool_stubs["crm.add_contact"]
    assert entry.signature == (
        "async def tools.crm.add_contact(owner: AddContact_owner | Mapping[str, Any], "
        "meta: Mapping[str, int] = ...) -> AddContactResult"
    )
    # Untitled shapes are named by where they sit: Parent_field.
    assert "class AddContact_owner(TypedDict):\n    name: str\n    address: NotRequired[AddContact_owner_address]\n" in entry.types
    assert "class AddContact_owner_address(TypedDict):\n    city: str\n" in entry.types
    assert entry.types.endswith("class AddContactResult(TypedDict):\n    id: int")


def test_refs_resolve_to_shared_named_classes_and_recursion_terminates() -> None:
    defs = {
        "Node": {
            "type": "object",
            "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            "required": ["value"],
        },
        "Status": {"type": "string", "enum": ["a", "b"]},
    }
    a = _tool("tree.put", {"root": {"$ref": "#/$defs/Node"}, "s": {"$ref": "#/$defs/Status"}}, required=["root"], **{"$defs": defs})
    b = Tool("tree", "get", "", {"type": "object", "properties": {}}, _noop, output_schema={"$ref": "#/$defs/Node", "$defs": defs})
    stubs = build_stubs(Catalog([a, b]))
    module = stubs.namespace_modules["tree"]
    assert module.count("class Node(TypedDict):") == 1  # shared by both tools
    assert "    children: NotRequired[list[Node]]\n" in module
    assert "async def put(root: Node | Mapping[str, Any], s: Literal[\"a\", \"b\"] = ...) -> Any: ..." in module
    assert "async def get() -> Node: ..." in module
    assert "class Node(TypedDict):" in stubs.tool_stubs["tree.get"].types


def test_same_name_different_shape_gets_distinct_classes() -> None:
    one = _tool("x.a", {"p": {"$ref": "#/$defs/Item"}}, ["p"], **{"$defs": {"Item": {"type": "object", "properties": {"a": {"type": "integer"}}}}})
    two = _tool("x.b", {"p": {"$ref": "#/$defs/Item"}}, ["p"], **{"$defs": {"Item": {"type": "object", "properties": {"b": {"type": "string"}}}}})
    module = build_stubs(Catalog([one, two])).namespace_modules["x"]
    assert "class Item(TypedDict):\n    a: NotRequired[int]\n" in module
    # The second shape named Item takes the name of where it sits, not a counter.
    assert "class B_p(TypedDict):\n    b: NotRequired[str]\n" in module


def test_unknown_constructs_fall_back_to_any() -> None:
    tool = _tool(
        "t.f",
        {"a": {}, "b": {"$ref": "http://example.com/x"}, "c": {"allOf": [{"type": "string"}, {"minLength": 1}]}, "d": {"type": "weird"}},
        required=["a", "b", "c", "d"],
    )
    assert _sig(tool) == "a: Any, b: Any, c: Any, d: Any) -> Any"


def test_unwritable_parameter_names_make_the_tool_loose() -> None:
    # "from" is a keyword and "user-id" not an identifier: only **{...} can pass them.
    tool = _tool("mail.search", {"from": {"type": "string"}, "user-id": {"type": "integer"}, "q": {"type": "string"}})
    assert _sig(tool) == "*args: Any, **kwargs: Any) -> Any"


def test_declared_extra_properties_add_kwargs() -> None:
    tool = _tool("kv.put", {"key": {"type": "string"}}, ["key"], additionalProperties={"type": "integer"})
    assert _sig(tool) == "key: str, **kwargs: int) -> Any"


def test_typed_dict_keys_that_are_not_identifiers_use_the_functional_form() -> None:
    tool = _tool("t.f", {"h": {"type": "object", "properties": {"content-type": {"type": "string"}, "class": {"type": "integer"}}, "required": ["class"]}})
    module = build_stubs(Catalog([tool])).namespace_modules["t"]
    assert 'F_h = TypedDict("F_h", {"content-type": NotRequired[str], "class": int})' in module


def test_tool_named_like_a_builtin_does_not_shadow_annotations() -> None:
    tool = _tool("tickets.list", {"ids": {"type": "array", "items": {"type": "integer"}}}, output={"type": "array", "items": {"type": "string"}})
    module = build_stubs(Catalog([tool])).namespace_modules["tickets"]
    assert "from builtins import list as _list" in module
    assert "async def list(ids: Sequence[int] = ...) -> _list[str]: ..." in module


def test_unreachable_names_are_left_out() -> None:
    cat = Catalog([_tool("ok.import", {}), _tool("ok._hidden", {}), _tool("ok.fine", {}), _tool("class.x", {})])
    stubs = build_stubs(cat)
    assert stubs.tools_module == "from . import ok as ok\n"
    assert "def fine()" in stubs.namespace_modules["ok"]
    assert "import(" not in stubs.namespace_modules["ok"] and "_hidden" not in stubs.namespace_modules["ok"]


def test_stubs_are_cached_by_catalog_version() -> None:
    cat = Catalog([_tool("a.b", {})])
    first = build_stubs(cat)
    assert build_stubs(cat) is first
    cat.add(_tool("a.c", {}))
    second = build_stubs(cat)
    assert second is not first and "def c()" in second.namespace_modules["a"]
    assert second.version == cat.version


def test_same_catalog_in_any_order_gives_identical_stubs() -> None:
    tools = [_tool(f"n{i % 3}.t{i}", {"x": {"type": "integer"}}) for i in range(12)]
    a, b = build_stubs(Catalog(tools)), build_stubs(Catalog(reversed(tools)))
    assert (a.tools_module, dict(a.namespace_modules)) == (b.tools_module, dict(b.namespace_modules))


def test_stubs_grow_linearly_with_the_catalog() -> None:
    # What a blow-up would look like without timing anything (speed is bench/'s):
    # ten times the tools give about ten times the text, each tool declared once.
    props = {
        "id": {"type": "integer"},
        "opts": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}}},
        "mode": {"enum": ["x", "y"]},
    }

    def stubs_for(n: int):
        return build_stubs(Catalog([_tool(f"ns{i % 50}.tool_{i}", props, ["id"],
                                          output={"type": "object", "properties": {"ok": {"type": "boolean"}}})
                                    for i in range(n)]))

    def size(stubs) -> int:
        return len(stubs.tools_module) + sum(len(m) for m in dict(stubs.namespace_modules).values())

    small, big = stubs_for(100), stubs_for(1000)
    text = "\n".join(dict(big.namespace_modules).values())
    assert all(text.count(f"def tool_{i}(") == 1 for i in range(1000))
    assert size(big) <= 11 * size(small)


# --- the contract with the real checker ---------------------------------------------------

CONTRACT_TOOLS = [
    _tool(
        "tracker.create_ticket",
        {
            "title": {"type": "string"},
            "priority": {"type": "integer", "default": 3},
            "status": {"enum": ["open", "closed"], "default": "open"},
            "owner": {"$ref": "#/$defs/Owner"},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
        required=["title"],
        output={"type": "object", "properties": {"id": {"type": "integer"}, "title": {"type": "string"}}, "required": ["id", "title"]},
        **{"$defs": {"Owner": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
    ),
    _tool("tracker.list", {"limit": {"type": "integer", "default": 10}}, output={"type": "array", "items": {"type": "integer"}}),
    _tool("slack.post_message", {"channel": {"type": "string"}, "text": {"type": "string"}}, required=["channel", "text"]),
]


async def _run(code: str) -> tuple[str, object, list[str]]:
    """Type-check and run ``code`` the way the adapter must; return (outcome, value, calls made)."""
    import pydantic_monty as pm

    stubs = build_stubs(Catalog(CONTRACT_TOOLS))
    calls: list[str] = []

    def handler(address: str):
        async def call(*args, **kwargs):
            calls.append(address)
            return {"id": 7, "title": kwargs.get("title", "")} if address.endswith("create_ticket") else [1, 2]

        return call

    tree = {
        ns: pm.ExternalModule(
            {t.name: handler(t.address) for t in CONTRACT_TOOLS if t.namespace == ns}, stubs=stubs.namespace_modules[ns]
        )
        for ns in stubs.namespace_modules
    }

    async def search(query="", namespace=None, limit=12, offset=0):
        return {"results": [], "total": 0, "next_offset": None}

    async def describe(address):
        return [{"address": address}]

    async def anything(*args, **kwargs):
        return None

    lookup = {
        "search": search,
        "describe": describe,
        "sources": anything,
        "yield_control": anything,
        "wait_for": anything,
        "wait_for_signal": anything,
        "emit": lambda value: None,
    }
    async with pm.AsyncMonty(min_processes=1, max_processes=1, request_timeout=30) as pool:
        async with pool.checkout(
            type_check=True,
            type_check_stubs=stubs.prelude,
            external_modules={"tools": pm.ExternalModule(tree, stubs=stubs.tools_module)},
        ) as session:
            try:
                value = await session.feed_run(code, external_lookup=lookup)
            except pm.MontyTypingError as exc:
                return "rejected", str(exc), calls
    return "ran", value, calls


checker = pytest.mark.slow  # starts a real Monty worker and its bundled ty checker


@checker
@pytest.mark.parametrize(
    "code, expected",
    [
        ('import tools\n(await tools.tracker.create_ticket(title="x", owner={"name": "a"}, labels=["l"]))["id"]', 7),
        ('from tools import tracker\nt = await tracker.create_ticket(title="x", status="closed")\nt["title"]', "x"),
        ("import tools.slack\nawait tools.slack.post_message(channel='c', text='t')", [1, 2]),
        # Positional and mixed calls, in the order describe() shows.
        ("import tools.slack\nawait tools.slack.post_message('c', 't')", [1, 2]),
        ('import tools as t\nmake = t.tracker.create_ticket\n(await make("x", 2, status="open"))["id"]', 7),
        (
            'import asyncio\nimport tools\nlabels = []\nlabels.append("a")\nowner = {"name": "n"}\n'
            'a, b = await asyncio.gather(tools.tracker.list(limit=2), tools.tracker.create_ticket(title="y", owner=owner, labels=labels))\n'
            "[a, b['id']]",
            [[1, 2], 7],
        ),
        (
            'r = await search("ticket", namespace="tracker", limit=5)\nd = await describe(["tracker.list"])\n'
            'await sources()\nemit(r["total"])\nawait yield_control()\nawait wait_for("x", timeout=1.5)\n'
            'await wait_for_signal("go")\n[r["next_offset"], d[0]["address"]]',
            [None, ["tracker.list"]],
        ),
    ],
)
async def test_checker_accepts_correct_programs(code: str, expected: object) -> None:
    outcome, value, _ = await _run(code)
    assert outcome == "ran", value
    assert value == expected


@checker
@pytest.mark.parametrize(
    "code, diagnostic",
    [
        ('import tools\nawait tools.tracker.create_ticket(titel="x")', "Argument `titel` does not match any known parameter"),
        ("import tools\nawait tools.tracker.create_ticket(priority=1)", "No argument provided for required parameter `title`"),
        ('import tools\nawait tools.tracker.create_ticket(title=5)', "Expected `str`, found `Literal[5]`"),
        ('import tools\nawait tools.tracker.create_ticket(title="x", status="pending")', 'Expected `Literal["open", "closed"]`'),
        ("import tools\nawait tools.tracker.lst()", "has no member `lst`"),
        ('import tools\nawait tools.slack.post_message("c", "t", "x")', "Too many positional arguments"),
        ('import tools\nawait tools.slack.post_message("c", channel="d", text="t")', "Multiple values provided for parameter"),
        ("import tools\nawait tools.trackr.list()", "has no member `trackr`"),
        ('import tools\nt = await tools.tracker.create_ticket(title="x")\nt["nope"]', 'Unknown key "nope"'),
        ('await search(qery="x")', "Argument `qery` does not match any known parameter of function `search`"),
        ('await describe(5)', "Expected `str | list[str]`"),
        ("await emit(1)", "is not awaitable"),
    ],
)
async def test_checker_rejects_wrong_calls_before_anything_runs(code: str, diagnostic: str) -> None:
    outcome, message, calls = await _run(code)
    assert outcome == "rejected", message
    assert diagnostic in message
    assert calls == []


def test_nullable_recursive_definition_terminates() -> None:
    defs = {"N": {"type": ["object", "null"], "properties": {"next": {"$ref": "#/$defs/N"}}}}
    tool = _tool("t.f", {"n": {"$ref": "#/$defs/N"}}, ["n"], **{"$defs": defs})
    module = build_stubs(Catalog([tool])).namespace_modules["t"]
    assert module.count("TypedDict):") == 1
    assert "next: NotRequired[Any]" in module


def test_class_names_never_collide_with_keywords_or_tools() -> None:
    tool = _tool("t.Result", {"x": {"type": "object", "title": "None", "properties": {"a": {"type": "integer"}}}}, ["x"],
                 output={"type": "object", "title": "Result", "properties": {"b": {"type": "string"}}})
    module = build_stubs(Catalog([tool])).namespace_modules["t"]
    assert "class None_(TypedDict):" in module
    assert "class ResultResult(TypedDict):" in module
    assert "async def Result(x: None_ | Mapping[str, Any]) -> ResultResult: ..." in module


EDGE_TOOLS = [
    _tool("tickets.list", {"ids": {"type": "array", "items": {"type": "integer"}}}, output={"type": "array", "items": {"type": "string"}}),
    _tool("tickets.import", {}),  # a keyword: unreachable, left out
    _tool("tickets.headers", {"h": {"type": "object", "properties": {"content-type": {"type": "string"}}}}, ["h"]),
    _tool("tickets.loose", {"from": {"type": "string"}}),
    _tool(
        "tickets.tree",
        {"root": {"$ref": "#/$defs/Node"}},
        ["root"],
        output={"type": "object", "title": "None", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        **{"$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}},
    ),
]


def test_edge_case_stubs_are_valid_python() -> None:
    import ast

    stubs = build_stubs(Catalog(EDGE_TOOLS))
    for text in [stubs.prelude, stubs.tools_module, *stubs.namespace_modules.values()]:
        ast.parse(text)


@checker
async def test_checker_accepts_edge_case_stubs() -> None:
    import pydantic_monty as pm

    stubs = build_stubs(Catalog(EDGE_TOOLS))

    async def ok(**kwargs):
        return kwargs

    # ExternalModule itself refuses keyword attribute names, so `import` is left out here too.
    attrs = {t.name: ok for t in EDGE_TOOLS if t.name != "import"}
    tree = {"tickets": pm.ExternalModule(attrs, stubs=stubs.namespace_modules["tickets"])}
    code = (
        "import tools\n"
        "a = await tools.tickets.list(ids=[1, 2])\n"
        'b = await tools.tickets.headers(h={"content-type": "json"})\n'
        'c = await tools.tickets.loose(**{"from": "x"})\n'
        'd = await tools.tickets.tree(root={"kids": [{"kids": []}]})\n'
        'd.get("ok")\n'
        "[len(a), b, c]"
    )
    async with pm.AsyncMonty(min_processes=1, max_processes=1, request_timeout=30) as pool:
        async with pool.checkout(
            type_check=True,
            type_check_stubs=stubs.prelude,
            external_modules={"tools": pm.ExternalModule(tree, stubs=stubs.tools_module)},
        ) as session:
            value = await session.feed_run(code)
            assert value == [1, {"h": {"content-type": "json"}}, {"from": "x"}]
            with pytest.raises(pm.MontyTypingError, match="unknown-argument"):
                await session.feed_run("import tools\nawait tools.tickets.list(idz=[1])")


def test_positional_order_is_required_first_then_optional_in_schema_order() -> None:
    from tether._tools.binding import bind
    from tether._tools.params import parameters

    tool = _tool("t.f", {"a": {"type": "integer", "default": 1}, "b": {"type": "string"}, "c": {"type": "boolean"}},
                 required=["b"])
    assert parameters(tool).positional == ("b", "a", "c")
    assert _sig(tool) == "b: str, a: int = 1, c: bool = ...) -> Any"
    assert bind(tool, ("x", 2), {"c": True}) == {"b": "x", "a": 2, "c": True}
