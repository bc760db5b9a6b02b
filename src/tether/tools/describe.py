"""``describe()`` and ``sources()``: what a program learns about tools at run time."""

from __future__ import annotations

from typing import Any

from ..errors import UnknownTool
from .catalog import Catalog
from .stubs import build_stubs, render_signature


def describe(catalog: Catalog, address_or_list: str | list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    """Describe one tool or several, in the order asked.

    Each entry is ``{"address", "signature", "types", "description",
    "annotations", "input_schema"}``; ``signature`` and ``types`` are the
    exact declarations the type checker holds the program to. An unknown
    address gives ``{"address", "error": "unknown_tool", "suggestions"}``
    instead of raising, so a list can partly succeed.
    """
    addresses = [address_or_list] if isinstance(address_or_list, str) else list(address_or_list)
    stubs = build_stubs(catalog)
    out: list[dict[str, Any]] = []
    for address in addresses:
        if not isinstance(address, str):
            out.append({"address": repr(address), "error": "unknown_tool", "suggestions": []})
            continue
        try:
            tool = catalog.get(address)
        except UnknownTool as exc:
            out.append({"address": address, "error": exc.code, "suggestions": exc.details.get("suggestions", [])})
            continue
        stub = stubs.tool_stubs.get(tool.address)
        out.append(
            {
                "address": tool.address,
                # A tool the program cannot name (keyword or _private) has no stub.
                "signature": stub.signature if stub else render_signature(tool),
                "types": stub.types if stub else "",
                "description": tool.description,
                "annotations": tool.annotations.to_dict(),
                "input_schema": tool.input_schema,
            }
        )
    return out


def list_sources(catalog: Catalog) -> list[dict[str, Any]]:
    """``[{"namespace", "tools": count, "summary"}]`` for every namespace, sorted."""
    return [dict(entry) for entry in catalog.namespaces()]
