"""describe() as a model meets it on a real catalog: signature first, bounded, names from the schema, stable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tether._tools import Catalog, Tool, describe
from tether._tools.describe import DEFAULT_BYTES
from tether._tools.model import Annotations
from tether.errors import UsageError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "github_schemas.json"
RESULT_LIMIT = 30_000  # a run's result limit (Limits.result_bytes)


async def _noop(args):
    return args


def _catalog() -> Catalog:
    ops = json.loads(FIXTURE.read_text())["operations"]
    return Catalog(
        Tool(
            namespace="github",
            name=op["name"],
            description=op["description"],
            input_schema=op["input_schema"],
            output_schema=op["output_schema"],
            title=op["title"],
            handler=_noop,
            annotations=Annotations(read_only=op["read_only"]),
            source="openapi",
        )
        for op in ops
    )


@pytest.fixture(scope="module")
def github() -> Catalog:
    return _catalog()


def _bytes(value) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def test_one_operation_fits_two_kilobytes_with_the_signature_first(github: Catalog) -> None:
    for tool in github.tools():
        [entry] = describe(github, tool.address)
        assert _bytes(entry) <= DEFAULT_BYTES == 2048, tool.address
        assert list(entry)[:2] == ["address", "signature"]
        assert entry["signature"].startswith(f"async def tools.{tool.address}(")


def test_what_does_not_fit_is_named_with_the_way_to_see_it(github: Catalog) -> None:
    [entry] = describe(github, "github.pulls_list")
    # The shape the tool returns comes first, as much of it as fits.
    assert entry["signature"].endswith("-> list[PullRequestSimple]")
    assert entry["types"].startswith("class PullRequestSimple(TypedDict):\n    url: str\n")
    assert "more fields" in entry["types"]
    assert "detail='full'" in entry["note"] and "SimpleUser" in entry["note"]


def test_full_detail_has_every_shape_and_the_schema(github: Catalog) -> None:
    [full] = describe(github, "github.pulls_list", detail="full")
    assert _bytes(full) > 10_000
    assert "note" not in full and full["input_schema"]["properties"]["state"]["enum"] == ["open", "closed", "all"]
    for shape in ("PullRequestSimple", "SimpleUser", "Milestone", "PullRequestSimple_head", "PullRequestSimple_labels"):
        assert f"class {shape}(TypedDict):" in full["types"], shape
    # One class per shape: the user appears in many fields, declared once.
    assert full["types"].count("class SimpleUser(TypedDict):") == 1


def test_nested_shapes_are_named_from_the_schema_never_a_counter(github: Catalog) -> None:
    for detail in ("default", "full"):
        for entry in describe(github, [t.address for t in github.tools()], detail=detail):
            text = entry["signature"] + entry["types"]
            for word in text.replace("[", " ").replace("]", " ").replace("|", " ").replace(",", " ").split():
                if word[:1].isupper() and word.rstrip(":").isidentifier():
                    assert not word.rstrip(":")[-1].isdigit(), (entry["address"], word)


def test_five_operations_at_once_fit_the_result_limit(github: Catalog) -> None:
    addresses = [t.address for t in github.tools()]
    five = (addresses * 2)[:5]
    assert _bytes(describe(github, five)) <= RESULT_LIMIT


def test_the_same_catalog_describes_identically_in_another_process(github: Catalog) -> None:
    here = json.dumps(describe(github, [t.address for t in github.tools()]), sort_keys=True)
    code = (
        "import json, sys; sys.path.insert(0, 'tests/tools'); import test_describe as t\n"
        "c = t._catalog(); from tether._tools import describe\n"
        "print(json.dumps(describe(c, [x.address for x in c.tools()]), sort_keys=True))"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).parent.parent.parent, env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout.strip()
    assert there == here


def test_names_do_not_change_when_the_catalog_grows(github: Catalog) -> None:
    before = describe(github, "github.pulls_list", detail="full")[0]["types"]
    bigger = _catalog()
    bigger.add(Tool("github", "aaa_first", "Sorts before everything.", {"type": "object"}, _noop,
                    output_schema={"type": "object", "title": "Simple User", "properties": {"other": {"type": "string"}}}))
    assert describe(bigger, "github.pulls_list", detail="full")[0]["types"] == before


def test_unknown_detail_is_a_usage_error(github: Catalog) -> None:
    with pytest.raises(UsageError) as info:
        describe(github, "github.pulls_list", detail="everything")
    assert info.value.code == "invalid_arguments"


async def test_parameters_a_python_call_cannot_name_are_listed_in_the_order_positions_fill():
    # An MCP tool taking "from" (a keyword) and "x-trace": the signature can only be
    # (*args, **kwargs), so describe says the names, the order and the schema.
    from tether._runtime import Runtime

    async def send(args):
        return args

    schema = {"type": "object", "properties": {"x-trace": {"type": "string"}, "from": {"type": "string"},
                                               "to": {"type": "string"}}, "required": ["from", "to"]}
    mail = Tool("mail", "send", "Send mail.", schema, send, annotations=Annotations(read_only=True), source="mcp")
    [entry] = describe(Catalog([mail]), "mail.send")
    assert list(entry)[:3] == ["address", "signature", "parameters"]
    assert entry["parameters"].endswith(': "from", "to", "x-trace" (optional)')
    assert entry["input_schema"] == schema and _bytes(entry) <= DEFAULT_BYTES
    assert describe(Catalog([mail]), "mail.send", detail="full")[0]["parameters"] == entry["parameters"]
    # The order shown is the order a positional call fills.
    async with Runtime(tools=[mail]) as rt:
        r = await rt.execute('import tools\nawait tools.mail.send("a@x", "b@x", "t1")')
    assert r.result == {"from": "a@x", "to": "b@x", "x-trace": "t1"}, r.error
    # A schema too big to show whole is named in the note instead.
    big = dict(schema, properties={**schema["properties"], **{f"p{i}": {"type": "string", "description": "x" * 80}
                                                              for i in range(20)}})
    [entry] = describe(Catalog([Tool("mail", "send", "Send mail.", big, send, source="mcp")]), "mail.send")
    assert "input_schema" not in entry and "the input schema is left out" in entry["note"]
    assert _bytes(entry) <= DEFAULT_BYTES
    # Tools whose parameters are all Python names need no such line.
    assert "parameters" not in describe(_catalog(), "github.pulls_list")[0]
