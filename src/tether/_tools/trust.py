"""A tool's own trust labels and argument roles, given in Python: ``@tool(trust=..., trust_fields=..., roles=...)``
or ``Tool(trust=...)`` (P-45, D-73).

The same words as a ``[[sources]]`` table's ``trust`` / ``trust_fields`` / ``roles`` (tether._sources.kinds), per
tool, so the tool's name is left out of the keys: ``trust_fields = {"body": "untrusted"}``, ``roles = {"ref":
"destination"}``. They are checked when the tool is declared, so a misspelt label fails there and then rather
than leaving a tool silently untrusted (the default, D-64) or silently trusted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from tether.errors import InvalidToolDefinition

LABELS = ("trusted", "untrusted")
# The roles of tether._engine.lineage.roles (ROLES), spelt here so declaring a tool imports nothing of the judge.
ROLES = ("destination", "content")

_NEXT = "See docs/security.md, \"Lineage\": which tools and fields to mark trusted, and which arguments are destinations."


def check_labels(where: str, trust: Any, trust_fields: Any, roles: Any,
                 arguments: Collection[str] | None) -> tuple[str | None, dict[str, str] | None, dict[str, str] | None]:
    """``trust``, ``trust_fields`` and ``roles`` checked and copied (plain dicts); ``InvalidToolDefinition`` naming
    what is wrong and what is allowed otherwise. ``arguments``: the tool's argument names, None when it takes any."""
    if trust is not None and trust not in LABELS:
        raise _bad(where, f"trust must be \"trusted\" or \"untrusted\", not {trust!r}")
    fields = _table(where, "trust_fields", trust_fields)
    for key, label in (fields or {}).items():
        if not key or any(not part for part in key.split(".")) or "[" in key or "]" in key:
            raise _bad(where, f"trust_fields key {key!r} is not a field path: write the keys of the result joined by "
                              "dots (\"sender\", \"meta.received\"), list indices left out, the tool's name too")
        if label not in LABELS:
            raise _bad(where, f"trust_fields[{key!r}] must be \"trusted\" or \"untrusted\", not {label!r}")
    given = _table(where, "roles", roles)
    for arg, role in (given or {}).items():
        if role not in ROLES:
            raise _bad(where, f"roles[{arg!r}] must be \"destination\" or \"content\", not {role!r}")
        if arguments is not None and arg not in arguments:
            known = ", ".join(sorted(arguments)) or "none"
            raise _bad(where, f"roles names {arg!r}, which is not an argument of the tool (its arguments: {known})")
    return trust, fields, given


def _table(where: str, what: str, value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _bad(where, f"{what} must be a mapping of names to labels, not {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _bad(where: str, problem: str) -> InvalidToolDefinition:
    return InvalidToolDefinition(f"tool {where}: {problem}; nothing was added", next_action=_NEXT,
                                 details={"tool": where})
