"""The catalog: lookup with suggestions, namespaces, versioning, argument validation."""

from __future__ import annotations

import pytest

from tether._tools import Catalog, Tool, describe, list_sources
from tether.errors import InvalidArguments, UnknownTool, UsageError


async def _noop(args):
    return args


TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "status": {"enum": ["open", "closed"]},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"],
        },
        "labels": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title"],
}


def _tool(address: str, schema: dict | None = None, description: str = "") -> Tool:
    ns, name = address.split(".")
    return Tool(ns, name, description, schema or {"type": "object", "properties": {}}, _noop)


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(
        [
            _tool("tracker.create_ticket", TICKET_SCHEMA, "Open a ticket."),
            _tool("tracker.get_ticket", {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}),
            _tool("tracker.list_tickets"),
            _tool("github.create_issue"),
            _tool("slack.post_message"),
        ]
    )


def test_get_returns_the_tool_and_accepts_the_call_spelling(catalog: Catalog) -> None:
    assert catalog.get("tracker.get_ticket").name == "get_ticket"
    assert catalog.get("tools.tracker.get_ticket").address == "tracker.get_ticket"
    assert "tracker.get_ticket" in catalog and "tracker.nope" not in catalog
    assert len(catalog) == 5


def test_duplicate_address_is_refused(catalog: Catalog) -> None:
    with pytest.raises(UsageError) as info:
        catalog.add(_tool("tracker.get_ticket"))
    assert info.value.code == "duplicate_tool"


@pytest.mark.parametrize(
    "wrong, expected",
    [
        ("tracker.get_tiket", "tracker.get_ticket"),  # typo in the name
        ("trackr.get_ticket", "tracker.get_ticket"),  # typo in the namespace
        ("github.post_message", "slack.post_message"),  # right name, wrong namespace
        ("create_issue", "github.create_issue"),  # no namespace at all
    ],
)
def test_unknown_tool_suggests_the_near_miss(catalog: Catalog, wrong: str, expected: str) -> None:
    with pytest.raises(UnknownTool) as info:
        catalog.get(wrong)
    assert info.value.code == "unknown_tool"
    assert info.value.details["suggestions"][0] == expected
    assert f"did you mean {expected}" in info.value.message


def test_unknown_tool_with_nothing_close_has_no_suggestions(catalog: Catalog) -> None:
    with pytest.raises(UnknownTool) as info:
        catalog.get("weather.forecast")
    assert info.value.details["suggestions"] == []
    assert "did you mean" not in info.value.message


def test_namespaces_count_and_summarise(catalog: Catalog) -> None:
    catalog.set_namespace_summary("tracker", "Support   tickets:\ncreate and triage")
    assert catalog.namespaces() == [
        {"namespace": "github", "tools": 1, "summary": "create_issue"},
        {"namespace": "slack", "tools": 1, "summary": "post_message"},
        {"namespace": "tracker", "tools": 3, "summary": "Support tickets: create and triage"},
    ]
    assert list_sources(catalog) == catalog.namespaces()


def test_derived_summary_is_bounded() -> None:
    cat = Catalog([_tool(f"big.tool_{i}") for i in range(10)])
    assert cat.namespaces()[0]["summary"] == "tool_0, tool_1, tool_2, tool_3, …"


def test_version_moves_on_every_change_and_memo_follows(catalog: Catalog) -> None:
    builds = []
    first = catalog.memo("k", lambda: builds.append(1) or len(builds))
    assert catalog.memo("k", lambda: builds.append(1) or len(builds)) == first
    v = catalog.version
    catalog.add(_tool("weather.forecast"))
    assert catalog.version > v
    assert catalog.memo("k", lambda: builds.append(1) or len(builds)) == 2
    v = catalog.version
    catalog.set_namespace_summary("weather", "Forecasts")
    assert catalog.version > v
    v = catalog.version
    catalog.remove("weather.forecast")
    assert catalog.version > v and "weather.forecast" not in catalog


def test_tools_are_sorted_whatever_the_insertion_order() -> None:
    a = Catalog([_tool("b.x"), _tool("a.y"), _tool("a.b")])
    assert [t.address for t in a.tools()] == ["a.b", "a.y", "b.x"]


# --- argument validation ---------------------------------------------------------


def test_valid_arguments_are_returned(catalog: Catalog) -> None:
    args = {"title": "Printer on fire", "priority": 2, "owner": {"name": "Ann"}, "labels": ["hw"]}
    assert catalog.validate_args("tracker.create_ticket", args) == args


def _problems(catalog: Catalog, address: str, args) -> tuple[str, list[dict]]:
    with pytest.raises(InvalidArguments) as info:
        catalog.validate_args(address, args)
    assert info.value.code == "invalid_arguments"
    return info.value.message, info.value.details["errors"]


def test_missing_and_unknown_arguments_are_named(catalog: Catalog) -> None:
    message, errors = _problems(catalog, "tracker.create_ticket", {"titel": "x"})
    assert "missing required argument 'title'" in message
    assert "unknown argument 'titel' (did you mean 'title'?)" in message
    assert {e["field"] for e in errors} == {"title", "titel"}
    assert message.startswith("tracker.create_ticket: ")


def test_wrong_type_says_what_was_expected_and_given(catalog: Catalog) -> None:
    message, _ = _problems(catalog, "tracker.create_ticket", {"title": "x", "priority": "high"})
    assert "argument 'priority' must be integer, got string \"high\"" in message


def test_enum_lists_the_allowed_values(catalog: Catalog) -> None:
    message, _ = _problems(catalog, "tracker.create_ticket", {"title": "x", "status": "pending"})
    assert "argument 'status' must be one of \"open\", \"closed\", got \"pending\"" in message


def test_nested_fields_are_named_by_path(catalog: Catalog) -> None:
    message, errors = _problems(catalog, "tracker.create_ticket", {"title": "x", "owner": {"email": 3}})
    assert "missing required field 'owner.name'" in message
    assert "field 'owner.email' must be string, got integer 3" in message
    _, errors = _problems(catalog, "tracker.create_ticket", {"title": "x", "labels": ["ok", 5]})
    assert errors[0]["field"] == "labels.1"


def test_constraint_violations_keep_the_schema_message(catalog: Catalog) -> None:
    message, _ = _problems(catalog, "tracker.create_ticket", {"title": "x", "priority": 9})
    assert "argument 'priority'" in message and "maximum" in message


def test_every_problem_is_reported_at_once(catalog: Catalog) -> None:
    _, errors = _problems(catalog, "tracker.create_ticket", {"priority": "x", "status": 1, "extra": True})
    assert {e["field"] for e in errors} == {"title", "priority", "status", "extra"}


def test_non_object_arguments_are_refused(catalog: Catalog) -> None:
    message, _ = _problems(catalog, "tracker.get_ticket", [1, 2])
    assert "must be keyword arguments" in message


def test_long_values_are_clipped_in_messages(catalog: Catalog) -> None:
    message, _ = _problems(catalog, "tracker.get_ticket", {"id": "9" * 500})
    assert len(message) < 200


def test_declared_additional_properties_are_allowed() -> None:
    cat = Catalog([_tool("kv.put", {"type": "object", "properties": {"key": {"type": "string"}}, "additionalProperties": True})])
    assert cat.validate_args("kv.put", {"key": "a", "anything": 1}) == {"key": "a", "anything": 1}
    typed = Catalog(
        [_tool("kv.put", {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}})]
    )
    with pytest.raises(InvalidArguments, match="'x' must be integer"):
        typed.validate_args("kv.put", {"x": "no"})


def test_a_broken_schema_still_checks_names() -> None:
    cat = Catalog([_tool("bad.tool", {"type": "object", "properties": {"a": {"type": "no-such-type"}}, "required": ["a"]})])
    assert cat.validate_args("bad.tool", {"a": 1}) == {"a": 1}
    with pytest.raises(InvalidArguments, match="missing required argument 'a'"):
        cat.validate_args("bad.tool", {})
    with pytest.raises(InvalidArguments, match="unknown argument 'b'"):
        cat.validate_args("bad.tool", {"a": 1, "b": 2})


def test_validating_an_unknown_tool_raises_unknown_tool(catalog: Catalog) -> None:
    with pytest.raises(UnknownTool):
        catalog.validate_args("tracker.nope", {})


# --- describe ----------------------------------------------------------------------


def test_describe_gives_signature_types_and_schema(catalog: Catalog) -> None:
    [entry] = describe(catalog, "tracker.create_ticket")
    assert list(entry)[:2] == ["address", "signature"]  # the signature comes first
    assert entry["address"] == "tracker.create_ticket"
    assert entry["signature"].startswith("async def tools.tracker.create_ticket(title: str,")
    assert "class CreateTicket_owner(TypedDict):" in entry["types"]
    assert entry["description"] == "Open a ticket."
    assert entry["annotations"]["read_only"] is False
    # The schema is what the signature already says: only the full detail repeats it.
    assert "input_schema" not in entry and "note" not in entry
    [full] = describe(catalog, "tracker.create_ticket", detail="full")
    assert full["input_schema"] == TICKET_SCHEMA


def test_describe_a_list_partly_succeeds(catalog: Catalog) -> None:
    entries = describe(catalog, ["tracker.get_ticket", "tracker.get_tiket", "tools.slack.post_message"])
    assert [e["address"] for e in entries] == ["tracker.get_ticket", "tracker.get_tiket", "slack.post_message"]
    assert entries[1]["error"] == "unknown_tool" and "signature" not in entries[1]
    assert entries[1]["suggestions"][0] == "tracker.get_ticket"
    assert entries[0]["signature"] == "async def tools.tracker.get_ticket(id: int) -> Any"
    assert entries[0]["types"] == ""
