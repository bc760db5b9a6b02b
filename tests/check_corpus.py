"""Programs as models write them, with the results they must give.

Used by tests/tools/test_check.py: every VALID program must pass the pre-run check
(in every check mode) and give its expected result; every INVALID program must
be refused before any call, with the code and the words given.
"""

from __future__ import annotations

from typing import Any, Literal

from typing_extensions import TypedDict

from tether._sources import tool
from tether._tools.model import Annotations, Tool


class Ticket(TypedDict):
    id: int
    title: str
    status: str
    priority: int


def _ticket(i: int) -> Ticket:
    return {"id": i, "title": f"ticket {i}", "status": "open" if i % 2 else "closed", "priority": i % 5 + 1}


@tool(namespace="tracker", read_only=True)
async def get_ticket(id: int) -> Ticket:
    """One ticket by id."""
    if id < 0 or id > 100:
        raise LookupError(f"ticket {id} does not exist")
    return _ticket(id)


@tool(namespace="tracker", read_only=True)
async def list_tickets(status: Literal["open", "closed"] = "open", limit: int = 10) -> list[Ticket]:
    """Tickets with a status, lowest id first."""
    out = [_ticket(i) for i in range(1, 60) if _ticket(i)["status"] == status]
    return out[:limit]


@tool(namespace="tracker")
async def create_ticket(title: str, priority: int = 3, *, labels: list[str] | None = None) -> dict:
    """Open a ticket."""
    return {"id": 101, "title": title, "priority": priority, "labels": labels or []}


@tool(namespace="tracker")
async def close_ticket(id: int, reason: str = "done") -> dict:
    """Close a ticket."""
    return {"id": id, "status": "closed", "reason": reason}


@tool(namespace="fs", read_only=True)
async def read(path: str) -> str:
    """A file's text."""
    if path.startswith("/missing"):
        raise FileNotFoundError(f"no such file: {path}")
    return f"contents of {path}"


@tool(namespace="fs", read_only=True)
async def sort(path: str, reverse: bool = False) -> list[str]:
    """The file's lines, sorted."""
    lines = ["b", "c", "a"]
    return sorted(lines, reverse=reverse)


@tool(namespace="weather", read_only=True)
async def forecast(city: str, days: int = 3) -> list[dict]:
    """Daily highs."""
    return [{"city": city, "day": d, "high": 20 + d} for d in range(days)]


async def _search_issues(args: dict) -> Any:
    return {"query": args["query"], "state": args.get("state", "open"), "count": 2}


# A schema tool (as MCP and OpenAPI give them): an optional parameter listed
# before a required one, so positional order (required first) is exercised.
SEARCH_ISSUES = Tool(
    "gh", "search_issues", "Search issues.",
    {"type": "object", "properties": {"state": {"enum": ["open", "closed"]}, "query": {"type": "string"},
                                      "per_page": {"type": "integer", "default": 30}},
     "required": ["query"]},
    _search_issues, annotations=Annotations(read_only=True), source="mcp",
)


def corpus_tools() -> list[Any]:
    return [get_ticket, list_tickets, create_ticket, close_ticket, read, sort, forecast, SEARCH_ISSUES]


VALID: list[tuple[str, Any]] = [
    # --- positional, keyword and mixed calls ---------------------------------------
    ('import tools\nawait tools.fs.sort("report.pdf")', ["a", "b", "c"]),
    ('import tools\nawait tools.fs.sort("report.pdf", True)', ["c", "b", "a"]),
    ('import tools\nawait tools.fs.sort("report.pdf", reverse=True)', ["c", "b", "a"]),
    ('import tools\nawait tools.fs.sort(path="r", reverse=False)', ["a", "b", "c"]),
    ('import tools\n(await tools.tracker.get_ticket(7))["title"]', "ticket 7"),
    ('import tools\nt = await tools.tracker.create_ticket("Printer on fire", 1, labels=["hw"])\nt["labels"]', ["hw"]),
    ('import tools\n(await tools.tracker.create_ticket("x"))["priority"]', 3),
    ('import tools\n(await tools.gh.search_issues("bug"))["state"]', "open"),
    ('import tools\n(await tools.gh.search_issues("bug", "closed"))["state"]', "closed"),
    ('import tools\nr = await tools.gh.search_issues("bug", per_page=5, state="closed")\nr["count"]', 2),
    ('import tools\nlen(await tools.weather.forecast("Oslo", 5))', 5),
    ('import tools\n[d["high"] for d in await tools.weather.forecast(city="Oslo")]', [20, 21, 22]),
    # --- aliases and bound functions ------------------------------------------------
    ('import tools as t\n(await t.tracker.get_ticket(3))["status"]', "open"),
    ('from tools import tracker\nlen(await tracker.list_tickets("closed", 4))', 4),
    ('from tools import tracker as tr, fs\n[(await tr.get_ticket(2))["id"], await fs.read("a")]', [2, "contents of a"]),
    ('from tools.fs import read\nawait read("notes.txt")', "contents of notes.txt"),
    ('from tools.weather import forecast as fc\n(await fc("Rome", 1))[0]["city"]', "Rome"),
    ('import tools.tracker\n(await tools.tracker.get_ticket(id=4))["priority"]', 5),
    ('import tools\nget = tools.tracker.get_ticket\n[(await get(i))["id"] for i in (1, 2)]', [1, 2]),
    ('import tools\nops = {"read": tools.fs.read}\nawait ops["read"]("x")', "contents of x"),
    ('import tools\nname = "read"\nawait getattr(tools.fs, name)("y")', "contents of y"),
    ('import tools\nns = getattr(tools, "fs")\nawait ns.read("z")', "contents of z"),
    ('import tools\nm = tools\nawait m.fs.read("q")', "contents of q"),
    ('import tools\ndef pick(mod):\n    return mod.fs\nawait pick(tools).read("p")', "contents of p"),
    ('import tools\ngh = tools.gh\n(await gh.search_issues(query="x"))["query"]', "x"),
    ('import tools\nargs = {"city": "Lima", "days": 2}\nlen(await tools.weather.forecast(**args))', 2),
    ('import tools\npos = ["r.txt"]\nawait tools.fs.sort(*pos)', ["a", "b", "c"]),
    # --- gather and control flow ------------------------------------------------------
    ('import asyncio\nimport tools\na, b = await asyncio.gather(tools.tracker.get_ticket(1), tools.tracker.get_ticket(2))\n'
     '[a["id"], b["id"]]', [1, 2]),
    ('import asyncio\nimport tools\nrs = await asyncio.gather(*[tools.tracker.get_ticket(i) for i in range(1, 6)])\n'
     'sum(r["priority"] for r in rs)', 15),
    ('import asyncio\nfrom tools import weather\n'
     'out = await asyncio.gather(*(weather.forecast(c, 1) for c in ["A", "B"]))\n[o[0]["city"] for o in out]', ["A", "B"]),
    ('import tools\ntotal = 0\nfor i in range(10):\n    r = await tools.tracker.get_ticket(id=i)\n    total += r["priority"]\ntotal',
     30),
    ('import tools\nopen_ = [t for t in await tools.tracker.list_tickets() if t["priority"] > 2]\nlen(open_)', 6),
    ('import tools\ni = 0\nwhile i < 3:\n    i += 1\n    await tools.fs.read(str(i))\ni', 3),
    # --- try/except on the codes tether raises ---------------------------------------
    ('import tools\ntry:\n    await tools.tracker.get_ticket(-1)\nexcept LookupError as e:\n    out = str(e)[:12]\nout',
     "[tool_error]"),
    ('import tools\ntry:\n    await tools.tracker.get_ticket(-1)\nexcept Exception as e:\n    out = "tool_error" in str(e)\nout',
     True),
    ('import tools\ntry:\n    await tools.fs.read("/missing/x")\nexcept FileNotFoundError:\n    out = "missing"\nout', "missing"),
    ('import tools\ntry:\n    await tools.tracker.close_ticket(13)\nexcept PermissionError as e:\n    out = str(e).split("]")[0]\n'
     'out', "[write_declined"),
    ('import tools\ntry:\n    await tools.tracker.close_ticket(13, "dup")\n    out = "sent"\nexcept (PermissionError, TimeoutError):\n'
     '    out = "not sent"\nout', "not sent"),
    ('import tools\nx = {"id": "nine"}\ntry:\n    await tools.tracker.get_ticket(**x)\nexcept TypeError as e:\n'
     '    out = str(e).startswith("[invalid_arguments]")\nout', True),
    ('try:\n    import os\n    out = "os"\nexcept ModuleNotFoundError:\n    out = "none"\nout', "os"),
    ('import tools\ntry:\n    r = await tools.tracker.get_ticket(5)\nfinally:\n    done = True\n[r["id"], done]', [5, True]),
    # --- the language: dataclasses, match, f-strings, json, datetime, re ------------
    ('from dataclasses import dataclass\nimport tools\n@dataclass\nclass Row:\n    id: int\n    title: str\n'
     't = await tools.tracker.get_ticket(8)\nrow = Row(t["id"], t["title"])\nf"{row.id}:{row.title}"', "8:ticket 8"),
    ('import tools\nt = await tools.tracker.get_ticket(9)\nmatch t["status"]:\n    case "open":\n        out = 1\n'
     '    case _:\n        out = 0\nout', 1),
    ('import tools\nt = await tools.tracker.get_ticket(3)\nf"#{t[\'id\']} {t[\'title\'].upper()} ({t[\'priority\']:02d})"',
     "#3 TICKET 3 (04)"),
    ('import json\nimport tools\njson.loads(json.dumps(await tools.tracker.get_ticket(1)))["id"]', 1),
    ('import datetime\nd = datetime.date(2026, 11, 30) + datetime.timedelta(days=2)\nd.isoformat()', "2026-12-02"),
    ('import re\nimport tools\ntext = await tools.fs.read("a/b.txt")\nre.findall(r"\\w+", text)[-1]', "txt"),
    ('import collections\nimport tools\nts = await tools.tracker.list_tickets(limit=5)\n'
     'c = collections.Counter(t["status"] for t in ts)\nc["open"]', 5),
    ('import math\nround(math.sqrt(16) + math.pi, 2)', 7.14),
    ('from functools import reduce\nreduce(lambda a, b: a * b, [1, 2, 3, 4])', 24),
    ('import itertools\nlist(itertools.islice(itertools.count(5), 3))', [5, 6, 7]),
    ('words = ["b", "a", "c"]\nsorted(words, key=lambda w: w, reverse=True)', ["c", "b", "a"]),
    ('data = {"a": 1, "b": 2}\n{k: v * 10 for k, v in data.items() if v > 1}', {"b": 20}),
    ('def first[T](xs: list[T]) -> T:\n    return xs[0]\nfirst([3, 4])', 3),
    ('def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nfib(10)', 55),
    ('async def titles(ids):\n    import tools\n    return [(await tools.tracker.get_ticket(i))["title"] for i in ids]\n'
     'await titles([1, 2])', ["ticket 1", "ticket 2"]),
    ('import tools\nif (n := len(await tools.tracker.list_tickets(limit=3))) > 2:\n    out = n\nout', 3),
    ('x = [1, 2, 3]\ny = list(map(lambda v: v + 1, filter(lambda v: v > 1, x)))\ny', [3, 4]),
    ('class Box:\n    def __init__(self, v):\n        self.v = v\n    def __repr__(self):\n        return f"Box({self.v})"\n'
     'repr(Box(2))', "Box(2)"),
    ('out = []\nfor i, w in enumerate(["x", "y"]):\n    out.append(f"{i}{w}")\n"-".join(out)', "0x-1y"),
    ('isinstance(3, int) and not isinstance("s", int)', True),
    # --- built-ins of the sandbox -----------------------------------------------------
    ('r = await search("ticket")\nr["total"] > 0', True),
    ('d = await describe("fs.sort")\nd[0]["signature"].startswith("async def tools.fs.sort(path: str")', True),
    ('s = await sources()\nsorted(x["namespace"] for x in s)', ["fs", "gh", "tracker", "weather"]),
    ('emit({"progress": 1})\n"emitted"', "emitted"),
    ('import tools\nprint("starting")\n(await tools.tracker.get_ticket(2))["id"]', 2),
]

# (program, code, words the message must hold)
INVALID: list[tuple[str, str, str]] = [
    ('import tools\nawait tools.fs.sort("a", True, 3)', "invalid_arguments", "takes 2 positional arguments but 3 were given"),
    ('import tools\nawait tools.fs.sort("a", path="b")', "invalid_arguments", "multiple values for argument 'path'"),
    ('import tools\nawait tools.fs.sort(pth="a")', "invalid_arguments", "did you mean 'path'?"),
    ('import tools\nawait tools.fs.sort()', "invalid_arguments", "missing required argument 'path'"),
    ('import tools\nawait tools.tracker.create_ticket("t", 1, ["x"])', "invalid_arguments", "takes 2 positional"),
    ('import tools\nawait tools.tracker.create_ticket(5)', "invalid_arguments", "argument 'title' must be string"),
    ('import tools\nawait tools.gh.search_issues("q", "pending")', "invalid_arguments", "argument 'state' must be one of"),
    ('import tools\nawait tools.fs.srot("a")', "unknown_tool", "did you mean fs.sort"),
    ('import tools as t\nawait t.fss.sort("a")', "unknown_tool", "did you mean fs"),
    ('from tools.tracker import get_tikcet\nawait get_tikcet(1)', "unknown_tool", "tracker.get_ticket"),
    ('from tools import trackr\nawait trackr.get_ticket(1)', "unknown_tool", "tracker"),
    ('import tools\nawait tools.tracker.get_ticket(1)\nawait tools.tracker.close_ticket(1, "x", "y")', "invalid_arguments",
     "takes 2 positional"),
    ('import tools\nfor i in range(3):\n    await tools.tracker.get_ticket(i)\nawait tools.weather.forcast("x")',
     "unknown_tool", "weather.forecast"),
    ('import tools\nx = (1,\nawait tools.fs.read("a")', "syntax_error", "line"),
    ('import tools\nawait tools.fs.read("a"))', "syntax_error", "line 2"),
]
