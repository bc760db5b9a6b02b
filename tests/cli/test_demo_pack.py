"""The demo help desk: its data, each tool, writes, fresh state, the demo program."""

from __future__ import annotations

import ast
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from tether._sources.python import tools_from_module
from tether._tools.model import Tool
from tether.demo import DEMO_PROGRAM
from tether.demo import helpdesk as helpdesk_module
from tether.demo.helpdesk import AGENTS, FIXTURE_NOW, HelpDesk, make_helpdesk
from tether.errors import InvalidArguments

READS = ("search_customers", "get_customer", "list_tickets", "get_ticket", "list_comments", "ticket_stats")
WRITES = ("create_ticket", "add_comment", "close_ticket", "assign_ticket")


class Desk:
    """Calls a desk's tools the way tether does: through each Tool's handler."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}

    async def __call__(self, name: str, **args: Any) -> Any:
        return await self.tools[name].handler(args)


@pytest.fixture
def desk() -> Desk:
    return Desk(make_helpdesk())


async def all_tickets(desk: Desk) -> list[dict[str, Any]]:
    return await desk("list_tickets", limit=200)


# --- the data -----------------------------------------------------------------


async def test_fixture_size_and_shape(desk: Desk) -> None:
    customers = await desk("search_customers", query="")
    tickets = await all_tickets(desk)
    comments = [c for t in tickets for c in await desk("list_comments", ticket_id=t["id"])]
    assert len(customers) == 12
    assert len(tickets) == 40
    assert len(comments) == 60
    assert set(Counter(t["status"] for t in tickets)) == {"open", "pending", "closed"}
    assert set(Counter(t["priority"] for t in tickets)) == {"low", "normal", "high", "urgent"}
    assert {t["customer_id"] for t in tickets} == {c["id"] for c in customers}
    assert any(c["internal"] for c in comments) and not all(c["internal"] for c in comments)
    assert all(t["created_at"] < FIXTURE_NOW.isoformat().replace("+00:00", "Z") for t in tickets)


async def test_fixture_is_deterministic() -> None:
    first, second = Desk(make_helpdesk()), Desk(make_helpdesk())
    assert await all_tickets(first) == await all_tickets(second)
    assert await first("list_comments", ticket_id="T1010") == await second("list_comments", ticket_id="T1010")
    other = Desk(make_helpdesk(seed=1))
    assert await all_tickets(other) != await all_tickets(first)


def test_tools_are_annotated_and_typed() -> None:
    tools = {t.name: t for t in make_helpdesk()}
    assert set(tools) == set(READS + WRITES)
    assert all(t.namespace == "helpdesk" for t in tools.values())
    for name in READS:
        assert tools[name].annotations.read_only, name
    for name in WRITES:
        assert tools[name].is_write, name
    assert tools["close_ticket"].annotations.destructive
    assert tools["assign_ticket"].annotations.idempotent
    assert not tools["create_ticket"].annotations.idempotent
    assert all(t.output_schema for t in tools.values())
    assert all(t.description and t.title for t in tools.values())
    assert tools["list_tickets"].input_schema["properties"]["limit"]["description"]


# --- reads --------------------------------------------------------------------


async def test_search_customers(desk: Desk) -> None:
    assert [c["id"] for c in await desk("search_customers", query="fjord")] == ["C004"]
    assert [c["name"] for c in await desk("search_customers", query="MEI")] == ["Mei Lin"]
    assert [c["id"] for c in await desk("search_customers", query="@kestrelhealth")] == ["C005"]
    assert await desk("search_customers", query="no such customer") == []


async def test_get_customer(desk: Desk) -> None:
    customer = await desk("get_customer", customer_id="C001")
    assert customer["name"] == "Ada Okafor"
    assert customer["plan"] == "enterprise"
    with pytest.raises(LookupError, match="no customer 'C999'"):
        await desk("get_customer", customer_id="C999")


async def test_list_tickets_filters(desk: Desk) -> None:
    tickets = await all_tickets(desk)
    assert [t["created_at"] for t in tickets] == sorted(t["created_at"] for t in tickets)
    open_ = await desk("list_tickets", status="open")
    assert open_ and all(t["status"] == "open" for t in open_)
    assert len(open_) == sum(t["status"] == "open" for t in tickets)
    mine = await desk("list_tickets", customer_id="C003")
    assert mine and all(t["customer_id"] == "C003" for t in mine)
    both = await desk("list_tickets", status="open", priority="urgent")
    assert both and all(t["status"] == "open" and t["priority"] == "urgent" for t in both)
    assert len(await desk("list_tickets", limit=3)) == 3
    assert len(await desk("list_tickets")) == 40  # default limit 50
    assert "body" not in tickets[0]


async def test_list_tickets_rejects_bad_filters(desk: Desk) -> None:
    with pytest.raises(LookupError, match="no customer 'nobody'"):
        await desk("list_tickets", customer_id="nobody")
    with pytest.raises(ValueError, match="limit must be between 1 and 200"):
        await desk("list_tickets", limit=0)
    # The schema lists the statuses, so tether refuses before the tool runs...
    with pytest.raises(InvalidArguments, match="status"):
        await desk("list_tickets", status="urgent")
    # ...and a direct call gets the same answer from the tool itself.
    with pytest.raises(ValueError, match="status must be one of open, pending, closed"):
        await HelpDesk().list_tickets(status="urgent")  # type: ignore[arg-type]


async def test_get_ticket(desk: Desk) -> None:
    ticket = await desk("get_ticket", ticket_id="T1001")
    assert ticket["title"] == "Cannot log in after password reset"
    assert ticket["body"]
    assert ticket["comment_count"] == len(await desk("list_comments", ticket_id="T1001"))
    with pytest.raises(LookupError, match="no ticket 'T9999'; ids look like 'T1001'"):
        await desk("get_ticket", ticket_id="T9999")


async def test_list_comments(desk: Desk) -> None:
    counts = {t["id"]: len(await desk("list_comments", ticket_id=t["id"])) for t in await all_tickets(desk)}
    busiest = max(counts, key=lambda ticket_id: counts[ticket_id])
    comments = await desk("list_comments", ticket_id=busiest)
    assert len(comments) >= 2
    assert [c["created_at"] for c in comments] == sorted(c["created_at"] for c in comments)
    ticket = await desk("get_ticket", ticket_id=busiest)
    assert all(ticket["created_at"] < c["created_at"] for c in comments)
    with pytest.raises(LookupError, match="no ticket 'T0'"):
        await desk("list_comments", ticket_id="T0")


async def test_ticket_stats_agree_with_the_tickets(desk: Desk) -> None:
    tickets = await all_tickets(desk)
    stats = await desk("ticket_stats")
    assert stats["total"] == 40
    assert stats["by_status"] == {s: sum(t["status"] == s for t in tickets) for s in ("open", "pending", "closed")}
    assert sum(stats["by_priority"].values()) == 40
    open_ = [t for t in tickets if t["status"] == "open"]
    assert stats["open_unassigned"] == sum(t["assignee"] is None for t in open_)
    assert stats["oldest_open_created_at"] == min(t["created_at"] for t in open_)


# --- writes -------------------------------------------------------------------


async def test_create_ticket(desk: Desk) -> None:
    ticket = await desk("create_ticket", customer_id="C002", title="Oven API down", body="All calls fail.")
    assert ticket["id"] == "T1041"
    assert (ticket["status"], ticket["priority"], ticket["assignee"]) == ("open", "normal", None)
    assert ticket["created_at"] == "2025-06-02T09:01:00Z"  # the default clock: one minute per write
    assert (await desk("get_ticket", ticket_id="T1041"))["title"] == "Oven API down"
    assert (await desk("ticket_stats"))["total"] == 41
    again = await desk("create_ticket", customer_id="C002", title="Oven API down", body="All calls fail.")
    assert again["id"] == "T1042"  # not idempotent: a second ticket


async def test_create_ticket_rejects_bad_input(desk: Desk) -> None:
    with pytest.raises(LookupError, match="no customer 'C404'"):
        await desk("create_ticket", customer_id="C404", title="x", body="y")
    with pytest.raises(ValueError, match="title must not be empty"):
        await desk("create_ticket", customer_id="C001", title="  ", body="y")
    with pytest.raises(InvalidArguments, match="priority"):
        await desk("create_ticket", customer_id="C001", title="x", body="y", priority="critical")
    assert (await desk("ticket_stats"))["total"] == 40


async def test_add_comment(desk: Desk) -> None:
    before = await desk("get_ticket", ticket_id="T1002")
    comment = await desk("add_comment", ticket_id="T1002", body="Looking into it.", internal=True)
    assert comment["id"] == 61
    assert comment["internal"] is True
    assert comment["author"] == before["assignee"]
    after = await desk("get_ticket", ticket_id="T1002")
    assert after["comment_count"] == before["comment_count"] + 1
    assert after["updated_at"] == comment["created_at"]
    assert (await desk("list_comments", ticket_id="T1002"))[-1] == comment
    with pytest.raises(LookupError):
        await desk("add_comment", ticket_id="T0", body="hi")
    with pytest.raises(ValueError, match="body must not be empty"):
        await desk("add_comment", ticket_id="T1002", body="")


async def test_close_ticket(desk: Desk) -> None:
    target = (await desk("list_tickets", status="open"))[0]["id"]
    closed = await desk("close_ticket", ticket_id=target, resolution="Reset the account.")
    assert (closed["status"], closed["resolution"]) == ("closed", "Reset the account.")
    assert target not in [t["id"] for t in await desk("list_tickets", status="open")]
    with pytest.raises(ValueError, match=f"ticket {target} is already closed"):
        await desk("close_ticket", ticket_id=target, resolution="again")
    with pytest.raises(LookupError):
        await desk("close_ticket", ticket_id="T0", resolution="x")


async def test_assign_ticket_is_idempotent(desk: Desk) -> None:
    target = next(t for t in await desk("list_tickets", status="open") if t["assignee"] is None)["id"]
    first = await desk("assign_ticket", ticket_id=target, agent="chloe")
    assert first["assignee"] == "chloe"
    again = await desk("assign_ticket", ticket_id=target, agent="chloe")
    assert again == first  # same agent: nothing changes, not even updated_at
    moved = await desk("assign_ticket", ticket_id=target, agent="dev")
    assert moved["assignee"] == "dev" and moved["updated_at"] > first["updated_at"]
    with pytest.raises(InvalidArguments, match="agent"):
        await desk("assign_ticket", ticket_id=target, agent="mallory")
    with pytest.raises(ValueError, match=f"agent must be one of {', '.join(AGENTS)}"):
        await HelpDesk().assign_ticket(ticket_id=target, agent="mallory")  # type: ignore[arg-type]


async def test_injected_clock_stamps_writes() -> None:
    moment = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    desk = Desk(make_helpdesk(clock=lambda: moment))
    ticket = await desk("create_ticket", customer_id="C001", title="x", body="y")
    assert ticket["created_at"] == "2030-01-02T03:04:00Z"


async def test_results_are_copies(desk: Desk) -> None:
    ticket = await desk("get_ticket", ticket_id="T1001")
    ticket["tags"].append("tampered")
    customers = await desk("search_customers", query="")
    customers[0]["name"] = "tampered"
    assert "tampered" not in (await desk("get_ticket", ticket_id="T1001"))["tags"]
    assert (await desk("get_customer", customer_id=customers[0]["id"]))["name"] != "tampered"


# --- fresh state --------------------------------------------------------------


async def test_a_fresh_desk_has_fresh_state() -> None:
    used, fresh = Desk(make_helpdesk()), Desk(make_helpdesk())
    await used("create_ticket", customer_id="C001", title="x", body="y")
    await used("close_ticket", ticket_id="T1001", resolution="done")
    assert (await used("ticket_stats"))["total"] == 41
    assert (await fresh("ticket_stats"))["total"] == 40
    assert (await fresh("get_ticket", ticket_id="T1001"))["status"] != "closed"
    assert (await Desk(make_helpdesk())("ticket_stats"))["total"] == 40


async def test_reset_starts_a_desk_over() -> None:
    desk = HelpDesk()
    tools = Desk(desk.tools())
    await tools("create_ticket", customer_id="C001", title="x", body="y")
    desk.reset()
    assert (await tools("ticket_stats"))["total"] == 40
    assert (await tools("create_ticket", customer_id="C001", title="x", body="y"))["created_at"].endswith("09:01:00Z")


async def test_module_exposes_the_default_desk() -> None:
    # What `--tools tether.demo.helpdesk` loads.
    tools = tools_from_module("tether.demo.helpdesk")
    assert sorted(t.name for t in tools) == sorted(READS + WRITES)
    desk = Desk(tools)
    helpdesk_module.default_desk.reset()
    try:
        await desk("create_ticket", customer_id="C001", title="x", body="y")
        assert (await helpdesk_module.default_desk.ticket_stats())["total"] == 41
        # Loading the module again gives tools on the same default desk.
        assert (await Desk(tools_from_module("tether.demo.helpdesk"))("ticket_stats"))["total"] == 41
    finally:
        helpdesk_module.default_desk.reset()


# --- the demo program ---------------------------------------------------------


def test_demo_program_stays_in_the_sandbox_subset() -> None:
    tree = ast.parse(DEMO_PROGRAM)
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.ClassDef) and node.bases), "no custom exception classes"
        assert not isinstance(node, (ast.Yield, ast.YieldFrom, ast.Delete)), "no generators, no del"
        if isinstance(node, ast.GeneratorExp):
            raise AssertionError("no generator expressions")
        if isinstance(node, ast.Attribute) and node.attr == "wait_for":
            raise AssertionError(f"no asyncio.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "gather":
            assert not node.keywords, "gather takes positional arguments only"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert any(c.func.id == "search" and c.args[0].value == "list open tickets" for c in calls)  # type: ignore[attr-defined]
    assert isinstance(tree.body[-1], ast.Expr) and isinstance(tree.body[-1].value, ast.Dict)


@pytest.mark.slow
async def test_demo_program_runs_and_type_checks() -> None:
    from tether._runtime import Runtime

    desk = HelpDesk()
    async with Runtime(tools=desk.tools(), type_check=True) as runtime:
        run = await runtime.execute(DEMO_PROGRAM)
    assert run.status == "completed", run.error
    result = run.result
    open_tickets = await desk.list_tickets(status="open", limit=200)
    assert result["open_tickets"] == len(open_tickets)
    assert result["by_priority"] == {p: sum(t["priority"] == p for t in open_tickets) for p in result["by_priority"]}
    oldest = sorted(open_tickets, key=lambda t: t["created_at"])[:5]
    assert [t["id"] for t in result["oldest_open"]] == [t["id"] for t in oldest]
    assert run.calls == 1 + 1 + 12 + 5  # search, customers, one list per customer, five ticket reads
    assert run.diagnostics["writes"] == 0
