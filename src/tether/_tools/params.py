"""A tool's calling convention: which parameters a call may pass by position, in which order.

Stubs (the declaration), ``describe`` (the text), the pre-run check and the
effect boundary (tools.binding) all read :func:`parameters`, so they cannot
disagree. It depends on nothing else in tether, so every one of them can
import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether._tools.model import Tool


@dataclass(frozen=True)
class Parameters:
    """A tool's parameters as a Python signature sees them."""

    positional: tuple[str, ...]  # may be passed by position, in this order
    keyword_only: tuple[str, ...]  # by keyword only, in the schema's order
    required: frozenset[str]


def parameters(tool: "Tool") -> Parameters:
    """The calling convention of ``tool`` (cached on the tool's schema object)."""
    schema = tool.input_schema
    cached = _CACHE.get(id(schema))
    if cached is not None and cached[0] is schema and cached[1] == tool.keyword_only:
        return cached[2]
    props = schema.get("properties") or {}
    required = frozenset(n for n in (schema.get("required") or []) if n in props)
    keyword_only = frozenset(tool.keyword_only)
    order = [n for n in props if n in required] + [n for n in props if n not in required]
    result = Parameters(
        positional=tuple(n for n in order if n not in keyword_only),
        keyword_only=tuple(n for n in props if n in keyword_only),
        required=required,
    )
    if len(_CACHE) > 50_000:
        _CACHE.clear()
    _CACHE[id(schema)] = (schema, tool.keyword_only, result)
    return result


# id(schema) -> (schema, keyword_only, Parameters); the schema is kept so its id stays unique.
_CACHE: dict[int, tuple[Any, tuple[str, ...], Parameters]] = {}
