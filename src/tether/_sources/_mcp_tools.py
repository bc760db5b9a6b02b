"""Tools from an MCP server's tools/list answer, as plain JSON.

Kept apart from ``tether._sources.mcp`` because it needs no part of the MCP
client stack: a command whose listing comes from the store's cache builds its
tools without importing the SDK (about a second) or starting the server.
"""

from __future__ import annotations

import re
from typing import Any, Awaitable, Callable, Mapping

from tether._sources._names import identifier, unique
from tether._tools.model import Annotations, Tool
from tether.errors import UsageError

HandlerFactory = Callable[[str, str], Callable[[dict[str, Any]], Awaitable[Any]]]

# Why a listed tool is not offered: tether's client cannot run it faithfully.
TASK_REQUIRED = ("requires MCP task augmentation (execution.taskSupport = 'required'), which tether's "
                 "client does not implement; calling it would always fail")


def build_tools(namespace: str, listing: list[dict[str, Any]], handler: HandlerFactory,
                timeout_seconds: float | None = None, *, idempotency: str = "none") -> tuple[list[Tool], dict[str, str], list[dict[str, str]]]:
    """``(tools, tether name -> upstream name, problems)`` for one listing.

    ``listing`` holds tools/list entries as JSON (camelCase keys, as on the
    wire). Names that are not Python identifiers are rewritten, so the same
    listing always gives the same names: cached and live listings agree.
    """
    tools: list[Tool] = []
    upstream: dict[str, str] = {}
    problems: list[dict[str, str]] = []
    taken: set[str] = set()
    for entry in listing:
        wire = str(entry.get("name", ""))
        if (entry.get("execution") or {}).get("taskSupport") == "required":
            problems.append({"operation": wire, "problem": TASK_REQUIRED})
            continue
        name = unique(identifier(wire, "t"), taken)
        hints = entry.get("annotations") or {}
        try:
            tool = Tool(
                namespace=namespace,
                name=name,
                description=entry.get("description") or entry.get("title") or "",
                input_schema=dict(entry.get("inputSchema") or {"type": "object"}),
                handler=handler(name, wire),
                title=entry.get("title") or hints.get("title"),
                output_schema=dict(entry["outputSchema"]) if entry.get("outputSchema") is not None else None,
                # Missing hints are False, so an unannotated tool is governed as a write.
                annotations=Annotations(
                    read_only=bool(hints.get("readOnlyHint")),
                    destructive=bool(hints.get("destructiveHint")),
                    idempotent=bool(hints.get("idempotentHint")),
                    open_world=bool(hints.get("openWorldHint")),
                ),
                source="mcp",
                timeout_seconds=timeout_seconds,
                idempotency=idempotency,
            )
        except UsageError as exc:
            problems.append({"operation": wire, "problem": exc.message})
            continue
        taken.add(name)
        upstream[name] = wire
        tools.append(tool)
    return tools, upstream, problems


def listing_json(listed: list[Any]) -> list[dict[str, Any]]:
    """SDK tool objects as the JSON the wire carried (what the cache keeps)."""
    out = []
    for item in listed:
        entry = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        entry.pop("icons", None)  # not used, and can be large data: URLs
        out.append(entry)
    return out


def server_summary(server_info: Mapping[str, Any]) -> str | None:
    """A namespace's one line from what the server says of itself: its title or name and the
    first sentence of its instructions (``server_info`` as kept with the cached listing)."""
    name = str(server_info.get("title") or server_info.get("name") or "")
    first = " ".join(_prose(str(server_info.get("instructions") or "")).split()).split(". ")[0].rstrip(".")
    return (f"{name}: {first}" if name and first else (name or first)) or None


_MARKUP = re.compile(r"^\s*(#{1,6}\s+|[-*+>]\s+|\d+\.\s+)|\*\*|`+")


def _prose(text: str) -> str:
    """Instructions as prose: markdown headings (a server's "# Usage"), list marks and emphasis left out.

    Headings are titles, not the first sentence; they would read as one in the prompt.
    """
    lines = [line for line in text.splitlines() if not re.match(r"^\s*#{1,6}\s", line)]
    return " ".join(_MARKUP.sub("", line) for line in lines if line.strip())
