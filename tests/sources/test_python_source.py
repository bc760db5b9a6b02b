"""Python functions as tools: schemas from signatures, namespaces, handlers."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import NotRequired, TypedDict

from tether._sources import tool, tools_from_module
from tether._tools import Catalog, build_stubs
from tether.errors import InvalidArguments, UsageError


class Owner(BaseModel):
    name: str
    email: str | None = None


class Window(TypedDict):
    start: str
    end: NotRequired[str]


class Ticket(BaseModel):
    id: int
    title: str
    owner: Owner | None = None


@tool(namespace="tracker", read_only=False, destructive=True, idempotent=True, open_world=True, title="New ticket")
async def create_ticket(
    title: str,
    priority: Annotated[int, Field(ge=1, le=5)] = 3,
    status: Literal["open", "closed"] = "open",
    owner: Owner | None = None,
    window: Window | None = None,
) -> Ticket:
    """Open a ticket in the tracker.

    Tickets start open unless told otherwise.

    Args:
        title: One line saying what is wrong,
            as the customer put it.
        priority: 1 is most urgent.
    Returns:
        The new ticket.
    """
    return Ticket(id=1, title=title, owner=owner)


@tool
def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


@tool(name="echo_all", namespace="util")
def echo(text, **extra: Any):
    return {"text": text, **extra}


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def test_decorated_functions_stay_callable() -> None:
    assert add(2, 3) == 5
    assert add.__tether_tool__.name == "add"
    assert create_ticket.__tether_tool__.namespace == "tracker"


def test_schema_from_signature_and_docstring() -> None:
    t = create_ticket.__tether_tool__.to_tool()
    assert t.address == "tracker.create_ticket"
    assert t.title == "New ticket"
    assert t.description == "Open a ticket in the tracker."
    schema = t.input_schema
    assert schema["required"] == ["title"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["title"] == {"type": "string", "description": "One line saying what is wrong, as the customer put it."}
    assert props["priority"]["minimum"] == 1 and props["priority"]["default"] == 3
    assert props["priority"]["description"] == "1 is most urgent."
    assert props["status"]["enum"] == ["open", "closed"]
    assert "Owner" in schema["$defs"] and "Window" in schema["$defs"]
    assert t.output_schema["$defs"]["Owner"]["properties"]["name"] == {"title": "Name", "type": "string"}
    assert t.annotations.to_dict() == {"read_only": False, "destructive": True, "idempotent": True, "open_world": True}


def test_stubs_from_a_python_tool_keep_its_types() -> None:
    t = create_ticket.__tether_tool__.to_tool()
    signature = build_stubs(Catalog([t])).tool_stubs[t.address].signature
    assert signature == (
        "async def tools.tracker.create_ticket(title: str, priority: int = 3, "
        'status: Literal["open", "closed"] = "open", owner: Owner | Mapping[str, Any] | None = None, '
        "window: Window | Mapping[str, Any] | None = None) -> Ticket"
    )


async def test_handler_validates_calls_and_returns_json() -> None:
    t = create_ticket.__tether_tool__.to_tool()
    result = await t.handler({"title": "Printer", "owner": {"name": "Ann"}})
    assert result == {"id": 1, "title": "Printer", "owner": {"name": "Ann", "email": None}}


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"titel": "x"}, "missing required argument 'title'; unknown argument 'titel'"),
        ({"title": "x", "priority": 9}, "argument 'priority': Input should be less than or equal to 5"),
        ({"title": "x", "owner": {"email": "e"}}, "missing required field 'owner.name'"),
        ({"title": "x", "window": {"end": "e"}}, "missing required field 'window.start'"),
    ],
)
async def test_handler_refuses_bad_arguments_without_calling(args: dict, fragment: str) -> None:
    t = create_ticket.__tether_tool__.to_tool()
    with pytest.raises(InvalidArguments) as info:
        await t.handler(args)
    assert fragment in info.value.message
    assert info.value.message.startswith("tracker.create_ticket: ")


async def test_an_error_inside_the_tool_is_not_an_argument_error() -> None:
    @tool(namespace="t")
    def strict(n: int) -> int:
        Owner.model_validate({})  # raises pydantic.ValidationError from the tool's own body
        return n

    with pytest.raises(Exception) as info:
        await strict.__tether_tool__.to_tool().handler({"n": 1})
    assert not isinstance(info.value, InvalidArguments)


async def test_sync_tool_and_var_keyword() -> None:
    t = echo.__tether_tool__.to_tool()
    assert t.address == "util.echo_all"
    assert t.input_schema["additionalProperties"] is True
    assert t.output_schema is None  # no return annotation
    assert await t.handler({"text": "hi", "more": 1}) == {"text": "hi", "more": 1}
    # Extras are declared, so the catalog lets them through too.
    assert Catalog([t]).validate_args("util.echo_all", {"text": "a", "x": 1}) == {"text": "a", "x": 1}


def test_namespace_comes_from_module_constant_then_module_name() -> None:
    def f(x: int) -> int:
        return x

    mod = _module("acme.services.billing", TETHER_NAMESPACE="money")
    f.__module__ = mod.__name__
    sys.modules[mod.__name__] = mod
    try:
        mod.f = tool(f)
        assert tools_from_module(mod)[0].address == "money.f"
        del mod.TETHER_NAMESPACE
        assert tools_from_module(mod)[0].address == "billing.f"
    finally:
        del sys.modules[mod.__name__]


def test_tools_from_a_file_path(tmp_path: Path) -> None:
    path = tmp_path / "weather-tools.py"
    path.write_text(
        textwrap.dedent(
            '''
            from __future__ import annotations
            from pydantic import BaseModel
            from tether._sources import tool

            @tool(read_only=True)
            async def forecast(city: str, days: int = 3) -> list[Day]:
                """Daily forecast."""
                return [Day(high=20.5)] * days

            class Day(BaseModel):  # defined after use: schemas are built on collection
                high: float

            def helper():
                pass
            '''
        )
    )
    [t] = tools_from_module(path)
    assert t.address == "weather_tools.forecast"
    assert t.annotations.read_only is True
    assert t.output_schema["items"] == {"$ref": "#/$defs/Day"}
    assert tools_from_module(str(path))[0].address == "weather_tools.forecast"


async def test_tools_from_a_dotted_module_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "crm.py").write_text(
        "from tether._sources import tool\n\n@tool\ndef find_customer(email: str) -> dict:\n    return {'email': email}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    [t] = tools_from_module("mypkg.crm")
    assert t.address == "crm.find_customer"
    assert await t.handler({"email": "a@b"}) == {"email": "a@b"}


def test_unimportable_module_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="cannot import tool module"):
        tools_from_module("no_such_module_here_xyz")
    with pytest.raises(UsageError, match="does not exist"):
        tools_from_module("/nonexistent/tools.py")


def test_positional_only_parameters_are_refused() -> None:
    def f(a: int, /) -> int:
        return a

    with pytest.raises(UsageError, match="needs a name") as info:
        tool(f, ).__tether_tool__.to_tool("ns")
    assert info.value.code == "invalid_tool_definition"


def test_unsupported_types_are_a_definition_error() -> None:
    class Opaque:
        pass

    def f(x: Opaque) -> int:
        return 1

    with pytest.raises(UsageError, match="pydantic cannot use") as info:
        tool(f).__tether_tool__.to_tool("ns")
    assert info.value.code == "invalid_tool_definition"


def test_keyword_only_parameters_stay_keyword_only() -> None:
    from tether._tools.binding import bind

    def move(src: str, dst: str = "/tmp", *, force: bool = False, mode: int) -> str:
        return src

    t = tool(move).__tether_tool__.to_tool("fs")
    assert t.keyword_only == ("force", "mode")
    assert build_stubs(Catalog([t])).tool_stubs[t.address].signature == (
        "async def tools.fs.move(src: str, dst: str = \"/tmp\", *, force: bool = False, mode: int) -> str"
    )
    assert bind(t, ("a", "b"), {"mode": 1}) == {"src": "a", "dst": "b", "mode": 1}
    with pytest.raises(InvalidArguments, match=r"takes 2 positional arguments but 3 were given; signature: tools\.fs\.move\("):
        bind(t, ("a", "b", True), {"mode": 1})
