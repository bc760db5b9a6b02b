"""A source's undo declarations (P-46): the ``undo`` table of its definition, and OpenAPI's natural pairs.

Applied where a source's tools enter the catalog (loader.py), for every kind:
``[sources.undo.<tool>]`` names the tool that undoes ``<tool>`` and how its
arguments follow. An OpenAPI ``POST`` to a collection (``.../things``) that has
a ``DELETE`` of one item of it (``.../things/{id}``) is paired with that
``DELETE``, its one path argument taken from the created resource's field of the
same name, else its ``id``; a table entry replaces the pair, ``false`` removes it.
"""

from __future__ import annotations

from typing import Any, Mapping

from tether._tools.model import Tool
from tether._tools.undo import Undo, UndoArgsError, undo_from_config


def with_undos(tools: list[Tool], definition: Mapping[str, Any]) -> list[Tool]:
    """``tools`` with the undos their definition declares, or pairs (the same list when none)."""
    table = definition.get("undo") or {}
    pairs = _openapi_pairs(tools)
    if not table and not pairs:
        return tools
    out = []
    for tool in tools:
        declared = table.get(tool.name)
        undo = (None if declared is False else
                undo_from_config(declared, f"[sources] {tool.namespace} undo.{tool.name}") if declared
                else pairs.get(tool.name))
        if undo is not None and tool.undo is None:
            # Frozen, and possibly deferred (its schema read when first asked for, D-47): set without a copy.
            object.__setattr__(tool, "undo", undo)
        out.append(tool)
    return out


def _openapi_pairs(tools: list[Tool]) -> dict[str, Undo]:
    """Each create (POST to a collection) of an OpenAPI source, by name: the DELETE of one item of it."""
    deletes: dict[str, tuple[Tool, str]] = {}
    for tool in tools:
        if tool.target is None or tool.target[0].upper() != "DELETE":
            continue
        collection, _, last = tool.target[1].rstrip("/").rpartition("/")
        if last.startswith("{") and last.endswith("}") and "{" not in collection:
            deletes[collection] = (tool, last[1:-1])
    pairs: dict[str, Undo] = {}
    for tool in tools:
        if tool.target is None or tool.target[0].upper() != "POST":
            continue
        found = deletes.get(tool.target[1].rstrip("/"))
        if found is not None:
            delete, param = found
            pairs[tool.name] = Undo(delete.address, _ItemOf(delete, param))
    return pairs


class _ItemOf:
    """The DELETE's arguments from what the POST returned: its one path argument (the schema's name for the
    path parameter), from the result's field of that name, else its ``id``."""

    def __init__(self, delete: Tool, param: str) -> None:
        self.delete, self.param = delete, param

    def __call__(self, args: dict[str, Any], result: Any) -> dict[str, Any]:
        if not isinstance(result, dict):
            raise UndoArgsError(f"the create returned no object to take {self.param!r} from")
        required = list((self.delete.input_schema or {}).get("required") or [])
        name = required[0] if len(required) == 1 else self.param
        for field in (self.param, name, "id"):
            if field in result:
                return {name: result[field]}
        raise UndoArgsError(f"the created resource has no {self.param!r} or 'id' field")
